"""Fleet sizing: the cheapest integer mix of device types that serves a workload within its SLO.

A plan spec (YAML/JSON, or built in Python) names the workload (request rate and token-length
distributions), the SLO (latency at a percentile) and a menu of device types::

    workload:
      rate: 40                                              # requests per second
      prompt_tokens: {dist: lognormal, mean: 1024, sigma: 1.0}
      output_tokens: {dist: fixed, value: 256}
      buckets: 10
    slo: {latency: 4.0, percentile: 99}
    devices:
      - {model: A100-80GB}                                  # catalog price and speed
      - {model: L4, price: 0.85, tokens_per_second: 2600}   # a measured profile wins
      - {model: H100-SXM-80GB, max_count: 8}

:func:`plan_fleet` splits the request-cost distribution into length buckets and solves a mixed
integer program (``scipy.optimize.milp``) for device counts and the share of each bucket each
type serves. :func:`verify` replays the plan in the simulator; :func:`plan_verified` tightens the
utilisation caps and re-solves until the simulator agrees. The queueing rule is documented in
``docs/fleet-sizing.md``.
"""

from __future__ import annotations

import difflib
import itertools
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import numpy.typing as npt
import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.stats import poisson

from hetero._errors_render import render_path, show
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import REFERENCE_TFLOPS, Device, DeviceSpec
from hetero.errors import AllocationError, ConfigError, HeteroError
from hetero.sched.item import CostModel, WorkItem
from hetero.sched.registry import make_policy
from hetero.sim.engine import Progress, Simulator
from hetero.sim.workload import FixedSize, LognormalSize, UniformSize

__all__ = [
    "DEFAULT_UNIT_RATE",
    "Bucket",
    "DeviceOption",
    "FleetPlan",
    "InfeasiblePlan",
    "MenuEntry",
    "PlanSLO",
    "PlanSpec",
    "PlanWorkload",
    "SingleTypeFleet",
    "TypePlan",
    "Verification",
    "capacity_table",
    "load_plan",
    "make_buckets",
    "menu",
    "parse_plan",
    "plan_fleet",
    "plan_verified",
    "verify",
]

#: Work units per second of a speed-1.0 device (a V100 at fp16). A catalog estimate of a type's
#: throughput is its fp16 TFLOPS / 125 × this: about a 7B-parameter model served with continuous
#: batching. Measured ``tokens_per_second`` replaces the estimate; ``unit_rate`` in the spec
#: replaces this constant.
DEFAULT_UNIT_RATE = 2500.0
#: Requests drawn (with a fixed seed) to find the length buckets: the bucket edges and means are
#: then stable to well under 1 % and every plan of a spec is the same.
BUCKET_SAMPLES = 200_000
_BUCKET_SEED = 20240601
#: Devices of one type the solver considers when the menu gives no max_count.
MAX_DEVICES_PER_TYPE = 4096
#: The verify loop scales every utilisation cap by this much per failed round.
TIGHTEN = 0.85

FloatArray = npt.NDArray[np.float64]


# --- the spec ---------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _bare_length(value: Any) -> Any:
    """A bare number is a fixed length: ``output_tokens: 256``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Length = Annotated[
    FixedSize | UniformSize | LognormalSize,
    Field(discriminator="dist"),
    BeforeValidator(_bare_length),
]


class PlanWorkload(_Strict):
    """What arrives: Poisson requests at ``rate`` per second, token lengths from distributions."""

    rate: float = Field(gt=0, description="requests per second")
    prompt_tokens: Length
    output_tokens: Length
    buckets: int = Field(default=10, ge=1, le=200, description="length buckets to plan with")


class PlanSLO(_Strict):
    """``percentile`` % of requests finish within ``latency`` seconds of arriving."""

    latency: float = Field(gt=0, description="seconds from arrival to completion")
    percentile: float = Field(default=99.0, gt=0, lt=100)


class MenuEntry(_Strict):
    """One device type on the menu. Missing ``price``/``tokens_per_second`` come from the catalog.

    ``tokens_per_second`` is a measured throughput in work units per second (prompt tokens count
    0.5, output tokens 1.0, as :class:`~hetero.sched.item.CostModel` weighs them).
    """

    model: str = Field(min_length=1)
    price: float | None = Field(default=None, ge=0, description="$ per device-hour")
    tokens_per_second: float | None = Field(default=None, gt=0)
    max_count: int | None = Field(default=None, ge=0)

    @field_validator("model")
    @classmethod
    def _known(cls, value: str) -> str:
        try:
            return get_catalog().get(value).model
        except HeteroError as exc:
            raise ValueError(str(exc)) from None


class PlanSpec(_Strict):
    """A whole plan spec; see the module docstring."""

    workload: PlanWorkload
    slo: PlanSLO
    devices: list[MenuEntry] = Field(min_length=1)
    max_utilization: float = Field(default=0.8, gt=0, lt=1)
    max_price_per_hour: float | None = Field(default=None, gt=0)
    unit_rate: float = Field(default=DEFAULT_UNIT_RATE, gt=0)


def load_plan(path: str | Path, overrides: Mapping[str, Any] | None = None) -> PlanSpec:
    """Read and validate a plan spec file; ``overrides`` are merged over it (nested mappings
    key by key) before validation, e.g. ``{"workload": {"rate": 80}}``."""
    path = Path(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError([("", f"cannot read plan spec {str(path)!r}: {reason}")]) from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            [("", f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError([("", f"{path}: invalid YAML{where}: {exc}")]) from None
    if overrides and isinstance(data, dict):
        data = _merge(data, overrides)
    return parse_plan(data, source=str(path))


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_plan(data: Any, source: str = "<plan>") -> PlanSpec:
    """Validate parsed YAML/JSON data; raises ``ConfigError`` listing every problem at once."""
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"{source}: expected a mapping with workload, slo and devices; got {show(data)}")]
        )
    problems: list[tuple[str, str]] = []
    spec: PlanSpec | None = None
    try:
        spec = PlanSpec.model_validate(data)
    except ValidationError as exc:
        problems += _problems(exc)
    # Checks across fields run on every entry that is valid by itself, so one bad field does not
    # hide a missing price elsewhere.
    entries = data.get("devices")
    if isinstance(entries, list):
        problems += [p for p in _menu_problems(entries) if p not in problems]
    if problems:
        raise ConfigError(problems)
    assert spec is not None
    return spec


def _menu_problems(entries: list[Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(entries):
        try:
            entry = MenuEntry.model_validate(raw)
        except ValidationError:
            continue  # reported with the spec's own errors
        spec = get_catalog().get(entry.model)
        if entry.price is None and spec.price_per_hour is None:
            problems.append(
                (
                    f"devices[{i}].price",
                    f"{entry.model} has no price in the catalog; give price: $ per device-hour",
                )
            )
        if entry.model in seen:
            problems.append(
                (
                    f"devices[{i}].model",
                    f"{entry.model} is already on the menu as devices[{seen[entry.model]}]; "
                    "list each type once",
                )
            )
        seen.setdefault(entry.model, i)
    return problems


_LENGTHS: dict[str, type[BaseModel]] = {
    "fixed": FixedSize,
    "uniform": UniformSize,
    "lognormal": LognormalSize,
}
_NESTED: dict[str, type[BaseModel] | dict[str, type[BaseModel]]] = {
    "workload": PlanWorkload,
    "slo": PlanSLO,
    "devices": MenuEntry,
    "prompt_tokens": _LENGTHS,
    "output_tokens": _LENGTHS,
}


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for err in exc.errors():
        loc: list[int | str] = []
        model: type[BaseModel] | dict[str, type[BaseModel]] | None = PlanSpec
        parent = model
        for part in err["loc"]:
            if isinstance(part, int):
                loc.append(part)
            elif isinstance(model, dict):  # a length's ``dist`` tag: not part of the path
                model = model.get(part)
            else:
                loc.append(part)
                parent, model = model, _NESTED.get(part)
        path = render_path(loc)
        kind = err["type"]
        ctx = err.get("ctx") or {}
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            allowed = ", ".join(_LENGTHS)
            got = f"unknown dist {ctx.get('tag')!r}" if kind == "union_tag_invalid" else "missing"
            problems.append((f"{path}.dist", f"{got}; allowed: {allowed}"))
        elif kind == "extra_forbidden":
            fields = sorted(parent.model_fields) if isinstance(parent, type) else []
            close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                (
                    path,
                    f"unknown key {str(loc[-1])!r}; {hint}allowed keys: "
                    f"{', '.join(fields) or 'none'}",
                )
            )
        elif kind == "missing":
            problems.append((path, "required field is missing"))
        else:
            message = str(err["msg"]).removeprefix("Value error, ")
            if "unknown device model" not in message:
                message += f" (got {show(err.get('input'))})"
            problems.append((path, message))
    return list(dict.fromkeys(problems))


# --- buckets and the menu ---------------------------------------------------------------------


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
        return {
            "index": self.index,
            "probability": self.probability,
            "low": self.low,
            "high": self.high,
            "mean_cost": self.mean_cost,
            "mean_square_cost": self.mean_square_cost,
            "mean_tokens": self.mean_tokens,
            "design_cost": self.design_cost,
        }


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


def _requests(
    workload: PlanWorkload, rng: np.random.Generator, n: int
) -> tuple[FloatArray, FloatArray]:
    """``(cost in work units, prompt + output tokens)`` of ``n`` requests."""
    model = CostModel()
    prompt = _draw(workload.prompt_tokens, rng, n)
    output = _draw(workload.output_tokens, rng, n)
    return prompt * model.prefill + output * model.decode, prompt + output


def make_buckets(workload: PlanWorkload, slo: PlanSLO) -> tuple[Bucket, ...]:
    """``workload.buckets`` equal-probability cost buckets (fewer when several coincide, as
    with fixed lengths), from :data:`BUCKET_SAMPLES` requests drawn with a fixed seed."""
    cost, tokens = _requests(workload, np.random.default_rng(_BUCKET_SEED), BUCKET_SAMPLES)
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


# --- the plan ---------------------------------------------------------------------------------


class InfeasiblePlan(AllocationError):
    """No fleet from the menu meets the SLO; ``constraint`` names what binds:
    ``"slo"`` (a bucket is too slow everywhere), ``"max_count"`` or ``"max_price_per_hour"``."""

    def __init__(self, constraint: str, message: str) -> None:
        self.constraint = constraint
        super().__init__(message)


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
        return {
            "model": self.model,
            "count": self.count,
            "price_per_hour": self.price_per_hour,
            "price_per_million_tokens": self.price_per_million_tokens,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """The cheapest mix meeting the SLO, with the single-type fleets to compare it with."""

    types: tuple[TypePlan, ...]
    buckets: tuple[Bucket, ...]
    price_per_hour: float
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


def _solve(
    p: _Problem, allowed: npt.NDArray[np.bool_], budget: float | None
) -> tuple[list[int], FloatArray] | None:
    """``(counts, shares[type, bucket])`` of the cheapest fleet (fewest devices among equally
    cheap ones) using only ``allowed`` types, or None if there is none.

    Variables: ``z[t, n]`` (binary: type ``t`` has exactly ``n >= 1`` devices) then
    ``x[t, b]`` (share of bucket ``b`` on ``t``). The capacity of ``n`` devices is not linear
    in ``n`` (pooling helps), so each count is its own binary with its own capacity.
    """
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
    first = milp(price, constraints=constraints, bounds=bounds, integrality=integrality)
    if first.x is None:
        return None
    # Among the cheapest fleets, the one with the fewest devices.
    best = float(first.fun)
    cheapest = LinearConstraint(price, -np.inf, best + 1e-9 * max(best, 1.0))
    second = milp(
        devices, constraints=[*constraints, cheapest], bounds=bounds, integrality=integrality
    )
    x = second.x if second.x is not None else first.x
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
        raise ValueError(f"cap_scale must be in (0, 1], got {cap_scale!r}")
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
        price_per_hour=sum(c * o.price for c, o in zip(counts, p.options, strict=True)),
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


# --- verification in the simulator -----------------------------------------------------------


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
        return {
            "requests": self.requests,
            "attainment": self.attainment,
            "target": self.target,
            "meets_slo": self.meets_slo,
            "latency_at_percentile": self.latency_at_percentile,
            "p50": self.p50,
            "p99": self.p99,
            "utilization": dict(self.utilization),
            "seed": self.seed,
        }


def _arrivals(spec: PlanSpec, requests: int, seed: int) -> Iterator[tuple[float, WorkItem]]:
    """Poisson arrivals at the spec's rate, request costs from its length distributions."""
    time_rng, size_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    times = np.cumsum(time_rng.exponential(1.0 / spec.workload.rate, requests)).tolist()
    costs = _requests(spec.workload, size_rng, requests)[0].tolist()
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
    progress: Callable[[int], Progress] | None = None,
) -> tuple[FleetPlan, list[Verification]]:
    """Plan, verify, and while the simulator misses the SLO scale every utilisation cap by
    :data:`TIGHTEN` and re-solve (at most ``rounds`` plans). Returns the last plan and every
    round's verification; the last one says whether the plan finally meets the SLO.
    ``progress(round)`` gives the progress callback of each round's simulation."""
    checks: list[Verification] = []
    scale = 1.0
    while True:
        plan = plan_fleet(spec, cap_scale=scale)
        check = verify(
            plan,
            spec,
            requests=requests,
            seed=seed,
            progress=progress(len(checks) + 1) if progress else None,
        )
        checks.append(check)
        if check.meets_slo or len(checks) >= rounds:
            return plan, checks
        scale *= TIGHTEN
