"""Checking a fleet plan in the simulator, and tightening it until the simulator agrees."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.errors import ConfigError
from hetero.plan.buckets import draw_requests
from hetero.plan.sizing import FleetPlan, plan_fleet
from hetero.plan.sizing_spec import PlanSpec
from hetero.sched.item import WorkItem
from hetero.sched.registry import make_policy
from hetero.sim.engine import Progress, Simulator

__all__ = [
    "TIGHTEN",
    "Verification",
    "plan_verified",
    "tighten",
    "verify",
]

#: The verify loop scales every utilisation cap by this much per failed round.
TIGHTEN = 0.85


@dataclass(frozen=True, slots=True)
class Verification:
    """How the plan did in the simulator."""

    requests: int
    attainment: float  # fraction of requests finished within the SLO latency
    target: float  # the SLO percentile as a fraction
    latency_at_percentile: float  # seconds, at the SLO percentile
    p50: float
    p99: float
    utilization: Mapping[str, float]  # mean over the devices of each type
    seed: int

    @property
    def meets_slo(self) -> bool:
        return self.attainment >= self.target

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "utilization": dict(self.utilization), "meets_slo": self.meets_slo}


def _arrivals(spec: PlanSpec, requests: int, seed: int) -> Iterator[tuple[float, WorkItem]]:
    """Poisson arrivals at the spec's rate, request costs from its length distributions."""
    time_rng, size_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    times = np.cumsum(time_rng.exponential(1.0 / spec.workload.rate, requests)).tolist()
    costs = draw_requests(spec.workload, size_rng, requests)[0].tolist()
    for i, (t, c) in enumerate(zip(times, costs, strict=True)):
        yield t, WorkItem(cost=c, id=i)


def verify(
    plan: FleetPlan,
    spec: PlanSpec,
    *,
    requests: int = 20_000,
    seed: int = 0,
    progress: Progress | None = None,
) -> Verification:
    """Run the planned fleet (emulated devices at the planned throughputs) through the simulator
    under ``shortest_expected_delay`` and measure SLO attainment."""
    if requests < 1:
        raise ConfigError([("requests", f"must be >= 1, got {requests}")])
    devices: list[Device] = []
    for t in plan.types:
        row = get_catalog().get(t.model)
        devices += [
            Device(
                id=f"{t.model.lower()}:{k}",
                spec=row,
                local_index=k,
                emulated=True,
                speed_override=t.throughput / spec.unit_rate,
            )
            for k in range(t.count)
        ]
    sim = Simulator(
        devices,
        make_policy("shortest_expected_delay", field="policy"),
        unit_rate=spec.unit_rate,
    )
    result = sim.run(
        _arrivals(spec, requests, seed),
        expected_duration=requests / spec.workload.rate,
        slo_latency=spec.slo.latency,
        total=requests,
        progress=progress,
    )
    by_model: dict[str, list[float]] = {}
    for d in result.metrics.devices:
        by_model.setdefault(d.model, []).append(d.utilization)
    latencies = result.latencies
    return Verification(
        requests=requests,
        attainment=float(result.slo_attainment or 0.0),
        target=spec.slo.percentile / 100.0,
        latency_at_percentile=float(np.percentile(latencies, spec.slo.percentile))
        if len(latencies)
        else math.inf,
        p50=result.metrics.p50,
        p99=result.metrics.p99,
        utilization={m: float(np.mean(u)) for m, u in by_model.items()},
        seed=seed,
    )


def plan_verified(
    spec: PlanSpec,
    *,
    requests: int = 20_000,
    seed: int = 0,
    rounds: int = 6,
    progress: Callable[[str], Progress] | None = None,
) -> tuple[FleetPlan, list[Verification]]:
    """Plan, verify, and while the simulator misses the SLO scale every utilisation cap by
    :data:`TIGHTEN` and re-solve (at most ``rounds`` plans). Returns the last plan and every
    round's verification; the last one says whether the plan finally meets the SLO.
    ``progress(name)`` gives the progress callback of each round's simulation, named
    ``plan 1``, ``plan 2``, ..."""
    return tighten(
        lambda scale: plan_fleet(spec, cap_scale=scale),
        lambda plan, bar: verify(plan, spec, requests=requests, seed=seed, progress=bar),
        rounds=rounds,
        progress=progress,
    )


class Check(Protocol):
    @property
    def meets_slo(self) -> bool: ...


PlanT = TypeVar("PlanT")
CheckT = TypeVar("CheckT", bound=Check)


def tighten(
    plan_at: Callable[[float], PlanT],
    check: Callable[[PlanT, Progress | None], CheckT],
    *,
    rounds: int,
    progress: Callable[[str], Progress] | None,
) -> tuple[PlanT, list[CheckT]]:
    """Plan with every cap scaled by 1, check it, and while the check misses the SLO scale the
    caps by :data:`TIGHTEN` and plan again, at most ``rounds`` plans: the last plan and every
    round's check. ``progress(name)`` gives round ``k``'s callback, named ``plan k``."""
    checks: list[CheckT] = []
    scale = 1.0
    while True:
        plan = plan_at(scale)
        result = check(plan, progress(f"plan {len(checks) + 1}") if progress else None)
        checks.append(result)
        if result.meets_slo or len(checks) >= rounds:
            return plan, checks
        scale *= TIGHTEN
