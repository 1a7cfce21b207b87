"""Monitoring of a running ``Context``: device readings (``hetero.runtime.device_probe``)
every ``monitoring_interval`` folded into the fleet's live state, memory-pressure warnings,
and the status that ``hetero top`` reads (``Context.status``, ``Context.memory_usage``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from hetero.devices.spec import Device
from hetero.errors import HeteroError
from hetero.runtime.device_probe import (
    DeviceSample,
    MemoryPressure,
    Monitor,
    memory_usage,
    usage_of,
)
from hetero.runtime.status import DeviceStatus, StatusSnapshot, StatusWriter, own_time_speeds
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.runtime.backend import Backend
    from hetero.runtime.books import EngineBooks
    from hetero.runtime.events import BackendSink
    from hetero.sched.dispatcher import Dispatcher

__all__ = ["FleetMonitor", "MonitorHost"]

log = logging.getLogger("hetero.runtime")


class MonitorHost(Protocol):
    """What the fleet monitor reads of the engine (``hetero.runtime.engine.Engine``)."""

    @property
    def lock(self) -> threading.RLock:
        """The lock that guards the engine's dispatcher and books."""

    @property
    def devices(self) -> Sequence[Device]: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def backend(self) -> Backend:
        """Where the workers run: their pids, the devices on this machine, the others' samples."""


class FleetMonitor:
    """Reads the devices of ``host`` each ``interval`` seconds once started, hands the readings
    to ``sink``, and publishes the status its ``books`` and dispatcher show. ``config_path`` is
    the config file the status names."""

    def __init__(
        self,
        host: MonitorHost,
        books: EngineBooks,
        sink: BackendSink,
        config_path: str | None,
        interval: float,
    ) -> None:
        self._host = host
        self._books = books
        self._sink = sink
        self._config_path = config_path
        self._interval = interval
        self._started_at = time.time()
        self._pressure = MemoryPressure()
        self._busy_mark: tuple[float, list[float]] = (time.monotonic(), [])
        self._flagged: set[str] = set()  # devices warned about as nearly out of memory
        self._monitor: Monitor | None = None
        self._status: StatusWriter | None = None

    def start(self) -> None:
        self._status = _status_writer()
        self._monitor = Monitor(self._targets, self._on_sample, interval=self._interval)
        self._monitor.start()

    def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.stop(timeout=2.0)
        if self._status is not None:
            self._status.close()

    def _targets(self) -> list[tuple[Device, int | None]]:
        """The devices this process reads itself (on this machine), with their worker pids."""
        backend = self._host.backend
        here = backend.on_this_machine()
        pids = backend.pids()
        return [(d, pids[i]) for i, d in enumerate(self._host.devices) if here[i]]

    def _on_sample(self, samples: list[DeviceSample]) -> None:
        """Fold a round of device readings (this machine's, and those the backend took on
        other machines) into the fleet's state and publish a status. Slowdowns need nothing
        here: observed durations already lower the device's speed."""
        host = self._host
        samples = [*samples, *host.backend.remote_samples()]
        found = self._sink.readings(samples)
        busy = self._busy_percent()
        for device, percent in zip(host.devices, busy, strict=False):
            if device.emulated:
                # Its worker mostly sleeps (pacing): busy is the time it held tasks.
                device.state.utilization = percent
        for i, sample in found:
            device = host.devices[i]
            state = device.state
            if not device.emulated and sample.utilization is not None:
                state.utilization = sample.utilization
            if sample.memory_used is not None:
                state.memory_used = sample.memory_used
            state.temperature_c = sample.temperature
            if (
                self._pressure.is_high(sample.memory_used, sample.memory_total)
                and device.id not in self._flagged
            ):
                self._flagged.add(device.id)
                log.warning("%s is nearly out of memory (%s)", device.id, _usage(sample))
        if self._status is not None:
            self._status.write(self.status())

    def _busy_percent(self) -> list[float]:
        """Per device, the percent of the time since the last call spent on tasks (service time
        of the tasks completed since)."""
        now = time.monotonic()
        with self._host.lock:
            busy = list(self._host.dispatcher.metrics.busy)
        last_at, last = self._busy_mark
        self._busy_mark = (now, busy)
        span = now - last_at
        if not last or span <= 0:
            return [0.0] * len(busy)
        last = last + busy[len(last) :]  # devices that joined since: no time measured yet
        return [
            min(100.0, max(0.0, 100.0 * (b - a) / span)) for a, b in zip(last, busy, strict=True)
        ]

    def status(self) -> StatusSnapshot:
        """What ``hetero top`` shows: the tasks by state, and each device's load and speed."""
        host, books = self._host, self._books
        with host.lock:
            d = host.dispatcher
            speed = d.perf.speed()
            metrics = d.metrics
            devices: list[DeviceStatus] = []
            for i, device in enumerate(host.devices):
                done = int(metrics.completed[i])
                learned, prior = own_time_speeds(
                    float(speed[i]) if done else None,
                    d.perf.prior(device, "default"),
                    emulated=device.emulated,
                    time_scale=host.backend.time_scale,
                    unit_rate=d.perf.unit_rate,
                )
                devices.append(
                    {
                        "id": device.id,
                        "model": device.model,
                        "kind": device.kind.value,
                        "emulated": device.emulated,
                        "healthy": bool(d.view.usable[i]) or i in books.holding,
                        "speed": learned,
                        "prior_speed": prior,
                        "running": int(d.view.running[i]),
                        "queued": int(d.view.in_flight[i] - d.view.running[i]),
                        "done": done,
                        "failed": int(metrics.failed[i]),
                        "utilization": device.state.utilization,
                        "memory_used": device.state.memory_used,
                        "memory_total": device.memory_bytes,
                        "temperature": device.state.temperature_c,
                    }
                )
            running = d.active - d.waiting  # tasks, each call of a batch among them
            stats = books.stats
            return {
                "pid": os.getpid(),
                "started": self._started_at,
                "updated": time.time(),
                "config": self._config_path,
                "tasks": {
                    "submitted": stats["submitted"],
                    "done": stats["done"],
                    "failed": stats["failed"],
                    "running": running,
                    "waiting": len(books.tasks) - running,
                },
                "devices": devices,
            }

    def memory_usage(self) -> dict[str, dict[str, int]]:
        """``{device id: {"used", "free", "total"}}`` in bytes, read from each device now."""
        here = self._targets()
        pids = {d.id: p for d, p in here if p is not None}
        usage = memory_usage([d for d, _ in here], pids)
        by_id = {d.id: d for d in self._host.devices}
        for sample in self._host.backend.remote_samples():
            usage[sample.device_id] = usage_of(by_id[sample.device_id], sample)
        return usage


def _status_writer() -> StatusWriter | None:
    """The writer of this process's status for ``hetero top``, or ``None`` (with a warning) when
    its directory cannot be used: a run does not fail for want of a status file."""
    writer = StatusWriter()
    try:
        writer.prepare()
    except (HeteroError, OSError) as exc:
        log.warning("%s; this Context publishes no status for `hetero top`", exc)
        return None
    return writer


def _usage(sample: DeviceSample) -> str:
    used, total = sample.memory_used or 0, sample.memory_total or 0
    return f"{format_size(used)} of {format_size(total)} used"
