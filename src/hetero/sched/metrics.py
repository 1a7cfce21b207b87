"""Per-device and fleet metrics: utilization, queues, completions, mean and percentile
latencies, throughput, load balance factor, imbalance and makespan efficiency (as
:mod:`hetero.telemetry.measures` defines them, like the profiler's).

The dispatcher feeds ``Metrics`` one call per finished item (cheap appends into arrays); numbers
are computed only when a report is asked for.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import asdict, dataclass

import numpy as np

from hetero.sched.view import FleetView
from hetero.telemetry.measures import efficiency, ideal_makespan, imbalance, load_balance

__all__ = ["DeviceMetrics", "FleetMetrics", "Metrics"]


@dataclass(frozen=True, slots=True)
class DeviceMetrics:
    id: str
    model: str
    speed: float
    utilization: float
    queue_length: int
    completed: int
    failed: int
    work_done: float
    throughput: float
    p50: float
    p95: float
    p99: float


@dataclass(frozen=True, slots=True)
class FleetMetrics:
    """The fleet over a run. ``load_balance_factor`` is the mean utilization of the usable
    devices over the highest one's (in [0, 1], 1.0: all equally busy; an idle device lowers
    it); ``imbalance`` the highest over the lowest (>= 1, seed 001's load balance factor, graded
    by ``imbalance_grade``; inf when a usable device sat idle) and ``makespan_efficiency`` the
    ideal makespan (total work over their total speed) over ``elapsed``, all as
    :mod:`hetero.telemetry.measures` defines them; NaN where undefined."""

    elapsed: float
    completed: int
    failed: int
    throughput: float
    work_throughput: float
    mean: float
    p50: float
    p95: float
    p99: float
    load_balance_factor: float
    makespan_efficiency: float
    devices: list[DeviceMetrics]
    # Last, with a default: built without it (a report made by hand), it is undefined.
    imbalance: float = math.nan

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _percentiles(values: np.ndarray) -> tuple[float, float, float]:
    if values.size == 0:
        return (math.nan, math.nan, math.nan)
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return (float(p50), float(p95), float(p99))


class Metrics:
    """Accumulates what happened on each device since ``start``."""

    def __init__(self, n_devices: int, start: float = 0.0) -> None:
        self.start = start
        self.last = start
        # Plain lists: one-element updates on them are several times cheaper than on numpy arrays.
        self.completed = [0] * n_devices
        self.failed = [0] * n_devices
        self.busy = [0.0] * n_devices  # slot-seconds spent running items
        self.work = [0.0] * n_devices
        # One entry per completed item, in completion order: latency, device and cost.
        self.latency = array("d")
        self.latency_device = array("l")
        self.latency_cost = array("d")

    def add_device(self) -> None:
        self.completed.append(0)
        self.failed.append(0)
        self.busy.append(0.0)
        self.work.append(0.0)

    def record(self, index: int, latency: float, busy: float, cost: float, now: float) -> None:
        """One item finished successfully on device ``index``."""
        self.completed[index] += 1
        self.busy[index] += busy
        self.work[index] += cost
        self.latency.append(latency)
        self.latency_device.append(index)
        self.latency_cost.append(cost)
        if now > self.last:
            self.last = now

    def record_failure(self, index: int, busy: float, now: float) -> None:
        if index >= 0:
            self.failed[index] += 1
            self.busy[index] += busy
        if now > self.last:
            self.last = now

    def report(
        self, view: FleetView, until: float | None = None, kind: str = "default"
    ) -> FleetMetrics:
        """Metrics from ``start`` to ``until`` (default: the last completion)."""
        end = self.last if until is None else until
        elapsed = max(end - self.start, 1e-12)
        speed = view.speed(kind)
        completed = np.array(self.completed)
        work = np.array(self.work)
        util = np.array(self.busy) / (elapsed * view.slots)
        lat = np.frombuffer(self.latency, dtype=np.float64) if self.latency else np.zeros(0)
        dev = (
            np.frombuffer(self.latency_device, dtype=np.int_)
            if self.latency_device
            else np.zeros(0, int)
        )
        devices = []
        for i, d in enumerate(view.devices):
            p50, p95, p99 = _percentiles(lat[dev == i])
            devices.append(
                DeviceMetrics(
                    id=d.id,
                    model=d.model,
                    speed=float(speed[i]),
                    utilization=float(util[i]),
                    queue_length=int(view.in_flight[i] - view.running[i]),
                    completed=self.completed[i],
                    failed=self.failed[i],
                    work_done=self.work[i],
                    throughput=self.completed[i] / elapsed,
                    p50=p50,
                    p95=p95,
                    p99=p99,
                )
            )
        # The devices still usable at the end: one that failed is not the policy's to fill.
        usable = view.usable if view.usable.any() else np.ones(len(util), dtype=bool)
        total_work = float(work.sum())
        ideal = ideal_makespan(total_work, speed[usable].tolist())
        balance = load_balance(util[usable].tolist())
        uneven = imbalance(util[usable].tolist())
        ratio = efficiency(ideal, elapsed)
        p50, p95, p99 = _percentiles(lat)
        return FleetMetrics(
            elapsed=elapsed,
            completed=int(completed.sum()),
            failed=sum(self.failed),
            throughput=float(completed.sum() / elapsed),
            work_throughput=total_work / elapsed,
            mean=float(lat.mean()) if lat.size else math.nan,
            p50=p50,
            p95=p95,
            p99=p99,
            load_balance_factor=math.nan if balance is None else balance,
            makespan_efficiency=math.nan if ratio is None else ratio,
            devices=devices,
            imbalance=math.nan if uneven is None else uneven,
        )
