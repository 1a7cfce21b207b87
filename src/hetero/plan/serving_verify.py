"""Checking a serving plan by running it: every planned replica an engine-faithful emulated
engine (``hetero.sim.engine_fleet``: continuous batching, chunked prefill, a paged KV cache, the
same step times the plan was made from), the router's dispatcher placing Poisson requests of
the spec's lengths on them, and each request's TTFT and TPOT measured against the SLO."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hetero.errors import ConfigError
from hetero.plan.serving import ServingPlan, plan_serving
from hetero.plan.serving_spec import ServingPlanSpec
from hetero.plan.verification import tighten
from hetero.serve.records import RouterOptions
from hetero.sim.engine_fleet import EngineFleetSimulator

__all__ = [
    "VERIFY_STRATEGY",
    "ServingVerification",
    "serving_plan_verified",
    "verify_serving",
]

#: The router's strategy in the check: the one that routes by the same TTFT/TPOT targets.
VERIFY_STRATEGY = "slo"

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class ServingVerification:
    """How the plan did: the share of requests within both SLOs, and the percentiles."""

    requests: int
    attainment: float
    target: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    tpot_p99: float
    failed: int
    utilization: Mapping[str, float]  # per option name, mean over its replicas
    max_utilization: float  # the cap the plan was made with
    seed: int

    @property
    def meets_slo(self) -> bool:
        return self.attainment >= self.target

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "utilization": dict(self.utilization), "meets_slo": self.meets_slo}


def _arrivals(spec: ServingPlanSpec, requests: int, seed: int) -> Iterator[tuple[float, int, int]]:
    """Poisson arrivals at the spec's rate, lengths drawn from the requests the plan's buckets
    were made from."""
    time_rng, size_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    times = np.cumsum(time_rng.exponential(1.0 / spec.workload.rate, requests))
    prompt, output = spec.lengths
    pick = size_rng.integers(0, len(prompt), requests)
    for t, i in zip(times.tolist(), pick.tolist(), strict=True):
        yield t, max(1, int(prompt[i])), max(1, int(output[i]))


def verify_serving(
    plan: ServingPlan,
    spec: ServingPlanSpec,
    *,
    requests: int = 5_000,
    seed: int = 0,
    progress: Progress | None = None,
) -> ServingVerification:
    """Run ``plan``'s replicas under the router's ``slo`` strategy with the spec's SLO and
    measure how many requests meet it."""
    if requests < 1:
        raise ConfigError([("requests", f"must be >= 1, got {requests}")])
    replicas = [
        (f"{o.option.name}:{k}", o.option.engine)
        for o in plan.options
        if o.option.engine is not None
        for k in range(o.replicas)
    ]
    slo = spec.slo
    sim = EngineFleetSimulator(
        replicas,
        options=RouterOptions(strategy=VERIFY_STRATEGY, slo_ttft=slo.ttft, slo_tpot=slo.tpot),
        priors="engine",  # a planned replica is declared with its GPU and model
    )
    arrivals = _arrivals(spec, requests, seed)
    if progress is not None:
        arrivals = _counted(arrivals, requests, progress)
    result = sim.run(arrivals, slo=(slo.ttft, slo.tpot))
    done = result.done
    ttft, tpot = result.ttft[done], result.tpot[done]
    busy: dict[str, list[float]] = {}
    for report in result.replicas:
        busy.setdefault(report.name.rsplit(":", 1)[0], []).append(report.utilisation)

    def pct(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values, q)) if len(values) else math.inf

    return ServingVerification(
        requests=requests,
        attainment=result.attainment(slo.ttft, slo.tpot),
        target=slo.percentile / 100.0,
        ttft_p50=pct(ttft, 50),
        ttft_p99=pct(ttft, 99),
        tpot_p50=pct(tpot, 50),
        tpot_p99=pct(tpot, 99),
        failed=int((~done).sum()),
        utilization={name: float(np.mean(u)) for name, u in busy.items()},
        max_utilization=plan.max_utilization,
        seed=seed,
    )


def _counted(
    arrivals: Iterator[tuple[float, int, int]], total: int, progress: Progress
) -> Iterator[tuple[float, int, int]]:
    for i, arrival in enumerate(arrivals, start=1):
        yield arrival
        if i % 100 == 0 or i == total:
            progress(i, total)


def serving_plan_verified(
    spec: ServingPlanSpec,
    *,
    requests: int = 5_000,
    seed: int = 0,
    rounds: int = 6,
    progress: Callable[[str], Progress] | None = None,
) -> tuple[ServingPlan, list[ServingVerification]]:
    """Plan, check, and while the check misses the SLO scale ``max_utilization`` by
    ``hetero.plan.verification.TIGHTEN`` and plan again (at most ``rounds`` plans). Returns the
    last plan and every round's check; the last says whether the plan finally meets the SLO.
    ``progress(name)`` gives each round's progress callback."""
    return tighten(
        lambda scale: plan_serving(replace_utilization(spec, spec.max_utilization * scale)),
        lambda plan, bar: verify_serving(plan, spec, requests=requests, seed=seed, progress=bar),
        rounds=rounds,
        progress=progress,
    )


def replace_utilization(spec: ServingPlanSpec, value: float) -> ServingPlanSpec:
    """``spec`` with another ``max_utilization``, its drawn lengths kept."""
    copy = spec.model_copy(update={"max_utilization": value})
    if "lengths" in spec.__dict__:  # a cached_property: carry the draw over
        copy.__dict__["lengths"] = spec.__dict__["lengths"]
    return copy
