"""What one simulation run produced: the metrics, the latencies and time series for plots."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.sched.metrics import FleetMetrics
from hetero.telemetry.measures import imbalance_grade

__all__ = ["SimResult", "TimeSeries"]


@dataclass(slots=True)
class TimeSeries:
    """Samples every ``interval`` simulated seconds: the final interval, which doubles each time
    the series fills (it keeps at most twice the simulator's ``samples``).

    ``utilization[k, d]`` is the fraction of device ``d``'s slots busy on average over the
    interval that ends at ``t[k]``; ``queue_length[k]`` the items waiting (pending + queued)
    fleet-wide at ``t[k]``.
    """

    interval: float
    t: npt.NDArray[np.float64]
    utilization: npt.NDArray[np.float64]
    queue_length: npt.NDArray[np.int64]


@dataclass(slots=True)
class SimResult:
    policy: str
    device_ids: list[str]
    device_models: list[str]
    metrics: FleetMetrics
    submitted: int
    completed: int
    failed: int
    rejected: int  # refused at admission (queue full): never admitted
    slo_latency: float | None
    slo_attainment: float | None  # completed within the SLO / submitted (rejected count as misses)
    events: int
    wall_seconds: float
    latencies: npt.NDArray[np.float64]  # of completed items, in completion order
    costs: npt.NDArray[np.float64]  # of the same items, in the same order
    series: TimeSeries
    failure_reasons: dict[str, int] = field(default_factory=dict)
    # With a prefix cache modelled: prompt blocks found cached / looked up (None without a cache
    # or a prompt), and per device (in device_ids' order) the blocks hit and looked up.
    prefix_hit_rate: float | None = None
    prefix_hits: npt.NDArray[np.int64] | None = None
    prefix_lookups: npt.NDArray[np.int64] | None = None

    @property
    def events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds > 0 else math.inf

    def summary(self) -> dict[str, Any]:
        """The comparison row: throughput, latency, SLO, balance, per-device utilization."""
        m = self.metrics
        return {
            "policy": self.policy,
            "submitted": self.submitted,
            "completed": self.completed,
            "failed": self.failed,
            "rejected": self.rejected,
            "throughput": m.throughput,
            "work_throughput": m.work_throughput,
            "mean": m.mean,
            "p50": m.p50,
            "p99": m.p99,
            "slo_attainment": self.slo_attainment,
            "load_balance_factor": m.load_balance_factor,
            "imbalance": m.imbalance,
            "imbalance_grade": imbalance_grade(m.imbalance),
            "makespan_efficiency": m.makespan_efficiency,
            "utilization": {d.id: d.utilization for d in m.devices},
            "simulated_seconds": m.elapsed,
            "events": self.events,
            "wall_seconds": self.wall_seconds,
            "events_per_second": self.events_per_second,
            "failure_reasons": dict(self.failure_reasons),
            "prefix_hit_rate": self.prefix_hit_rate,
        }
