"""Cgroups that hold a set of processes whatever they do: a process cannot leave its cgroup by
detaching from its parent (``setsid``, a daemon's double fork), so the processes of a worker's
cgroup are exactly the worker and what its tasks started, wherever they went in the process tree.

A cgroup is made where this process may make one: under its own cgroup in the v2 hierarchy, else
in v1's cpu controller (as root, or in a systemd scope delegated to the user). Elsewhere (no
cgroups, not Linux, no permission) ``writable_root`` is ``None`` and callers do without. On v1's
cpu controller, and on v2 where a controller is enabled for the subtree, the new cgroup is a
scheduling group of its own: its processes share one default weight of CPU.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from hetero.runtime.procs import left_by_dead_process

__all__ = ["Cgroup", "remove_stale", "writable_root"]

log = logging.getLogger("hetero.runtime")

#: Seconds ``Cgroup.kill`` keeps killing what is left (a process may fork while it is killed).
KILL_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Cgroup:
    """One cgroup directory."""

    path: Path

    @classmethod
    def make(cls, root: Path, name: str, pid: int) -> Cgroup | None:
        """A new cgroup ``name`` under ``root`` holding process ``pid`` (and what it starts from
        now on); ``None`` if it cannot be made, the reason logged."""
        path = root / name
        try:
            path.mkdir()
            (path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            log.debug("no cgroup for pid %d at %s: %s", pid, path, exc)
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def pids(self) -> list[int]:
        """The processes in it now (none once it is removed)."""
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self) -> bool:
        """SIGKILL every process in it until none is left, then remove it; whether it is gone
        (a process that outlasts ``KILL_TIMEOUT_S``, or the directory's removal failing, leaves
        it for ``remove_stale``)."""
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while pids := self.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)  # a killed process is listed until it has exited
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


@functools.cache
def writable_root() -> Path | None:
    """Where this process may make cgroups: the first of its own cgroups (v2, then v1's cpu
    controller) in which a test cgroup could be made and removed; ``None`` where none."""
    for root in _own_cgroups():
        probe = root / f"hetero-probe-{os.getpid()}"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError:
            continue
        return root
    return None


def _own_cgroups() -> list[Path]:
    """This process's cgroup directory in the v2 hierarchy and in v1's cpu controller, where
    they are mounted (``/proc/self/cgroup`` names the cgroups, ``/proc/self/mountinfo`` where
    their hierarchies are)."""
    try:
        cgroups = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:  # not Linux
        return []
    own: dict[str, str] = {}  # "v2" or "cpu" -> the cgroup's path in its hierarchy
    for line in cgroups:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and not controllers:
            own["v2"] = path
        elif "cpu" in controllers.split(","):
            own["cpu"] = path
    found: dict[str, Path] = {}
    for line in mounts:
        # id parent major:minor root mountpoint options [optional...] - fstype source superoptions
        left, _, right = line.partition(" - ")
        fields, (fstype, _, options) = left.split(), right.split()[:3]
        if fstype == "cgroup2":
            kind = "v2"
        elif fstype == "cgroup" and "cpu" in options.split(","):
            kind = "cpu"
        else:
            continue
        if kind in own and kind not in found:
            found[kind] = _inside(Path(fields[4]), fields[3], own[kind])
    return [found[k] for k in ("v2", "cpu") if k in found]


def _inside(mountpoint: Path, mount_root: str, path: str) -> Path:
    """The directory of cgroup ``path`` under a hierarchy mounted at ``mountpoint`` from its
    cgroup ``mount_root`` (a container sees its own cgroup as the root)."""
    relative = os.path.relpath(path, mount_root)
    return mountpoint if relative.startswith("..") else mountpoint / relative


def remove_stale(root: Path) -> int:
    """Kill what is left in the workers' cgroups of drivers that are no longer running (killed
    with whatever was to clean up after them) and remove those cgroups; how many were removed."""
    removed = 0
    for path in root.glob("hetero-*"):
        if path.is_dir() and left_by_dead_process(path.name):
            removed += Cgroup(path).kill()
    return removed
