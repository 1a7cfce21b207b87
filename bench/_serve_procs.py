"""The processes bench_serve.py and bench_serve_real.py start: a fleet of mock replicas (one
process for all of them), ``hetero serve``, sglang-router, vllm-router and the load generator,
each stopped for sure at the end.

Every child runs in a session of its own, so stopping it stops what it started too; a child that
is not Python of ours is also asked by the kernel to die with this process (``PR_SET_PDEATHSIG``),
and the mock process exits when its stdin closes, so a benchmark killed with SIGKILL leaves
nothing behind. Output goes to log files, never to pipes nobody reads (a full pipe would stall
a router mid-run).

Run as a script, this module is the mock fleet process:

    python bench/_serve_procs.py mocks '[{"speed": 1.0, "slots": 4}, ...]'

It prints ``mock N listening on URL`` per replica, then ``ready``, and serves until SIGTERM or
until its stdin closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

# sglang-router cannot take port 0: it gets a port nobody listens on now (another program may
# take it before the child binds it; on this machine none does).
from hetero.commands.launch import free_port

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
URL = re.compile(r"listening on (http://[^\s(]+)")


class StartError(RuntimeError):
    """A child did not come up; the message carries the tail of its logs."""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec. The parent has no threads (PDEATHSIG fires when
    # the forking *thread* ends), so this fires only when the benchmark itself is gone.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def tree_cpu_seconds(pid: int) -> float | None:
    """User + system CPU of process ``pid`` and its living descendants; None if it is gone."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0.0
    for p in tree:
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile
            t = p.cpu_times()
            total += t.user + t.system
    return total


@dataclass
class Child:
    """One started process: its logs, what it printed, how much CPU its tree used."""

    name: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    command: list[str]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") if self.stdout.exists() else ""

    def tail(self, chars: int = 2000) -> str:
        logs = [f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in self._logs()]
        return "\n".join(logs)

    def _logs(self) -> list[Path]:
        return [p for p in (self.stdout, self.stderr) if p.exists() and p.stat().st_size]

    def wait_for_line(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        """The first match of ``pattern`` in what the child printed, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(self.output())
            if found:
                return found
            if self.proc.poll() is not None:
                raise StartError(
                    f"{self.name} exited ({self.proc.returncode}) before it was ready:\n"
                    + self.tail()
                )
            if time.monotonic() > deadline:
                raise StartError(f"{self.name} not ready after {timeout:g} s:\n" + self.tail())
            time.sleep(0.05)

    def cpu_seconds(self) -> float:
        """User + system CPU of the process and its living descendants."""
        return tree_cpu_seconds(self.pid) or 0.0

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM to the child's whole session, SIGKILL to what is left after ``timeout``."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
            try:
                self.proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # anything the child left in its session


class Children:
    """Starts processes and stops every one of them on ``close`` (also on errors and Ctrl-C:
    use it as a context manager). Logs live in a temporary folder, kept with ``keep_logs``."""

    def __init__(self, keep_logs: bool = False) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="hetero-bench-serve-"))
        self._keep = keep_logs
        self._children: list[Child] = []
        self._count = 0

    @property
    def log_dir(self) -> Path:
        return self._dir

    def start(
        self,
        name: str,
        command: Sequence[str],
        *,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        die_with_parent: bool = True,
    ) -> Child:
        self._count += 1
        stem = f"{self._count:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}"
        out, err = self._dir / f"{stem}.out", self._dir / f"{stem}.err"
        with out.open("wb") as fout, err.open("wb") as ferr:
            proc = subprocess.Popen(
                list(command),
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=fout,
                stderr=ferr,
                cwd=ROOT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
                preexec_fn=_die_with_parent if die_with_parent else None,
            )
        child = Child(name, proc, out, err, list(command))
        self._children.append(child)
        return child

    def stop(self, child: Child) -> None:
        child.stop()
        if child in self._children:
            self._children.remove(child)

    def close(self) -> None:
        while self._children:
            self._children.pop().stop()
        if not self._keep:
            for p in self._dir.iterdir():
                p.unlink()
            self._dir.rmdir()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------ the three kinds


def start_mocks(children: Children, configs: Sequence[dict[str, Any]]) -> tuple[Child, list[str]]:
    """One process serving a mock replica per config (``MockConfig`` fields); their URLs."""
    child = children.start(
        "mocks", [sys.executable, str(HERE), "mocks", json.dumps(list(configs))], stdin=True
    )
    child.wait_for_line(re.compile(r"^ready$", re.M), 60)
    urls = URL.findall(child.output())
    if len(urls) != len(configs):
        raise StartError(f"expected {len(configs)} mock URLs, got {urls}:\n{child.tail()}")
    return child, urls


def hetero_serve_available() -> str | None:
    """None when ``hetero serve`` can be run here, else why not."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "hetero", "serve", "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`hetero serve --help` failed: {exc}"
    if done.returncode != 0:
        # typer's error box: keep the lines with words, not its border
        words = [ln.strip("│╭╮╰╯─ ") for ln in (done.stderr or done.stdout).splitlines()]
        said = " ".join(w for w in words if w)
        return f"`hetero serve --help` exited {done.returncode}: {said[-300:]}"
    return None


def hetero_serve_command(
    replicas: Sequence[str], strategy: str | None, flags: Sequence[str] = ()
) -> list[str]:
    """``replicas``: ``URL=speed:S,slots=N`` declarations; ``flags``: more of hetero serve's."""
    command = [sys.executable, "-m", "hetero", "serve", "--host", "127.0.0.1", "--port", "0"]
    for r in replicas:
        command += ["--replica", r]
    if strategy is not None:
        command += ["--strategy", strategy]
    return command + list(flags)


def start_hetero_serve(
    children: Children,
    replicas: Sequence[str],
    strategy: str | None,
    flags: Sequence[str] = (),
    tree: str | None = None,
) -> tuple[Child, str]:
    """``tree``: another checkout whose ``src`` the router runs from (its C kernel built)."""
    name = re.sub(r"[^A-Za-z0-9.]+", "_", " ".join([f"hetero-serve-{strategy}", *flags]))
    env = {"PYTHONPATH": str(Path(tree) / "src")} if tree else None
    child = children.start(name, hetero_serve_command(replicas, strategy, flags), env=env)
    found = child.wait_for_line(re.compile(r"hetero serve " + URL.pattern), 60)
    return child, found.group(1)


def sglang_router_version() -> tuple[str | None, str | None]:
    """``(version, None)``, or ``(None, why not)`` when sglang-router is not installed."""
    return _router_version("sglang-router", ("sglang_router.launch_router",))


def _router_version(dist: str, modules: Sequence[str]) -> tuple[str | None, str | None]:
    from importlib import metadata

    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None, f"{dist} is not installed (pip install {dist})"
    try:
        for module in modules:
            importlib.import_module(module)
    except Exception as exc:  # a broken install: its Rust extension missing, say
        return None, f"import {module} failed: {type(exc).__name__}: {exc}"
    return version, None


def sglang_router_command(
    urls: Sequence[str], policy: str, port: int | str, metrics: int | str
) -> list[str]:
    return _router_command("sglang_router.launch_router", "warn", urls, policy, port, metrics)


def _router_command(
    module: str,
    log_level: str,
    urls: Sequence[str],
    policy: str,
    port: int | str,
    metrics: int | str,
) -> list[str]:
    """sglang-router's command line, which its fork vllm-router shares."""
    return [
        sys.executable,
        "-m",
        module,
        "--worker-urls",
        *urls,
        "--policy",
        policy,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(metrics),  # its default, 29000, would clash between runs
        "--log-level",
        log_level,
        "--worker-startup-check-interval",
        "1",  # default 30 s between checks of a worker that is not up yet
    ]


def start_sglang_router(children: Children, urls: Sequence[str], policy: str) -> tuple[Child, str]:
    return _start_rust_router(children, "sglang-router", sglang_router_command, urls, policy)


def _start_rust_router(
    children: Children,
    name: str,
    command: Callable[[Sequence[str], str, int | str, int | str], list[str]],
    urls: Sequence[str],
    policy: str,
) -> tuple[Child, str]:
    """sglang-router or vllm-router (its fork), started and waited for: their /health answers
    before the workers are registered; /readiness counts the healthy ones."""
    port = free_port()
    child = children.start(f"{name}-{policy}", command(urls, policy, port, free_port()))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if child.proc.poll() is not None:
            raise StartError(f"{name} exited ({child.proc.returncode}):\n{child.tail()}")
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(url + "/readiness", timeout=2) as resp,
        ):
            if json.loads(resp.read()).get("healthy_workers") == len(urls):
                return child, url
        if time.monotonic() > deadline:
            raise StartError(f"{name} not ready after 60 s:\n{child.tail()}")
        time.sleep(0.1)


def vllm_router_version() -> tuple[str | None, str | None]:
    """``(version, None)``, or ``(None, why not)`` when vllm-router (PyPI ``vllm-router``, the
    Rust router of the vLLM project) is not installed. Its Rust module is imported too: without
    it vllm-router falls back to a debugging balancer."""
    return _router_version("vllm-router", ("vllm_router.launch_router", "vllm_router.router"))


def vllm_router_command(
    urls: Sequence[str], policy: str, port: int | str, metrics: int | str
) -> list[str]:
    # Its console script ``vllm-router`` runs this module's main().
    return _router_command("vllm_router.launch_router", "warning", urls, policy, port, metrics)


def start_vllm_router(children: Children, urls: Sequence[str], policy: str) -> tuple[Child, str]:
    return _start_rust_router(children, "vllm-router", vllm_router_command, urls, policy)


def warm_up(url: str, body: bytes, n: int, path: str = "/v1/chat/completions") -> None:
    """``n`` requests one after the other; raises on the first that fails, so a configuration
    that cannot serve at all is reported as such, not measured as a wall of errors."""
    for _ in range(n):
        request = urllib.request.Request(
            url + path, data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise StartError(f"warm-up request to {url} failed: {exc.code} {detail}") from exc


# ------------------------------------------------------------------------ mock fleet process


async def _serve_mocks(configs: list[dict[str, Any]], out: TextIO) -> None:
    from hetero.serve.emulator.server import MockConfig, MockReplica

    replicas = []
    for k, fields in enumerate(configs):
        if "models" in fields:
            fields = {**fields, "models": tuple(fields["models"])}
        replica = MockReplica(MockConfig(**fields), host="127.0.0.1", port=0)
        replicas.append(replica)
        url = await replica.start()
        print(f"mock {k} listening on {url}", file=out, flush=True)
    print("ready", file=out, flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)

    def on_stdin() -> None:  # EOF: the benchmark is gone
        if not os.read(sys.stdin.fileno(), 4096):
            loop.remove_reader(sys.stdin.fileno())
            done.set()

    loop.add_reader(sys.stdin.fileno(), on_stdin)
    try:
        await done.wait()
    finally:
        for replica in replicas:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(replica.stop(), 5)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "mocks":
        print(__doc__, file=sys.stderr)
        return 2
    with contextlib.suppress(BrokenPipeError):  # its reader gone: nothing left to tell
        asyncio.run(_serve_mocks(json.loads(argv[1]), sys.stdout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
