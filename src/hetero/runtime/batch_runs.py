"""The engine's batched calls (``@hetero.task(batch=…)``): what it does when the dispatcher
starts or queues one, and how a batch goes to its device's worker as one order.

The record of batches is the ``Batcher``'s (``hetero.runtime.batching``, pure); this is its
driver: a call the dispatcher starts on a device joins the batch collecting there or opens one,
sized for that device; a call queued there joins one with room; a batch goes once full, or when
the engine's timer finds it due. Everything here runs with the engine's lock held.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from hetero.runtime.batching import Batch, Batcher, batch_size
from hetero.runtime.task_record import Task, batch_order
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.instructions import Instruction
from hetero.sched.item import ItemState

if TYPE_CHECKING:
    from hetero.devices.spec import Device
    from hetero.runtime.books import EngineBooks
    from hetero.runtime.worker import TaskOrder

__all__ = ["BatchHost", "BatchRuns"]


class BatchHost(Protocol):
    """What batched calls need of the engine (``hetero.runtime.engine.Engine``)."""

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def devices(self) -> Sequence[Device]: ...

    @property
    def cpu_time_scale(self) -> float:
        """How emulated durations of tasks without a declared cost are paced."""

    def apply(self, out: Sequence[Instruction]) -> None:
        """Carry out the dispatcher's instructions."""

    def arm_timer(self, at: float) -> None:
        """Have the engine's timer fire by ``at`` (a batch's due time)."""

    def send(self, device: int, calls: Sequence[Task], order: TaskOrder) -> int:
        """Send ``order``, which carries ``calls``, to ``device``'s worker; its number."""


class BatchRuns:
    """The batched calls of ``host``, carried out through its ``batcher``; ``books`` are the
    engine's (a device held while its worker stops a task takes no batch)."""

    def __init__(self, host: BatchHost, books: EngineBooks, batcher: Batcher[Task]) -> None:
        self._host = host
        self._books = books
        self._batcher = batcher
        # The speed of the fastest device a task may use, by those devices (None: any).
        self._fastest: dict[tuple[str, ...] | None, float] = {}

    def fleet_changed(self) -> None:
        """A device joined: the fastest of a task's devices may be another."""
        self._fastest.clear()

    def run(self, task: Task, device: int) -> list[Instruction]:
        """The dispatcher started batched call ``task`` on ``device``: it joins the batch
        collecting there or opens one, which takes the calls of its kind queued there; the
        batch goes once full or due."""
        options = task.options.batch
        assert options is not None and task.batch_key is not None
        out, batch, joined = self._batcher.started(
            task, device, functools.partial(self._size, task, device), options.max_wait
        )
        self._joined(joined, device)
        return out + self._placed(batch)

    def queued(self, task: Task) -> None:
        """Batched call ``task``, just admitted, may wait in a device's queue: it joins the
        batch collecting there, if any has room."""
        host = self._host
        rec = host.dispatcher.records.get(task.id)
        if rec is None or rec.state is not ItemState.QUEUED:
            return
        options = task.options.batch
        assert options is not None
        batch = self._batcher.queued(task, rec.device, options.max_wait)
        if batch is not None:
            self._joined([task], rec.device)
            host.apply(self._placed(batch))

    def send_due(self, now: float) -> list[Instruction]:
        """Send the batches whose oldest call has waited long enough."""
        out: list[Instruction] = []
        for batch in self._batcher.due(now):
            out += self._send(batch)
        return out

    def _joined(self, calls: list[Task], device: int) -> None:
        for call in calls:
            call.attempt += 1  # as the dispatcher counts it: the call has started
            call.device = device

    def _placed(self, batch: Batch[Task]) -> list[Instruction]:
        """Send ``batch`` if it is ready, else have the timer wake at its due time."""
        if self._batcher.ready(batch, time.monotonic()):
            return self._send(batch)
        self._host.arm_timer(batch.due)
        return []

    def _size(self, task: Task, device: int) -> int:
        """The calls a batch of ``task`` holds on ``device``: by its speed relative to the
        fastest device the task may use, and its memory (``batching.batch_size``)."""
        options = task.options.batch
        assert options is not None
        view = self._host.dispatcher.view
        devices = self._host.devices
        only = None if task.only is None else tuple(task.only)
        fastest = self._fastest.get(only)
        if fastest is None:
            usable = devices if only is None else [devices[view.index[i]] for i in only]
            fastest = self._fastest[only] = max(d.speed for d in usable)
        memory_total = int(view.mem_total[device])
        return batch_size(
            options, devices[device].speed, fastest, memory_total, task.options.memory
        )

    def _send(self, batch: Batch[Task]) -> list[Instruction]:
        """One order for the calls of ``batch``, each argument a list of theirs."""
        host = self._host
        if batch.device in self._books.holding:
            # Its worker is being stopped (for another task): the calls are placed again,
            # charged no attempt, as a Run decided before the hold is.
            out: list[Instruction] = []
            for call in self._batcher.drop(batch):
                call.device = -1
                call.attempt -= 1
                out += host.dispatcher.requeue(call.id, "its device is stopping a task")
            return out
        calls = self._batcher.take(batch)
        order = batch_order(batch.id, calls, host.cpu_time_scale)
        batch.order = host.send(batch.device, calls, order)
        return []
