"""The worker process: runs one device's tasks, one at a time, for the local backend.

Started by the local backend as ``python -c "…main(FD, DRIVER_PID)"`` with one end of a socket
pair. Frames both ways are pickled lists of messages, so a burst of tiny tasks costs one system
call per burst, not per task. The main thread runs tasks from an inbox; a reader thread fills the
inbox, answers cancellations and notices the driver going away. The kernel kills the worker when
its driver dies (``PR_SET_PDEATHSIG``), even while a task holds the GIL and no thread here can
run; whenever the worker ends itself, it takes the processes its tasks started with it, those
that detached included (it adopts orphans, and leads their session: ``hetero.runtime.fence``).

Driver -> worker: ``("init", WorkerSetup, PROTOCOL)``, ``("fn", key, bytes)``,
``("run", TaskOrder)``, ``("recycle", [(name, size)])`` (result files the driver let go),
``("cancel", task_id)``, ``("exit",)``.
Worker -> driver: ``("ready", pid)``, ``("done", TaskReply)``, ``("error", TaskReply)``,
``("released", [name])`` (argument files it no longer maps),
``("dropped", task_id)`` (a cancelled order it does not run: not started, or already ended),
``("warn", text)``.
"""

from __future__ import annotations

import contextlib
import operator
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field, fields
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

from hetero.devices.spec import Device
from hetero.runtime import current
from hetero.runtime.batching import BatchResultError, combine, split
from hetero.runtime.procs import adopt_orphans, die_with_parent, kill_tree, tree_rss
from hetero.runtime.serialize import Packed, SegmentPool, pack, unpack

__all__ = ["PROTOCOL", "TaskOrder", "TaskReply", "WorkerSetup", "main", "run_order"]

#: Changes whenever the messages between driver and worker change: a worker started from newer
#: code on disk than its driver's (an upgrade mid-run) exits with _EXIT_SKEW instead of
#: misreading them.
PROTOCOL = 5
_EXIT_SKEW = 5

# Replies wait at most this long, or this many, before they are sent together.
_FLUSH_SECONDS = 0.002
_FLUSH_COUNT = 64
# A task that starts within this long of the previous one's due end counts as back to back.
_PACE_SLACK = 0.002


@dataclass(slots=True)
class WorkerSetup:
    """What a worker needs to know about its device and its driver."""

    device: Device
    prefix: str  # shared-memory segment names this worker writes start with it
    time_scale: float = 1.0
    memory_limit: int | None = None  # bytes; enforced where the framework can
    rss_interval: float = 0.2
    # Results travel inside the reply, not through shared-memory files: for a driver that may
    # be on another machine (the Ray backend).
    inline: bool = False


@dataclass(slots=True)
class TaskOrder:
    """One attempt of one task, or one batch of calls of a batched task (``args``: each
    call's arguments, packed; ``task_id``: the batch's id), run as one call."""

    task_id: int
    attempt: int
    fn: str  # key of a function sent before with ("fn", key, bytes)
    args: Packed | list[Packed]
    name: str
    cost: float
    declared_cost: bool  # else an emulated device paces by the measured CPU time
    checkpoint_dir: str | None
    cpu_time_scale: float  # the time scale of that CPU-time pacing

    def __reduce__(self) -> tuple[type[TaskOrder], tuple[Any, ...]]:
        # A plain tuple of fields: pickling a slotted dataclass field by field costs 5x more,
        # on a path every task takes twice.
        return (TaskOrder, _fields_TaskOrder(self))


_fields_TaskOrder = operator.attrgetter(*(f.name for f in fields(TaskOrder)))


@dataclass(slots=True)
class TaskReply:
    """How an attempt ended: its result (``done``) or error, and where the time went."""

    task_id: int
    attempt: int
    started: float
    ended: float
    unpack_seconds: float = 0.0
    pack_seconds: float = 0.0
    bytes_out: int = 0
    cpu_seconds: float = 0.0
    result: Packed | None = None
    error: str = ""  # "ExcType: message"
    remote_traceback: str = ""
    exception: bytes | None = None  # the exception, pickled, when it can be
    retryable: bool = True
    checkpointed: bool = False  # the task wrote a checkpoint (the driver removes it at the end)
    out_of_memory: bool = False  # the worker outgrew its device's limit (worth another device)

    def __reduce__(self) -> tuple[type[TaskReply], tuple[Any, ...]]:
        # A plain tuple of fields: pickling a slotted dataclass field by field costs 5x more,
        # on a path every task takes twice.
        return (TaskReply, _fields_TaskReply(self))


_fields_TaskReply = operator.attrgetter(*(f.name for f in fields(TaskReply)))


@dataclass
class _State:
    conn: Connection | None  # None: no socket (a Ray actor); notes wait for the reply
    setup: WorkerSetup | None = None
    inbox: deque[TaskOrder] = field(default_factory=deque)
    functions: dict[str, Any] = field(default_factory=dict)
    raw_functions: dict[str, bytes] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    running: int = -1  # task id being run now
    attempt: int = 0  # and its attempt
    closing: bool = False
    warned: bool = False
    paced_until: float = -1.0  # when the last emulated task was due to end
    outbox: list[tuple[Any, ...]] = field(default_factory=list)  # replies not yet sent
    out_lock: threading.Lock = field(default_factory=threading.Lock)
    held: threading.Event = field(default_factory=threading.Event)  # replies are being held
    held_since: float = 0.0
    pool: SegmentPool = field(default_factory=SegmentPool)  # result files the driver let go
    released: deque[str] = field(default_factory=deque)  # argument files this process let go
    notes: list[tuple[Any, ...]] = field(default_factory=list)  # warnings, without a socket

    def release(self, name: str, size: int) -> None:
        """A mapping of an argument file is gone (called by its finalizer, in any thread): the
        driver may rewrite the file."""
        self.released.append(name)


def _send(state: _State, messages: list[tuple[Any, ...]]) -> None:
    if state.conn is None:
        state.notes += messages  # sent with the next reply
        return
    data = pickle.dumps(messages, protocol=5)
    with state.send_lock:
        state.conn.send_bytes(data)


def _reader(state: _State) -> None:
    conn = state.conn
    assert conn is not None
    try:
        while True:
            data = conn.recv_bytes()
            try:
                messages = pickle.loads(data)
            except Exception:
                os._exit(_EXIT_SKEW)  # written by another version of hetero than this one
            dropped: list[tuple[Any, ...]] = []
            with state.cond:
                for msg in messages:
                    tag = msg[0]
                    if tag == "run":
                        state.inbox.append(msg[1])
                    elif tag == "fn":
                        state.raw_functions[msg[1]] = msg[2]
                    elif tag == "init":
                        if msg[2] != PROTOCOL:
                            os._exit(_EXIT_SKEW)
                        state.setup = msg[1]
                    elif tag == "recycle":
                        for name, size in msg[1]:
                            state.pool.give(name, size)
                    elif tag == "cancel":
                        dropped += _cancel(state, msg[1])
                    elif tag == "exit":
                        state.closing = True
                        state.inbox.clear()  # the driver has settled these tasks already
                state.cond.notify()
            if dropped:
                _send(state, dropped)
    except (EOFError, OSError):
        # The driver closed its end (or died, if the kernel's signal has not come first):
        # nothing to report to. This thread reads whatever the main thread runs, so a long
        # task ends here too.
        _exit(0)


def _exit(code: int) -> None:
    """End this worker now, and the processes its task started (they would outlive it)."""
    kill_tree(os.getpid(), root=False)
    os._exit(code)


def _cancel(state: _State, task_id: int) -> list[tuple[Any, ...]]:
    """Drop ``task_id`` from the inbox; if it is running, end the process (the only way to stop
    Python code), after which the driver restarts this device's worker. An order this worker
    does not hold (its reply is on the way) is confirmed as dropped too, so that the driver
    knows at once that nothing of it runs here."""
    if state.running == task_id:
        _exit(3)
    for order in state.inbox:
        if order.task_id == task_id:
            state.inbox.remove(order)
            break
    return [("dropped", task_id)]


def _watch_memory(state: _State, limit: int, interval: float) -> None:
    """Fail the running task and end the worker when the worker and the processes its task
    started hold more than ``limit`` bytes together (a limit per process, such as RLIMIT_AS,
    would let each child have as much again)."""
    import psutil

    proc = psutil.Process()
    while True:
        time.sleep(interval)
        rss = tree_rss(proc)
        if rss > limit and state.running >= 0:
            order_id, attempt = state.running, state.attempt
            text = (
                f"MemoryError: worker memory {rss / 1e9:.2f} GB (with the processes its task "
                f"started) exceeded the device's limit {limit / 1e9:.2f} GB"
            )
            now = time.monotonic()
            reply = TaskReply(order_id, attempt, now, now, error=text, out_of_memory=True)
            with contextlib.suppress(Exception):
                _send(state, [("error", reply)])
            _exit(4)


def _limit_frameworks(device: Device, limit: int | None) -> None:
    """Cap the GPU memory pools of the frameworks present (the RSS watch covers the CPU)."""
    if limit is None or device.type != "gpu" or device.emulated:
        return
    fraction = min(1.0, limit / max(device.spec.memory_bytes, 1))
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(fraction, 0)
    with contextlib.suppress(Exception):
        import cupy  # type: ignore[import-not-found]

        cupy.get_default_memory_pool().set_limit(size=limit)


def _function(state: _State, key: str, kind: str) -> Any:
    fn = state.functions.get(key)
    if fn is None:
        fn = cloudpickle.loads(state.raw_functions.pop(key))
        state.functions[key] = fn
    if isinstance(fn, dict):  # per-device variants: {"gpu": f, "cpu": g, "default": h}
        return fn.get(kind, fn.get("default"))
    return fn


def run_order(state: _State, order: TaskOrder) -> tuple[str, TaskReply]:
    """Run one attempt on this worker's device: ``("done" | "error", reply)``."""
    setup = state.setup
    assert setup is not None
    device = setup.device
    started = time.monotonic()
    reply = TaskReply(order.task_id, order.attempt, started, started)
    calls = len(order.args) if isinstance(order.args, list) else 0
    try:
        fn = _function(state, order.fn, str(device.type))
        if isinstance(order.args, list):
            unpacked = [unpack(p, on_release=state.release) for p in order.args]
            args, kwargs = combine([value for value, _ in unpacked])
            reply.unpack_seconds = sum(seconds for _, seconds in unpacked)
            del unpacked
        else:
            (args, kwargs), reply.unpack_seconds = unpack(order.args, on_release=state.release)
    except BaseException as exc:
        reply.error = f"{type(exc).__name__}: could not load the task on {device.id}: {exc}"
        reply.remote_traceback = traceback.format_exc()
        reply.retryable = False
        reply.ended = time.monotonic()
        return "error", reply
    current.enter(device, order.task_id, order.attempt, order.checkpoint_dir)
    # Host-timed pacing (an emulated device, no declared cost) leaves out the time the task
    # waited for a CPU: that is this host's contention, not the device's speed.
    host_timed = device.emulated and not order.declared_cost
    queued0 = _runqueue_seconds() if host_timed else 0.0
    started = time.monotonic()
    cpu0 = time.thread_time()
    try:
        result = fn(*args, **kwargs)
        if calls:
            result = split(order.name, result, calls)
    except BaseException as exc:
        reply.started, reply.ended = started, time.monotonic()
        reply.error = f"{type(exc).__name__}: {exc}"
        reply.remote_traceback = traceback.format_exc()
        with contextlib.suppress(Exception):
            reply.exception = cloudpickle.dumps(exc)
        # Another attempt would return the same count: not worth a retry.
        reply.retryable = not isinstance(exc, BatchResultError)
        return "error", reply
    finally:
        reply.checkpointed = current.leave()
        del args, kwargs
    reply.cpu_seconds = time.thread_time() - cpu0
    if device.emulated:
        queued = _runqueue_seconds() - queued0 if host_timed else 0.0
        reply.started, reply.ended = _pace(state, order, started, reply.cpu_seconds, queued)
    else:
        reply.started, reply.ended = started, time.monotonic()
    try:
        reply.result = pack(result, setup.prefix, state.pool, inline=setup.inline)
    except BaseException as exc:
        reply.error = f"{type(exc).__name__}: the result of {order.name} cannot be pickled: {exc}"
        reply.remote_traceback = traceback.format_exc()
        reply.retryable = False
        return "error", reply
    reply.pack_seconds = reply.result.seconds
    reply.bytes_out = reply.result.nbytes
    return "done", reply


def _runqueue_seconds() -> float:
    """Seconds this thread has waited, runnable, for a CPU (Linux's schedstat; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _pace(
    state: _State, order: TaskOrder, started: float, cpu_seconds: float, queued: float = 0.0
) -> tuple[float, float]:
    """Hold the slot until the emulated duration has passed. With a declared cost: cost over the
    device's speed, times the time scale. Without: the CPU time measured here over the speed
    (times the order's ``cpu_time_scale``), plus the time the task spent off the CPU (I/O,
    sleeps), which a faster device would not shorten, less the ``queued`` seconds it waited
    for a CPU of this host. Returns when the emulated device started and ended the task: the
    end it was due at, not when the sleep overshot to (the next task is paced from the due end,
    so the driver would otherwise learn a speed some 2% below the one the device delivers)."""
    setup = state.setup
    assert setup is not None
    now = time.monotonic()  # one reading: the device running at the host's pace never "lags"
    if order.declared_cost:
        target = order.cost * setup.time_scale / setup.device.speed
    else:
        off_cpu = max(0.0, now - started - cpu_seconds - queued)
        target = off_cpu + cpu_seconds * order.cpu_time_scale / setup.device.speed
    # Back-to-back tasks are paced from where the previous one was due to end, not from when
    # this one actually started: the few hundred µs a sleep overshoots and a hand-over costs
    # are then made up, and the device's long-run speed is exactly its declared one.
    base = state.paced_until if 0 <= started - state.paced_until < _PACE_SLACK else started
    due = base + target
    state.paced_until = due
    elapsed = now - started
    if due > now:
        time.sleep(due - now)
        return base, due
    if target > 0 and elapsed - queued > target * 1.05 + 1e-3 and not state.warned:
        state.warned = True
        _send(
            state,
            [
                (
                    "warn",
                    f"emulation saturated on {setup.device.id}: {order.name} ran for "
                    f"{elapsed * 1e3:.1f} ms but its emulated duration is {target * 1e3:.1f} ms "
                    "(the host cannot keep pace; raise time_scale, or use fewer emulated "
                    "devices than cores); speeds measured on this device are too low",
                )
            ],
        )
    return base, now


def main(fd: int, driver: int) -> None:
    die_with_parent(driver)
    adopt_orphans()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    state = _State(Connection(fd))
    threading.Thread(target=_reader, args=(state,), daemon=True, name="hetero-reader").start()
    with state.cond:
        while state.setup is None:
            state.cond.wait()
    setup = state.setup
    current.set_device(setup.device)
    _limit_frameworks(setup.device, setup.memory_limit)
    if setup.memory_limit is not None and (setup.device.emulated or setup.device.type == "cpu"):
        # Host memory stands for the device's only where the device is the host (a real GPU's
        # limit is the framework pool's, set above).
        threading.Thread(
            target=_watch_memory,
            args=(state, setup.memory_limit, setup.rss_interval),
            daemon=True,
            name="hetero-rss",
        ).start()
    _send(state, [("ready", os.getpid())])
    threading.Thread(target=_flusher, args=(state,), daemon=True, name="hetero-flush").start()
    inbox = state.inbox
    while True:
        with state.cond:
            while not inbox and not state.closing:
                state.cond.wait()
            if state.closing and not inbox:
                break
            order = inbox.popleft()
            state.running, state.attempt = order.task_id, order.attempt
        reply = run_order(state, order)
        state.running = -1
        with state.out_lock:
            state.outbox.append(reply)
            # Tiny tasks' replies wait for company while more orders are queued (one message
            # for many); the flusher sends them within _FLUSH_SECONDS whatever runs next.
            hold = bool(inbox) and len(state.outbox) < _FLUSH_COUNT
            if hold and len(state.outbox) == 1:
                state.held_since = time.monotonic()
                state.held.set()
        if not hold:
            _flush(state)
    _flush(state)
    kill_tree(os.getpid(), root=False)  # what its tasks left running ends with it
    sys.exit(0)


def _flush(state: _State) -> None:
    with state.out_lock:
        batch, state.outbox = state.outbox, []
        state.held.clear()
        if state.released:
            names = []
            while state.released:
                names.append(state.released.popleft())
            batch.append(("released", names))
        if batch:
            _send(state, batch)


def _flusher(state: _State) -> None:
    while True:
        state.held.wait()
        delay = state.held_since + _FLUSH_SECONDS - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if state.held.is_set() and time.monotonic() - state.held_since >= _FLUSH_SECONDS:
            _flush(state)
