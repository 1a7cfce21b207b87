"""Workloads for the simulator: what arrives, when, and how big each item is.

A workload file (YAML or JSON) is validated into a :class:`WorkloadSpec`; every problem in it is
reported at once through one :class:`~hetero.errors.ConfigError`, each as
``field.path: message (got VALUE)``. :func:`generate` turns a spec into ``(arrival time, item)``
pairs in time order, lazily and deterministically for a seed::

    requests: 100000
    arrivals: {process: poisson, load: 0.8}      # or rate: 250 (items/s); bursty; closed
    size: {dist: lognormal, mean: 300, sigma: 1.0}
    memory: 2GB
    priorities: {0: 0.9, 5: 0.1}
    slo: {latency: 2.0}
    failures: [{device: "a100-80gb:0", at: 30, recover: 90}]
    seed: 7

Sizes are work units: a device of speed ``s`` takes ``cost / s`` seconds for an item. ``load`` is
a fraction of the fleet's capacity (its total work units per second), so ``load: 0.8`` keeps any
fleet 80 % busy on average.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hetero._data_files import read_data_file
from hetero._errors_render import Nested, show, validation_problems
from hetero.errors import ConfigError
from hetero.sched.item import CostModel, WorkItem
from hetero.units import parse_size

__all__ = [
    "SLO",
    "BurstyArrivals",
    "ClosedArrivals",
    "DeviceFailure",
    "DrawnSize",
    "FixedSize",
    "LognormalSize",
    "PoissonArrivals",
    "TraceSize",
    "UniformSize",
    "WorkloadSpec",
    "arrival_rate",
    "generate",
    "load_workload",
    "mean_size",
    "parse_workload",
]

#: Items drawn per numpy call by :func:`generate`.
CHUNK = 65536
_MAX_TRACE_PROBLEMS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _rate_or_load(model: PoissonArrivals | BurstyArrivals) -> None:
    if (model.rate is None) == (model.load is None):
        if model.rate is None:
            raise ValueError(
                "give exactly one of 'rate' (items per second) or 'load' (fraction of fleet "
                "capacity, e.g. 0.8); neither was given"
            )
        raise ValueError(
            "give exactly one of 'rate' (items per second) or 'load' (fraction of fleet "
            f"capacity), not both (got rate={model.rate!r}, load={model.load!r})"
        )


class PoissonArrivals(_Strict):
    """Independent arrivals at a constant mean ``rate`` (items/s) or ``load`` (of capacity)."""

    process: Literal["poisson"]
    rate: float | None = Field(default=None, gt=0, description="items per second")
    load: float | None = Field(default=None, gt=0, description="fraction of fleet capacity")

    @model_validator(mode="after")
    def _one_of(self) -> PoissonArrivals:
        _rate_or_load(self)
        return self


class BurstyArrivals(_Strict):
    """A two-state (calm/burst) Markov-modulated Poisson process.

    ``rate`` or ``load`` is the long-run MEAN. Bursts last ``burst_seconds`` and calm spells
    ``calm_seconds`` on average (exponentially distributed); while bursting, items arrive
    ``burst_factor`` times as fast as while calm. The calm rate is chosen so that the long-run
    mean is ``rate``: ``calm = rate * (B + C) / (factor * B + C)``.
    """

    process: Literal["bursty"]
    rate: float | None = Field(default=None, gt=0, description="mean items per second")
    load: float | None = Field(default=None, gt=0, description="mean fraction of fleet capacity")
    burst_factor: float = Field(default=4.0, gt=1)
    burst_seconds: float = Field(default=1.0, gt=0)
    calm_seconds: float = Field(default=4.0, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> BurstyArrivals:
        _rate_or_load(self)
        return self

    def rates(self, mean: float) -> tuple[float, float]:
        """``(calm rate, burst rate)`` for a long-run mean of ``mean`` items/s."""
        b, c = self.burst_seconds, self.calm_seconds
        calm = mean * (b + c) / (self.burst_factor * b + c)
        return calm, calm * self.burst_factor


class ClosedArrivals(_Strict):
    """Every item arrives at t=0: a batch."""

    process: Literal["closed"]


def _bare_process(value: Any) -> Any:
    """Accept a bare process name as shorthand: ``arrivals: closed``."""
    return {"process": value} if isinstance(value, str) else value


def _bare_size(value: Any) -> Any:
    """Accept a bare number as shorthand for a fixed size: ``size: 5``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Arrivals = Annotated[
    PoissonArrivals | BurstyArrivals | ClosedArrivals,
    Field(discriminator="process"),
    BeforeValidator(_bare_process),
]


class FixedSize(_Strict):
    dist: Literal["fixed"]
    value: float = Field(gt=0, description="work units per item")


class UniformSize(_Strict):
    dist: Literal["uniform"]
    low: float = Field(ge=0)
    high: float = Field(gt=0)

    @field_validator("high")
    @classmethod
    def _above_low(cls, value: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if low is not None and not value > low:
            raise ValueError(f"must be greater than low={low!r} (got {value!r})")
        return value


class LognormalSize(_Strict):
    """Log-normal sizes with the given ``mean``; ``sigma`` is the std of the underlying normal."""

    dist: Literal["lognormal"]
    mean: float = Field(gt=0, description="mean work units per item")
    sigma: float = Field(default=1.0, ge=0, le=10)

    @property
    def mu(self) -> float:
        return math.log(self.mean) - self.sigma**2 / 2


@dataclass(frozen=True, slots=True, eq=False)
class _Trace:
    """A trace in columns, sorted by arrival when it has arrivals."""

    path: Path
    cost: npt.NDArray[np.float64]
    arrival: npt.NDArray[np.float64] | None
    memory: list[int] | None
    priority: list[int] | None
    kind: list[str] | None
    tags: list[frozenset[str]] | None

    def __len__(self) -> int:
        return len(self.cost)

    @property
    def period(self) -> float:
        """How far each repeat of the trace is shifted in time (its span plus one mean gap)."""
        if self.arrival is None or len(self.arrival) == 0:
            return 0.0
        span = float(self.arrival[-1] - self.arrival[0])
        n = len(self.arrival)
        return span * n / (n - 1) if n > 1 else float(self.arrival[-1])


class TraceSize(_Strict):
    """Items replayed from a JSONL or CSV file (see :func:`load_trace` for the columns).

    The trace is read on first use (``parse_workload`` reads it at once to report problems).
    If its rows carry ``arrival`` times, those replace the arrival process.
    """

    dist: Literal["trace"]
    path: Path
    _trace: _Trace | None = PrivateAttr(default=None)

    def trace(self) -> _Trace:
        """The loaded trace; raises ``ConfigError`` naming the file, line and field if bad."""
        if self._trace is None:
            trace, problems = _read_trace(self.path)
            if trace is None:
                raise ConfigError([("size.path", p) for p in problems])
            self._trace = trace
        return self._trace


Size = Annotated[
    FixedSize | UniformSize | LognormalSize | TraceSize,
    Field(discriminator="dist"),
    BeforeValidator(_bare_size),
]
#: A size drawn from a distribution, not a trace (fleet sizing's token lengths).
DrawnSize = Annotated[
    FixedSize | UniformSize | LognormalSize,
    Field(discriminator="dist"),
    BeforeValidator(_bare_size),
]


def _memory(value: Any) -> int:
    size = parse_size(value)
    if size < 0:
        raise ValueError(f"size must be >= 0 bytes, got {value!r}")
    return size


class SLO(_Strict):
    latency: float = Field(gt=0, description="seconds from arrival to completion")


def _str_id(value: Any) -> Any:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class DeviceFailure(_Strict):
    """Device ``device`` fails at ``at`` seconds and, if ``recover`` is set, comes back then."""

    device: Annotated[str, BeforeValidator(_str_id)] = Field(min_length=1)
    at: float = Field(ge=0)
    recover: float | None = None

    @field_validator("recover")
    @classmethod
    def _after_failure(cls, value: float | None, info: ValidationInfo) -> float | None:
        at = info.data.get("at")
        if value is not None and at is not None and not value > at:
            raise ValueError(f"must be later than at={at!r} (got {value!r})")
        return value


class WorkloadSpec(_Strict):
    """A whole workload file."""

    requests: int = Field(default=10_000, ge=1, description="items to generate")
    arrivals: Arrivals = Field(default_factory=lambda: ClosedArrivals(process="closed"))
    size: Size = Field(default_factory=lambda: FixedSize(dist="fixed", value=1.0))
    memory: Annotated[int, BeforeValidator(_memory)] | None = None
    kind: str = Field(default="default", min_length=1)
    priorities: dict[int, float] | None = None
    slo: SLO | None = None
    failures: list[DeviceFailure] = Field(default_factory=list)
    seed: int = 0

    @field_validator("priorities")
    @classmethod
    def _distribution(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("give at least one priority: probability pair, e.g. {0: 0.9, 5: 0.1}")
        bad = {k: p for k, p in value.items() if not 0 <= p <= 1}
        if bad:
            raise ValueError(f"probabilities must be between 0 and 1 (got {bad!r})")
        total = sum(value.values())
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"probabilities must sum to 1 within 1e-6, got sum {total!r} (got {value!r})"
            )
        return value


# --- traces -----------------------------------------------------------------------------------


_TAG_SPLIT = re.compile(r"[;|,\s]+")
_TRACE_COLUMNS = (
    "cost",
    "prompt_tokens",
    "max_new_tokens",
    "arrival",
    "memory",
    "priority",
    "kind",
    "tags",
)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any, *, integer: bool = False) -> float | int | None:
    """``value`` (JSON number or CSV text) as a finite number >= 0, or None if it is not one."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        return None
    if integer:
        if value != int(value):
            return None
        return int(value)
    return float(value)


class _Row:
    """Parses one trace row into column lists, collecting problems with the line number."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cost: list[float] = []
        self.arrival: list[float | None] = []
        self.memory: list[int | None] = []
        self.priority: list[int | None] = []
        self.kind: list[str | None] = []
        self.tags: list[frozenset[str] | None] = []
        self.problems: list[str] = []
        self.lines: list[int] = []
        self.costs = CostModel()

    def bad(self, line: int, field: str, message: str, value: Any) -> None:
        self.problems.append(f"{self.name} line {line}: field {field!r} {message} (got {value!r})")

    def add(self, line: int, row: Mapping[str, Any]) -> None:
        def present(key: str) -> bool:
            value = row.get(key)
            return value is not None and value != ""

        ok = True
        if present("cost"):
            cost = _number(row["cost"])
            if cost is None:
                self.bad(line, "cost", "must be a finite number >= 0", row["cost"])
                ok = False
        elif present("prompt_tokens") or present("max_new_tokens"):
            tokens = []
            for key in ("prompt_tokens", "max_new_tokens"):
                value = _number(row.get(key), integer=True) if present(key) else None
                if value is None:
                    what = "must be an integer >= 0" if present(key) else "is missing"
                    self.bad(
                        line,
                        key,
                        f"{what} (cost = prompt_tokens * 0.5 + max_new_tokens * 1.0)",
                        row.get(key),
                    )
                    ok = False
                tokens.append(int(value or 0))
            cost = self.costs.cost(tokens[0], tokens[1])
        else:
            self.problems.append(
                f"{self.name} line {line}: needs 'cost' or 'prompt_tokens' + 'max_new_tokens' "
                f"(got keys {sorted(row)!r})"
            )
            ok = False
        arrival = memory = priority = kind = tags = None
        if present("arrival"):
            arrival = _number(row["arrival"])
            if arrival is None:
                self.bad(line, "arrival", "must be a finite number of seconds >= 0", row["arrival"])
                ok = False
        if present("memory"):
            try:
                memory = _memory(row["memory"])
            except ValueError as exc:
                self.bad(line, "memory", f"must be a size in bytes >= 0 ({exc})", row["memory"])
                ok = False
        if present("priority"):
            raw = row["priority"]
            try:
                priority = int(raw.strip()) if isinstance(raw, str) else raw
            except ValueError:
                priority = None
            if not isinstance(priority, int) or isinstance(priority, bool):
                self.bad(line, "priority", "must be an integer", raw)
                priority = None
                ok = False
        if present("kind"):
            kind = row["kind"]
            if not isinstance(kind, str) or not kind.strip():
                self.bad(line, "kind", "must be a non-empty string", kind)
                ok = False
        if present("tags"):
            raw = row["tags"]
            if isinstance(raw, str):
                tags = frozenset(t for t in _TAG_SPLIT.split(raw) if t)
            elif isinstance(raw, list) and all(isinstance(t, str) for t in raw):
                tags = frozenset(raw)
            else:
                self.bad(line, "tags", "must be a list of strings or a ';'-separated string", raw)
                ok = False
        if ok:
            assert cost is not None
            self.lines.append(line)
            self.cost.append(cost)
            self.arrival.append(arrival)
            self.memory.append(memory)
            self.priority.append(priority)
            self.kind.append(kind)
            self.tags.append(tags)


def _read_trace(path: Path) -> tuple[_Trace | None, list[str]]:
    """Read a JSONL or CSV trace; returns ``(trace, [])`` or ``(None, problems)``."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, [f"cannot read trace {str(path)!r}: {reason}"]
    rows = _Row(path.name)
    suffix = path.suffix.lower()
    as_csv = suffix == ".csv" or (
        suffix not in (".jsonl", ".json", ".ndjson") and not text.lstrip().startswith("{")
    )
    if as_csv:
        reader = csv.DictReader(text.splitlines())
        header = [h.strip() for h in reader.fieldnames or []]
        if "cost" not in header and not {"prompt_tokens", "max_new_tokens"} <= set(header):
            return None, [
                f"{path.name} line 1: the CSV header needs a 'cost' column or 'prompt_tokens' "
                f"and 'max_new_tokens' columns; known columns: {', '.join(_TRACE_COLUMNS)} "
                f"(got {header!r})"
            ]
        reader.fieldnames = header
        for row in reader:
            rows.add(reader.line_num, row)
            if len(rows.problems) > _MAX_TRACE_PROBLEMS:
                break
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                rows.problems.append(
                    f"{path.name} line {number}: invalid JSON: {exc.msg} (got {line[:60]!r})"
                )
            else:
                if isinstance(row, dict):
                    rows.add(number, row)
                else:
                    rows.problems.append(
                        f"{path.name} line {number}: expected a JSON object with 'cost' "
                        f"(got {line[:60]!r})"
                    )
            if len(rows.problems) > _MAX_TRACE_PROBLEMS:
                break
    if not rows.problems and not rows.cost:
        rows.problems.append(f"{path.name}: the trace has no items")
    if not rows.problems:
        with_arrival = [a is not None for a in rows.arrival]
        if any(with_arrival) and not all(with_arrival):
            first = rows.lines[with_arrival.index(False)]
            rows.problems.append(
                f"{path.name} line {first}: field 'arrival' is missing but other lines have it; "
                "give an arrival on every line or on none"
            )
    if rows.problems:
        if len(rows.problems) > _MAX_TRACE_PROBLEMS:
            rows.problems[_MAX_TRACE_PROBLEMS:] = ["... (more problems not shown)"]
        return None, rows.problems
    cost = np.array(rows.cost, dtype=np.float64)
    arrival = None
    order: list[int] | None = None
    if rows.arrival[0] is not None:
        arrival = np.array(rows.arrival, dtype=np.float64)
        sort = np.argsort(arrival, kind="stable")
        if (np.diff(arrival) < 0).any():
            arrival, cost, order = arrival[sort], cost[sort], sort.tolist()

    def column(values: list[Any], fill: Any) -> list[Any] | None:
        if all(v is None for v in values):
            return None
        out = [fill if v is None else v for v in values]
        return out if order is None else [out[i] for i in order]

    return _Trace(
        path=path,
        cost=cost,
        arrival=arrival,
        memory=column(rows.memory, -1),
        priority=column(rows.priority, None),
        kind=column(rows.kind, None),
        tags=column(rows.tags, None),
    ), []


# --- parsing ----------------------------------------------------------------------------------


def load_workload(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload file (YAML or JSON). A trace path is relative to the file."""
    path = Path(path)
    data = read_data_file(path, "workload")
    return parse_workload(data, source=str(path), base_dir=path.parent)


def parse_workload(
    data: Any, source: str = "<workload>", base_dir: str | Path | None = None
) -> WorkloadSpec:
    """Validate already-parsed YAML/JSON data; raises ``ConfigError`` listing every problem.

    A relative trace path is taken relative to ``base_dir`` (default: the working directory).
    The trace is read here, so its problems are reported now. Without ``requests``, a trace
    workload has as many requests as the trace has items.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"{source}: expected a mapping of workload fields, got {show(data)}")]
        )
    size = data.get("size")
    if base_dir is not None and isinstance(size, dict) and size.get("dist") == "trace":
        trace_path = size.get("path")
        if isinstance(trace_path, str) and trace_path and not Path(trace_path).is_absolute():
            data = {**data, "size": {**size, "path": str(Path(base_dir) / trace_path)}}
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, data, WorkloadSpec, _NESTED)) from None
    if isinstance(spec.size, TraceSize):
        trace = spec.size.trace()
        if "requests" not in spec.model_fields_set:
            spec = spec.model_copy(update={"requests": len(trace)})
    return spec


_NESTED: Nested = {
    "arrivals": {"poisson": PoissonArrivals, "bursty": BurstyArrivals, "closed": ClosedArrivals},
    "size": {
        "fixed": FixedSize,
        "uniform": UniformSize,
        "lognormal": LognormalSize,
        "trace": TraceSize,
    },
    "slo": SLO,
    "failures": DeviceFailure,
}


# --- generation -------------------------------------------------------------------------------


def mean_size(spec: WorkloadSpec) -> float:
    """The mean work units per item of ``spec``'s size distribution (or of its trace)."""
    size = spec.size
    if isinstance(size, FixedSize):
        return size.value
    if isinstance(size, UniformSize):
        return (size.low + size.high) / 2
    if isinstance(size, LognormalSize):
        return size.mean
    return float(size.trace().cost.mean())


def _trace_arrivals(spec: WorkloadSpec) -> _Trace | None:
    if isinstance(spec.size, TraceSize):
        trace = spec.size.trace()
        if trace.arrival is not None:
            return trace
    return None


def arrival_rate(spec: WorkloadSpec, capacity: float) -> float | None:
    """The mean arrival rate in items/s for a fleet of ``capacity`` work units/s.

    ``None`` for a batch (``closed``, or a trace whose items all arrive at once).
    """
    trace = _trace_arrivals(spec)
    if trace is not None:
        return len(trace) / trace.period if trace.period > 0 else None
    arrivals = spec.arrivals
    if isinstance(arrivals, ClosedArrivals):
        return None
    if arrivals.rate is not None:
        return arrivals.rate
    assert arrivals.load is not None
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ValueError(
            f"capacity must be a finite number > 0 work units/s to use load, got {capacity!r}"
        )
    return arrivals.load * capacity / mean_size(spec)


class _PoissonClock:
    def __init__(self, rng: np.random.Generator, rate: float) -> None:
        self.rng, self.scale, self.last = rng, 1.0 / rate, 0.0

    def __call__(self, m: int) -> npt.NDArray[np.float64]:
        t = np.cumsum(self.rng.exponential(self.scale, m))
        t += self.last
        self.last = float(t[-1])
        return t


class _BurstyClock:
    """Markov-modulated Poisson arrivals by time rescaling.

    Unit-rate Poisson points ``s`` are mapped through the inverse of the cumulative intensity
    ``Λ(t)``, which is piecewise linear over the calm and burst periods (generated in blocks).
    """

    _BLOCK = 1024

    def __init__(self, rng: np.random.Generator, spec: BurstyArrivals, rate: float) -> None:
        self.rng = rng
        calm, burst = spec.rates(rate)
        self.durations = (spec.calm_seconds, spec.burst_seconds)
        self.levels = (calm, burst)
        b, c = spec.burst_seconds, spec.calm_seconds
        self.bursting = bool(rng.random() < b / (b + c))  # start in the stationary distribution
        self.s = 0.0  # last unit-rate point
        self.t_start = np.zeros(1)  # start time of each known period
        self.lam_start = np.zeros(1)  # Λ at each start
        self.rate = np.array([self.levels[self.bursting]])
        first = rng.exponential(self.durations[self.bursting])
        self.t_end, self.lam_end = first, first * self.rate[0]

    def _extend(self) -> None:
        k = self._BLOCK
        state = (np.arange(1, k + 1) + int(self.bursting)) % 2  # alternate, starting after ours
        self.bursting = bool(state[-1])
        calm_s, burst_s = self.durations
        lengths = self.rng.exponential(1.0, k) * np.where(state == 1, burst_s, calm_s)
        rates = np.where(state == 1, self.levels[1], self.levels[0])
        t_start = self.t_end + np.concatenate(([0.0], np.cumsum(lengths[:-1])))
        lam_start = self.lam_end + np.concatenate(([0.0], np.cumsum((lengths * rates)[:-1])))
        self.t_end = float(t_start[-1] + lengths[-1])
        self.lam_end = float(lam_start[-1] + lengths[-1] * rates[-1])
        self.t_start = np.concatenate((self.t_start, t_start))
        self.lam_start = np.concatenate((self.lam_start, lam_start))
        self.rate = np.concatenate((self.rate, rates))

    def __call__(self, m: int) -> npt.NDArray[np.float64]:
        s = np.cumsum(self.rng.exponential(1.0, m))
        s += self.s
        self.s = float(s[-1])
        while self.lam_end <= self.s:
            self._extend()
        k = np.searchsorted(self.lam_start, s, side="right") - 1
        t: npt.NDArray[np.float64] = self.t_start[k] + (s - self.lam_start[k]) / self.rate[k]
        keep = int(k[-1])  # periods before the last point's are done with
        self.t_start = self.t_start[keep:]
        self.lam_start = self.lam_start[keep:]
        self.rate = self.rate[keep:]
        return t


class _TraceClock:
    """A trace's own arrivals, repeated (each repeat shifted by the trace's period)."""

    def __init__(self, arrival: npt.NDArray[np.float64], period: float) -> None:
        self.arrival, self.period, self.position = arrival, period, 0

    def __call__(self, m: int) -> npt.NDArray[np.float64]:
        idx = np.arange(self.position, self.position + m)
        self.position += m
        n = len(self.arrival)
        t: npt.NDArray[np.float64] = self.arrival[idx % n] + (idx // n) * self.period
        return t


def generate(spec: WorkloadSpec, capacity: float) -> Iterator[tuple[float, WorkItem]]:
    """Yield ``(arrival time, item)`` for ``spec.requests`` items in non-decreasing time order.

    Lazy (items are drawn in numpy chunks of :data:`CHUNK`) and deterministic for ``spec.seed``;
    arrival times, sizes and priorities come from independent random streams, so changing the
    size distribution leaves the arrival times alone. ``capacity`` is the fleet's total work
    units per second; it turns ``load`` into a rate: ``load * capacity / mean_size(spec)``.
    Items have ids ``0 .. requests - 1`` in arrival order.
    """
    rate = arrival_rate(spec, capacity)  # validates capacity now, not at the first next()
    arrival_rng, size_rng, priority_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(3)
    )
    trace = spec.size.trace() if isinstance(spec.size, TraceSize) else None
    clock: Callable[[int], npt.NDArray[np.float64]]
    if trace is not None and trace.arrival is not None:
        clock = _TraceClock(trace.arrival, trace.period)
    elif isinstance(spec.arrivals, ClosedArrivals) or rate is None:

        def clock(m: int) -> npt.NDArray[np.float64]:
            return np.zeros(m)

    elif isinstance(spec.arrivals, BurstyArrivals):
        clock = _BurstyClock(arrival_rng, spec.arrivals, rate)
    else:
        clock = _PoissonClock(arrival_rng, rate)
    return _items(spec, clock, size_rng, priority_rng, trace)


def _sizes(
    spec: WorkloadSpec, rng: np.random.Generator, start: int, m: int
) -> npt.NDArray[np.float64]:
    size = spec.size
    if isinstance(size, FixedSize):
        return np.full(m, size.value)
    if isinstance(size, UniformSize):
        return rng.uniform(size.low, size.high, m)
    if isinstance(size, LognormalSize):
        return rng.lognormal(size.mu, size.sigma, m)
    cost = size.trace().cost
    picked: npt.NDArray[np.float64] = cost[np.arange(start, start + m) % len(cost)]
    return picked


def _items(
    spec: WorkloadSpec,
    clock: Callable[[int], npt.NDArray[np.float64]],
    size_rng: np.random.Generator,
    priority_rng: np.random.Generator,
    trace: _Trace | None,
) -> Iterator[tuple[float, WorkItem]]:
    total = spec.requests
    kind = spec.kind
    memory = spec.memory or 0
    no_tags: frozenset[str] = frozenset()
    prio_keys = prio_p = None
    if spec.priorities is not None:
        prio_keys = np.array(list(spec.priorities), dtype=np.int64)
        prio_p = np.array(list(spec.priorities.values()), dtype=np.float64)
        prio_p /= prio_p.sum()
    per_row = trace is not None and any(
        c is not None for c in (trace.memory, trace.priority, trace.kind, trace.tags)
    )
    item = WorkItem
    start = 0
    while start < total:
        m = min(CHUNK, total - start)
        times: list[float] = clock(m).tolist()
        costs: list[float] = _sizes(spec, size_rng, start, m).tolist()
        ids = range(start, start + m)
        prios: list[int] | None = None
        if prio_keys is not None:
            prios = priority_rng.choice(prio_keys, size=m, p=prio_p).tolist()
        if per_row:
            assert trace is not None
            yield from _trace_rows(trace, start, m, times, costs, prios, kind, memory)
        elif prios is None:
            for i, t, c in zip(ids, times, costs, strict=True):
                yield t, item(c, kind, memory, 0, None, no_tags, None, i)
        else:
            for i, t, c, p in zip(ids, times, costs, prios, strict=True):
                yield t, item(c, kind, memory, p, None, no_tags, None, i)
        start += m


def _trace_rows(
    trace: _Trace,
    start: int,
    m: int,
    times: list[float],
    costs: list[float],
    prios: list[int] | None,
    kind: str,
    memory: int,
) -> Iterator[tuple[float, WorkItem]]:
    n = len(trace)
    for j in range(m):
        i = start + j
        r = i % n
        row_memory = trace.memory[r] if trace.memory is not None else -1
        row_priority = trace.priority[r] if trace.priority is not None else None
        if row_priority is None:
            row_priority = prios[j] if prios is not None else 0
        row_kind = trace.kind[r] if trace.kind is not None else None
        row_tags = trace.tags[r] if trace.tags is not None else None
        yield (
            times[j],
            WorkItem(
                cost=costs[j],
                kind=row_kind or kind,
                memory=memory if row_memory < 0 else row_memory,
                priority=row_priority,
                tags=row_tags or frozenset(),
                id=i,
            ),
        )
