"""Which devices of a fleet suit a piece of work: filter out the ones that cannot run it, then
score and rank the rest.

The work is inference (requests) or training (samples). Filters (all run on every device, so
each one gets every reason): health, free memory, required capabilities, an estimated-latency
SLO, a minimum throughput and a price ceiling. Criteria: compute (peak TFLOPS of the dtype),
bandwidth (memory GB/s), features (share of preferred capabilities) and cost efficiency (work
per dollar). Each criterion is divided by the best *eligible* device's figure, so a score
reads "this fraction of the best", and the total is the weighted sum. See ``docs/matching.md``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DTYPES, Device, DeviceSpec
from hetero.errors import ConfigError
from hetero.plan.models import ModelShape
from hetero.units import format_size

__all__ = [
    "CRITERIA",
    "DEFAULT_BANDWIDTH_EFFICIENCY",
    "DEFAULT_COMPUTE_EFFICIENCY",
    "MEMORY_BOUND_SHIFT",
    "TRAINING_FLOPS_PER_PARAMETER",
    "Criterion",
    "FilterResult",
    "Match",
    "Requirements",
    "ScoreWeights",
    "known_capabilities",
    "match",
    "training_flops",
]

#: The scored criteria, in the order tables and weights list them.
CRITERIA: tuple[str, ...] = ("compute", "bandwidth", "features", "cost")

#: Share of peak TFLOPS that real training/inference reaches: PaLM reports 46% model FLOPs
#: utilisation, Megatron-LM 52% of A100 peak (sources in docs/matching.md).
DEFAULT_COMPUTE_EFFICIENCY = 0.5

#: Share of peak memory bandwidth that streaming kernels reach: microbenchmarks measure about
#: 70-85% on V100 and T4 (sources in docs/matching.md).
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8

#: Share of the compute weight moved to bandwidth for memory-bound work. Decode-like work reads
#: every weight once per step, so its speed follows bandwidth (the roofline's slanted side); a
#: quarter stays on compute for the compute-bound parts around it (prefill, batching).
MEMORY_BOUND_SHIFT = 0.75

#: FLOPs to train one token per parameter it passes through: 2 forward, 4 backward (Kaplan et
#: al., "Scaling Laws for Neural Language Models", 2020: C ≈ 6N per token).
TRAINING_FLOPS_PER_PARAMETER = 6


def training_flops(model: ModelShape, seq: int) -> float:
    """FLOPs to train on one sample of ``seq`` tokens: 6 × active parameters × tokens.

    Attention's own FLOPs (which grow with ``seq``) and recomputation under activation
    checkpointing (a second forward pass: 8 instead of 6) are left out.
    """
    return float(TRAINING_FLOPS_PER_PARAMETER * model.active_params * seq)


@cache
def known_capabilities() -> frozenset[str]:
    """Every capability name the catalog uses (``fp8``, ``nvlink``, ``mig``, ...)."""
    return frozenset(name for spec in get_catalog() for name in spec.capabilities)


def _suggest(value: str, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, allowed, n=3, cutoff=0.5)
    return f"closest: {', '.join(close)}; " if close else ""


def _capability_problems(name: str, values: frozenset[str]) -> list[tuple[str, str]]:
    known = sorted(known_capabilities())
    return [
        (name, f"unknown capability {value!r}; {_suggest(value, known)}known: {', '.join(known)}")
        for value in sorted(values - known_capabilities())
    ]


def _number_problems(
    name: str, value: float | None, *, positive: bool, at_most_one: bool = False
) -> list[tuple[str, str]]:
    """``value`` must be a finite number, > 0 (``positive``) or >= 0, and <= 1 if asked."""
    if value is None:
        return []
    allowed = "a number " + ("> 0" if positive else ">= 0") + (" and <= 1" if at_most_one else "")
    bad = (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (value <= 0 if positive else value < 0)
        or (at_most_one and value > 1)
    )
    return [(name, f"got {value!r}; expected {allowed}")] if bad else []


@dataclass(frozen=True, slots=True)
class Requirements:
    """What one piece of work needs from a device (validated on construction).

    The work is inference, one request at a time, or with ``train`` training, one sample at a
    time. ``work_flops`` and ``bytes_moved`` describe one request (or sample); with either, a
    device's time for one is estimated as ``max(flops / (peak TFLOPS x compute_efficiency),
    bytes / (bandwidth x bandwidth_efficiency))`` and checked against ``latency_slo`` seconds
    (inference only) and its inverse against ``min_throughput`` (requests or samples per
    second).
    """

    memory_bytes: int = 0
    require: frozenset[str] = frozenset()
    prefer: frozenset[str] = frozenset()
    dtype: str = "bf16"
    memory_bound: bool = False
    work_flops: float | None = None
    bytes_moved: float | None = None
    latency_slo: float | None = None
    max_price_per_hour: float | None = None
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    train: bool = False
    min_throughput: float | None = None

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        for name in ("require", "prefer"):
            value = getattr(self, name)
            if isinstance(value, str):
                problems.append((name, f"got the string {value!r}; expected a set of names"))
                continue
            object.__setattr__(self, name, frozenset(value))
            problems += _capability_problems(name, getattr(self, name))
        if isinstance(self.memory_bytes, bool) or not isinstance(self.memory_bytes, int):
            problems.append(("memory_bytes", f"got {self.memory_bytes!r}; expected an int >= 0"))
        else:
            problems += _number_problems("memory_bytes", self.memory_bytes, positive=False)
        if self.dtype not in DTYPES:
            problems.append(
                (
                    "dtype",
                    f"unknown dtype {self.dtype!r}; {_suggest(str(self.dtype), DTYPES)}"
                    f"allowed: {', '.join(DTYPES)}",
                )
            )
        for name in ("work_flops", "bytes_moved", "latency_slo", "min_throughput"):
            problems += _number_problems(name, getattr(self, name), positive=True)
        problems += _number_problems("max_price_per_hour", self.max_price_per_hour, positive=False)
        for name in ("compute_efficiency", "bandwidth_efficiency"):
            problems += _number_problems(name, getattr(self, name), positive=True, at_most_one=True)
        if not isinstance(self.train, bool):
            problems.append(("train", f"got {self.train!r}; expected true or false"))
        for name in ("latency_slo", "min_throughput"):
            if (
                getattr(self, name) is not None
                and self.work_flops is None
                and self.bytes_moved is None
            ):
                problems.append(
                    (name, f"needs work_flops or bytes_moved to estimate a time per {self.unit}")
                )
        if self.train is True and self.latency_slo is not None:
            problems.append(
                (
                    "latency_slo",
                    "applies to inference requests; training is judged by its throughput: "
                    "give min_throughput (samples per second) instead",
                )
            )
        if problems:
            raise ConfigError(problems)

    @property
    def unit(self) -> str:
        """What one piece of the work is: ``"sample"`` when training, else ``"request"``."""
        return "sample" if self.train else "request"

    def estimate(self, spec: DeviceSpec) -> tuple[float, str] | None:
        """Seconds per request (or sample) on ``spec`` and what bounds it (``compute`` or
        ``memory``), or None when neither ``work_flops`` nor ``bytes_moved`` is known. No
        throughput: ``inf``."""
        times: list[tuple[float, str]] = []
        if self.work_flops is not None:
            rate = spec.peak_tflops(self.dtype) * 1e12 * self.compute_efficiency
            times.append((self.work_flops / rate if rate > 0 else math.inf, "compute"))
        if self.bytes_moved is not None:
            rate = spec.memory_bandwidth_gbs * 1e9 * self.bandwidth_efficiency
            times.append((self.bytes_moved / rate if rate > 0 else math.inf, "memory"))
        return max(times) if times else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["require"] = sorted(self.require)
        data["prefer"] = sorted(self.prefer)
        return data


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    """Relative importance of each criterion: non-negative, not all zero; only ratios matter."""

    compute: float = 0.4
    bandwidth: float = 0.3
    features: float = 0.1
    cost: float = 0.2

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        for name in CRITERIA:
            problems += _number_problems(f"weights.{name}", getattr(self, name), positive=False)
        if not problems and sum(getattr(self, name) for name in CRITERIA) <= 0:
            problems.append(("weights", "all weights are 0; give at least one a positive weight"))
        if problems:
            raise ConfigError(problems)

    @classmethod
    def parse(cls, text: str) -> ScoreWeights:
        """``"compute=0.4,cost=0.2"``; criteria not named get weight 0."""
        allowed = ", ".join(CRITERIA)
        values: dict[str, float] = {}
        problems: list[tuple[str, str]] = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, number = (s.strip() for s in part.partition("="))
            if not sep:
                problems.append(("weights", f"cannot read {part!r}; expected NAME=NUMBER"))
            elif name not in CRITERIA:
                hint = _suggest(name, CRITERIA)
                problems.append(
                    ("weights", f"unknown criterion {name!r}; {hint}allowed: {allowed}")
                )
            elif name in values:
                problems.append(("weights", f"{name!r} is given twice"))
            else:
                try:
                    values[name] = float(number)
                except ValueError:
                    problems.append(("weights", f"{name}={number!r} is not a number"))
        if not values and not problems:
            problems.append(
                ("weights", f"no weights in {text!r}; expected e.g. compute=0.5,cost=0.5")
            )
        if problems:
            raise ConfigError(problems)
        return cls(**{name: values.get(name, 0.0) for name in CRITERIA})

    def effective(self, memory_bound: bool = False) -> dict[str, float]:
        """Weights summing to 1, with ``MEMORY_BOUND_SHIFT`` of compute moved to bandwidth for
        memory-bound work."""
        raw = {name: float(getattr(self, name)) for name in CRITERIA}
        if memory_bound:
            moved = raw["compute"] * MEMORY_BOUND_SHIFT
            raw["compute"] -= moved
            raw["bandwidth"] += moved
        total = sum(raw.values())
        return {name: value / total for name, value in raw.items()}

    def to_dict(self) -> dict[str, float]:
        return {name: float(getattr(self, name)) for name in CRITERIA}


@dataclass(frozen=True, slots=True)
class FilterResult:
    """One filter's verdict on one device."""

    name: str
    passed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Criterion:
    """One criterion on one device: the raw figure, its score (figure / best eligible figure,
    in [0, 1]), the effective weight and the reason in words."""

    name: str
    value: float
    score: float
    weight: float
    reason: str


@dataclass(frozen=True, slots=True)
class Match:
    """How one device fares: eligible or not (and why), its scores and its weighted total."""

    device: Device
    eligible: bool
    filters: tuple[FilterResult, ...]
    criteria: tuple[Criterion, ...]
    total: float
    estimated_seconds: float | None

    @property
    def estimated_throughput(self) -> float | None:
        """Requests (samples, when training) per second: the inverse of ``estimated_seconds``."""
        return None if self.estimated_seconds is None else _rate(self.estimated_seconds)

    @property
    def scores(self) -> dict[str, float]:
        return {c.name: c.score for c in self.criteria}

    @property
    def reasons(self) -> list[str]:
        return [f.reason for f in self.filters] + [c.reason for c in self.criteria]

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.id,
            "model": self.device.model,
            "eligible": self.eligible,
            "total": self.total,
            "scores": self.scores,
            "values": {c.name: _finite(c.value) for c in self.criteria},
            "weights": {c.name: c.weight for c in self.criteria},
            "estimated_seconds": _finite(self.estimated_seconds),
            "estimated_throughput": self.estimated_throughput,
            "filters": {f.name: f.passed for f in self.filters},
            "reasons": self.reasons,
        }


def _finite(value: float | None) -> float | None:
    # JSON has no infinity: a device with no throughput or a free one reports null.
    return value if value is not None and math.isfinite(value) else None


def _figure(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _seconds(value: float) -> str:
    return "never (no throughput)" if math.isinf(value) else f"{value:.3g} s"


def _rate(seconds: float) -> float:
    return 0.0 if math.isinf(seconds) else 1 / seconds


def _filters(
    device: Device, req: Requirements, estimate: tuple[float, str] | None
) -> tuple[FilterResult, ...]:
    spec = device.spec
    free = device.state.memory_free
    missing = sorted(req.require - spec.capabilities)
    results = [
        FilterResult(
            "health", device.state.healthy, f"health: {'' if device.state.healthy else 'un'}healthy"
        ),
        FilterResult(
            "memory",
            free >= req.memory_bytes,
            f"memory: needs {format_size(req.memory_bytes)}, has {format_size(free)} free",
        ),
        FilterResult(
            "capabilities",
            not missing,
            f"capabilities: missing {', '.join(missing)}"
            if missing
            else f"capabilities: has {', '.join(sorted(req.require))}"
            if req.require
            else "capabilities: none required",
        ),
    ]
    if estimate is None:
        results.append(FilterResult("latency", True, "latency: no work size given, not checked"))
        results.append(
            FilterResult("throughput", True, "throughput: no work size given, not checked")
        )
    else:
        seconds, bound = estimate
        text = f"latency: est. {_seconds(seconds)} per {req.unit} ({bound}-bound)"
        if req.latency_slo is None:
            results.append(FilterResult("latency", True, f"{text}, no SLO"))
        else:
            ok = seconds <= req.latency_slo
            word = "within" if ok else "over"
            results.append(FilterResult("latency", ok, f"{text}, {word} SLO {req.latency_slo:g} s"))
        rate = _rate(seconds)
        text = f"throughput: est. {_figure(rate)} {req.unit}s/s"
        if req.min_throughput is None:
            results.append(FilterResult("throughput", True, f"{text}, no minimum"))
        else:
            ok = rate >= req.min_throughput
            word = "at least" if ok else "below"
            results.append(
                FilterResult("throughput", ok, f"{text}, {word} {req.min_throughput:g}/s")
            )
    price = spec.price_per_hour
    limit = req.max_price_per_hour
    if limit is None:
        price_text = "no price" if price is None else f"${price:.2f}/h"
        results.append(FilterResult("price", True, f"price: {price_text}, no limit"))
    elif price is None:
        results.append(
            FilterResult("price", False, f"price: no price, cannot check ${limit:.2f}/h")
        )
    else:
        ok = price <= limit
        word = "within" if ok else "over"
        results.append(FilterResult("price", ok, f"price: ${price:.2f}/h, {word} ${limit:.2f}/h"))
    # A rejection says so at the end of its own reason, so every line reads on its own.
    return tuple(
        r if r.passed else FilterResult(r.name, False, f"{r.reason}: rejected") for r in results
    )


def _raw_values(
    device: Device, req: Requirements, estimate: tuple[float, str] | None
) -> dict[str, tuple[float, str]]:
    """Each criterion's raw figure (higher is better) and how to say it."""
    spec = device.spec
    tflops = spec.peak_tflops(req.dtype)
    have = sorted(req.prefer & spec.capabilities)
    # With nothing preferred every device meets all (zero) preferences: a constant 1.
    features = (
        (
            len(have) / len(req.prefer),
            f"{len(have)} of {len(req.prefer)} preferred ({', '.join(have) or 'none'})",
        )
        if req.prefer
        else (1.0, "nothing preferred")
    )
    price = spec.price_per_hour
    if estimate is not None:
        # Requests (samples) per dollar: what one costs on this device, inverted.
        speed = 3600 * _rate(estimate[0])
        unit = f"{req.unit}s per $"
    elif req.memory_bound:
        speed, unit = spec.memory_bandwidth_gbs, "GB/s per $/h"
    else:
        speed, unit = tflops, f"{req.dtype} TFLOPS per $/h"
    if price is None:
        cost = (0.0, "no price")
    elif price <= 0:
        cost = (math.inf, "free")
    else:
        cost = (speed / price, f"{_figure(speed / price)} {unit} at ${price:.2f}/h")
    return {
        "compute": (tflops, f"{tflops:g} TFLOPS {req.dtype}"),
        "bandwidth": (spec.memory_bandwidth_gbs, f"{spec.memory_bandwidth_gbs:,.0f} GB/s"),
        "features": features,
        "cost": cost,
    }


def _ratio(value: float, best: float) -> float:
    if math.isinf(best):
        return 1.0 if math.isinf(value) else 0.0
    return min(value / best, 1.0) if best > 0 else 0.0


def match(
    devices: Sequence[Device], requirements: Requirements, weights: ScoreWeights | None = None
) -> list[Match]:
    """Every device of ``devices`` judged against ``requirements``, ranked best first.

    Eligible devices come first, by weighted total; ties go to the lower device id, so the
    order never depends on the input order. Scores divide by the best eligible device's figure
    (by the best of all devices when none is eligible, to show what would come closest).
    """
    weights_used = (weights or ScoreWeights()).effective(requirements.memory_bound)
    estimates = [requirements.estimate(d.spec) for d in devices]
    filters = [_filters(d, requirements, e) for d, e in zip(devices, estimates, strict=True)]
    raws = [_raw_values(d, requirements, e) for d, e in zip(devices, estimates, strict=True)]
    eligible = [all(f.passed for f in fs) for fs in filters]
    pool = [raw for raw, ok in zip(raws, eligible, strict=True) if ok] or raws
    best = {name: max((raw[name][0] for raw in pool), default=0.0) for name in CRITERIA}
    matches = []
    for device, estimate, fs, raw, ok in zip(
        devices, estimates, filters, raws, eligible, strict=True
    ):
        criteria = []
        for name in CRITERIA:
            value, text = raw[name]
            score = _ratio(value, best[name])
            above = " (above the best eligible)" if not ok and value > best[name] else ""
            criteria.append(
                Criterion(
                    name,
                    value,
                    score,
                    weights_used[name],
                    f"{name}: {text}, {score:.2f} of the best{above}",
                )
            )
        total = sum(c.weight * c.score for c in criteria)
        matches.append(
            Match(device, ok, fs, tuple(criteria), total, None if estimate is None else estimate[0])
        )
    return sorted(matches, key=lambda m: (not m.eligible, -m.total, m.device.id))
