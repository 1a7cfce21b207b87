"""The engine's record of one task (``Task``) and what is made of it: the work item the
dispatcher places, the order that carries an attempt (or a batch of calls) to a worker, and the
error its future gets when it fails."""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hetero.errors import TaskFailed
from hetero.runtime.batching import Batch
from hetero.runtime.futures import TaskFuture
from hetero.runtime.serialize import Packed
from hetero.runtime.tasks import TaskOptions
from hetero.runtime.worker import TaskOrder, TaskReply
from hetero.sched.item import WorkItem

__all__ = ["Task", "batch_order", "failure", "task_order", "work_item"]


@dataclass(slots=True, eq=False)
class Task:
    """The engine's record of one task, from its submission to its future's completion."""

    id: int
    name: str
    function: tuple[str, bytes]
    options: TaskOptions
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: TaskFuture
    only: list[str] | None
    submitted: float
    waiting_on: int = 0
    packed: Packed | None = None
    cost: float = 1.0
    declared: bool = False
    complexity: float | None = None  # the tier it asks for (TaskOptions.complexity)
    batch: bool = False  # of a map or a task graph: placed for the makespan (WorkItem.batch)
    attempt: int = 0
    device: int = -1
    sent: float = 0.0
    order: int = 0  # orders sent before this attempt's (a worker runs its orders in turn)
    result: Any = None
    reply: TaskReply | None = None
    checkpoint_dir: str | None = None
    wrote_checkpoint: bool = False
    item: WorkItem | None = None
    # A batched task's call (TaskOptions.batch): which calls it may share a batch with (its
    # function, and its arguments' shape), and the batch it is in.
    batch_key: Hashable | None = None
    in_batch: Batch[Task] | None = None


def work_item(task: Task) -> WorkItem:
    """What the dispatcher places for ``task``: of its declared ``kind`` of work when its cost
    is declared, else of a kind of its own (``TaskOptions.speed_kind``)."""
    options = task.options
    return WorkItem(
        cost=task.cost,
        kind=options.kind if task.declared else options.speed_kind(task.name),
        memory=options.memory,
        priority=options.priority,
        complexity=task.complexity,
        tags=options.tags,
        id=task.id,
        batch=task.batch,
    )


def task_order(task: Task, cpu_time_scale: float) -> TaskOrder:
    """The order for ``task``'s current attempt."""
    assert task.packed is not None
    return TaskOrder(
        task.id,
        task.attempt,
        task.function[0],
        task.packed,
        task.name,
        task.cost,
        task.declared,
        task.checkpoint_dir,
        cpu_time_scale,
    )


def batch_order(batch_id: int, calls: Sequence[Task], cpu_time_scale: float) -> TaskOrder:
    """One order for the ``calls`` of batch ``batch_id``: the function is called once, with each
    argument the list of theirs; its cost is theirs summed, and it has no checkpoints."""
    packed = []
    for call in calls:
        assert call.packed is not None
        packed.append(call.packed)
    first = calls[0]
    return TaskOrder(
        batch_id,
        1,
        first.function[0],
        packed,
        first.name,
        sum(call.cost for call in calls),
        first.declared,
        None,
        cpu_time_scale,
    )


def failure(task: Task, reason: str) -> TaskFailed:
    """The error of ``task``, failed for ``reason``: with the worker's traceback, and the
    exception the function raised as its cause (when it can be unpickled here)."""
    reply = task.reply
    error = TaskFailed(
        f"task {task.id} ({task.name}) failed: {reason}",
        reply.remote_traceback if reply is not None and reply.remote_traceback else None,
    )
    if reply is not None and reply.exception is not None:
        with contextlib.suppress(Exception):
            error.__cause__ = cloudpickle.loads(reply.exception)
    return error
