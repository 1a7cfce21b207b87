"""The local backend: one worker process per device on this machine.

Workers are plain ``python -c`` processes running ``hetero.runtime.worker.main``, joined to
the driver by a socket pair (no re-import of the user's ``__main__``, so scripts need no
``if __name__ == "__main__"`` guard and notebooks work). A GPU worker sees only its GPU
(``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``); the CPU worker is pinned to its cores.
One reader thread serves every worker; orders queue per worker and go out as one frame when
the engine flushes.

Workers are started from one thread that lives as long as the backend, because the kernel's
signal that kills a worker with its driver (``PR_SET_PDEATHSIG``) fires when the *thread* that
started it exits. A worker told to stop a task it runs ends itself at once, unless the task
holds the GIL (C code): then the reader thread kills it, and the processes its task started,
``STOP_GRACE_S`` seconds later. Each worker leads a session of its own and sits in a cgroup of
its own where one can be made, so that what its tasks start, detached or not, ends with it
(``hetero.runtime.fence``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, TypeVar

from hetero.devices.spec import Device, DeviceKind
from hetero.errors import BackendError
from hetero.runtime.backend import (
    STOP_GRACE_S,
    Backend,
    BackendEvents,
    killed_for_overrun,
    overdue,
    stops_over,
)
from hetero.runtime.fence import Fence, Fenced
from hetero.runtime.procs import kill_tree
from hetero.runtime.serialize import remove_prefix, remove_segments, remove_stale
from hetero.runtime.worker import PROTOCOL, TaskOrder, WorkerSetup

__all__ = ["LocalBackend"]

log = logging.getLogger("hetero.runtime")

#: More devices than this per CPU core get a warning when the local backend starts.
WORKERS_PER_CORE = 4
T = TypeVar("T")

_WORKER_MAIN = (
    "import sys; from hetero.runtime.worker import main; main(int(sys.argv[1]), int(sys.argv[2]))"
)
_EXIT_REASONS = {
    3: "stopped to end a task",
    4: "over its memory limit",
    5: "it runs another version of hetero than the driver; restart the driver",
}


@dataclass(eq=False)
class _Worker:
    index: int
    generation: int
    proc: subprocess.Popen[bytes]
    conn: Connection
    fenced: Fenced
    outbox: list[tuple[Any, ...]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    functions: set[str] = field(default_factory=set)
    closed: bool = False
    ready: threading.Event = field(default_factory=threading.Event)
    # Tasks it was told to stop, not yet confirmed over (a reply, a dropped order): task id ->
    # when the worker is killed if it has not confirmed by then. Guarded by the backend's
    # _stop_lock, not by ``lock``, which a send to a worker that does not read may hold.
    stopping: dict[int, float] = field(default_factory=dict)
    killed: bool = False  # by the reader thread, for not stopping a task in time


class _Launcher:
    """Starts worker processes from a thread of its own, which lives until ``close``: a worker
    gets the kernel's kill signal when the thread that started it exits, and the threads that
    ask for workers (the caller's, which may be short-lived) must not be that thread."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._serve, daemon=True, name="hetero-launcher")
        self._thread.start()

    def call(self, start: Callable[[], T]) -> T:
        """``start()``, run by the launcher's thread."""
        done: Future[T] = Future()
        self._requests.put((start, done))
        return done.result()

    def close(self) -> None:
        """Stop the thread (after the workers it started have ended)."""
        self._requests.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (request := self._requests.get()) is not None:
            start, done = request
            try:
                done.set_result(start())
            except BaseException as exc:
                done.set_exception(exc)


class LocalBackend(Backend):
    """Worker processes on this machine.

    Args:
        time_scale: emulated durations are multiplied by it.
        memory_limits: per device, bytes the worker may use (``None``: no limit).
        cgroups: put each worker in a cgroup of its own under the hierarchy found writable
            (``True``), under this directory, or in none (``False``: its session and, on
            Linux, its adopted orphans still end with it; see ``hetero.runtime.fence``).
    """

    def __init__(
        self,
        *,
        time_scale: float = 1.0,
        memory_limits: Sequence[int | None] | None = None,
        cgroups: bool | Path = True,
    ) -> None:
        self.time_scale = time_scale
        self._cgroups = cgroups
        self._limits = list(memory_limits) if memory_limits is not None else None
        self._devices: list[Device] = []
        self._events: BackendEvents | None = None
        self._workers: list[_Worker | None] = []
        self._generation = 0
        self._lock = threading.Lock()
        self._closed = False
        self._prefix = f"hetero-{os.getpid()}-{id(self) & 0xFFFF:x}"
        self._wake_r, self._wake_w = socket.socketpair()
        self._reader: threading.Thread | None = None
        self._recycled: deque[tuple[str, int]] = deque()
        self._started: list[_Worker] = []  # spawned, not yet watched by the reader
        self._launcher: _Launcher | None = None
        self._fence: Fence | None = None
        self._stop_lock = threading.Lock()

    # ---------------------------------------------------------------------------- Backend

    def start(self, devices: Sequence[Device], events: BackendEvents) -> None:
        self._devices = list(devices)
        self._events = events
        cores = os.cpu_count() or 1
        # A few emulated devices per core are fine (they mostly sleep); dozens are a mistake.
        if len(self._devices) > WORKERS_PER_CORE * cores:
            log.warning(
                "%d devices start up to %d worker processes on %d CPU cores (more than %d per "
                "core): they will take turns on the cores and slow one another",
                len(self._devices),
                len(self._devices),
                cores,
                WORKERS_PER_CORE,
            )
        remove_stale()  # shared memory left by drivers that were killed
        self._workers = [None] * len(self._devices)
        self._fence = Fence(self._prefix, self._cgroups)
        self._launcher = _Launcher()
        self._reader = threading.Thread(target=self._read, daemon=True, name="hetero-backend")
        self._reader.start()

    def send(self, device: int, order: TaskOrder, function: tuple[str, bytes]) -> None:
        worker = self._workers[device] or self._spawn(device)
        key, blob = function
        with worker.lock:
            if key not in worker.functions:
                worker.functions.add(key)
                worker.outbox.append(("fn", key, blob))
            worker.outbox.append(("run", order))

    def cancel(self, device: int, task_id: int) -> None:
        worker = self._workers[device]
        if worker is not None:
            with worker.lock:
                worker.outbox.append(("cancel", task_id))
            with self._stop_lock:
                worker.stopping[task_id] = time.monotonic() + STOP_GRACE_S
            self._flush(worker)
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")  # the reader watches the new deadline

    def restart(self, device: int) -> None:
        with self._lock:
            worker = self._workers[device]
            self._workers[device] = None
        if worker is not None:
            self._end(worker, kill=True)

    def pids(self) -> list[int | None]:
        return [w.proc.pid if w is not None else None for w in self._workers]

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = [w for w in self._workers if w is not None]
            self._workers = [None] * len(self._workers)
        for w in workers:  # ask politely first: queued orders are dropped, running ones end
            with w.lock:
                w.outbox.append(("exit",))
            self._flush(w)
        for w in workers:
            self._end(w, kill=False, timeout=timeout)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._reader is not None:
            self._reader.join(timeout)
        for w in workers:
            with contextlib.suppress(OSError):
                w.conn.close()
        while self._recycled:
            remove_segments([(*self._recycled.popleft(), True)])
        self._wake_r.close()
        self._wake_w.close()
        if self._launcher is not None:
            self._launcher.close()
        if self._fence is not None:
            self._fence.close()
        remove_prefix(self._prefix)

    # --------------------------------------------------------------------------- internals

    def _spawn(self, index: int) -> _Worker:
        with self._lock:
            if self._closed or self._launcher is None or self._fence is None:
                raise BackendError("the backend is closed" if self._closed else "not started")
            existing = self._workers[index]
            if existing is not None:
                return existing
            device = self._devices[index]
            ours, theirs = socket.socketpair()
            env = dict(os.environ)
            if device.kind is DeviceKind.GPU and not device.emulated:
                visible = str(device.uuid or device.local_index or 0)
                env["CUDA_VISIBLE_DEVICES"] = env["HIP_VISIBLE_DEVICES"] = visible
            elif device.kind is DeviceKind.CPU and not device.emulated and device.cores:
                threads = str(device.cores)
                env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = threads
                env["OPENBLAS_NUM_THREADS"] = threads
            elif device.emulated:
                # Emulated devices share the host: one BLAS thread each keeps them from
                # fighting over cores (the pacing, not the host, sets their speed).
                env.setdefault("OMP_NUM_THREADS", "1")
                env.setdefault("OPENBLAS_NUM_THREADS", "1")
                env.setdefault("MKL_NUM_THREADS", "1")
            try:
                args = [sys.executable, "-c", _WORKER_MAIN, str(theirs.fileno()), str(os.getpid())]
                proc = self._launcher.call(
                    lambda: subprocess.Popen(
                        args,
                        pass_fds=(theirs.fileno(),),
                        env=env,
                        stdin=subprocess.DEVNULL,
                        # Its session holds what its tasks start (the driver's Ctrl-C is the
                        # driver's to handle: workers ignore it).
                        start_new_session=True,
                    )
                )
            except OSError as exc:
                ours.close()
                raise BackendError(f"cannot start a worker for {device.id}: {exc}") from exc
            finally:
                theirs.close()
            if device.kind is DeviceKind.CPU and not device.emulated and device.cores:
                with contextlib.suppress(OSError, AttributeError):
                    cores = sorted(os.sched_getaffinity(0))[: device.cores]
                    os.sched_setaffinity(proc.pid, cores)
            self._generation += 1
            # Fenced before it is sent any task, so before it can start anything.
            fenced = self._fence.enclose(proc.pid, f"{index}-{self._generation}")
            conn = Connection(ours.detach())
            worker = _Worker(index, self._generation, proc, conn, fenced)
            limit = self._limits[index] if self._limits is not None else None
            setup = WorkerSetup(
                device=device,
                prefix=f"{self._prefix}-{index}-{self._generation}",
                time_scale=self.time_scale,
                memory_limit=limit,
            )
            worker.outbox.append(("init", setup, PROTOCOL))
            self._workers[index] = worker
            self._started.append(worker)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")  # the reader picks up the new connection
        log.debug("started worker pid %d for %s", proc.pid, device.id)
        return worker

    def warm(self, timeout: float | None) -> None:
        workers = [self._workers[i] or self._spawn(i) for i in range(len(self._devices))]
        if timeout is None:
            return
        deadline = time.monotonic() + timeout
        late = [w for w in workers if not w.ready.wait(max(0.0, deadline - time.monotonic()))]
        if late:
            ids = ", ".join(self._devices[w.index].id for w in late)
            raise BackendError(f"workers not ready after {timeout:g} s: {ids}")

    def recycle(self, name: str, size: int) -> None:
        if self._closed:
            remove_segments([(name, size, True)])  # no worker left to reuse it
        else:
            self._recycled.append((name, size))  # deque.append: safe from any thread, no lock

    def _hand_back(self) -> None:
        """Give the workers back the result files the driver let go of (or remove those of
        workers that are gone)."""
        while self._recycled:
            try:
                name, size = self._recycled.popleft()
            except IndexError:
                break
            index, generation = _owner(name, self._prefix)
            worker = self._workers[index] if 0 <= index < len(self._workers) else None
            if worker is None or worker.generation != generation:
                remove_segments([(name, size, True)])
                continue
            with worker.lock:
                worker.outbox.append(("recycle", [(name, size)]))

    def flush(self) -> None:
        if self._recycled:
            self._hand_back()
        for worker in self._workers:
            if worker is not None and worker.outbox:
                self._flush(worker)

    def _flush(self, worker: _Worker) -> None:
        # Sent by whichever thread produced the orders, under the worker's lock so frames keep
        # their order. A send cannot block for long: the worker's reader thread always drains
        # its socket, whatever its main thread is running.
        with worker.lock:
            if not worker.outbox or worker.closed:
                return
            batch, worker.outbox = worker.outbox, []
            # A worker that is gone fails the send; the reader reports it.
            with contextlib.suppress(OSError, ValueError):
                worker.conn.send_bytes(pickle.dumps(batch, protocol=5))

    def _read(self) -> None:
        events = self._events
        assert events is not None
        wake = self._wake_r
        # Every worker's connection is watched until its end of file, also after the worker
        # was replaced, so that each is closed once; new ones arrive through _started.
        by_conn: dict[Any, _Worker] = {}
        while True:
            with self._lock:
                for w in self._started:
                    by_conn[w.conn] = w
                self._started.clear()
                if self._closed and not by_conn:
                    return
            ready = wait([wake, *by_conn], self._kill_late(by_conn.values()))
            for obj in ready:
                if obj is wake:
                    with contextlib.suppress(OSError):
                        wake.recv(4096)
                    continue
                worker = by_conn[obj]
                try:
                    messages = pickle.loads(worker.conn.recv_bytes())
                except (EOFError, OSError):
                    del by_conn[obj]
                    self._lost(worker)
                    continue
                if worker.stopping:
                    self._confirm_stops(worker, messages)
                if self._workers[worker.index] is not worker:
                    continue  # from a worker already replaced: its tasks were dealt with
                if messages[0][0] == "ready":
                    worker.ready.set()
                try:
                    events.replies(worker.index, messages)
                except Exception:  # the engine's bug must not kill the reader thread
                    log.exception("error handling replies from %s", self._devices[worker.index].id)

    def _lost(self, worker: _Worker) -> None:
        with self._lock:
            current = self._workers[worker.index] is worker
            if current:
                self._workers[worker.index] = None
        self._end(worker, kill=True, timeout=1.0)
        worker.conn.close()
        code = worker.proc.returncode
        if not current or self._events is None:
            return
        device = self._devices[worker.index].id
        if worker.killed:
            reason = killed_for_overrun(f"worker of {device}", STOP_GRACE_S)
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            reason = f"worker of {device} was killed by {name}"
        else:
            reason = f"worker of {device} exited ({_EXIT_REASONS.get(code, f'code {code}')})"
        try:
            self._events.worker_lost(worker.index, reason)
        except Exception:
            log.exception("error handling the loss of the worker of %s", device)

    def _kill_late(self, workers: Iterable[_Worker]) -> float | None:
        """Kill each worker (with what its task started) that has not stopped a task in time;
        returns the seconds until the next stop falls due (``None``: none is pending)."""
        with self._stop_lock:
            late, wait = overdue(workers, time.monotonic())
            late = [worker for worker in late if worker.proc.poll() is None]
            for worker in late:
                worker.killed = True
        for worker in late:
            log.debug("killing worker pid %d: a stopped task still runs", worker.proc.pid)
            kill_tree(worker.proc.pid)
        return wait

    def _confirm_stops(self, worker: _Worker, messages: list[tuple[Any, ...]]) -> None:
        """Forget the stops that ``messages`` show are over: a dropped order, a task's reply."""
        with self._stop_lock:
            for task_id in stops_over(messages):
                worker.stopping.pop(task_id, None)

    def _end(self, worker: _Worker, kill: bool, timeout: float = 5.0) -> None:
        if kill and worker.proc.poll() is None:
            kill_tree(worker.proc.pid)
        try:
            worker.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(worker.proc.pid)
            worker.proc.wait()
        assert self._fence is not None  # a worker was started
        self._fence.release(worker.fenced)
        with worker.lock:
            worker.closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        remove_prefix(f"{self._prefix}-{worker.index}-{worker.generation}-")


def _owner(name: str, prefix: str) -> tuple[int, int]:
    """The device index and worker generation that wrote segment ``name`` (-1s if not ours):
    names are ``<prefix>-<index>-<generation>-<n>``."""
    if not name.startswith(prefix + "-"):
        return -1, -1
    parts = name[len(prefix) + 1 :].split("-")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return -1, -1
