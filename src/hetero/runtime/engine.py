"""The driver's engine behind ``hetero.Context``: the task table, the ``Dispatcher`` and the
carrying out of its instructions.

Calls become tasks (``hetero.runtime.task_record``), handed to the dispatcher once their
arguments are ready (a task graph's waits: ``hetero.runtime.graph``): ``submit`` there,
``cancel`` when the caller asks, ``expire`` from the timer thread (``hetero.runtime.timer``) at
the time the dispatcher's ``WakeAt`` set. The engine is a ``Driver`` (``hetero.sched.driver``):
its ``Run``/``Stop`` instructions are carried out through the ``Backend`` (a batched task's
calls by ``hetero.runtime.batch_runs``) and ``Finish`` becomes the task's future. What the
backend reports comes in through ``BackendSink`` (``hetero.runtime.events``), the object the
backend is given. No balancing logic lives here: which device runs what, in which order,
stolen by whom, is the dispatcher's answer.

The task table and the per-device tables and counts are the engine's books
(``hetero.runtime.books``), which it hands to those parts; each part sees the engine itself
only through a narrow protocol of its own (``SinkHost``, ``GraphHost``, ``BatchHost``,
``MonitorHost``, as ``MapHost`` for maps). One lock guards the dispatcher and the books;
futures are completed after it is released, so callbacks may submit more work.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hetero.devices.spec import Device
from hetero.errors import HeteroError, NoCapableDevice, QueueFull, TaskFailed
from hetero.runtime.backend import Backend
from hetero.runtime.backlog import Backlog
from hetero.runtime.batch_runs import BatchRuns
from hetero.runtime.batching import Batcher
from hetero.runtime.books import EngineBooks
from hetero.runtime.definitions import TaskDefinitions
from hetero.runtime.events import BackendSink
from hetero.runtime.fleet_monitor import FleetMonitor
from hetero.runtime.futures import Ending, TaskFuture, futures_in, settle
from hetero.runtime.graph import TaskGraph
from hetero.runtime.ledger import Ledger
from hetero.runtime.profiling import Profiler
from hetero.runtime.task_record import Task, failure, task_order, work_item
from hetero.runtime.tasks import TaskFunction
from hetero.runtime.timer import TimerThread
from hetero.runtime.worker import TaskOrder
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.driver import Driver
from hetero.sched.health import Hold
from hetero.sched.instructions import Finish, Instruction, Run, Stop
from hetero.sched.item import Cause, ItemState
from hetero.sched.view import FleetView

__all__ = ["Engine", "cap_memory"]

log = logging.getLogger("hetero.runtime")

_CLOSED = "this Context is closed; create a new one to run more tasks"


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
        self._strategy = strategy
        self.cpu_time_scale = cpu_time_scale
        self._checkpoint_base = checkpoint_base
        self.prefetch = prefetch
        self._memory_pool = memory_pool
        self.lock = threading.RLock()
        self.books = books = EngineBooks.for_devices(len(devices))
        self.backlog: Backlog[Task] = Backlog()
        self._definitions = TaskDefinitions(key)
        self._ids = itertools.count(1)
        self._orders = itertools.count()
        self.closed = False
        self.closing = False
        self._started = False
        self.timer = TimerThread(self.lock, self._next_due, self._fire, self.flush)
        # Batches of batched tasks' calls: their ids are drawn from the tasks' own.
        self.batcher: Batcher[Task] = Batcher(dispatcher, books.tasks, lambda: next(self._ids))
        self.batches = BatchRuns(self, books, self.batcher)
        self.graph = TaskGraph(self, books)
        self.ledger = Ledger(f"hetero-{os.getpid()}-c{key}", backend.recycle)
        self.profiler = Profiler(self.lock, devices)
        self.events = BackendSink(
            self, books, ledger=self.ledger, batcher=self.batcher, profiler=self.profiler
        )
        self.monitoring = FleetMonitor(self, books, self.events, config_path, monitoring_interval)

    @property
    def view(self) -> FleetView:
        return self.dispatcher.view

    def add_device(self, device: Device) -> int:
        """Track one more device (with the lock held); returns its index."""
        cap_memory(device, self._memory_pool)
        self.devices.append(device)
        self.books.add_device()
        self._definitions.fleet_changed()
        self.batches.fleet_changed()
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
            self.timer.start()
            self.monitoring.start()
            self._started = True

    # --------------------------------------------------------------------------- timer

    def _next_due(self) -> float:
        """When the timer fires: the dispatcher's next deadline or a batch's, if earlier."""
        return min(self.wake_at, self.batcher.next_due())

    def _fire(self, now: float) -> None:
        """The timer fired (with the lock held): deadlines passed, batches whose wait is over."""
        due = self.batcher.next_due()
        if self.wake_at <= now:
            self.expire()
        if due <= now:
            self.apply(self.batches.send_due(now))

    def arm_timer(self, at: float) -> None:
        """The timer thread reads its due time again: the new ``wake_at``, or a batch's
        (called with the lock held)."""
        self.timer.wake()

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
        self.books.stats["submitted"] += 1
        task.batch = batch
        if parents:
            self.graph.wait(task, parents)
        else:
            self.admit(task)
        return future

    def function(self, spec: TaskFunction[Any, Any]) -> tuple[str, bytes]:
        """The task's code, pickled once per function object (workers cache it by key)."""
        return self._definitions.code(spec)

    def admit(self, task: Task) -> None:
        """Pack the arguments and hand the task to the dispatcher (or the backlog)."""
        options = task.options
        if options.cost is not None and not task.declared:
            task.cost, task.declared = options.cost_of(task.args, task.kwargs)
        if options.complexity is not None:  # from the arguments, before packing drops them
            task.complexity = options.complexity_of(task.args, task.kwargs)
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
        task.item = item = work_item(task)
        with self.lock:
            if self.closed:
                self.release(task)
                raise HeteroError(_CLOSED)
            tasks = self.books.tasks
            tasks[task.id] = task
            if self.backlog:
                self.backlog.push(task, options.priority)
                return
            if not self.dispatcher.view.usable.all() and self.stranded(task):
                del tasks[task.id]
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
                del tasks[task.id]
                self.release(task)
                if isinstance(exc, NoCapableDevice):
                    raise NoCapableDevice(f"task {task.name!r}: {exc}") from None
                raise
            self.apply(out)
            if task.batch_key is not None:
                self.batches.queued(task)
        self.flush()

    def stranded(self, task: Task) -> bool:
        """Whether no usable device may run ``task`` (devices that left never come back)."""
        view = self.dispatcher.view
        holding = self.books.holding  # held devices take work again once their worker lets go
        if task.only is None:
            return not (view.usable.any() or holding)
        index = view.index
        return not any(view.usable[index[i]] or index[i] in holding for i in task.only)

    # ------------------------------------------------------------------- cancel and close

    def cancel(self, task_id: int) -> bool:
        """Cancel a task wherever it is (a running one is stopped); ``False`` if it has ended."""
        with self.lock:
            task = self.books.tasks.get(task_id)
            if task is None:
                return False
            if task_id not in self.dispatcher.records:
                self.end_unplaced(task)
            else:
                self.apply(self.dispatcher.cancel(task_id, "cancelled by the caller"))
        self.flush()
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
            tasks = self.books.tasks
            out: list[Instruction] = []
            for task_id in list(tasks):
                if task_id in self.dispatcher.records:
                    out += self.dispatcher.cancel(task_id, "context closed")
            self.apply(out)
            for task in list(tasks.values()):  # waiting on parents, or in the backlog
                self.books.endings.append(Ending(task.future, cancelled=True))
                self._forget(task)
            self.timer.stop()
        self.flush()
        self.monitoring.stop()
        self.backend.close(timeout=2.0)
        self.ledger.close()
        return True

    def _wait_all(self, timeout: float | None) -> None:
        with self.lock:
            tasks = self.books.tasks.values()
            futures = [t.future for t in tasks] + [t.future for t in self.backlog]
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
        if ins.device in self.books.holding:
            return self._redirect(ins)
        task = self.books.tasks[ins.item.id]  # type: ignore[index]
        if task.batch_key is not None:
            return self.batches.run(task, ins.device)
        self._run(task, ins.device)
        return None

    def on_finish(self, ins: Finish) -> None:
        self._finish(ins)

    def on_stop(self, ins: Stop) -> list[Instruction]:
        """Have the worker stop a task: an order not yet started is dropped; to stop the one it
        runs, the worker ends (the backend kills it if it cannot: C code holding the GIL). Until
        it has let go of that task, its device is held (drained: its queue moves on, nothing
        new is placed there), since the slot is not free while the task may still run."""
        task = self.books.tasks.get(ins.item.id)  # type: ignore[arg-type]
        if task is None or task.device < 0:
            return []
        device = task.device
        self.books.on_device[device].discard(task.id)
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
        books = self.books
        books.stops[device] += 1
        self.backend.cancel(device, order_id)
        held = books.holding.get(device)
        if held is not None:
            held.add(order_id)
            return []
        tasks = books.tasks
        if not self.dispatcher.view.usable[device] or any(
            tasks[t].order < number for t in books.on_device[device] if t in tasks
        ):
            return []  # its device is going down or away, or it waits behind another order
        books.holding[device] = {order_id}
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
        if log.isEnabledFor(logging.DEBUG):
            self._log_decision(task, device)
        self.send(device, [task], task_order(task, self.cpu_time_scale))

    def send(self, device: int, calls: Sequence[Task], order: TaskOrder) -> int:
        """Send ``order``, which carries ``calls`` (one task's attempt, or a batch's calls), to
        ``device``'s worker; returns its number among the orders sent."""
        number = next(self._orders)
        now = time.monotonic()
        on_device = self.books.on_device[device]
        for call in calls:
            call.sent = now
            call.order = number
            on_device.add(call.id)
            assert call.packed is not None
            self.ledger.sent(call.packed, device)
        self.backend.send(device, order, calls[0].function)
        return number

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
        books = self.books
        task = books.tasks.pop(ins.item.id, None)  # type: ignore[arg-type]
        if task is None:
            return
        if task.device >= 0:
            books.on_device[task.device].discard(task.id)
        self.release(task)
        if ins.state is ItemState.DONE:
            books.stats["done"] += 1
            books.endings.append(Ending(task.future, result=task.result))
        elif ins.state is ItemState.CANCELLED:
            books.stats["cancelled"] += 1
            books.endings.append(Ending(task.future, cancelled=True))
        else:
            books.stats["failed"] += 1
            books.endings.append(Ending(task.future, error=failure(task, ins.reason)))
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
        self.books.tasks.pop(task.id, None)
        self.release(task)

    def end_unplaced(self, task: Task, error: TaskFailed | None = None) -> None:
        """End a task the dispatcher does not hold (waiting on parents, or in the backlog):
        cancelled, or failed with ``error``."""
        self.backlog.remove(task)
        self._forget(task)
        books = self.books
        if error is None:
            books.stats["cancelled"] += 1
            books.endings.append(Ending(task.future, cancelled=True))
        else:
            books.stats["failed"] += 1
            books.endings.append(Ending(task.future, error=error))

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
                self.batches.queued(task)

    def flush(self) -> None:
        """Send the orders given to the backend, then ``settle`` (with the lock released)."""
        self.backend.flush()
        self.settle()

    def settle(self) -> None:
        """Complete the ended tasks' futures (outside the lock: their callbacks may submit),
        then remove what ended tasks left behind."""
        with self.lock:
            endings, self.books.endings = self.books.endings, []
        settle(endings)
        self.ledger.collect()


def cap_memory(device: Device, pool: int | None) -> None:
    """Limit ``device`` to ``memory_pool_size`` bytes (``None``: no cap)."""
    if pool is not None:
        limit = device.memory_limit
        device.memory_limit = pool if limit is None else min(pool, limit)
        device.state.memory_total = device.memory_bytes
