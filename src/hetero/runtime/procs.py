"""A worker's process tree: the processes its tasks started, their memory, ending them together,
and the kernel's promise that a worker dies with its driver.

A task may start processes of its own (``subprocess``, ``multiprocessing``); they count against
its device's memory limit and end with its worker. On Linux the tree is read from
``/proc/<pid>/task/<tid>/children`` (a fraction of a millisecond for a small tree); elsewhere
psutil finds it by scanning every process.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import psutil

__all__ = ["descendants", "die_with_parent", "kill_tree", "tree_rss"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


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
    """SIGKILL every process under ``pid``, and ``pid`` itself unless ``root`` is false. The tree
    is read first and the root killed first, so that it starts nothing more."""
    victims = descendants(pid)
    if root:
        victims.insert(0, pid)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when ``parent`` ends, however it ends (SIGKILL
    included) and whatever this process is doing (C code holding the GIL included). Linux only
    (``PR_SET_PDEATHSIG``); elsewhere a no-op.

    The signal comes when the *thread* that started this process exits, so ``parent`` must start
    it from a thread that lives as long as it needs the process. Exits at once if ``parent`` has
    already ended (this process was adopted before the request took effect)."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(0)
