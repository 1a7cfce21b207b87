"""The autoscaler's loop: traffic in, the policy's actions carried out on the router.

Every ``interval`` the controller reads the traffic (an injected callable), hands it and the
fleet it manages to the ``ScalePolicy``, and carries out what comes back through the router's
own membership operations and a ``Provider``; it balances nothing itself.

- *start*: ``provider.start`` in a background task; once the replica is warm, ``router.add``,
  then the ``added`` hook (``hetero serve`` probes it and starts reading its load, as for a
  replica added through the admin API).
- *drain*: ``router.drain`` (the router sends it nothing new; what it queued moves elsewhere),
  a wait until the router has no request of it in flight, then ``router.remove`` and
  ``provider.stop``. No request is cut: a replica leaves only once its last answer is read.

With ``dry_run`` it decides and records, and changes nothing. ``status()`` is what ``/status``
shows of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hetero.errors import ConfigError, HeteroError
from hetero.serve.autoscale.policy import Action, Member, ScalePolicy, Traffic, TypeFleet
from hetero.serve.autoscale.providers import Provider, ReplicaHandle
from hetero.serve.records import ReplicaState
from hetero.serve.replicas import Replica
from hetero.serve.router import Router

__all__ = ["AutoscaleController", "ControllerOptions", "url_only"]

log = logging.getLogger("hetero.serve.autoscale")

#: Decisions ``status()`` lists, newest last (the policy keeps more).
_SHOWN_DECISIONS = 20


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """``interval``: seconds between decisions; ``drain_poll``: between looks at a draining
    replica's requests; ``drain_timeout``: how long a drain waits for them before the replica
    is removed anyway (the router then retries them elsewhere, or ends them)."""

    interval: float = 5.0
    dry_run: bool = False
    drain_poll: float = 0.1
    drain_timeout: float = 900.0

    def __post_init__(self) -> None:
        problems = [
            (name, f"must be seconds > 0, got {value!r}")
            for name in ("interval", "drain_poll", "drain_timeout")
            if not 0 < (value := getattr(self, name)) < math.inf
        ]
        if problems:
            raise ConfigError(problems)


def url_only(handle: ReplicaHandle) -> Replica:
    """A started replica as the router first knows it: its name and URL; the rest (models,
    speed, capacity) is learned from it."""
    return Replica(handle.name, handle.url, None, None, set(), False)


@dataclass(slots=True, eq=False)
class _Managed:
    """A replica the controller started (or adopted): ``key`` is its name in the router once
    it has one, a placeholder while it starts."""

    key: str
    type_name: str
    state: Literal["starting", "warm", "draining"]
    since: float
    handle: ReplicaHandle | None = None


class AutoscaleController:
    """Drives ``policy`` for ``router`` through ``provider`` (see the module's docstring).

    ``traffic`` is called once per tick; ``added`` is awaited with each replica's router state
    once it has joined; ``describe`` makes the router's ``Replica`` of a started one
    (default ``url_only``); ``clock`` is the policy's time (monotonic seconds)."""

    def __init__(
        self,
        router: Router,
        policy: ScalePolicy,
        provider: Provider,
        traffic: Callable[[], Traffic],
        *,
        options: ControllerOptions | None = None,
        added: Callable[[ReplicaState], Awaitable[None]] | None = None,
        describe: Callable[[ReplicaHandle], Replica] = url_only,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.router = router
        self.policy = policy
        self.provider = provider
        self.options = options or ControllerOptions()
        self._traffic = traffic
        self._added = added
        self._describe = describe
        self.clock = clock
        self.managed: dict[str, _Managed] = {}
        self.last_traffic: Traffic | None = None
        self.last_error = ""  # why the last tick decided nothing (a failing sizer, say)
        self.failures: deque[dict[str, Any]] = deque(maxlen=50)
        self._placeholders = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ life

    def adopt(self, handle: ReplicaHandle) -> None:
        """Manage a replica the router already has, started through the provider before the
        router existed (it needs one to be built): it counts as warm, and may be drained."""
        if handle.type_name not in self.policy.types:
            raise ConfigError([("type", f"unknown replica type {handle.type_name!r}")])
        self.router.state_of(handle.name)  # a ConfigError if the router does not have it
        self.managed[handle.name] = _Managed(
            handle.name, handle.type_name, "warm", self.clock(), handle
        )

    def start(self) -> None:
        """Run the loop in the background until ``close``."""
        if self._loop is None:
            self._loop = asyncio.create_task(self.run(), name="autoscale")

    async def run(self) -> None:
        while True:
            await self.tick()
            await asyncio.sleep(self.options.interval)

    async def close(self, stop_replicas: bool = True) -> None:
        """End the loop and what it has under way (starts are cancelled: their processes
        end); with ``stop_replicas``, stop every replica it manages too (the router is
        shutting down: nothing is drained)."""
        tasks = [t for t in (self._loop, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._loop = None
        if stop_replicas:
            handles = [m.handle for m in self.managed.values() if m.handle is not None]
            self.managed.clear()
            await asyncio.gather(*(self._stop(h) for h in handles))

    # ------------------------------------------------------------------ one tick

    async def tick(self) -> list[Action]:
        """Decide once and set the actions going; returns them."""
        now = self.clock()
        try:
            observed = self._traffic()
            self.last_traffic = observed
            actions = self.policy.decide(now, observed, self.fleet())
        except Exception as exc:  # the loop outlives a failing sizer or traffic reader
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("autoscale: no decision this tick")
            return []
        self.last_error = ""
        for action in actions:
            what = f"{action.count}" if action.kind == "start" else action.replica
            dry = " (dry run: not done)" if self.options.dry_run else ""
            log.info(
                "autoscale: %s %s %s%s: %s", action.kind, action.type_name, what, dry, action.reason
            )
            if not self.options.dry_run:
                self._carry_out(action)
        return actions

    def fleet(self) -> dict[str, TypeFleet]:
        """The managed replicas by type and state, as the policy reads them."""
        groups: dict[str, dict[str, list[Member]]] = {
            name: {"starting": [], "warm": [], "draining": []} for name in self.policy.types
        }
        for m in self.managed.values():
            load = self._in_flight(m.key) if m.state == "warm" else 0
            groups[m.type_name][m.state].append(Member(m.key, m.since, load))
        return {
            name: TypeFleet(tuple(g["starting"]), tuple(g["warm"]), tuple(g["draining"]))
            for name, g in groups.items()
        }

    def _in_flight(self, name: str) -> int:
        """Requests the router has on replica ``name``, running or queued there."""
        state = self.router.by_name.get(name)
        if state is None or state.removed:
            return 0
        return int(self.router.dispatcher.view.in_flight[state.index])

    def _carry_out(self, action: Action) -> None:
        if action.kind == "start":
            for _ in range(action.count):
                key = f"{action.type_name}#{next(self._placeholders)}"
                member = _Managed(key, action.type_name, "starting", self.clock())
                self.managed[key] = member
                self._spawn(self._start(member))
        else:
            member = self.managed[action.replica]
            member.state, member.since = "draining", self.clock()
            try:
                self.router.drain(member.key)  # at once: nothing new reaches it from now on
            except ConfigError:  # removed meanwhile (through the admin API): only stop it
                self._spawn(self._leave(member, drained=False))
            else:
                self._spawn(self._leave(member, drained=True))

    def _spawn(self, work: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ actions

    async def _start(self, member: _Managed) -> None:
        try:
            handle = await self.provider.start(member.type_name)
        except HeteroError as exc:
            del self.managed[member.key]
            self._failed(member.type_name, "start", str(exc))
            return
        except BaseException:
            del self.managed[member.key]
            raise
        del self.managed[member.key]
        member.key, member.handle = handle.name, handle
        self.managed[handle.name] = member  # still starting until the router has it
        try:
            state = self.router.add(self._describe(handle))
        except ConfigError as exc:  # its name is taken (a replica from the command line?)
            del self.managed[handle.name]
            await self._stop(handle)
            self._failed(member.type_name, "add", str(exc))
            return
        if self._added is not None:
            try:
                await self._added(state)
            except Exception:  # it is in the router, whose health checks judge it from now
                log.exception("autoscale: after %s joined", handle.name)
        member.state, member.since = "warm", self.clock()
        log.info("autoscale: %s joined at %s", handle.name, handle.url)

    async def _leave(self, member: _Managed, drained: bool) -> None:
        """Wait until the draining replica has no request left (or ``drain_timeout`` is
        over), then remove it from the router and stop it."""
        name = member.key
        if drained:
            deadline = self.clock() + self.options.drain_timeout
            while self._in_flight(name) and self.clock() < deadline:
                await asyncio.sleep(self.options.drain_poll)
            left = self._in_flight(name)
            if left:
                log.warning(
                    "autoscale: %s still has %d requests after %g s of draining: removed anyway",
                    name,
                    left,
                    self.options.drain_timeout,
                )
            with contextlib.suppress(ConfigError):  # removed meanwhile
                self.router.remove(name)
        del self.managed[name]
        if member.handle is not None:
            await self._stop(member.handle)
        log.info("autoscale: %s drained and stopped", name)

    async def _stop(self, handle: ReplicaHandle) -> None:
        try:
            await self.provider.stop(handle)
        except HeteroError as exc:
            self._failed(handle.type_name, "stop", f"{handle.name}: {exc}")

    def _failed(self, type_name: str, what: str, reason: str) -> None:
        log.error("autoscale: %s of a %s replica failed: %s", what, type_name, reason)
        self.failures.append(
            {"type": type_name, "action": what, "at": round(time.time(), 3), "reason": reason}
        )

    # ------------------------------------------------------------------ reporting

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows: per type its replicas by state and the policy's view, the
        last decisions with their reasons, the last traffic seen and the last failures."""
        now = self.clock()
        policy = self.policy.status(now)
        types: dict[str, Any] = {}
        for name, group in self.fleet().items():
            types[name] = {
                "warm": len(group.warm),
                "starting": len(group.starting),
                "draining": len(group.draining),
                "replicas": {m.key: m.state for m in self.managed.values() if m.type_name == name},
                **policy[name],
            }
        decisions = list(self.policy.log)[-_SHOWN_DECISIONS:]
        return {
            "dry_run": self.options.dry_run,
            "interval_s": self.options.interval,
            "provider": self.provider.name,
            "types": types,
            "decisions": [d.as_dict(now) for d in decisions],
            "traffic": None if self.last_traffic is None else _traffic(self.last_traffic),
            "last_error": self.last_error or None,
            "failures": list(self.failures),
        }


def _traffic(seen: Traffic) -> dict[str, Any]:
    """The traffic without its samples (they are many, and the means say enough) and without
    ``settled``, which the policy works out from the fleet when it decides (not observed)."""
    out = asdict(seen)
    for key in ("prompt_samples", "output_samples", "settled"):
        out.pop(key)
    return out
