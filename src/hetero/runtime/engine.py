"""The driver's engine behind ``hetero.Context``: the task table, the ``Dispatcher`` and the
carrying out of its instructions.

Calls become tasks, handed to the dispatcher once their arguments are ready: ``submit`` there,
``cancel`` when the caller asks, ``expire`` from a timer thread at the time the dispatcher's
``WakeAt`` set. The engine is a ``Driver`` (``hetero.sched.driver``): its ``Run``/``Stop``
instructions are carried out through the ``Backend`` and ``Finish`` becomes the task's future.
What the backend reports comes in through ``BackendSink`` (``hetero.runtime.events``), the
object the backend is given. No balancing logic lives here: which device runs what, in which
order, stolen by whom, is the dispatcher's answer.

One lock guards the dispatcher and the task table; futures are completed after it is released,
so callbacks may submit more work.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import cloudpickle

from hetero.devices.spec import Device
from hetero.errors import HeteroError, NoCapableDevice, QueueFull, TaskFailed
from hetero.runtime.backend import Backend
from hetero.runtime.backlog import Backlog
from hetero.runtime.batching import Batch, Batcher, batch_size
from hetero.runtime.definitions import TaskDefinitions
from hetero.runtime.events import BackendSink, new_breaker
from hetero.runtime.futures import Ending, TaskFuture, futures_in, resolve, settle
from hetero.runtime.ledger import Ledger
from hetero.runtime.monitoring import FleetMonitor
from hetero.runtime.profiling import Profiler
from hetero.runtime.serialize import Packed
from hetero.runtime.tasks import TaskFunction, TaskOptions
from hetero.runtime.worker import TaskOrder, TaskReply
from hetero.sched.dispatcher import Dispatcher, Finish, Instruction, Run, Stop
from hetero.sched.driver import Driver
from hetero.sched.health import Hold
from hetero.sched.item import Cause, ItemState, WorkItem
from hetero.sched.view import FleetView

__all__ = ["Engine", "Task", "cap_memory"]

log = logging.getLogger("hetero.runtime")

_CLOSED = "this Context is closed; create a new one to run more tasks"


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


class Engine(Driver):
    """Runs tasks on ``devices`` (the engine's own list: devices that join are appended) through
    ``backend``, placed by ``dispatcher``.

    ``key`` tells this engine's functions and files from another's in the same process;
    ``checkpoint_base`` is where tasks' checkpoint directories go (``None``: no checkpoints);
    ``prefetch`` and ``memory_pool`` apply to devices that join; ``config_path`` and
    ``monitoring_interval`` are the monitor's.
    """

    def __init__(
        self,
        devices: list[Device],
        dispatcher: Dispatcher,
        backend: Backend,
        *,
        key: int,
        strategy: str,
        cpu_time_scale: float,
        checkpoint_base: str | None,
        prefetch: int,
        memory_pool: int | None,
        config_path: str | None,
        monitoring_interval: float,
    ) -> None:
        super().__init__(dispatcher)
        self.devices = devices
        self.backend = backend
        # Futures of the tasks that ended, completed by ``settle`` once the lock is released.
        self.endings: list[Ending] = []
        self._strategy = strategy
        self._cpu_time_scale = cpu_time_scale
        self._checkpoint_base = checkpoint_base
        self.prefetch = prefetch
        self._memory_pool = memory_pool
        self.lock = threading.RLock()
        self.tasks: dict[int, Task] = {}
        self.on_device: list[set[int]] = [set() for _ in devices]
        # Per device: judged by its lost workers (the core's breaker, as replicas are).
        self.breakers = [new_breaker() for _ in devices]
        self.stops = [0] * len(devices)  # orders cancelled per device, not yet confirmed
        # Devices whose worker was told to stop the task it runs: the tasks stopped there that
        # the worker has not yet let go of. Such a device takes no work until it has, or is gone.
        self.holding: dict[int, set[int]] = {}
        self.backlog: Backlog[Task] = Backlog()
        self._definitions = TaskDefinitions(key)
        self._ids = itertools.count(1)
        self._orders = itertools.count()
        self.stats = {"submitted": 0, "done": 0, "failed": 0, "cancelled": 0, "retried": 0}
        self.closed = False
        self.closing = False
        self._started = False
        self._deadline_cond = threading.Condition(self.lock)
        self._timer: threading.Thread | None = None
        # Batches of batched tasks' calls: their ids are drawn from the tasks' own.
        self.batcher: Batcher[Task] = Batcher(dispatcher, self.tasks, lambda: next(self._ids))
        self._fastest: dict[tuple[str, ...] | None, float] = {}  # by the devices a task may use
        self.ledger = Ledger(f"hetero-{os.getpid()}-c{key}", backend.recycle)
        self.profiler = Profiler(self.lock, devices)
        self.monitoring = FleetMonitor(self, config_path, monitoring_interval)
        self.events = BackendSink(self)

    @property
    def view(self) -> FleetView:
        return self.dispatcher.view

    def add_device(self, device: Device) -> int:
        """Track one more device (with the lock held); returns its index."""
        cap_memory(device, self._memory_pool)
        self.devices.append(device)
        self.on_device.append(set())
        self.breakers.append(new_breaker())
        self.stops.append(0)
        self._definitions.fleet_changed()
        self._fastest.clear()
        return len(self.devices) - 1

    # --------------------------------------------------------------------------- start

    def start(self, timeout: float | None) -> None:
        """Start every device's worker now (``timeout``: wait until each is ready)."""
        self._ensure_started()
        self.backend.warm(timeout)

    def _ensure_started(self) -> None:
        if self._started:
            return
        with self.lock:
            if self._started:
                return
            self.backend.start(self.devices, self.events)
            self._timer = threading.Thread(
                target=self._expire_loop, daemon=True, name="hetero-timer"
            )
            self._timer.start()
            self.monitoring.start()
            self._started = True

    def _expire_loop(self) -> None:
        """The one timer: the dispatcher's deadlines and the batches whose wait is over."""
        with self.lock:
            while not self.closed:
                now = time.monotonic()
                due = self.batcher.next_due()
                delay = min(self.wake_at, due) - now  # inf: nothing pending
                if delay > 0:
                    self._deadline_cond.wait(None if delay == math.inf else delay)
                    continue
                if self.wake_at <= now:
                    self.expire()
                if due <= now:
                    out: list[Instruction] = []
                    for batch in self.batcher.due(now):
                        out += self._send_batch(batch)
                    self.apply(out)
                self.lock.release()
                try:
                    self.backend.flush()
                    self.settle()
                finally:
                    self.lock.acquire()

    def arm_timer(self, at: float) -> None:
        """The timer thread reads the new ``wake_at`` (called with the lock held)."""
        self._deadline_cond.notify()

    # --------------------------------------------------------------------------- submit

    def submit(
        self,
        spec: TaskFunction[Any, Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        function: tuple[str, bytes] | None = None,
        name: str | None = None,
        cost: tuple[float, bool] | None = None,
        batch: bool = False,
    ) -> TaskFuture:
        """Start a task of ``spec``: ``function`` is its shipped code (default: ``spec``'s),
        ``cost`` its ``(work units, declared)`` (default: from its options when admitted)."""
        if self.closed or self.closing:
            raise HeteroError(_CLOSED)
        self._ensure_started()
        options = spec.options
        only = self._definitions.devices(spec, self.dispatcher.view, self.devices)
        function = function or self.function(spec)
        task_id = next(self._ids)
        name = name or spec.name
        future = TaskFuture(task_id, name, self)
        task = Task(
            task_id,
            name,
            function,
            options,
            tuple(args),
            dict(kwargs),
            future,
            only,
            time.monotonic(),
        )
        if cost is not None:
            task.cost, task.declared = cost
        if options.batch is not None:  # only calls of one shape combine into one call
            task.batch_key = (function[0], len(task.args), tuple(sorted(task.kwargs)))
        elif self._checkpoint_base is not None:  # a batch has no checkpoints of its own
            task.checkpoint_dir = f"{self._checkpoint_base}/{task_id}"
        parents = futures_in((task.args, task.kwargs))
        self.stats["submitted"] += 1
        task.batch = batch
        if not parents:
            self._admit(task)
            return future
        task.batch = True  # a node of a task graph: the graph's end is what counts
        task.waiting_on = len(parents)
        with self.lock:
            self.tasks[task_id] = task
        for parent in parents:
            parent.add_done_callback(functools.partial(self._parent_done, task))
        return future

    def function(self, spec: TaskFunction[Any, Any]) -> tuple[str, bytes]:
        """The task's code, pickled once per function object (workers cache it by key)."""
        return self._definitions.code(spec)

    def _parent_done(self, task: Task, parent: Future) -> None:  # type: ignore[type-arg]
        with self.lock:
            if task.future.done() or task.id not in self.tasks:
                return
            if parent.cancelled() or parent.exception() is not None:
                failure = None if parent.cancelled() else parent.exception()
                # The parent's message alone: its traceback is printed once, with the parent
                # itself as this error's cause, not again at every level of the graph.
                reason = failure.message if isinstance(failure, TaskFailed) else failure
                cause = "was cancelled" if failure is None else f"failed: {reason}"
                pid = getattr(parent, "task_id", "?")
                error = TaskFailed(
                    f"task {task.id} ({task.name}) not run: parent task {pid} {cause}"
                )
                error.__cause__ = failure
                del self.tasks[task.id]
                self.stats["failed"] += 1
                self.endings.append(Ending(task.future, error=error))
                failed = True
            else:
                task.waiting_on -= 1
                if task.waiting_on > 0:
                    return
                del self.tasks[task.id]
                memo: dict[int, Any] = {}
                task.args = resolve(task.args, memo)
                task.kwargs = resolve(task.kwargs, memo)
                failed = False
        if failed:
            self.settle()
            return
        try:
            self._admit(task)
        except HeteroError as exc:
            task.future.set_exception(exc)

    def _admit(self, task: Task) -> None:
        """Pack the arguments and hand the task to the dispatcher."""
        options = task.options
        if options.cost is not None and not task.declared:
            task.cost, task.declared = options.cost_of(task.args, task.kwargs)
        try:
            task.packed = self.ledger.pack_arguments(
                task.id, (task.args, task.kwargs), inline=not self.backend.shared_memory
            )
        except Exception as exc:
            raise HeteroError(
                f"the arguments of task {task.id} ({task.name}) cannot be sent to a worker: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if all(owned for _, _, owned in task.packed.segments):
            task.args, task.kwargs = (), {}  # the packed copy is what retries use
        # else they hold kept results the order refers to: alive until the task ends
        item = WorkItem(
            cost=task.cost,
            kind=options.kind if task.declared else options.speed_kind(task.name),
            memory=options.memory,
            priority=options.priority,
            tags=options.tags,
            id=task.id,
            batch=task.batch,
        )
        task.item = item
        with self.lock:
            if self.closed:
                self.release(task)
                raise HeteroError(_CLOSED)
            self.tasks[task.id] = task
            if self.backlog:
                self.backlog.push(task, options.priority)
                return
            if not self.dispatcher.view.usable.all() and self.stranded(task):
                del self.tasks[task.id]
                self.release(task)
                raise NoCapableDevice(
                    f"task {task.name!r}: no device it may use is left in the fleet "
                    f"(now: {', '.join(self.dispatcher.members) or 'none'})"
                )
            try:
                out = self.dispatcher.submit(
                    item, only=task.only, retries=options.retries, timeout=options.timeout
                )
            except QueueFull:  # the engine keeps a backlog instead of refusing work
                self.backlog.push(task, options.priority)
                return
            except HeteroError as exc:
                del self.tasks[task.id]
                self.release(task)
                if isinstance(exc, NoCapableDevice):
                    raise NoCapableDevice(f"task {task.name!r}: {exc}") from None
                raise
            self.apply(out)
            if task.batch_key is not None:
                self._batch_if_queued(task)
        self.backend.flush()
        self.settle()

    def stranded(self, task: Task) -> bool:
        """Whether no usable device may run ``task`` (devices that left never come back)."""
        view = self.dispatcher.view
        holding = self.holding  # held devices take work again once their worker lets go
        if task.only is None:
            return not (view.usable.any() or holding)
        index = view.index
        return not any(view.usable[index[i]] or index[i] in holding for i in task.only)

    # ------------------------------------------------------------------- cancel and close

    def cancel(self, task_id: int) -> bool:
        """Cancel a task wherever it is (a running one is stopped); ``False`` if it has ended."""
        with self.lock:
            task = self.tasks.get(task_id)
            if task is None:
                return False
            if task_id not in self.dispatcher.records:
                self.end_unplaced(task)
            else:
                self.apply(self.dispatcher.cancel(task_id, "cancelled by the caller"))
        self.backend.flush()
        self.settle()
        return True

    def shutdown(self, wait: bool, timeout: float | None) -> bool:
        """End every worker, after the tasks finish (``wait``) or cancelling them; ``False``
        if already shut down."""
        with self.lock:
            if self.closed:
                return False
            self.closing = True
        if wait:
            self._wait_all(timeout)
        with self.lock:
            self.closed = True
            self.backlog.clear()
            out: list[Instruction] = []
            for task_id in list(self.tasks):
                if task_id in self.dispatcher.records:
                    out += self.dispatcher.cancel(task_id, "context closed")
            self.apply(out)
            for task in list(self.tasks.values()):  # waiting on parents, or in the backlog
                self.endings.append(Ending(task.future, cancelled=True))
                self._forget(task)
            self._deadline_cond.notify_all()
        self.backend.flush()
        self.settle()
        self.monitoring.stop()
        self.backend.close(timeout=2.0)
        self.ledger.close()
        return True

    def _wait_all(self, timeout: float | None) -> None:
        with self.lock:
            futures = [t.future for t in self.tasks.values()] + [t.future for t in self.backlog]
        from concurrent.futures import wait

        wait(futures, timeout=timeout)

    # ------------------------------------------------------------------- instructions out

    def apply(self, out: Sequence[Instruction]) -> None:
        """Carry out the dispatcher's instructions (called with the lock held), then admit what
        the backlog holds while the dispatcher has room."""
        super().apply(out)
        if self.backlog:
            self._drain_backlog()

    def on_run(self, ins: Run) -> list[Instruction] | None:
        if ins.device in self.holding:
            return self._redirect(ins)
        task = self.tasks[ins.item.id]  # type: ignore[index]
        if task.batch_key is not None:
            return self._run_batched(task, ins.device)
        self._run(task, ins.device)
        return None

    def on_finish(self, ins: Finish) -> None:
        self._finish(ins)

    def on_stop(self, ins: Stop) -> list[Instruction]:
        """Have the worker stop a task: an order not yet started is dropped; to stop the one it
        runs, the worker ends (the backend kills it if it cannot: C code holding the GIL). Until
        it has let go of that task, its device is held (drained: its queue moves on, nothing
        new is placed there), since the slot is not free while the task may still run."""
        task = self.tasks.get(ins.item.id)  # type: ignore[arg-type]
        if task is None or task.device < 0:
            return []
        device = task.device
        self.on_device[device].discard(task.id)
        status = "failed" if ins.cause is Cause.TIMED_OUT else "cancelled"
        self.profiler.trace(task, None, status, ins.reason)
        task.device = -1
        if task.batch_key is None:
            return self._stop_order(device, task.id, task.order)
        # A call of a batch leaves it; the batch goes on for the others, and its order is
        # stopped only once no call waits on it (before it is sent, nothing runs yet).
        batch = self.batcher.leave(task)
        return [] if batch is None else self._stop_order(device, batch.id, batch.order)

    def _stop_order(self, device: int, order_id: int, number: int) -> list[Instruction]:
        """Stop the order ``order_id`` (a task, or a batch) sent to ``device``'s worker as its
        ``number``-th order."""
        self.stops[device] += 1
        self.backend.cancel(device, order_id)
        held = self.holding.get(device)
        if held is not None:
            held.add(order_id)
            return []
        tasks = self.tasks
        if not self.dispatcher.view.usable[device] or any(
            tasks[t].order < number for t in self.on_device[device] if t in tasks
        ):
            return []  # its device is going down or away, or it waits behind another order
        self.holding[device] = {order_id}
        return self.dispatcher.hold(self.devices[device].id, Hold.STOPPING)

    def _redirect(self, ins: Run) -> list[Instruction]:
        """A ``Run`` decided before its device was held, whose worker is being stopped: placed
        again (charged no attempt), unless it has ended since (later in the same burst)."""
        rec = self.dispatcher.records.get(ins.item.id)
        if rec is None or rec.state is not ItemState.RUNNING or rec.device != ins.device:
            return []
        return self.dispatcher.requeue(ins.item.id, "its device is stopping a task")

    def _run(self, task: Task, device: int) -> None:
        task.attempt += 1
        task.device = device
        task.sent = time.monotonic()
        task.order = next(self._orders)
        self.on_device[device].add(task.id)
        assert task.packed is not None
        self.ledger.sent(task.packed, device)
        order = TaskOrder(
            task.id,
            task.attempt,
            task.function[0],
            task.packed,
            task.name,
            task.cost,
            task.declared,
            task.checkpoint_dir,
            self._cpu_time_scale,
        )
        if log.isEnabledFor(logging.DEBUG):
            self._log_decision(task, device)
        self.backend.send(device, order, task.function)

    # ------------------------------------------------------------------------- batches

    def _run_batched(self, task: Task, device: int) -> list[Instruction]:
        """The dispatcher started a batched call on ``device``: it joins the batch collecting
        there or opens one, which takes the calls of its kind queued there; the batch goes
        once full or due (``hetero.runtime.batching``)."""
        options = task.options.batch
        assert options is not None and task.batch_key is not None
        out, batch, joined = self.batcher.started(
            task, device, functools.partial(self._batch_size, task, device), options.max_wait
        )
        self._joined(joined, device)
        return out + self._batch_placed(batch)

    def _batch_if_queued(self, task: Task) -> None:
        """A batched call just admitted waits in a device's queue: it joins the batch
        collecting there, if any has room (called with the lock held)."""
        rec = self.dispatcher.records.get(task.id)
        if rec is None or rec.state is not ItemState.QUEUED:
            return
        options = task.options.batch
        assert options is not None
        batch = self.batcher.queued(task, rec.device, options.max_wait)
        if batch is not None:
            self._joined([task], rec.device)
            self.apply(self._batch_placed(batch))

    def _joined(self, calls: list[Task], device: int) -> None:
        for call in calls:
            call.attempt += 1  # as the dispatcher counts it: the call has started
            call.device = device

    def _batch_placed(self, batch: Batch[Task]) -> list[Instruction]:
        """Send ``batch`` if it is ready, else have the timer wake at its due time."""
        if self.batcher.ready(batch, time.monotonic()):
            return self._send_batch(batch)
        self._deadline_cond.notify()
        return []

    def _batch_size(self, task: Task, device: int) -> int:
        """The calls a batch of ``task`` holds on ``device``: by its speed relative to the
        fastest device the task may use, and its memory (``batching.batch_size``)."""
        options = task.options.batch
        assert options is not None
        devices = self.devices
        only = None if task.only is None else tuple(task.only)
        fastest = self._fastest.get(only)
        if fastest is None:
            index = self.dispatcher.view.index
            usable = devices if only is None else [devices[index[i]] for i in only]
            fastest = self._fastest[only] = max(d.speed for d in usable)
        memory_total = int(self.dispatcher.view.mem_total[device])
        return batch_size(
            options, devices[device].speed, fastest, memory_total, task.options.memory
        )

    def _send_batch(self, batch: Batch[Task]) -> list[Instruction]:
        """One order for the calls of ``batch``, each argument a list of theirs."""
        device = batch.device
        if device in self.holding:
            # Its worker is being stopped (for another task): the calls are placed again,
            # charged no attempt, as a Run decided before the hold is.
            out: list[Instruction] = []
            for call in self.batcher.drop(batch):
                call.device = -1
                call.attempt -= 1
                out += self.dispatcher.requeue(call.id, "its device is stopping a task")
            return out
        calls = self.batcher.take(batch)
        now = time.monotonic()
        batch.order = next(self._orders)
        on_device = self.on_device[device]
        packed = []
        for call in calls:
            call.sent = now
            call.order = batch.order
            on_device.add(call.id)
            assert call.packed is not None
            self.ledger.sent(call.packed, device)
            packed.append(call.packed)
        first = calls[0]
        order = TaskOrder(
            batch.id,
            1,
            first.function[0],
            packed,
            first.name,
            sum(call.cost for call in calls),
            first.declared,
            None,
            self._cpu_time_scale,
        )
        self.backend.send(device, order, first.function)
        return []

    def _log_decision(self, task: Task, device: int) -> None:
        view = self.dispatcher.view
        assert task.item is not None
        delays = view.expected_delay(task.item.kind, task.cost)
        ranked = sorted(range(view.n), key=lambda i: float(delays[i]))
        others = ", ".join(
            f"{view.ids[i]} {float(delays[i]):.3g}s" for i in ranked[:3] if i != device
        )
        log.debug(
            "task %d (%s, cost %.3g, attempt %d) -> %s by %s: expected delay %.3gs there; "
            "next best: %s",
            task.id,
            task.name,
            task.cost,
            task.attempt,
            view.ids[device],
            self._strategy,
            float(delays[device]),
            others or "none",
        )

    def _finish(self, ins: Finish) -> None:
        task = self.tasks.pop(ins.item.id, None)  # type: ignore[arg-type]
        if task is None:
            return
        if task.device >= 0:
            self.on_device[task.device].discard(task.id)
        self.release(task)
        if ins.state is ItemState.DONE:
            self.stats["done"] += 1
            self.endings.append(Ending(task.future, result=task.result))
        elif ins.state is ItemState.CANCELLED:
            self.stats["cancelled"] += 1
            self.endings.append(Ending(task.future, cancelled=True))
        else:
            self.stats["failed"] += 1
            reply = task.reply
            error = TaskFailed(
                f"task {task.id} ({task.name}) failed: {ins.reason}",
                reply.remote_traceback if reply is not None and reply.remote_traceback else None,
            )
            if reply is not None and reply.exception is not None:
                with contextlib.suppress(Exception):
                    error.__cause__ = cloudpickle.loads(reply.exception)
            self.endings.append(Ending(task.future, error=error))
        task.result = None

    def release(self, task: Task) -> None:
        """Let go of what an ended task holds: its argument files and its checkpoints."""
        if task.packed is not None:
            self.ledger.release(task.packed)
            task.packed = None
        task.args, task.kwargs = (), {}
        if task.wrote_checkpoint and task.checkpoint_dir is not None:
            self.ledger.discard(task.checkpoint_dir)

    def _forget(self, task: Task) -> None:
        self.tasks.pop(task.id, None)
        self.release(task)

    def end_unplaced(self, task: Task, error: TaskFailed | None = None) -> None:
        """End a task the dispatcher does not hold (waiting on parents, or in the backlog):
        cancelled, or failed with ``error``."""
        self.backlog.remove(task)
        self._forget(task)
        if error is None:
            self.stats["cancelled"] += 1
            self.endings.append(Ending(task.future, cancelled=True))
        else:
            self.stats["failed"] += 1
            self.endings.append(Ending(task.future, error=error))

    def _drain_backlog(self) -> None:
        while self.backlog and self.dispatcher.waiting < self.dispatcher.max_queue_size:
            task = self.backlog.pop()
            assert task.item is not None
            out = self.dispatcher.submit(
                task.item,
                only=task.only,
                retries=task.options.retries,
                timeout=task.options.timeout,
            )
            self.apply(out)
            if task.batch_key is not None:
                self._batch_if_queued(task)

    def settle(self) -> None:
        """Complete the ended tasks' futures (outside the lock: their callbacks may submit),
        then remove what ended tasks left behind."""
        with self.lock:
            endings, self.endings = self.endings, []
        settle(endings)
        self.ledger.collect()


def cap_memory(device: Device, pool: int | None) -> None:
    """Limit ``device`` to ``memory_pool_size`` bytes (``None``: no cap)."""
    if pool is not None:
        limit = device.memory_limit
        device.memory_limit = pool if limit is None else min(pool, limit)
        device.state.memory_total = device.memory_bytes
