"""The execution engine: ``Context`` runs tasks on worker processes (one per device), placed by
``hetero.sched``; ``Backend`` is the boundary a second backend (Ray) implements."""

from __future__ import annotations

from hetero.runtime.backend import Backend, BackendEvents
from hetero.runtime.context import Context, TaskFuture, get_memory_usage
from hetero.runtime.current import checkpoint, get_current_device, restore
from hetero.runtime.mapping import MapRun
from hetero.runtime.task import TaskFunction, TaskOptions, task

__all__ = [
    "Backend",
    "BackendEvents",
    "Context",
    "MapRun",
    "TaskFunction",
    "TaskFuture",
    "TaskOptions",
    "checkpoint",
    "get_current_device",
    "get_memory_usage",
    "restore",
    "task",
]
