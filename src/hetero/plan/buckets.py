"""Length buckets of a fleet-sizing workload and the device menu resolved against the catalog."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import REFERENCE_TFLOPS, DeviceSpec
from hetero.plan.sizing_spec import PlanSLO, PlanSpec, PlanWorkload
from hetero.sched.item import CostModel
from hetero.sim.workload import FixedSize, LognormalSize, UniformSize

__all__ = [
    "BUCKET_SAMPLES",
    "Bucket",
    "DeviceOption",
    "draw_lengths",
    "draw_requests",
    "make_buckets",
    "menu",
]

#: Requests drawn (with a fixed seed) to find the length buckets: the bucket edges and means are
#: then stable to well under 1 % and every plan of a spec is the same.
BUCKET_SAMPLES = 200_000
_BUCKET_SEED = 20240601

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Bucket:
    """Requests whose cost falls in one quantile range of the request-cost distribution.

    ``design_cost`` is the request the eligibility rule checks: the bucket's upper edge, but no
    higher than the cost quantile that the SLO allows to miss (see ``docs/fleet-sizing.md``).
    """

    index: int  # 1-based, in increasing cost
    probability: float
    low: float  # work units
    high: float
    mean_cost: float
    mean_square_cost: float  # E[cost²] in the bucket: the service-time variability
    mean_tokens: float  # prompt + output tokens
    design_cost: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _draw(
    length: FixedSize | UniformSize | LognormalSize, rng: np.random.Generator, n: int
) -> FloatArray:
    """``n`` whole token counts from ``length``."""
    if isinstance(length, FixedSize):
        values = np.full(n, length.value)
    elif isinstance(length, UniformSize):
        values = rng.uniform(length.low, length.high, n)
    else:
        values = rng.lognormal(length.mu, length.sigma, n)
    whole: FloatArray = np.rint(values)
    return whole


def draw_lengths(
    prompt_tokens: FixedSize | UniformSize | LognormalSize,
    output_tokens: FixedSize | UniformSize | LognormalSize,
    rng: np.random.Generator,
    n: int,
) -> tuple[FloatArray, FloatArray]:
    """``(prompt tokens, output tokens)`` of ``n`` requests, whole numbers."""
    return _draw(prompt_tokens, rng, n), _draw(output_tokens, rng, n)


def draw_requests(
    workload: PlanWorkload, rng: np.random.Generator, n: int
) -> tuple[FloatArray, FloatArray]:
    """``(cost in work units, prompt + output tokens)`` of ``n`` requests."""
    model = CostModel()
    prompt, output = draw_lengths(workload.prompt_tokens, workload.output_tokens, rng, n)
    return prompt * model.prefill + output * model.decode, prompt + output


def make_buckets(workload: PlanWorkload, slo: PlanSLO) -> tuple[Bucket, ...]:
    """``workload.buckets`` equal-probability cost buckets (fewer when several coincide, as
    with fixed lengths), from :data:`BUCKET_SAMPLES` requests drawn with a fixed seed."""
    cost, tokens = draw_requests(workload, np.random.default_rng(_BUCKET_SEED), BUCKET_SAMPLES)
    order = np.argsort(cost, kind="stable")
    cost, tokens = cost[order], tokens[order]
    # Half the SLO's miss budget goes to the longest requests, half to queueing.
    allowed_miss = 1.0 - (1.0 - slo.percentile / 100.0) / 2.0
    design_cap = float(np.quantile(cost, allowed_miss))
    groups: list[tuple[int, int]] = []
    edges = np.linspace(0, len(cost), workload.buckets + 1).round().astype(int)
    for start, stop in itertools.pairwise(edges.tolist()):
        if stop <= start:
            continue
        if groups and cost[groups[-1][0]] == cost[stop - 1]:  # same single value: merge
            groups[-1] = (groups[-1][0], stop)
        else:
            groups.append((int(start), int(stop)))
    buckets = []
    for k, (start, stop) in enumerate(groups, start=1):
        low, high = float(cost[start]), float(cost[stop - 1])
        buckets.append(
            Bucket(
                index=k,
                probability=(stop - start) / len(cost),
                low=low,
                high=high,
                mean_cost=float(cost[start:stop].mean()),
                mean_square_cost=float(np.square(cost[start:stop]).mean()),
                mean_tokens=float(tokens[start:stop].mean()),
                design_cost=min(high, max(low, design_cap)),
            )
        )
    return tuple(buckets)


@dataclass(frozen=True, slots=True)
class DeviceOption:
    """One menu entry resolved: price, throughput in work units/s and where they came from."""

    model: str
    spec: DeviceSpec
    price: float
    throughput: float
    measured: bool
    max_count: int | None


def menu(spec: PlanSpec) -> tuple[DeviceOption, ...]:
    """The menu with catalog facts filled in (throughput: measured, else fp16 TFLOPS / 125 ×
    ``unit_rate``: the speed model the simulator's ``PerfModel`` uses)."""
    catalog = get_catalog()
    options = []
    for entry in spec.devices:
        row = catalog.get(entry.model)
        price = entry.price if entry.price is not None else row.price_per_hour
        assert price is not None  # parse_plan rejects an entry with no price anywhere
        measured = entry.tokens_per_second is not None
        throughput = (
            entry.tokens_per_second
            if entry.tokens_per_second is not None
            else max(row.peak_tflops("fp16") / REFERENCE_TFLOPS, 1e-6) * spec.unit_rate
        )
        options.append(DeviceOption(row.model, row, price, throughput, measured, entry.max_count))
    return tuple(options)
