"""A worker's process tree: the processes its tasks started, their memory, ending them together,
and the kernel's promise that a worker dies with its driver.

A task may start processes of its own (``subprocess``, ``multiprocessing``); they count against
its device's memory limit and end with its worker. On Linux the tree is read from
``/proc/<pid>/task/<tid>/children`` (a fraction of a millisecond for a small tree); elsewhere
psutil finds it by scanning every process. A process that detaches from the tree (a daemon's
double fork) is kept in it by ``adopt_orphans`` on Linux, and found in its worker's session
unless it started a session of its own (``setsid``); only a cgroup (``cgroups.py``) holds that
one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

__all__ = [
    "adopt_orphans",
    "descendants",
    "die_with_parent",
    "kill_session",
    "kill_tree",
    "left_by_dead_process",
    "session",
    "tree_rss",
]

# From <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_OWNER = re.compile(r"^hetero-(\d+)-")


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, theirs, and so on (parents before their children)."""
    if not _proc_lists_children():
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    found: list[int] = []
    seen = {pid}
    todo = [pid]
    while todo:
        for child in _children(todo.pop()):
            if child not in seen:  # a pid reused while the tree is read
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def _children(pid: int) -> list[int]:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone
        return []
    found: list[int] = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as file:
                found += map(int, file.read().split())
        except OSError:  # the thread or the process ended meanwhile
            continue
    return found


@functools.cache
def _proc_lists_children() -> bool:
    pid = os.getpid()
    return os.path.exists(f"/proc/{pid}/task/{pid}/children")


def session(sid: int) -> list[int]:
    """The pids of the processes of session ``sid`` (its leader ``sid`` among them while it runs):
    those that left their parent's tree without calling ``setsid`` are still there."""
    import psutil

    found: list[int] = []
    for pid in psutil.pids():
        with contextlib.suppress(OSError):  # ended meanwhile, or not ours to ask about
            if os.getsid(pid) == sid:
                found.append(pid)
    return found


def tree_rss(proc: psutil.Process) -> int:
    """Bytes resident in ``proc`` and every process under it (a page shared between two of them,
    as after a fork, counts in each: the sum is an upper bound)."""
    import psutil

    total = proc.memory_info().rss
    for pid in descendants(proc.pid):
        with contextlib.suppress(psutil.Error):  # ended meanwhile, or not ours to read
            total += psutil.Process(pid).memory_info().rss
    return total


def kill_tree(pid: int, *, root: bool = True) -> None:
    """SIGKILL every process under ``pid`` and every process of the session it leads (a worker
    leads one), and ``pid`` itself unless ``root`` is false. Both are read first and the root
    killed first, so that it starts nothing more."""
    victims = descendants(pid)
    seen = {pid, *victims}
    victims += [p for p in session(pid) if p not in seen]
    if root:
        victims.insert(0, pid)
    _kill(victims)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``: what is left of a worker's tasks once the worker
    itself has ended (and been waited for, so its tree can no longer be read)."""
    _kill(session(sid))


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` ends, however it ends (SIGKILL
    included) and whatever this process is doing (C code holding the GIL included). Linux only
    (``PR_SET_PDEATHSIG``); elsewhere a no-op.

    The signal comes when the *thread* that started this process exits, so ``parent`` must start
    it from a thread that lives as long as it needs the process. Exits at once if ``parent`` has
    already ended (this process was adopted before the request took effect)."""
    if sys.platform.startswith("linux"):
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, "PR_SET_PDEATHSIG")
    if os.getppid() != parent:
        os._exit(0)


def adopt_orphans() -> None:
    """Have the processes under this one that lose their parent (a daemon's double fork) handed
    to this process rather than to init, so that they stay in its tree: counted in its memory,
    killed with it. Linux only (``PR_SET_CHILD_SUBREAPER``); elsewhere a no-op.

    An adopted process that ends stays a zombie until this process ends: which of its children
    it did not start itself cannot be told, and reaping one a task started would take its exit
    status from the task's own ``wait``."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):  # a kernel before 3.4: orphans go to init, as before
            _prctl(_PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")


def _prctl(option: int, value: int, name: str) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({name}) failed")


def left_by_dead_process(name: str) -> bool:
    """Whether ``name`` is one a driver gives what must not outlive it (``hetero-<its pid>-…``:
    shared-memory segments, its workers' cgroups) and that driver is no longer running."""
    import psutil

    match = _OWNER.match(name)
    return match is not None and not psutil.pid_exists(int(match.group(1)))
