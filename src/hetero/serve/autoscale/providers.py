"""Actuation: the providers that start a replica and stop it again.

A ``Provider`` has two calls: ``start(type_name)`` returns once the new replica answers
``GET /v1/models`` on its URL (it is warm), ``stop(handle)`` ends it once the router has drained
it. The base here holds what every provider shares: retries with exponential back-off, each
failed attempt logged and kept (``failures``), and the readiness wait that fails fast when the
replica's process exits. Two providers:

- ``LocalProcessProvider`` runs each replica as a process on this machine, from a command
  template per type (``{host}`` and ``{port}`` filled in), in a session of its own so that
  stopping it (SIGTERM, then SIGKILL after a grace) ends every process it started. A fence
  (``runtime/fence.py``, sessions only) ends what is left of those sessions when the provider
  closes, and its sentinel does when ``hetero serve`` is killed with SIGKILL: an engine's own
  workers (vLLM's engine core) do not outlive it.
- ``RayProvider`` runs the same command from a Ray actor, placed by the type's accelerator, so
  replicas start on the cluster's nodes; the actor reports the URL and stops its process.

A provider's failure is a ``ProviderError``: the type, every attempt's reason and the last lines
the replica wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from hetero.errors import ConfigError, ProviderError
from hetero.runtime.fence import Fence
from hetero.serve.autoscale.policy import ReplicaType

__all__ = [
    "LocalProcessProvider",
    "Provider",
    "RayPlacement",
    "RayProvider",
    "ReplicaHandle",
    "ReplicaProcess",
    "Retry",
    "RetryingProvider",
    "StartFailure",
    "ready_timeout",
]

log = logging.getLogger("hetero.serve.autoscale")

#: Lines of a replica's output kept to quote when it fails.
_TAIL_LINES = 20


@dataclass(frozen=True, slots=True)
class Retry:
    """How often a start is tried, and the wait before each retry: ``backoff``, doubling up to
    ``max_backoff`` (1 s, 2 s, 4 s...)."""

    attempts: int = 3
    backoff: float = 1.0
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError([("attempts", f"must be >= 1, got {self.attempts!r}")])
        if not 0 <= self.backoff <= self.max_backoff:
            raise ConfigError(
                [("backoff", f"must be between 0 and max_backoff, got {self.backoff!r}")]
            )

    def wait(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failed attempt."""
        return float(min(self.backoff * 2 ** (failed - 1), self.max_backoff))


@dataclass(frozen=True, slots=True)
class ReplicaHandle:
    """A replica a provider started: its name in the router, its type and URL, and where it
    runs (``pid`` of its process's group leader, on this machine or a Ray node)."""

    name: str
    type_name: str
    url: str
    provider: str
    pid: int | None = None
    node: str = ""


@dataclass(frozen=True, slots=True)
class StartFailure:
    """One failed attempt at starting a replica (``RetryingProvider.failures``)."""

    type_name: str
    attempt: int
    reason: str
    at: float  # time.time()


class Provider(Protocol):
    """What the controller starts and stops replicas through."""

    name: str

    async def start(self, type_name: str) -> ReplicaHandle:
        """A new warm replica of the type; ``ProviderError`` once every attempt failed."""
        ...

    async def stop(self, handle: ReplicaHandle) -> None:
        """End the replica (the router has drained and removed it)."""
        ...


def ready_timeout(rtype: ReplicaType) -> float:
    """How long a replica of ``rtype`` may take to answer before its start counts as failed:
    a start four times slower than expected still passes, and 30 s more for a cold cache."""
    return rtype.startup_s * 4 + 30.0


def _free_port(host: str) -> int:
    """A port free on ``host`` now (another process may take it before the replica binds it:
    the replica then exits at once, and its start is retried on another)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _fill(template: Sequence[str], host: str, port: int) -> list[str]:
    """The command of ``template`` with ``{host}`` and ``{port}`` filled in (by replacement,
    not ``str.format``: other braces, such as a JSON argument's, stay as they are)."""
    return [a.replace("{host}", host).replace("{port}", str(port)) for a in template]


def _url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


# Run in front of a replica's command on Linux: the kernel kills the replica when the process
# that started it ends, however it ends (``hetero serve`` killed, its Ray actor killed), then
# the command takes its place (same pid; the request survives exec).
_TIED = """import os, sys
from hetero.runtime.procs import die_with_parent
die_with_parent(int(sys.argv[1]))
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as exc:
    sys.stderr.write(f"cannot run {sys.argv[2]!r}: {exc}\\n")
    sys.exit(127)
"""


class ReplicaProcess:
    """One replica's process: started in a session (and process group) of its own, its output
    (stdout and stderr together: engines such as vLLM log to stdout) read as it comes, the
    last lines kept; on Linux it dies with the process that started it. Plain blocking code,
    used on the event loop's thread (start, ``why_exited``) and in threads (``stop``) here,
    and inside a Ray actor."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, fence: Fence | None = None
    ) -> None:
        self.argv = list(argv)
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)
        command = self.argv
        if sys.platform.startswith("linux"):
            command = [sys.executable, "-c", _TIED, str(os.getpid()), *self.argv]
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: stop ends every process it started
            env={**os.environ, **env} if env else None,
        )
        self.pid = self.proc.pid
        self._fence = fence
        self._fenced = None if fence is None else fence.enclose(self.pid, str(self.pid))
        # Read all along: a full pipe would stall the replica.
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"tail-{self.pid}")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                self.tail.append(line.decode(errors="replace").rstrip())

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def output(self) -> str:
        """The last lines it wrote (once it has exited, all of them up to its end)."""
        if self.proc.poll() is not None:
            self._reader.join(1.0)  # its last lines may still be in the pipe
        return "\n".join(self.tail)

    def why_exited(self) -> str | None:
        """Why it is no longer running (its exit status and last lines), or None if it is."""
        code = self.exit_code()
        if code is None:
            return None
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        out = self.output()
        return f"{how}; its last output:\n{out}" if out else f"{how}, writing nothing"

    def alive(self) -> bool:
        """Whether any process of its group is left (the leader reaped if it has ended)."""
        self.proc.poll()
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a process of the group we may not signal: still there
            return True
        return True

    def stop(self, grace: float) -> None:
        """SIGTERM to the whole group, SIGKILL to what is left after ``grace`` seconds; returns
        once no process of the group is left (blocking)."""
        self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            log.warning("replica process %d still runs %g s after SIGTERM: killed", self.pid, grace)
            self._signal(signal.SIGKILL)
            self.proc.wait()
            deadline = time.monotonic() + 5.0  # killed processes end at once; init reaps them
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        if self._fence is not None and self._fenced is not None:
            self._fence.release(self._fenced)  # a process that left the group, in the session
        self._reader.join(1.0)

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


class _AttemptFailed(Exception):
    """One attempt failed, for the reason given (the next may succeed)."""


async def _wait_ready(
    url: str,
    timeout: float,
    why_exited: Callable[[], Awaitable[str | None]],
    poll: float = 0.1,
) -> None:
    """Return once ``GET {url}/v1/models`` answers 200; ``_AttemptFailed`` when the replica's
    process has exited (``why_exited`` says how) or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    async with aiohttp.ClientSession() as session:
        while True:
            gone = await why_exited()
            if gone is not None:
                raise _AttemptFailed(f"its process {gone}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise _AttemptFailed(f"not ready after {timeout:g} s (GET /v1/models: {last})")
            try:
                probe = aiohttp.ClientTimeout(total=max(0.1, min(2.0, left)))
                async with session.get(f"{url}/v1/models", timeout=probe) as reply:
                    if reply.status == 200:
                        return
                    last = f"HTTP {reply.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            await asyncio.sleep(min(poll, max(0.0, deadline - time.monotonic())))


def _with_output(exc: _AttemptFailed, output: str) -> _AttemptFailed:
    """``exc`` with the last lines of a replica that never answered (one that exited has
    them in its reason already)."""
    return _AttemptFailed(f"{exc}; its last output:\n{output}") if output else exc


class RetryingProvider(ABC):
    """The shared part of a provider: ``start`` tries ``_attempt`` up to ``retry.attempts``
    times with back-off between, logging and keeping each failure."""

    name = "provider"

    def __init__(self, types: Sequence[ReplicaType], retry: Retry | None = None) -> None:
        self.types = {t.name: t for t in types}
        self.retry = retry or Retry()
        self.failures: deque[StartFailure] = deque(maxlen=100)
        self._names = itertools.count(1)

    def _new_name(self, type_name: str) -> str:
        return f"{type_name}-{next(self._names)}"

    async def start(self, type_name: str) -> ReplicaHandle:
        if type_name not in self.types:
            raise ConfigError(
                [("type", f"unknown replica type {type_name!r}; types: {', '.join(self.types)}")]
            )
        reasons: list[str] = []
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return await self._attempt(type_name)
            except _AttemptFailed as exc:
                reason = str(exc)
            reasons.append(f"attempt {attempt}: {reason}")
            self.failures.append(StartFailure(type_name, attempt, reason, time.time()))
            more = attempt < self.retry.attempts
            log.warning(
                "%s: starting a %s replica failed (attempt %d of %d%s): %s",
                self.name,
                type_name,
                attempt,
                self.retry.attempts,
                f", again in {self.retry.wait(attempt):g} s" if more else "",
                reason,
            )
            if more:
                await asyncio.sleep(self.retry.wait(attempt))
        raise ProviderError(
            f"{self.name} provider could not start a replica of type {type_name!r} "
            f"({self.retry.attempts} attempts):\n" + "\n".join(reasons)
        )

    @abstractmethod
    async def _attempt(self, type_name: str) -> ReplicaHandle:
        """Start one replica and wait until it is warm; ``_AttemptFailed`` if it does not come
        (having stopped whatever it started). Cancelled, it stops what it started too."""

    @abstractmethod
    async def stop(self, handle: ReplicaHandle) -> None: ...

    @abstractmethod
    async def close(self) -> None:
        """Stop every replica it still runs and what it keeps for them; it starts no more."""


def _commands(
    types: Sequence[ReplicaType], commands: Mapping[str, Sequence[str]]
) -> dict[str, tuple[str, ...]]:
    """The command template of each type, checked: one per type, none empty, none extra."""
    names = {t.name for t in types}
    problems = [(f"commands.{n}", "no command for this replica type") for n in names - {*commands}]
    problems += [
        (f"commands.{n}", f"not a replica type; types: {', '.join(sorted(names))}")
        for n in sorted({*commands} - names)
    ]
    problems += [(f"commands.{n}", "the command is empty") for n, c in commands.items() if not c]
    if problems:
        raise ConfigError(problems)
    return {n: tuple(c) for n, c in commands.items()}


class LocalProcessProvider(RetryingProvider):
    """Replicas as processes on this machine (see the module's docstring). ``commands`` maps
    each type to its argv template; ``timeouts`` overrides a type's readiness timeout
    (default ``ready_timeout``); ``grace`` is how long a replica has to end after SIGTERM."""

    name = "local"

    def __init__(
        self,
        types: Sequence[ReplicaType],
        commands: Mapping[str, Sequence[str]],
        *,
        host: str = "127.0.0.1",
        retry: Retry | None = None,
        grace: float = 10.0,
        timeouts: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(types, retry)
        self.commands = _commands(types, commands)
        self.host = host
        self.grace = grace
        self.env = dict(env or {})
        self.timeouts = {t.name: ready_timeout(t) for t in types} | dict(timeouts or {})
        self.processes: dict[str, ReplicaProcess] = {}  # by replica name, while it runs
        # Sessions only: a cgroup of the fence's would take a replica out of one its command
        # put itself in (a CPU quota, as bench/_cgexec.py sets).
        self.fence = Fence(f"hetero-replicas-{os.getpid()}", cgroups=False)

    async def _attempt(self, type_name: str) -> ReplicaHandle:
        port = _free_port(self.host)
        argv = _fill(self.commands[type_name], self.host, port)
        try:
            proc = ReplicaProcess(argv, self.env, self.fence)
        except OSError as exc:  # not found, not executable: no retry will change it, but say so
            raise _AttemptFailed(f"cannot run {argv[0]!r}: {exc}") from exc
        url = _url_of(self.host, port)

        async def why_exited() -> str | None:
            if proc.exit_code() is None:
                return None
            # In a thread: its last lines may take a moment to be read from the pipe.
            return await asyncio.to_thread(proc.why_exited)

        try:
            await _wait_ready(url, self.timeouts[type_name], why_exited)
        except _AttemptFailed as exc:
            hung = proc.exit_code() is None  # else its exit status and output are in exc
            await asyncio.to_thread(proc.stop, self.grace)
            raise _with_output(exc, proc.output() if hung else "") from None
        except BaseException:  # cancelled: what was started ends too
            await asyncio.to_thread(proc.stop, self.grace)
            raise
        name = self._new_name(type_name)
        self.processes[name] = proc
        log.info("local: %s is warm at %s (pid %d)", name, url, proc.pid)
        return ReplicaHandle(name, type_name, url, self.name, pid=proc.pid, node="localhost")

    async def stop(self, handle: ReplicaHandle) -> None:
        proc = self.processes.pop(handle.name, None)
        if proc is not None:
            await asyncio.to_thread(proc.stop, self.grace)

    async def close(self) -> None:
        """Stop every replica this provider still runs, and the fence's sentinel."""
        procs = list(self.processes.values())
        self.processes.clear()
        await asyncio.gather(*(asyncio.to_thread(p.stop, self.grace) for p in procs))
        await asyncio.to_thread(self.fence.close)


@dataclass(frozen=True, slots=True)
class RayPlacement:
    """Where a type's actor may run: ``accelerator`` is a Ray accelerator type (``A100``,
    ``H100``...), which the actor asks a sliver of so that it lands on a node that has one;
    ``num_gpus`` the GPUs the replica's process gets (Ray sets ``CUDA_VISIBLE_DEVICES``)."""

    accelerator: str | None = None
    num_gpus: float = 0.0
    num_cpus: float = 1.0

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.accelerator:
            # A sliver: the node's accelerator_type resource is 1, and many replicas share it.
            opts["resources"] = {f"accelerator_type:{self.accelerator}": 0.001}
        return opts


class _ReplicaActor:
    """The Ray actor behind one replica: runs its process on the actor's node."""

    def __init__(self) -> None:
        self.proc: ReplicaProcess | None = None
        self.fence = Fence(f"hetero-replica-{os.getpid()}", cgroups=False)

    def launch(
        self, template: Sequence[str], host: str | None, env: Mapping[str, str]
    ) -> tuple[str, int, str]:
        """Start the process; its URL, pid and node address."""
        from hetero.runtime.ray_cluster import import_ray

        node: str = import_ray().util.get_node_ip_address()
        host = host or node
        port = _free_port(host)
        self.proc = ReplicaProcess(_fill(template, host, port), env, self.fence)
        return _url_of(host, port), self.proc.pid, node

    def why_exited(self) -> str | None:
        return None if self.proc is None else self.proc.why_exited()

    def output(self) -> str:
        return "" if self.proc is None else self.proc.output()

    def stop(self, grace: float) -> None:
        if self.proc is not None:
            self.proc.stop(grace)
        self.fence.close()


class RayProvider(RetryingProvider):
    """Replicas started by Ray actors (see the module's docstring). Connects to Ray (or uses
    the connection this process has) on the first start. ``host`` is the address each replica
    listens on and is reached at; None: its node's address."""

    name = "ray"

    def __init__(
        self,
        types: Sequence[ReplicaType],
        commands: Mapping[str, Sequence[str]],
        *,
        placements: Mapping[str, RayPlacement] | None = None,
        host: str | None = None,
        retry: Retry | None = None,
        grace: float = 10.0,
        timeouts: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(types, retry)
        self.commands = _commands(types, commands)
        unknown = sorted({*(placements or {})} - {t.name for t in types})
        if unknown:
            raise ConfigError([(f"placements.{n}", "not a replica type") for n in unknown])
        self.placements = {t.name: RayPlacement() for t in types} | dict(placements or {})
        self.host = host
        self.grace = grace
        self.env = dict(env or {})
        self.timeouts = {t.name: ready_timeout(t) for t in types} | dict(timeouts or {})
        self.actors: dict[str, Any] = {}  # by replica name, while it runs
        self._remote: Any = None  # the actor class, made once Ray is imported

    def _ray(self) -> Any:
        """Ray, connected: to the cluster this process joined, else as ``ray.init()`` does
        (that blocks for seconds: ``hetero serve`` had better connect before it serves)."""
        from hetero.runtime.ray_cluster import import_ray

        ray = import_ray()
        if not ray.is_initialized():
            ray.init(logging_level="WARNING")
        if self._remote is None:
            self._remote = ray.remote(_ReplicaActor)
        return ray

    async def _attempt(self, type_name: str) -> ReplicaHandle:
        ray = self._ray()
        actor = self._remote.options(**self.placements[type_name].options()).remote()
        timeout = self.timeouts[type_name]
        started = time.monotonic()
        launched = False
        try:
            launch = actor.launch.remote(self.commands[type_name], self.host, self.env)
            try:
                # Bounded: an actor asking for what no node has is never placed.
                url, pid, node = await asyncio.wait_for(launch, timeout)
            except asyncio.TimeoutError:
                raise _AttemptFailed(
                    f"its actor was not placed within {timeout:g} s: does a node have "
                    f"{self.placements[type_name].options()} free?"
                ) from None
            except ray.exceptions.RayError as exc:
                raise _AttemptFailed(f"its actor failed: {exc}") from exc
            launched = True

            async def why_exited() -> str | None:
                gone: str | None = await actor.why_exited.remote()
                return gone

            try:
                await _wait_ready(url, timeout - (time.monotonic() - started), why_exited)
            except _AttemptFailed as exc:
                hung = await actor.why_exited.remote() is None
                output: str = await actor.output.remote() if hung else ""
                raise _with_output(exc, output) from None
        except BaseException:  # failed or cancelled: what was started ends too
            await self._end(ray, actor, launched)
            raise
        name = self._new_name(type_name)
        self.actors[name] = actor
        log.info("ray: %s is warm at %s (pid %d on %s)", name, url, pid, node)
        return ReplicaHandle(name, type_name, url, self.name, pid=pid, node=node)

    async def _end(self, ray: Any, actor: Any, launched: bool = True) -> None:
        """Stop the actor's process (with its grace: killing the actor alone would end only
        the process's leader, at once), then the actor. An actor that never launched one
        (never placed) is only killed: a call to it would wait for its placement."""
        if launched:
            try:
                await asyncio.wait_for(actor.stop.remote(self.grace), self.grace + 30)
            except (ray.exceptions.RayError, asyncio.TimeoutError) as exc:
                log.warning("ray: stopping a replica's process failed: %r", exc)
        ray.kill(actor)

    async def stop(self, handle: ReplicaHandle) -> None:
        actor = self.actors.pop(handle.name, None)
        if actor is not None:
            await self._end(self._ray(), actor)

    async def close(self) -> None:
        """Stop every replica this provider still runs."""
        actors = list(self.actors.values())
        self.actors.clear()
        if actors:
            ray = self._ray()
            await asyncio.gather(*(self._end(ray, a) for a in actors))
