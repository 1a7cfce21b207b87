"""How a running Context is seen from another process (``hetero top``): a JSON status file.

Each process running a Context writes ``<pid>.json`` into the status directory, replacing it
whole on every update, and removes it on exit. Readers drop the files of processes that are gone.

The directory is private: made with mode 0700, and used only when it belongs to this user and no
one else may write to it. ``/tmp/hetero-<uid>`` is a name any local user can take first, and the
owner of the directory decides what ``hetero top`` shows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, cast

import psutil

from hetero.errors import HeteroError

__all__ = [
    "DeviceStatus",
    "StatusSnapshot",
    "StatusWriter",
    "TaskCounts",
    "check_private_dir",
    "own_time_speeds",
    "read_statuses",
    "status_dir",
]

log = logging.getLogger("hetero.runtime")

# A file is stale when its pid now belongs to a process started after the file's last update;
# the slack absorbs the rounding of process start times.
_PID_REUSE_SLACK_S = 1.0


class TaskCounts(TypedDict):
    """Tasks of a Context by state; ``waiting`` counts those not yet on a device."""

    submitted: int
    done: int
    failed: int
    running: int
    waiting: int


class DeviceStatus(TypedDict):
    """One device of a running Context. Speeds are in work units per second of the device's
    own time (``own_time_speeds``): an emulated device's without the Context's ``time_scale``,
    so that learned and prior speeds compare, whatever the scale."""

    id: str
    model: str
    kind: str
    emulated: bool
    healthy: bool
    speed: float | None  # learned from completed tasks; None before the first
    prior_speed: float  # from the catalog or the config, before any task ran
    running: int
    queued: int
    done: int
    failed: int
    utilization: float | None  # percent
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes
    temperature: float | None  # °C


class StatusSnapshot(TypedDict):
    """What a Context publishes: ``started`` and ``updated`` are unix times, ``config`` the
    absolute path of its fleet config (``None`` when built without a file)."""

    pid: int
    started: float
    updated: float
    config: str | None
    tasks: TaskCounts
    devices: list[DeviceStatus]


_KEYS = StatusSnapshot.__required_keys__


def own_time_speeds(
    learned: float | None,
    prior: float,
    *,
    emulated: bool,
    time_scale: float,
    unit_rate: float,
) -> tuple[float | None, float]:
    """A device's learned and prior speeds in work units per second of its own time.

    The engine measures speeds by the wall clock, and an emulated device runs ``1 /
    time_scale`` times faster than the device it stands for, so its learned speed is
    multiplied by ``time_scale`` (a real device's is its own). Priors come from the
    ``PerfModel`` in its ``unit_rate`` (work units per second of a speed-1.0 device: ``1 /
    time_scale`` on an all-emulated fleet, else 1), so each is divided by it. A V100 (speed 1)
    then shows about 1.0 for both at any ``time_scale``, where it showed 10 learned beside a
    prior of 1 at ``time_scale=0.1`` on a fleet with a real device.
    """
    if not (time_scale > 0 and unit_rate > 0):
        raise ValueError(f"time_scale and unit_rate must be > 0, got {time_scale}, {unit_rate}")
    own = learned * time_scale if learned is not None and emulated else learned
    return own, prior / unit_rate


def status_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$HETERO_STATUS_DIR``, else ``$XDG_RUNTIME_DIR/hetero``, else ``/tmp/hetero-<uid>``."""
    env = os.environ if environ is None else environ
    if env.get("HETERO_STATUS_DIR"):
        return Path(env["HETERO_STATUS_DIR"])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "hetero"
    return Path("/tmp") / f"hetero-{os.getuid()}"


def check_private_dir(path: Path) -> bool:
    """Whether ``path`` exists; ``HeteroError`` (naming the path, its owner or mode, and what is
    expected) unless it is a directory that this user owns and that no one else may write to,
    reached through no one else's symbolic link."""
    try:
        link = path.lstat()
        found = path.stat() if stat.S_ISLNK(link.st_mode) else link
    except FileNotFoundError:
        return False
    mode = stat.S_IMODE(found.st_mode)
    me = os.getuid()
    if link.st_uid != me:
        what = "is a symbolic link" if link is not found else "is"
        problem = f"{what} owned by {_user(link.st_uid)}"
    elif not stat.S_ISDIR(found.st_mode):
        problem = "is not a directory"
    elif found.st_uid != me:
        problem = f"is owned by {_user(found.st_uid)}"
    elif mode & 0o022:
        problem = f"has mode {mode:o}, which lets other users write to it"
    else:
        return True
    raise HeteroError(
        f"status directory {path} {problem}; expected a directory owned by {_user(me)} with "
        "mode 0700 (its owner decides what `hetero top` shows). Remove it, or set "
        "HETERO_STATUS_DIR to a private directory"
    )


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:  # no such user in the password database
        return f"uid {uid}"


class StatusWriter:
    """Publishes one process's snapshots at ``path`` (default: ``<status dir>/<pid>.json``)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else status_dir() / f"{os.getpid()}.json"
        self._ready = False

    def prepare(self) -> None:
        """Make the directory (mode 0700) if need be and check that it is private to this user
        (``HeteroError`` if not); ``write`` does it on first use."""
        if self._ready:
            return
        # Private to this user: the snapshot names config paths and device load.
        with contextlib.suppress(FileExistsError):
            self.path.parent.mkdir(mode=0o700, parents=True)
        check_private_dir(self.path.parent)
        self._ready = True

    def write(self, snapshot: StatusSnapshot) -> None:
        """Replace the file with ``snapshot``; a reader sees the old file or the new, whole."""
        self.prepare()
        # The temporary name does not end in .json, so readers never pick it up.
        fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                json.dump(snapshot, file)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def close(self) -> None:
        """Remove the file: the Context is no longer running."""
        self.path.unlink(missing_ok=True)


def read_statuses(directory: str | Path | None = None) -> list[StatusSnapshot]:
    """The snapshots of the Contexts running now, oldest ``started`` first.

    Files of processes that have exited are deleted; unreadable or invalid ones are skipped. A
    directory that is not private to this user is not read (a warning says why).
    """
    folder = Path(directory) if directory is not None else status_dir()
    try:
        if not check_private_dir(folder):
            return []
    except HeteroError as exc:
        log.warning("%s; not reading it", exc)
        return []
    found: list[StatusSnapshot] = []
    for path in folder.glob("*.json"):
        if not path.stem.isdigit():
            continue
        pid = int(path.stem)
        if not _alive(pid):
            _remove(path)
            continue
        snapshot = _load(path)
        if snapshot is None:
            continue
        if _started_after(pid, snapshot["updated"]):  # the pid was reused
            _remove(path)
            continue
        found.append(snapshot)
    return sorted(found, key=lambda s: s["started"])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process exists
        return True


def _started_after(pid: int, when: float) -> bool:
    try:
        return psutil.Process(pid).create_time() > when + _PID_REUSE_SLACK_S
    except psutil.Error:
        return False


def _load(path: Path) -> StatusSnapshot | None:
    try:
        data: Any = json.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):  # gone meanwhile, or not JSON
        return None
    if not isinstance(data, dict) or not data.keys() >= _KEYS:
        return None
    if not all(isinstance(data[key], (int, float)) for key in ("pid", "started", "updated")):
        return None
    return cast(StatusSnapshot, data)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):  # not ours to delete: its owner's reader will
        path.unlink(missing_ok=True)
