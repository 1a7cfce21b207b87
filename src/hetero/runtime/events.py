"""What the backend and the monitor report, turned into dispatcher calls: ``BackendSink`` is
the engine's side of ``BackendEvents``, the object a ``Backend`` is given at ``start``.

Workers' replies become ``complete``/``fail``; a lost worker moves its tasks, and each device
is judged by the core's circuit breaker: after ``UNHEALTHY_AFTER`` losses in a row its circuit
opens (the device is held: its work moves), and after ``RECOVERY_COOLDOWN_S`` it is on trial
again, its next task deciding; devices that join or leave
enter or leave the dispatcher's fleet; device readings set the memory held outside the
engine's tasks. Each event is handled under the engine's lock, and the futures it ends are
completed after the lock is released.

The sink sees of the engine only ``SinkHost`` (its lock, dispatcher, fleet, and the few
steps it asks of it) and the parts the engine hands it: its books (``EngineBooks``: the task
table, what each device holds, breakers, counts), ledger, batcher and profiler.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from hetero.devices.spec import Device
from hetero.errors import TaskFailed
from hetero.runtime.device_probe import DeviceSample
from hetero.runtime.worker import TaskReply
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.health import Breaker, Hold
from hetero.sched.instructions import Finish, Instruction
from hetero.sched.item import ItemState

if TYPE_CHECKING:
    from hetero.runtime.batching import Batch, Batcher
    from hetero.runtime.books import EngineBooks
    from hetero.runtime.ledger import Ledger
    from hetero.runtime.profiling import Profiler
    from hetero.runtime.task_record import Task

__all__ = ["RECOVERY_COOLDOWN_S", "UNHEALTHY_AFTER", "BackendSink", "SinkHost", "new_breaker"]

log = logging.getLogger("hetero.runtime")

#: Consecutive worker losses after which a device's circuit opens and its work moves.
UNHEALTHY_AFTER = 3
#: Seconds a device whose circuit opened takes no work before its next task is its trial.
RECOVERY_COOLDOWN_S = 30.0


def new_breaker() -> Breaker:
    return Breaker(UNHEALTHY_AFTER, RECOVERY_COOLDOWN_S)


#: Messages by which a worker lets go of an order: it ran it, or it does not hold it.
_LET_GO = frozenset({"done", "error", "dropped"})


class SinkHost(Protocol):
    """What the backend's sink needs of the engine (``hetero.runtime.engine.Engine``)."""

    @property
    def lock(self) -> threading.RLock:
        """The lock that guards the engine's dispatcher and books."""

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def devices(self) -> Sequence[Device]: ...

    @property
    def closed(self) -> bool:
        """Whether the engine has shut down (what is reported after that is ignored)."""

    @property
    def prefetch(self) -> int:
        """Orders a device's worker holds beyond the one it runs (the slots of one that joins)."""

    def apply(self, out: Sequence[Instruction]) -> None:
        """Carry out the dispatcher's instructions."""

    def flush(self) -> None:
        """Send the orders given, then complete the ended tasks' futures (lock released)."""

    def add_device(self, device: Device) -> int:
        """Track one more device; its index."""

    def stranded(self, task: Task) -> bool:
        """Whether no usable device may run ``task``."""

    def end_unplaced(self, task: Task, error: TaskFailed | None = None) -> None:
        """End a task the dispatcher does not hold: cancelled, or failed with ``error``."""


class BackendSink:
    """The handlers of what the backend of ``host`` reports (from the backend's own thread):
    the engine's ``books``, ``ledger``, ``batcher`` and ``profiler`` are updated with it."""

    def __init__(
        self,
        host: SinkHost,
        books: EngineBooks,
        *,
        ledger: Ledger,
        batcher: Batcher[Task],
        profiler: Profiler,
    ) -> None:
        self._host = host
        self._books = books
        self._ledger = ledger
        self._batcher = batcher
        self._profiler = profiler
        self._warned: set[str] = set()  # workers' warnings, each logged once

    def replies(self, device: int, messages: list[tuple[Any, ...]]) -> None:
        """What the worker of ``device`` reported, handled under one lock acquisition."""
        host, books = self._host, self._books
        ledger = self._ledger
        results = [ledger.open_result(m[1].result) if m[0] == "done" else None for m in messages]
        with host.lock:
            for msg, unpacked in zip(messages, results, strict=True):
                tag = msg[0]
                if unpacked is not None:
                    self._done(device, msg[1], unpacked)
                elif tag == "error":
                    self._error(device, msg[1])
                elif tag == "dropped":
                    books.stops[device] = max(0, books.stops[device] - 1)
                elif tag == "released":
                    ledger.let_go(device, msg[1])
                elif tag == "warn" and msg[1] not in self._warned:
                    self._warned.add(msg[1])
                    log.warning("%s", msg[1])
                if device in books.holding and tag in _LET_GO:
                    self._stopped(device, msg[1] if tag == "dropped" else msg[1].task_id)
        host.flush()

    def _stopped(self, device: int, task_id: int) -> None:
        """The worker of held ``device`` has let go of ``task_id`` (dropped it, or replied);
        once it has let go of every task stopped there, the device takes work again."""
        host, books = self._host, self._books
        held = books.holding[device]
        held.discard(task_id)
        if not held:
            del books.holding[device]
            host.apply(host.dispatcher.release(host.devices[device].id, Hold.STOPPING))

    def _done(self, device: int, reply: TaskReply, unpacked: tuple[Any, float]) -> None:
        host, books = self._host, self._books
        finished = self._batcher.finished(reply.task_id, device)
        if finished is not None:
            self._batch_done(device, reply, unpacked, *finished)
            return
        task = self._current(device, reply)
        if task is None:
            return
        if books.breakers[device].success():
            log.info("%s: circuit closed, its trial task succeeded", host.devices[device].id)
        task.result, seconds = unpacked
        reply.unpack_seconds += seconds
        task.wrote_checkpoint |= reply.checkpointed
        task.future.device = host.devices[device].id
        self._profiler.trace(task, reply, "done")
        out = host.dispatcher.complete(task.id, service_time=reply.ended - reply.started)
        host.apply(out)

    def _error(self, device: int, reply: TaskReply) -> None:
        host = self._host
        finished = self._batcher.finished(reply.task_id, device)
        if finished is not None:
            self._batch_failed(device, reply, *finished)
            return
        task = self._current(device, reply)
        if task is None:
            return
        task.reply = reply
        task.wrote_checkpoint |= reply.checkpointed
        task.future.device = host.devices[device].id
        retry = reply.retryable and (task.options.retry_exceptions or reply.out_of_memory)
        out = host.dispatcher.fail(task.id, reply.error, retryable=retry)
        self._attempt_ended(task, reply, out, reply.error)
        host.apply(out)

    def _batch_done(
        self,
        device: int,
        reply: TaskReply,
        unpacked: tuple[Any, float],
        batch: Batch[Task],
        live: list[tuple[int, Task]],
    ) -> None:
        """A batch's results, one per call in order: each call still waiting on it completes
        with its own, in its share of the batch's time (see ``_shares``)."""
        host, books = self._host, self._books
        if books.breakers[device].success():
            log.info("%s: circuit closed, its trial task succeeded", host.devices[device].id)
        results, seconds = unpacked
        reply.unpack_seconds += seconds
        device_id = host.devices[device].id
        on_device = books.on_device[device]
        out: list[Instruction] = []
        for (k, task), part in zip(live, self._shares(batch, reply, live), strict=True):
            on_device.discard(task.id)
            task.result = results[k]
            task.future.device = device_id
            self._profiler.trace(task, part, "done")
            out += host.dispatcher.complete(task.id, service_time=part.ended - part.started)
        host.apply(out)

    def _batch_failed(
        self, device: int, reply: TaskReply, batch: Batch[Task], live: list[tuple[int, Task]]
    ) -> None:
        """The batch's call raised (or returned a wrong number of results): every call still
        waiting on it fails with that reason, or is retried as its options say."""
        host, books = self._host, self._books
        device_id = host.devices[device].id
        on_device = books.on_device[device]
        out: list[Instruction] = []
        for _, task in live:
            on_device.discard(task.id)
            task.reply = reply
            task.future.device = device_id
            retry = reply.retryable and (task.options.retry_exceptions or reply.out_of_memory)
            ended = host.dispatcher.fail(task.id, reply.error, retryable=retry)
            self._attempt_ended(task, reply, ended, reply.error)
            out += ended
        host.apply(out)

    @staticmethod
    def _shares(
        batch: Batch[Task], reply: TaskReply, live: list[tuple[int, Task]]
    ) -> list[TaskReply]:
        """Each live call's part of the batch's span, in proportion to its cost among every
        call the batch ran (those cancelled meanwhile included): the speeds learned from the
        parts are the batch's, and a profile counts the device's busy time once."""
        costs = [c.cost for c in batch.calls]
        total = sum(costs)
        span = reply.ended - reply.started
        starts = [reply.started]
        for cost in costs:
            share = cost / total if total > 0 else 1 / len(costs)
            starts.append(starts[-1] + span * share)
        return [dataclasses.replace(reply, started=starts[k], ended=starts[k + 1]) for k, _ in live]

    def worker_lost(self, device: int, reason: str) -> None:
        host, books = self._host, self._books
        dispatcher = host.dispatcher
        with host.lock:
            if host.closed:
                return
            held = books.holding.pop(device, None) is not None  # the worker is gone now
            self._batcher.lost(device)  # their calls are among the tasks it held
            lost = [
                t
                for t in map(books.tasks.get, sorted(books.on_device[device]))
                if t is not None and dispatcher.state_of(t.id) is ItemState.RUNNING
            ]
            books.on_device[device].clear()
            self._ledger.worker_gone(device)
            deliberate = books.stops[device] > 0  # ended to stop a task: not the device's fault
            books.stops[device] = 0
            for task in lost:
                task.wrote_checkpoint = True  # unknown: it may have written one
            if lost:
                level = logging.INFO if deliberate else logging.WARNING
                log.log(level, "%s; %d task(s) moved", reason, len(lost))
            out: list[Instruction] = []
            dev = host.devices[device].id
            breaker = books.breakers[device]
            # The last device in service keeps its circuit closed, however it fails: without
            # it nothing runs at all; its tasks still fail by their own retries.
            others = dispatcher.view.usable.sum() - bool(dispatcher.view.usable[device])
            if not deliberate and breaker.failure(time.monotonic(), reason, may_open=others > 0):
                # Held first, so that the lost tasks and the queue move elsewhere rather than
                # back onto this device.
                log.warning(
                    "%s: circuit open after %d lost workers; on trial again in %g s",
                    dev,
                    breaker.failures,
                    breaker.cooldown,
                )
                out += dispatcher.hold(dev, Hold.CIRCUIT_OPEN)
                timer = threading.Timer(breaker.cooldown, self._cooldown_over, (device,))
                timer.daemon = True
                timer.start()
            for task in lost:
                if deliberate:
                    out += dispatcher.requeue(task.id, reason)
                else:
                    out += dispatcher.fail(task.id, reason, retryable=True)
            if held:
                out += dispatcher.release(dev, Hold.STOPPING)
            for task in lost:
                self._attempt_ended(task, None, out, reason, charged=not deliberate)
            host.apply(out)
        host.flush()

    def _cooldown_over(self, device: int) -> None:
        """A device's circuit has been open for its cooldown: it takes work again, and its next
        task's outcome closes the circuit or opens it again (a fresh worker starts with it)."""
        host, books = self._host, self._books
        with host.lock:
            if host.closed or not books.breakers[device].probe_ok(time.monotonic()):
                return
            dev = host.devices[device].id
            log.info("%s: circuit half-open, on trial", dev)
            host.apply(host.dispatcher.release(dev, Hold.CIRCUIT_OPEN))
        host.flush()

    def device_added(self, device: Device) -> int:
        """A device joined (its node joined the cluster): it takes work at once."""
        host = self._host
        with host.lock:
            index = host.add_device(device)
            log.info("%s joined the fleet", device.id)
            out = host.dispatcher.add_device(device, slots=1 + host.prefetch, parallel=1)
            host.apply(out)
        host.flush()
        return index

    def device_gone(self, device: int, reason: str) -> None:
        """``device`` left for good: what it ran or held queued is placed elsewhere, without
        being charged an attempt (it did not fail)."""
        host, books = self._host, self._books
        with host.lock:
            if host.closed:
                return
            dev = host.devices[device]
            books.on_device[device].clear()
            books.stops[device] = 0
            books.holding.pop(device, None)
            out = host.dispatcher.remove_device(dev.id, reason)
            log.warning("%s left the fleet: %s", dev.id, reason)
            host.apply(out)
            self._fail_if_fleetless(reason)
        host.flush()

    def readings(self, samples: Iterable[DeviceSample]) -> list[tuple[int, DeviceSample]]:
        """A monitor round: memory measured beyond what placed tasks declare goes to the
        dispatcher, so a device that fills up gets no more tasks that need memory; a GPU
        reporting errors is marked down. Returns the samples of the fleet's devices, with
        their indices."""
        host, books = self._host, self._books
        dispatcher = host.dispatcher
        out: list[Instruction] = []
        with host.lock:
            view = dispatcher.view
            found = [(view.index[s.device_id], s) for s in samples if s.device_id in view.index]
            for i, sample in found:
                device = host.devices[i]
                if sample.memory_used is not None:
                    held = max(0, sample.memory_used - int(view.mem_used[i]))
                    out += dispatcher.set_external_memory(device.id, held)
                if sample.errors and not device.emulated and device.kind.value == "gpu":
                    books.holding.pop(i, None)  # down now: it takes no work until device_up
                    out += dispatcher.device_down(device.id, "device reported errors")
            host.apply(out)
        host.flush()
        return found

    def _fail_if_fleetless(self, reason: str) -> None:
        """End every task that no device left could run (failed, with the reason) rather than
        let its caller wait for ever: all of them when the fleet is empty."""
        host, books = self._host, self._books
        why = f"no device it may use is left (the last: {reason})"
        # The dispatcher's items (its down devices are gone: the engine never brings them
        # back), then the tasks it does not hold yet (in the backlog, waiting on parents).
        host.apply(host.dispatcher.abandon_stranded(why, down_is_final=True))
        for task in list(books.tasks.values()):
            if task.id not in host.dispatcher.records and host.stranded(task):
                error = TaskFailed(f"task {task.id} ({task.name}) failed: {why}")
                host.end_unplaced(task, error)

    def _attempt_ended(
        self,
        task: Task,
        reply: TaskReply | None,
        out: list[Instruction],
        reason: str,
        charged: bool = True,
    ) -> None:
        """Trace and count an attempt that failed: ``failed`` when the dispatcher ended the
        task with it (``out`` holds its ``Finish``), else ``retried``."""
        final = any(type(i) is Finish and i.item.id == task.id for i in out)
        if not final and charged:
            self._books.stats["retried"] += 1
        self._profiler.trace(task, reply, "failed" if final else "retried", reason)
        if reply is None:
            task.device = -1

    def _current(self, device: int, reply: TaskReply) -> Task | None:
        """The task a reply is for, unless the reply is stale (an attempt already moved on)."""
        task = self._books.tasks.get(reply.task_id)
        if task is None or task.attempt != reply.attempt or task.device != device:
            return None  # its result, if any, is removed when collected
        self._books.on_device[device].discard(task.id)
        return task
