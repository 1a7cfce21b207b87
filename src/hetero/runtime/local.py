"""The local backend: one worker process per device on this machine.

Workers are plain ``python -c`` processes running ``hetero.runtime.worker.main``, joined to
the driver by a socket pair (no re-import of the user's ``__main__``, so scripts need no
``if __name__ == "__main__"`` guard and notebooks work). A GPU worker sees only its GPU
(``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``); the CPU worker is pinned to its cores.
One reader thread serves every worker; orders queue per worker and go out as one frame when
the engine flushes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from hetero.devices.spec import Device, DeviceKind
from hetero.errors import BackendError
from hetero.runtime.backend import Backend, BackendEvents
from hetero.runtime.serialize import remove_prefix, remove_segments, remove_stale
from hetero.runtime.worker import PROTOCOL, TaskOrder, WorkerSetup

__all__ = ["LocalBackend"]

log = logging.getLogger("hetero.runtime")

_WORKER_MAIN = "import sys; from hetero.runtime.worker import main; main(int(sys.argv[1]))"
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
    outbox: list[tuple[Any, ...]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    functions: set[str] = field(default_factory=set)
    closed: bool = False
    ready: threading.Event = field(default_factory=threading.Event)


class LocalBackend(Backend):
    """Worker processes on this machine.

    Args:
        time_scale: emulated durations are multiplied by it.
        memory_limits: per device, bytes the worker may use (``None``: no limit).
    """

    def __init__(
        self, *, time_scale: float = 1.0, memory_limits: Sequence[int | None] | None = None
    ) -> None:
        self.time_scale = time_scale
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

    # ---------------------------------------------------------------------------- Backend

    def start(self, devices: Sequence[Device], events: BackendEvents) -> None:
        self._devices = list(devices)
        self._events = events
        remove_stale()  # shared memory left by drivers that were killed
        self._workers = [None] * len(self._devices)
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
            self._flush(worker)

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
        remove_prefix(self._prefix)

    # --------------------------------------------------------------------------- internals

    def _spawn(self, index: int) -> _Worker:
        with self._lock:
            if self._closed:
                raise BackendError("the backend is closed")
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
                proc = subprocess.Popen(
                    [sys.executable, "-c", _WORKER_MAIN, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    start_new_session=False,
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
            conn = Connection(ours.detach())
            worker = _Worker(index, self._generation, proc, conn)
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
            ready = wait([wake, *by_conn])
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
        if code < 0:
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

    def _end(self, worker: _Worker, kill: bool, timeout: float = 5.0) -> None:
        if kill and worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                worker.proc.kill()
        try:
            worker.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            worker.proc.kill()
            worker.proc.wait()
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
