"""What a running task can ask about where it runs: its device, and its checkpoints.

Set by the worker around each task; read by ``hetero.get_current_device``,
``hetero.checkpoint`` and ``hetero.restore``.
"""

from __future__ import annotations

import os
import pickle
import re
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import cloudpickle

from hetero.devices.spec import Device
from hetero.errors import HeteroError

__all__ = ["checkpoint", "get_current_device", "restore"]

T = TypeVar("T")

_device: Device | None = None
_task: tuple[int, int, str | None] | None = None  # (task id, attempt, checkpoint directory)
_wrote = False
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def set_device(device: Device) -> None:
    global _device
    _device = device


def enter(device: Device, task_id: int, attempt: int, checkpoint_dir: str | None) -> None:
    global _device, _task
    _device = device
    _task = (task_id, attempt, checkpoint_dir)


def leave() -> bool:
    """End the task; whether it wrote a checkpoint."""
    global _task, _wrote
    wrote, _task, _wrote = _wrote, None, False
    return wrote


def get_current_device() -> Device:
    """The device the calling task runs on (``dev.type == "gpu"``, ``dev.emulated``, …).

    Raises ``HeteroError`` outside a task."""
    if _device is None:
        raise HeteroError(
            "get_current_device() is only available inside a task run by a hetero.Context"
        )
    return _device


def _path(name: str | None) -> Path:
    if _task is None:
        raise HeteroError("hetero.checkpoint/restore can only be called inside a running task")
    directory = _task[2]
    if directory is None:
        raise HeteroError(
            "no checkpoint store here: the Context was made with checkpoint_dir=False, or the "
            "task is batched (its calls are retried one by one, not as the batch)"
        )
    key = "state" if name is None else name
    if not isinstance(key, str) or not _NAME.match(key):
        raise HeteroError(
            f"checkpoint name {name!r} is invalid; allowed: 1-128 letters, digits, '_', '.', '-'"
        )
    return Path(directory) / f"{key}.pkl"


def checkpoint(state: Any, name: str | None = None) -> None:
    """Persist ``state`` for this task; a retry of the task gets it back from ``restore``.

    The write is atomic (a retry sees the previous checkpoint or this one, never half of one)."""
    global _wrote
    path = _path(name)
    _wrote = True
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            cloudpickle.dump(state, f, protocol=5)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def restore(default: T, name: str | None = None) -> T | Any:
    """The latest state this task saved with ``checkpoint`` (in an earlier attempt), or
    ``default`` when there is none."""
    path = _path(name)
    try:
        with path.open("rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return default
