"""Which GPUs, how many, at which tensor-parallel degree, to serve one model within a TTFT/TPOT
SLO at the least cost per hour: a Mélange-style integer program over replica options.

1. **Length buckets**: the requests' prompt and output lengths are cut into a grid of quantile
   ranges (``prompt_buckets × output_buckets``); each non-empty cell is a bucket with its share
   of the traffic, its mean lengths and its design request (the longest within the SLO's
   percentile).
2. **Options**: each menu GPU at each tensor-parallel degree is an engine
   (:func:`hetero.serve.engine_model.engine_spec`: the model's memory fit on the devices, its
   step time from the catalog's TFLOPS, bandwidth and link), or the reason it is none (does not
   fit, a degree the model's heads do not split into, no link).
3. **Capacity**: per option and bucket, the requests per second one replica serves within the
   SLO (:func:`hetero.plan.replica_capacity.replica_capacity`), or why none.
4. **Program** (``scipy.optimize.milp``): replica counts per option, paid and owned, and the
   share of each bucket each option serves. Every bucket is served whole; an option's load
   (``Σ share × bucket rate / capacity``) stays within ``max_utilization`` of its replicas;
   devices stay within each GPU's ``max_count``, owned ones within ``owned``. The cheapest plan
   ($/h of paid devices) wins; among equally cheap ones, the one with the fewest devices.

The plan says why each GPU was or was not chosen, and the cheapest plan of each GPU alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.devices.catalog import get_catalog
from hetero.errors import ConfigError, InfeasiblePlan
from hetero.plan.replica_capacity import ReplicaCapacity, replica_capacity
from hetero.plan.serving_spec import TENSOR_PARALLEL_DEGREES, ServingPlanSpec
from hetero.plan.sizing import cheapest_then_fewest
from hetero.serve.engine_model import EngineSpec, engine_spec

__all__ = [
    "LengthBucket",
    "OptionPlan",
    "ReplicaOption",
    "ServingPlan",
    "ServingPlanner",
    "length_buckets",
    "plan_serving",
    "replica_options",
]

FloatArray = npt.NDArray[np.float64]
# Replicas of one option the program may choose when the menu gives no cap.
_MAX_REPLICAS = 10_000


@dataclass(frozen=True, slots=True)
class LengthBucket:
    """Requests whose prompt and output fall in one cell of the quantile grid."""

    index: int  # 1-based
    probability: float
    prompt_range: tuple[int, int]
    output_range: tuple[int, int]
    prompt_mean: float
    output_mean: float
    design_prompt: float  # the longest prompt the TTFT SLO is checked for
    design_total: float  # the longest request (prompt and output) a replica must hold

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "probability": self.probability,
            "prompt_tokens": list(self.prompt_range),
            "output_tokens": list(self.output_range),
            "prompt_mean": self.prompt_mean,
            "output_mean": self.output_mean,
            "design_prompt": self.design_prompt,
            "design_total": self.design_total,
        }


def _edges(values: FloatArray, count: int) -> FloatArray:
    """``count`` quantile ranges' edges, the lowest and highest values included."""
    edges: FloatArray = np.unique(np.quantile(values, np.linspace(0, 1, count + 1)))
    return edges


def length_buckets(spec: ServingPlanSpec) -> tuple[LengthBucket, ...]:
    """The non-empty cells of the prompt × output quantile grid. Half the SLO's miss budget
    goes to the longest requests: a bucket's design request is its longest, but no longer than
    that quantile of all requests."""
    prompt, output = spec.lengths
    w = spec.workload
    quantile = 1.0 - (1.0 - spec.slo.percentile / 100.0) / 2.0
    total = prompt + output
    cap_prompt, cap_total = np.quantile(prompt, quantile), np.quantile(total, quantile)
    p_edges, o_edges = _edges(prompt, w.prompt_buckets), _edges(output, w.output_buckets)
    # Each value in the cell of the highest edge at or below it (the last edge closes the
    # last cell).
    p_cell = np.clip(
        np.searchsorted(p_edges, prompt, side="right") - 1, 0, max(len(p_edges) - 2, 0)
    )
    o_cell = np.clip(
        np.searchsorted(o_edges, output, side="right") - 1, 0, max(len(o_edges) - 2, 0)
    )
    cells = p_cell * len(o_edges) + o_cell
    buckets: list[LengthBucket] = []
    for cell in np.unique(cells):
        mask = cells == cell
        p, o, t = prompt[mask], output[mask], total[mask]
        buckets.append(
            LengthBucket(
                index=len(buckets) + 1,
                probability=float(mask.mean()),
                prompt_range=(int(p.min()), int(p.max())),
                output_range=(int(o.min()), int(o.max())),
                prompt_mean=float(p.mean()),
                output_mean=max(1.0, float(o.mean())),
                design_prompt=float(min(p.max(), max(p.min(), cap_prompt))),
                design_total=float(min(t.max(), max(t.min(), cap_total))),
            )
        )
    return tuple(buckets)


@dataclass(frozen=True, slots=True)
class ReplicaOption:
    """One GPU type at one tensor-parallel degree: its engine, or why it cannot serve."""

    gpu: str
    tensor_parallel: int
    device_price: float  # $ per device-hour
    engine: EngineSpec | None
    reason: str | None = None

    @property
    def name(self) -> str:
        return self.gpu if self.tensor_parallel == 1 else f"{self.gpu} ×{self.tensor_parallel}"

    @property
    def price(self) -> float:
        """$ per replica-hour."""
        return self.device_price * self.tensor_parallel


def replica_options(spec: ServingPlanSpec) -> tuple[ReplicaOption, ...]:
    """Every menu GPU at each of its degrees (default 1, 2, 4, 8 up to its ``max_count``)."""
    catalog = get_catalog()
    options = []
    for entry in spec.devices:
        row = catalog.get(entry.model)
        price = entry.price if entry.price is not None else row.price_per_hour
        assert price is not None  # parse_serving_plan refuses an entry with no price anywhere
        degrees = entry.tensor_parallel or tuple(
            k for k in TENSOR_PARALLEL_DEGREES if entry.max_count is None or k <= entry.max_count
        )
        for k in degrees:
            if entry.max_count is not None and k > entry.max_count:
                reason = f"TP {k} needs {k} devices; max_count is {entry.max_count}"
                options.append(ReplicaOption(row.model, k, price, None, reason))
                continue
            try:
                engine = engine_spec(
                    spec.shape, row, tensor_parallel=k, calibration=entry.calibration()
                )
            except ConfigError as exc:
                reason = "; ".join(message for _, message in exc.problems)
                options.append(ReplicaOption(row.model, k, price, None, reason))
                continue
            options.append(ReplicaOption(row.model, k, price, engine))
    return tuple(options)


@dataclass(frozen=True, slots=True)
class OptionPlan:
    """The replicas of one option in a plan."""

    option: ReplicaOption
    replicas: int
    owned_devices: int
    utilization: float  # planned load / (replicas × capacity), 0..max_utilization
    buckets: Mapping[int, float]  # bucket index -> share of it served here
    tpot: float  # predicted at the planned load (seconds)
    ttft: float

    @property
    def devices(self) -> int:
        return self.replicas * self.option.tensor_parallel

    @property
    def price(self) -> float:
        """$ per hour for the devices not owned."""
        return (self.devices - self.owned_devices) * self.option.device_price

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.option.gpu,
            "tensor_parallel": self.option.tensor_parallel,
            "replicas": self.replicas,
            "devices": self.devices,
            "owned_devices": self.owned_devices,
            "price_per_hour": self.price,
            "utilization": self.utilization,
            "headroom": 1.0 / self.utilization - 1.0 if self.utilization > 0 else None,
            "predicted_tpot": self.tpot,
            "predicted_ttft": self.ttft,
            "kv_tokens": self.option.engine.kv_tokens if self.option.engine else None,
            "buckets": {str(b): s for b, s in self.buckets.items()},
        }


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """The cheapest fleet for the model, why each GPU was or was not chosen, and the cheapest
    fleet of each GPU alone."""

    model: str
    options: tuple[OptionPlan, ...]  # chosen options only
    buckets: tuple[LengthBucket, ...]
    rate: float
    why: Mapping[str, str]  # per menu GPU
    single_type: Mapping[str, float | str]  # per menu GPU: $/h alone, or why it cannot
    solve_seconds: float
    max_utilization: float  # the cap each option's load was planned within
    capacity: Mapping[str, Sequence[float]] = field(default_factory=dict)  # option -> per bucket

    @property
    def price_per_hour(self) -> float:
        return sum(o.price for o in self.options)

    @property
    def price_per_million_requests(self) -> float:
        return self.price_per_hour / (self.rate * 3600) * 1e6

    @property
    def devices(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.options:
            out[o.option.gpu] = out.get(o.option.gpu, 0) + o.devices
        return out

    @property
    def replicas(self) -> dict[str, int]:
        return {o.option.name: o.replicas for o in self.options}

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "rate": self.rate,
            "price_per_hour": self.price_per_hour,
            "price_per_million_requests": self.price_per_million_requests,
            "devices": self.devices,
            "replicas": self.replicas,
            "options": [o.to_dict() for o in self.options],
            "why": dict(self.why),
            "single_type": dict(self.single_type),
            "buckets": [b.to_dict() for b in self.buckets],
            "capacity_requests_per_second": {k: list(v) for k, v in self.capacity.items()},
            "solve_seconds": self.solve_seconds,
            "max_utilization": self.max_utilization,
        }


@dataclass(frozen=True, slots=True)
class _Problem:
    options: tuple[ReplicaOption, ...]
    buckets: tuple[LengthBucket, ...]
    capacity: tuple[tuple[ReplicaCapacity | None, ...], ...]  # [option][bucket]
    rate: FloatArray  # requests/s per bucket
    cap: FloatArray  # [option, bucket] requests/s, 0 where not eligible
    utilization: float
    max_devices: Mapping[str, int | None]
    owned: Mapping[str, int]
    budget: float | None


def _problem(spec: ServingPlanSpec) -> _Problem:
    buckets = length_buckets(spec)
    options = replica_options(spec)
    slo = spec.slo
    table = tuple(
        tuple(
            replica_capacity(
                o.engine,
                b.prompt_mean,
                b.output_mean,
                ttft=slo.ttft,
                tpot=slo.tpot,
                design_prompt=b.design_prompt,
                design_total=b.design_total,
            )
            if o.engine is not None
            else None
            for b in buckets
        )
        for o in options
    )
    cap = np.array([[c.rate if c is not None else 0.0 for c in row] for row in table])
    return _Problem(
        options=options,
        buckets=buckets,
        capacity=table,
        rate=np.array([spec.workload.rate * b.probability for b in buckets]),
        cap=cap.reshape(len(options), len(buckets)),
        utilization=spec.max_utilization,
        max_devices={d.model: d.max_count for d in spec.devices},
        owned={d.model: d.owned for d in spec.devices},
        budget=spec.max_price_per_hour,
    )


def _solve(
    p: _Problem, allowed: npt.NDArray[np.bool_], budget: float | None
) -> tuple[FloatArray, FloatArray, FloatArray] | None:
    """``(paid replicas, owned replicas, shares[option, bucket])`` of the cheapest plan using
    only ``allowed`` options (fewest devices among equally cheap ones), or None."""
    from scipy.optimize import Bounds, LinearConstraint  # slow to import: only to plan

    n_o, n_b = p.cap.shape
    usable = (p.cap > 0) & allowed[:, None]
    n_vars = 2 * n_o + n_o * n_b  # paid[o], own[o], x[o, b]
    share = slice(2 * n_o, n_vars)
    tp = np.array([o.tensor_parallel for o in p.options], dtype=float)
    price = np.zeros(n_vars)
    price[:n_o] = [o.price for o in p.options]
    devices = np.zeros(n_vars)
    devices[:n_o] = devices[n_o : 2 * n_o] = tp
    rows: list[tuple[FloatArray, float, float]] = []
    with np.errstate(divide="ignore"):
        per_replica = np.where(usable, p.rate[None, :] / np.where(usable, p.cap, 1.0), 0.0)
    for o in range(n_o):  # load within max_utilization of the replicas
        row = np.zeros(n_vars)
        row[o] = row[n_o + o] = -p.utilization
        row[2 * n_o + o * n_b : 2 * n_o + (o + 1) * n_b] = per_replica[o]
        rows.append((row, -np.inf, 0.0))
    for b in range(n_b):  # every bucket served whole
        row = np.zeros(n_vars)
        row[2 * n_o + b :: n_b] = 1.0
        rows.append((row, 1.0, 1.0))
    for gpu in {o.gpu for o in p.options}:
        mine = np.array([o.gpu == gpu for o in p.options], dtype=float) * tp
        if (limit := p.max_devices.get(gpu)) is not None:
            row = np.zeros(n_vars)
            row[:n_o] = row[n_o : 2 * n_o] = mine
            rows.append((row, -np.inf, float(limit)))
        row = np.zeros(n_vars)
        row[n_o : 2 * n_o] = mine
        rows.append((row, -np.inf, float(p.owned.get(gpu, 0))))
    if budget is not None:
        rows.append((price, -np.inf, budget))
    matrix = np.array([r[0] for r in rows])
    constraints = [LinearConstraint(matrix, [r[1] for r in rows], [r[2] for r in rows])]
    # A replica count never needs to exceed what carries every bucket it may serve alone.
    need = np.ceil((per_replica * usable).sum(axis=1) / p.utilization) + 1
    upper_count = np.where(allowed & usable.any(axis=1), np.minimum(need, _MAX_REPLICAS), 0)
    upper = np.concatenate((upper_count, upper_count, usable.astype(float).ravel()))
    bounds = Bounds(np.zeros(n_vars), upper)
    integrality = np.concatenate((np.ones(2 * n_o), np.zeros(n_o * n_b)))
    x = cheapest_then_fewest(price, devices, constraints, bounds, integrality)
    if x is None:
        return None
    return (
        np.round(x[:n_o]),
        np.round(x[n_o : 2 * n_o]),
        np.clip(x[share].reshape(n_o, n_b), 0.0, 1.0),
    )


def _at_load(
    option: ReplicaOption,
    bucket_caps: Sequence[ReplicaCapacity | None],
    shares: FloatArray,
    rates: FloatArray,
    replicas: int,
) -> tuple[float, float]:
    """Predicted ``(tpot, ttft)`` of the option's replicas at their planned load: the
    capacity-weighted mix of its buckets' figures at the batch the load keeps running."""
    weights = shares * rates
    if replicas == 0 or weights.sum() <= 0:
        return math.nan, math.nan
    tpot = ttft = 0.0
    for w, cap in zip(weights / weights.sum(), bucket_caps, strict=True):
        if w > 0 and cap is not None and cap.eligible:
            tpot += w * cap.tpot
            ttft += w * cap.ttft
    return tpot, ttft


def plan_serving(spec: ServingPlanSpec) -> ServingPlan:
    """The cheapest fleet serving ``spec``'s model and traffic within its SLO. Raises
    :class:`InfeasiblePlan` naming why none does: the model fits no offered GPU (naming the
    smallest that fits), no GPU meets the SLO (naming the best achievable), or the caps or the
    budget are too tight."""
    return ServingPlanner(spec).plan()


class ServingPlanner:
    """A spec's options and their capacity per length bucket, worked out once; :meth:`plan`
    then solves for any request rate (what an autoscaler asks again and again)."""

    def __init__(self, spec: ServingPlanSpec) -> None:
        started = time.perf_counter()
        self.spec = spec
        self.problem = _problem(spec)
        self.setup_seconds = time.perf_counter() - started

    def plan(
        self,
        rate: float | None = None,
        *,
        explain: bool = True,
        only: Collection[tuple[str, int]] | None = None,
    ) -> ServingPlan:
        """The cheapest fleet at ``rate`` requests/s (default the spec's), of the options
        ``only`` names (``(GPU, tensor-parallel degree)``; default every one). Without
        ``explain``, the single-type fleets and the reasons are left out (one solve, not one
        per GPU more)."""
        started = time.perf_counter()
        spec = self.spec
        p = self.problem
        if rate is not None and rate != spec.workload.rate:
            p = replace(p, rate=p.rate * (rate / spec.workload.rate))
        allowed = np.array(
            [only is None or (o.gpu, o.tensor_parallel) in only for o in p.options], dtype=bool
        )
        solution = _solve(p, allowed, p.budget)
        if solution is None:
            raise _why_not(spec, p)
        chosen = _chosen(p, *solution)
        singles = _singles(p) if explain else {}
        return ServingPlan(
            model=spec.shape.name,
            options=chosen,
            buckets=p.buckets,
            rate=float(p.rate.sum()),
            why=_why(p, chosen, singles) if explain else {},
            single_type=singles,
            solve_seconds=time.perf_counter() - started + (self.setup_seconds if explain else 0),
            max_utilization=spec.max_utilization,
            capacity={o.name: p.cap[i].tolist() for i, o in enumerate(p.options) if o.engine},
        )


def _chosen(
    p: _Problem, paid: FloatArray, owned: FloatArray, shares: FloatArray
) -> tuple[OptionPlan, ...]:
    chosen = []
    for o, option in enumerate(p.options):
        replicas = int(paid[o] + owned[o])
        if not replicas:
            continue
        load = float((shares[o] * p.rate / np.where(p.cap[o] > 0, p.cap[o], 1.0)).sum())
        tpot, ttft = _at_load(option, p.capacity[o], shares[o], p.rate, replicas)
        chosen.append(
            OptionPlan(
                option=option,
                replicas=replicas,
                owned_devices=int(owned[o]) * option.tensor_parallel,
                utilization=load / replicas,
                buckets={
                    b.index: float(shares[o, i])
                    for i, b in enumerate(p.buckets)
                    if shares[o, i] > 1e-9
                },
                tpot=tpot,
                ttft=ttft,
            )
        )
    return tuple(chosen)


def _singles(p: _Problem) -> dict[str, float | str]:
    """Per GPU, the $/h of the cheapest plan of it alone (owned devices free), or why none."""
    out: dict[str, float | str] = {}
    for gpu in dict.fromkeys(o.gpu for o in p.options):
        allowed = np.array([o.gpu == gpu for o in p.options])
        solution = _solve(p, allowed, None)
        if solution is None:
            out[gpu] = _gpu_reason(p, gpu) or _unserved(p, allowed)
            continue
        paid = solution[0]
        out[gpu] = float(sum(paid[o] * p.options[o].price for o in range(len(p.options))))
    return out


def _unserved(p: _Problem, allowed: npt.NDArray[np.bool_]) -> str:
    """Why the ``allowed`` options alone cannot carry the load: the buckets none of them
    serves within the SLO, or the cap."""
    missing = [b.index for i, b in enumerate(p.buckets) if not p.cap[allowed, i].any()]
    if missing:
        share = sum(p.buckets[i - 1].probability for i in missing)
        return (
            f"serves no request of buckets {', '.join(map(str, missing))} ({share:.0%} of "
            "requests) within the SLO"
        )
    return "cannot carry the whole load within its max_count"


def _gpu_reason(p: _Problem, gpu: str) -> str | None:
    """Why ``gpu`` can serve no bucket at any degree, or None when it can serve some."""
    mine = [(i, o) for i, o in enumerate(p.options) if o.gpu == gpu]
    if any(p.cap[i].any() for i, _ in mine):
        return None
    fitting = [(i, o) for i, o in mine if o.engine is not None]
    if not fitting:
        return "; ".join(f"TP {o.tensor_parallel}: {o.reason}" for _, o in mine)
    i, o = fitting[-1]
    caps = [c for c in p.capacity[i] if c is not None]
    return f"at TP {o.tensor_parallel}: {caps[0].reason}" if caps else None


def _why(
    p: _Problem, chosen: Sequence[OptionPlan], singles: Mapping[str, float | str]
) -> dict[str, str]:
    out: dict[str, str] = {}
    by_gpu: dict[str, list[OptionPlan]] = {}
    for c in chosen:
        by_gpu.setdefault(c.option.gpu, []).append(c)
    # $ per million requests at full capacity, on the bucket mix it could serve.
    for gpu in dict.fromkeys(o.gpu for o in p.options):
        if gpu in by_gpu:
            parts = []
            for c in by_gpu[gpu]:
                served = ", ".join(str(b) for b in c.buckets)
                owned = f", {c.owned_devices} owned" if c.owned_devices else ""
                parts.append(
                    f"{c.replicas} × TP {c.option.tensor_parallel}{owned} for buckets "
                    f"{served} at {c.utilization:.0%} of capacity"
                )
            out[gpu] = "chosen: " + "; ".join(parts)
            continue
        reason = _gpu_reason(p, gpu)
        if reason is not None:
            out[gpu] = "not chosen: " + reason
            continue
        cost = _cost_per_million(p, gpu)
        limit = p.max_devices.get(gpu)
        if limit == 0:
            out[gpu] = "not chosen: max_count is 0"
        else:
            alone = singles.get(gpu)
            tail = (
                f"alone it would cost ${alone:,.2f}/h"
                if isinstance(alone, float)
                else f"alone it {alone}"
            )
            out[gpu] = f"not chosen: ${cost:,.2f} per million requests at capacity; {tail}"
    return out


def _cost_per_million(p: _Problem, gpu: str) -> float:
    """The least $ per million requests of ``gpu`` at any degree, on the buckets it serves."""
    best = math.inf
    for i, o in enumerate(p.options):
        if o.gpu != gpu or not p.cap[i].any():
            continue
        ok = p.cap[i] > 0
        mix = p.rate[ok] / p.rate[ok].sum()
        seconds = float((mix / p.cap[i][ok]).sum())  # replica-seconds per request
        best = min(best, o.price * seconds / 3600 * 1e6 / p.utilization)
    return best


def _why_not(spec: ServingPlanSpec, p: _Problem) -> InfeasiblePlan:
    if not any(o.engine is not None for o in p.options):
        offered = ", ".join(dict.fromkeys(o.gpu for o in p.options))
        return InfeasiblePlan(
            "model",
            f"{spec.shape.name} fits none of {offered} at any tensor-parallel degree offered; "
            f"{_smallest_fit(spec)}",
        )
    unserved = [b for i, b in enumerate(p.buckets) if not p.cap[:, i].any()]
    if unserved:
        b = unserved[0]
        best = _best_achievable(p, p.buckets.index(b))
        return InfeasiblePlan(
            "slo",
            f"no offered GPU serves bucket {b.index} (prompts {b.prompt_range[0]:,}–"
            f"{b.prompt_range[1]:,}, outputs {b.output_range[0]:,}–{b.output_range[1]:,} tokens,"
            f" {b.probability:.1%} of requests) within TTFT {spec.slo.ttft:g} s and TPOT "
            f"{spec.slo.tpot * 1e3:g} ms; {best}",
        )
    if p.budget is not None:
        free = _solve(p, np.ones(len(p.options), dtype=bool), None)
        if free is not None:
            cost = float(sum(free[0][o] * p.options[o].price for o in range(len(p.options))))
            return InfeasiblePlan(
                "max_price_per_hour",
                f"the cheapest fleet meeting the SLO costs ${cost:,.2f}/h, above "
                f"max_price_per_hour ${p.budget:,.2f}",
            )
    caps = ", ".join(f"{g} {n}" for g, n in p.max_devices.items() if n is not None)
    return InfeasiblePlan(
        "max_count",
        f"no fleet within max_count ({caps}) carries {p.rate.sum():g} requests/s within the SLO",
    )


def _best_achievable(p: _Problem, b: int) -> str:
    """The lowest TPOT and TTFT any option reaches for bucket ``b`` alone."""
    best_tpot = best_ttft = (math.inf, "")
    for i, o in enumerate(p.options):
        cap = p.capacity[i][b]
        if cap is None:
            continue
        best_tpot = min(best_tpot, (cap.tpot, o.name))
        best_ttft = min(best_ttft, (cap.ttft, o.name))
    if math.isinf(best_tpot[0]):
        reasons = {c.reason for row in p.capacity for c in (row[b],) if c is not None}
        return "; ".join(sorted(r for r in reasons if r)) or "no option fits"
    return (
        f"the best achievable is TPOT {best_tpot[0] * 1e3:,.1f} ms ({best_tpot[1]}) and TTFT "
        f"{best_ttft[0]:,.2f} s ({best_ttft[1]}), each alone on an idle replica"
    )


def _smallest_fit(spec: ServingPlanSpec) -> str:
    """The catalog GPU and degree with the least memory in all that hold the model."""
    best: tuple[float, str] | None = None
    for row in get_catalog():
        if row.kind.value != "gpu" or row.price_per_hour is None:
            continue
        for k in TENSOR_PARALLEL_DEGREES:
            try:
                engine_spec(spec.shape, row, tensor_parallel=k)
            except ConfigError:
                continue
            total = row.memory_bytes * k
            if best is None or total < best[0]:
                best = (total, f"{k} × {row.model}" if k > 1 else row.model)
            break
    if best is None:
        return "no GPU in the catalog holds it at up to 8 devices per replica"
    return f"the smallest fit in the catalog is {best[1]} ({best[0] / 1024**3:,.0f} GiB in all)"
