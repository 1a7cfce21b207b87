"""The fence around the local backend's workers: nothing a task starts outlives its Context.

Each worker leads a session of its own, and is put in a cgroup of its own where one can be made
(``cgroups.py``); on Linux it also adopts the orphans among its descendants
(``procs.adopt_orphans``). A worker that ends takes its tree and its session with it
(``procs.kill_tree``), and ``Fence.release`` then kills what is left in its cgroup and session.
What that reaches:

- with a cgroup: every process a task started, however it detached (``setsid``, double fork);
- without one, on Linux: every process under the worker while it runs, orphans included (it
  adopts them); once it has ended, those of its session. A process that starts a session of its
  own and is orphaned only after its worker ended (or whose parent escaped that way) is out of
  reach;
- elsewhere: the worker's tree and its session, not its orphans that started a session.

A driver killed with SIGKILL cannot release anything: the kernel kills its workers
(``PR_SET_PDEATHSIG``), and a sentinel process that the fence starts with the first worker,
told every worker's pid and cgroup over a pipe, sees the pipe close and kills what is left in
their cgroups and sessions.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from hetero.runtime.cgroups import Cgroup, remove_stale, writable_root
from hetero.runtime.procs import kill_session

__all__ = ["Fence", "Fenced", "sentinel"]

log = logging.getLogger("hetero.runtime")

_SENTINEL_MAIN = "from hetero.runtime.fence import sentinel; sentinel()"


@dataclass(eq=False)
class Fenced:
    """One worker inside the fence: its pid (its session's id) and its cgroup, if it has one."""

    pid: int
    cgroup: Cgroup | None
    released: bool = False


class Fence:
    """The workers of one backend, whose names start with ``prefix`` (``hetero-<driver pid>-``:
    the cgroups of a driver that is gone are found by it). ``cgroups``: make them under the
    hierarchy found writable (``True``), under that directory, or not at all (``False``)."""

    def __init__(self, prefix: str, cgroups: bool | Path = True) -> None:
        self.prefix = prefix
        if isinstance(cgroups, Path):
            self.root: Path | None = cgroups
        else:
            self.root = writable_root() if cgroups else None
        if self.root is not None:
            remove_stale(self.root)  # left by drivers killed with their sentinel
        self._lock = threading.Lock()
        self._sentinel: subprocess.Popen[bytes] | None = None
        self._closed = False

    def enclose(self, pid: int, name: str) -> Fenced:
        """Put the just-started worker ``pid`` in a cgroup ``<prefix>-<name>`` (where cgroups
        are made), before it starts anything, and tell the sentinel."""
        cgroup = None if self.root is None else Cgroup.make(self.root, f"{self.prefix}-{name}", pid)
        fenced = Fenced(pid, cgroup)
        path = "" if cgroup is None else str(cgroup.path)
        self._tell(f"+{pid} {path}\n", start=True)
        return fenced

    def release(self, fenced: Fenced) -> None:
        """Kill what is left of an ended worker, once it has been waited for: its cgroup and
        its session."""
        with self._lock:
            if fenced.released:
                return
            fenced.released = True
        _sweep(fenced.pid, fenced.cgroup)
        self._tell(f"-{fenced.pid}\n")

    def close(self, timeout: float = 5.0) -> None:
        """Stop the sentinel, after every worker was released (it then has nothing to do)."""
        with self._lock:
            sentinel, self._sentinel, self._closed = self._sentinel, None, True
        if sentinel is None:
            return
        assert sentinel.stdin is not None
        with contextlib.suppress(OSError):
            sentinel.stdin.close()  # it sweeps what is still listed (nothing), and ends
        try:
            sentinel.wait(timeout)
        except subprocess.TimeoutExpired:
            sentinel.kill()
            sentinel.wait()

    def _tell(self, line: str, start: bool = False) -> None:
        """Write ``line`` to the sentinel (started first if ``start``, once, before close)."""
        with self._lock:
            try:
                if self._sentinel is None and start and not self._closed:
                    self._sentinel = _start_sentinel()
                if self._sentinel is None:
                    return
                stdin = self._sentinel.stdin
                assert stdin is not None
                stdin.write(line.encode())
                stdin.flush()
            except OSError as exc:  # it could not start, or died: the fence holds while we run
                log.debug("the sentinel of %s cannot be told %r: %s", self.prefix, line, exc)


def _start_sentinel() -> subprocess.Popen[bytes]:
    # A session of its own: the terminal's Ctrl-C, which the driver handles, must not end it.
    return subprocess.Popen(
        [sys.executable, "-c", _SENTINEL_MAIN],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )


def _sweep(pid: int, cgroup: Cgroup | None) -> None:
    if cgroup is not None:
        cgroup.kill()
    kill_session(pid)


def sentinel() -> None:
    """The sentinel process: reads ``+PID CGROUP`` (a worker started; CGROUP may be empty) and
    ``-PID`` (it was released) from its stdin, and when its driver closes the pipe, however the
    driver ended, sweeps the workers still listed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    workers: dict[int, str] = {}
    for line in sys.stdin:
        pid, _, path = line[1:].strip().partition(" ")
        if line.startswith("+"):
            workers[int(pid)] = path
        else:
            workers.pop(int(pid), None)
    for pid, path in workers.items():
        _sweep(pid, Cgroup(Path(path)) if path else None)
