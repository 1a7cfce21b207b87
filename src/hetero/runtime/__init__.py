"""The execution engine: ``Context`` runs tasks on worker processes (one per device), placed by
``hetero.sched``; ``Backend`` is the boundary a second backend (Ray) implements."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hetero._lazy import lazy_exports

if _TYPE_CHECKING:
    from hetero.runtime.backend import (
        Backend,
        BackendEvents,
    )
    from hetero.runtime.batching import (
        BatchOptions,
    )
    from hetero.runtime.context import (
        Context,
        get_memory_usage,
    )
    from hetero.runtime.current import (
        checkpoint,
        get_current_device,
        restore,
    )
    from hetero.runtime.futures import (
        TaskFuture,
    )
    from hetero.runtime.mapping import (
        MapRun,
    )
    from hetero.runtime.tasks import (
        TaskFunction,
        TaskOptions,
        task,
    )

_EXPORTS = {
    "Backend": "hetero.runtime.backend",
    "BackendEvents": "hetero.runtime.backend",
    "BatchOptions": "hetero.runtime.batching",
    "Context": "hetero.runtime.context",
    "get_memory_usage": "hetero.runtime.context",
    "checkpoint": "hetero.runtime.current",
    "get_current_device": "hetero.runtime.current",
    "restore": "hetero.runtime.current",
    "TaskFuture": "hetero.runtime.futures",
    "MapRun": "hetero.runtime.mapping",
    "TaskFunction": "hetero.runtime.tasks",
    "TaskOptions": "hetero.runtime.tasks",
    "task": "hetero.runtime.tasks",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "Backend",
    "BackendEvents",
    "BatchOptions",
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
