"""Monitoring of a running ``Context``: device readings every ``monitoring_interval`` folded
into the fleet's live state, memory-pressure warnings, and the status that ``hetero top``
reads (``Context.status``, ``Context.memory_usage``)."""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

from hetero.devices.spec import Device
from hetero.errors import HeteroError
from hetero.runtime.monitor import (
    DeviceSample,
    MemoryPressure,
    Monitor,
    memory_usage,
    usage_of,
)
from hetero.runtime.status import DeviceStatus, StatusSnapshot, StatusWriter, own_time_speeds
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.runtime.engine import Engine

__all__ = ["FleetMonitor"]

log = logging.getLogger("hetero.runtime")


class FleetMonitor:
    """Reads the engine's devices each ``interval`` seconds once started, and publishes its
    status. ``config_path`` is the config file the status names."""

    def __init__(self, engine: Engine, config_path: str | None, interval: float) -> None:
        self._engine = engine
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
        backend = self._engine.backend
        here = backend.on_this_machine()
        pids = backend.pids()
        return [(d, pids[i]) for i, d in enumerate(self._engine.devices) if here[i]]

    def _on_sample(self, samples: list[DeviceSample]) -> None:
        """Fold a round of device readings (this machine's, and those the backend took on
        other machines) into the fleet's state and publish a status. Slowdowns need nothing
        here: observed durations already lower the device's speed."""
        engine = self._engine
        samples = [*samples, *engine.backend.remote_samples()]
        found = engine.events.readings(samples)
        busy = self._busy_percent()
        for device, percent in zip(engine.devices, busy, strict=False):
            if device.emulated:
                # Its worker mostly sleeps (pacing): busy is the time it held tasks.
                device.state.utilization = percent
        for i, sample in found:
            device = engine.devices[i]
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
        with self._engine.lock:
            busy = list(self._engine.dispatcher.metrics.busy)
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
        engine = self._engine
        with engine.lock:
            d = engine.dispatcher
            speed = d.perf.speed()
            metrics = d.metrics
            devices: list[DeviceStatus] = []
            for i, device in enumerate(engine.devices):
                done = int(metrics.completed[i])
                learned, prior = own_time_speeds(
                    float(speed[i]) if done else None,
                    d.perf.prior(device, "default"),
                    emulated=device.emulated,
                    time_scale=engine.backend.time_scale,
                    unit_rate=d.perf.unit_rate,
                )
                devices.append(
                    {
                        "id": device.id,
                        "model": device.model,
                        "kind": device.kind.value,
                        "emulated": device.emulated,
                        "healthy": bool(d.view.usable[i]) or i in engine.holding,
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
            stats = engine.stats
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
                    "waiting": len(engine.tasks) - running,
                },
                "devices": devices,
            }

    def memory_usage(self) -> dict[str, dict[str, int]]:
        """``{device id: {"used", "free", "total"}}`` in bytes, read from each device now."""
        here = self._targets()
        pids = {d.id: p for d, p in here if p is not None}
        usage = memory_usage([d for d, _ in here], pids)
        by_id = {d.id: d for d in self._engine.devices}
        for sample in self._engine.backend.remote_samples():
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
