"""Fleet sizing: the cheapest integer mix of device types that serves a workload within its SLO.

:func:`plan_fleet` takes a :class:`~hetero.plan.sizing_spec.PlanSpec` (workload, SLO, menu of
device types), splits the request-cost distribution into length buckets
(:mod:`hetero.plan.buckets`) and solves a mixed integer program (``scipy.optimize.milp``) for
device counts and the share of each bucket each type serves. :mod:`hetero.plan.verification`
replays a plan in the simulator and tightens the utilisation caps until the simulator agrees. The
queueing rule is documented in ``docs/fleet-sizing.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError, InfeasiblePlan
from hetero.plan.buckets import Bucket, DeviceOption, make_buckets, menu
from hetero.plan.sizing_spec import PlanSpec

__all__ = [
    "MAX_DEVICES_PER_TYPE",
    "FleetPlan",
    "InfeasiblePlan",
    "SingleTypeFleet",
    "TypePlan",
    "capacity_table",
    "cheapest_then_fewest",
    "plan_fleet",
]

#: Devices of one type the solver considers when the menu gives no max_count.
MAX_DEVICES_PER_TYPE = 4096

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TypePlan:
    """One menu type in a plan: how many, how busy, and which buckets it serves (share 0..1)."""

    model: str
    count: int
    price: float
    throughput: float
    measured: bool
    utilization: float  # planned load / (count × throughput); 0 when count is 0
    utilization_cap: float
    buckets: Mapping[int, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "count": self.count,
            "price_per_hour": self.price,
            "throughput": self.throughput,
            "throughput_source": "measured" if self.measured else "catalog",
            "utilization": self.utilization,
            "utilization_cap": self.utilization_cap,
            "buckets": {str(b): share for b, share in self.buckets.items()},
        }


@dataclass(frozen=True, slots=True)
class SingleTypeFleet:
    """The cheapest fleet of one type alone, or why that type alone cannot meet the SLO."""

    model: str
    count: int | None
    price_per_hour: float | None
    price_per_million_tokens: float | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """The cheapest mix meeting the SLO, with the single-type fleets to compare it with."""

    types: tuple[TypePlan, ...]
    buckets: tuple[Bucket, ...]
    tokens_per_hour: float
    load: float  # work units per second the workload brings
    cap_scale: float  # every utilisation cap was multiplied by this (the verify loop lowers it)
    solve_seconds: float
    single_type: tuple[SingleTypeFleet, ...] = field(default=())

    @property
    def mix(self) -> dict[str, int]:
        return {t.model: t.count for t in self.types if t.count}

    @property
    def devices(self) -> int:
        return sum(t.count for t in self.types)

    @property
    def price_per_hour(self) -> float:
        return sum(t.count * t.price for t in self.types)

    @property
    def price_per_million_tokens(self) -> float:
        return self.price_per_hour / self.tokens_per_hour * 1e6

    def to_dict(self) -> dict[str, Any]:
        return {
            "mix": self.mix,
            "devices": self.devices,
            "price_per_hour": self.price_per_hour,
            "price_per_million_tokens": self.price_per_million_tokens,
            "tokens_per_hour": self.tokens_per_hour,
            "load_work_units_per_second": self.load,
            "cap_scale": self.cap_scale,
            "solve_seconds": self.solve_seconds,
            "types": [t.to_dict() for t in self.types],
            "buckets": [b.to_dict() for b in self.buckets],
            "single_type": [s.to_dict() for s in self.single_type],
        }


def _eligible(
    options: Sequence[DeviceOption], buckets: Sequence[Bucket], latency: float
) -> npt.NDArray[np.bool_]:
    """Bucket ``b`` may run on type ``t`` when its design request takes at most half the SLO
    latency there: the other half is the waiting budget of :func:`capacity_table`."""
    design = np.array([b.design_cost for b in buckets])
    speed = np.array([o.throughput for o in options])
    ok: npt.NDArray[np.bool_] = design[None, :] / speed[:, None] <= latency / 2
    return ok


def _wait_tail(n: FloatArray, rho: FloatArray, wait: FloatArray) -> FloatArray:
    """Erlang C: ``P(W > wait)`` in an M/M/n queue at utilisation ``rho`` (``wait`` in mean
    service times), through the Poisson form of Erlang B, which is stable for large ``n``."""
    from scipy.stats import poisson  # scipy takes most of a second to import: only when planning

    a = n * rho
    log_b = poisson.logpmf(n, a) - poisson.logcdf(n, a)
    b = np.exp(log_b)
    c = b / (1.0 - rho * (1.0 - b))
    tail: FloatArray = c * np.exp(-n * (1.0 - rho) * wait)
    return tail


def capacity_table(
    throughput: float,
    mean_service: float,
    scv: float,
    n_max: int,
    latency: float,
    miss: float,
    ceiling: float,
) -> FloatArray:
    """Work units/s that ``n`` devices of one type may carry, for ``n = 0 .. n_max``.

    The largest utilisation (at most ``ceiling``) at which ``n`` pooled devices keep
    ``P(wait > latency / 2) <= miss``: the M/M/n (Erlang C) tail with its decay slowed by
    ``(1 + scv) / 2`` for service times of squared coefficient of variation ``scv`` (the
    Kingman / Allen–Cunneen correction for M/G/n). Found by bisection (the tail grows with
    utilisation), for every ``n`` at once.
    """
    n = np.arange(1, n_max + 1, dtype=np.float64)
    wait = np.full(n_max, latency / 2 / (mean_service * (1.0 + scv) / 2.0))
    low, high = np.zeros(n_max), np.full(n_max, ceiling)
    ok = _wait_tail(n, high, wait) <= miss
    for _ in range(40):  # 2^-40 of the ceiling: far below anything a fleet notices
        mid = (low + high) / 2
        good = _wait_tail(n, mid, wait) <= miss
        low = np.where(good, mid, low)
        high = np.where(good, high, mid)
    rho = np.where(ok, ceiling, low)
    return np.concatenate(([0.0], n * rho * throughput))


@dataclass(frozen=True, slots=True)
class _Problem:
    """The MILP's data."""

    options: tuple[DeviceOption, ...]
    buckets: tuple[Bucket, ...]
    eligible: npt.NDArray[np.bool_]  # [type, bucket]
    capacity: tuple[FloatArray, ...]  # per type: work units/s of n devices, n = 0 .. its limit
    bucket_load: FloatArray  # work units/s per bucket
    budget: float | None
    latency: float


def _problem(spec: PlanSpec, cap_scale: float) -> _Problem:
    options = menu(spec)
    buckets = make_buckets(spec.workload, spec.slo)
    eligible = _eligible(options, buckets, spec.slo.latency)
    load = np.array([spec.workload.rate * b.probability * b.mean_cost for b in buckets])
    prob = np.array([b.probability for b in buckets])
    mean = np.array([b.mean_cost for b in buckets])
    square = np.array([b.mean_square_cost for b in buckets])
    total = float(load.sum())
    miss = (1.0 - spec.slo.percentile / 100.0) / 2  # the queueing half of the miss budget
    ceiling = spec.max_utilization * cap_scale
    tables = []
    for t, option in enumerate(options):
        mask = eligible[t]
        if not mask.any():
            tables.append(np.zeros(1))
            continue
        # Service-time moments of everything the type may serve (the MILP picks the shares).
        weight = prob[mask] / prob[mask].sum()
        mean_cost = float(weight @ mean[mask])
        scv = float(weight @ square[mask]) / mean_cost**2 - 1.0
        service = mean_cost / option.throughput
        # Enough devices to carry the whole load alone, or max_count.
        limit = option.max_count if option.max_count is not None else MAX_DEVICES_PER_TYPE
        n_max = min(limit, math.ceil(total / (ceiling * option.throughput)) + 1)
        table = capacity_table(
            option.throughput, service, scv, n_max, spec.slo.latency, miss, ceiling
        )
        while option.max_count is None and table[-1] < total and n_max < limit:
            n_max = min(limit, 2 * n_max)
            table = capacity_table(
                option.throughput, service, scv, n_max, spec.slo.latency, miss, ceiling
            )
        if option.max_count is None and table[-1] >= total:
            table = table[: int(np.argmax(table >= total)) + 1]  # more would never be chosen
        tables.append(table)
    return _Problem(
        options, buckets, eligible, tuple(tables), load, spec.max_price_per_hour, spec.slo.latency
    )


def cheapest_then_fewest(
    price: FloatArray,
    devices: FloatArray,
    constraints: list[Any],
    bounds: Any,
    integrality: FloatArray,
) -> FloatArray | None:
    """The solution of the mixed integer program of least ``price``, and among the equally
    cheap ones the one of fewest ``devices`` (both per variable), or None if it has none."""
    from scipy.optimize import LinearConstraint, milp  # see _wait_tail

    first = milp(price, constraints=constraints, bounds=bounds, integrality=integrality)
    if first.x is None:
        return None
    best = float(first.fun)
    cheapest = LinearConstraint(price, -np.inf, best + 1e-9 * max(best, 1.0))
    second = milp(
        devices, constraints=[*constraints, cheapest], bounds=bounds, integrality=integrality
    )
    x: FloatArray = second.x if second.x is not None else first.x
    return x


def _solve(
    p: _Problem, allowed: npt.NDArray[np.bool_], budget: float | None
) -> tuple[list[int], FloatArray] | None:
    """``(counts, shares[type, bucket])`` of the cheapest fleet (fewest devices among equally
    cheap ones) using only ``allowed`` types, or None if there is none.

    Variables: ``z[t, n]`` (binary: type ``t`` has exactly ``n >= 1`` devices) then
    ``x[t, b]`` (share of bucket ``b`` on ``t``). The capacity of ``n`` devices is not linear
    in ``n`` (pooling helps), so each count is its own binary with its own capacity.
    """
    from scipy.optimize import Bounds, LinearConstraint  # see _wait_tail

    n_t, n_b = p.eligible.shape
    sizes = [len(table) - 1 if allowed[t] else 0 for t, table in enumerate(p.capacity)]
    z_start = np.concatenate(([0], np.cumsum(sizes))).astype(int)
    n_z = int(z_start[-1])
    n_vars = n_z + n_t * n_b
    price = np.zeros(n_vars)
    devices = np.zeros(n_vars)
    one_count = np.zeros((n_t, n_vars))  # at most one count per type
    load = np.zeros((n_t, n_vars))  # load on t <= capacity of its count
    for t in range(n_t):
        z = slice(z_start[t], z_start[t + 1])
        n = np.arange(1, sizes[t] + 1)
        price[z] = p.options[t].price * n
        devices[z] = n
        one_count[t, z] = 1.0
        load[t, z] = -p.capacity[t][1 : sizes[t] + 1]
        load[t, n_z + t * n_b : n_z + (t + 1) * n_b] = p.bucket_load
    cover = np.zeros((n_b, n_vars))  # every bucket fully served: sum_t x[t, b] = 1
    for b in range(n_b):
        cover[b, n_z + b :: n_b] = 1.0
    constraints = [
        LinearConstraint(cover, 1.0, 1.0),
        LinearConstraint(load, -np.inf, 0.0),
        LinearConstraint(one_count, 0.0, 1.0),
    ]
    if budget is not None:
        constraints.append(LinearConstraint(price, -np.inf, budget))
    share_upper = (p.eligible & allowed[:, None]).astype(float).ravel()
    bounds = Bounds(np.zeros(n_vars), np.concatenate((np.ones(n_z), share_upper)))
    integrality = np.concatenate((np.ones(n_z), np.zeros(n_t * n_b)))
    x = cheapest_then_fewest(price, devices, constraints, bounds, integrality)
    if x is None:
        return None
    chosen = np.round(x[:n_z])
    counts = [
        int(chosen[z_start[t] : z_start[t + 1]] @ np.arange(1, sizes[t] + 1)) for t in range(n_t)
    ]
    return counts, np.clip(x[n_z:].reshape(n_t, n_b), 0.0, 1.0)


def _why_not(p: _Problem, allowed: npt.NDArray[np.bool_]) -> InfeasiblePlan:
    """Which constraint makes a plan over the ``allowed`` types infeasible (budget aside)."""
    options = p.options
    speed = np.array([o.throughput for o in options])
    usable = p.eligible & allowed[:, None]
    for b, bucket in enumerate(p.buckets):
        if usable[:, b].any():
            continue
        fastest = max((t for t in range(len(options)) if allowed[t]), key=lambda t: speed[t])
        seconds = bucket.design_cost / speed[fastest]
        return InfeasiblePlan(
            "slo",
            f"bucket {bucket.index} ({bucket.low:,.0f}–{bucket.high:,.0f} work units, mean "
            f"{bucket.mean_tokens:,.0f} tokens) takes {seconds:.2f} s for its "
            f"{bucket.design_cost:,.0f}-work-unit design request on the fastest type "
            f"{options[fastest].model}, above half the {p.latency:g} s SLO (the other half is "
            "the queueing budget)",
        )
    # Eligibility is a speed threshold, so the types able to serve a bucket shrink as buckets
    # grow: checking capacity over these nested sets is exact (Hall's condition).
    capacity = np.array([table[-1] for table in p.capacity])
    for b in reversed(range(len(p.buckets))):
        types = usable[:, b]
        if b and (usable[:, b - 1] == types).all():
            continue  # the smallest bucket this set of types serves alone holds the check
        need = float(p.bucket_load[b:].sum())
        have = float(capacity[types].sum())
        if need <= have * (1 + 1e-9):
            continue
        who = ", ".join(o.model for o, ok in zip(options, types, strict=True) if ok)
        last = len(p.buckets)
        which = f"bucket {last}" if b + 1 == last else f"buckets {b + 1}–{last}"
        if b == 0:
            return InfeasiblePlan(
                "max_count",
                f"max_count caps the fleet of {who} at {have:,.0f} work units/s within the SLO, "
                f"the workload needs {need:,.0f}",
            )
        return InfeasiblePlan(
            "max_count",
            f"max_count caps {who} at {have:,.0f} work units/s within the SLO; {which}, "
            f"which only {'they' if ',' in who else 'it'} can serve "
            f"in half the {p.latency:g} s SLO, need {need:,.0f}",
        )
    limits = ", ".join(f"{o.model} {len(t) - 1}" for o, t in zip(options, p.capacity, strict=True))
    return InfeasiblePlan(
        "max_count",
        f"no fleet within {limits} devices carries {p.bucket_load.sum():,.0f} work units/s",
    )


def _tokens_per_hour(spec: PlanSpec, buckets: Sequence[Bucket]) -> float:
    return spec.workload.rate * sum(b.probability * b.mean_tokens for b in buckets) * 3600.0


def plan_fleet(spec: PlanSpec, *, cap_scale: float = 1.0) -> FleetPlan:
    """The cheapest fleet meeting ``spec``'s SLO, plus each single type's cheapest fleet.

    ``cap_scale`` (0 < s <= 1) multiplies every utilisation cap: :func:`plan_verified` lowers
    it when the simulator finds the plan misses its SLO. Raises :class:`InfeasiblePlan` naming
    the binding constraint.
    """
    if not 0 < cap_scale <= 1:
        raise ConfigError(f"cap_scale must be in (0, 1], got {cap_scale!r}")
    started = time.perf_counter()
    p = _problem(spec, cap_scale)
    everything = np.ones(len(p.options), dtype=bool)
    solution = _solve(p, everything, p.budget)
    if solution is None:
        if p.budget is not None and (free := _solve(p, everything, None)) is not None:
            cheapest = sum(c * o.price for c, o in zip(free[0], p.options, strict=True))
            raise InfeasiblePlan(
                "max_price_per_hour",
                f"the cheapest fleet meeting the SLO costs ${cheapest:,.2f}/hour, above "
                f"max_price_per_hour ${p.budget:,.2f}",
            )
        raise _why_not(p, everything)
    tokens = _tokens_per_hour(spec, p.buckets)
    singles = tuple(_single(p, t, tokens) for t in range(len(p.options)))
    counts, shares = solution
    types = []
    for t, option in enumerate(p.options):
        count = int(counts[t])
        used = float(shares[t] @ p.bucket_load)
        types.append(
            TypePlan(
                model=option.model,
                count=count,
                price=option.price,
                throughput=option.throughput,
                measured=option.measured,
                utilization=used / (count * option.throughput) if count else 0.0,
                utilization_cap=float(p.capacity[t][count]) / (count * option.throughput)
                if count
                else 0.0,
                buckets={
                    bucket.index: float(shares[t, b])
                    for b, bucket in enumerate(p.buckets)
                    if shares[t, b] > 1e-9
                },
            )
        )
    return FleetPlan(
        types=tuple(types),
        buckets=p.buckets,
        tokens_per_hour=tokens,
        load=float(p.bucket_load.sum()),
        cap_scale=cap_scale,
        solve_seconds=time.perf_counter() - started,
        single_type=singles,
    )


def _single(p: _Problem, t: int, tokens_per_hour: float) -> SingleTypeFleet:
    allowed = np.zeros(len(p.options), dtype=bool)
    allowed[t] = True
    model = p.options[t].model
    solution = _solve(p, allowed, None)  # the budget is the mix's business, not the comparison's
    if solution is None:
        return SingleTypeFleet(model, None, None, None, str(_why_not(p, allowed)))
    count = solution[0][t]
    price = count * p.options[t].price
    return SingleTypeFleet(model, count, price, price / tokens_per_hour * 1e6, None)
