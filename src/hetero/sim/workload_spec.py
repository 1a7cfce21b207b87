"""The models of a workload file, validated by pydantic: arrival processes, size
distributions (or a trace), prompts that share prefixes, memory, priorities, SLO and device
failures, all in :class:`WorkloadSpec`. :mod:`hetero.sim.workload` reads files into them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hetero.errors import ConfigError
from hetero.sim.trace import Trace, memory_size, read_trace

__all__ = [
    "MAX_PROMPT_BLOCKS",
    "SLO",
    "Arrivals",
    "BurstyArrivals",
    "ChatPrompts",
    "ClosedArrivals",
    "DeviceFailure",
    "DrawnSize",
    "FixedSize",
    "HotPrompts",
    "LognormalSize",
    "PoissonArrivals",
    "Prompts",
    "SinglePrompts",
    "Size",
    "TraceSize",
    "UniformSize",
    "WorkloadSpec",
]


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


def _bare(key: str) -> BeforeValidator:
    """Accept a bare tag as shorthand for a tagged section: ``arrivals: closed``."""
    return BeforeValidator(lambda value: {key: value} if isinstance(value, str) else value)


def _bare_size(value: Any) -> Any:
    """Accept a bare number as shorthand for a fixed size: ``size: 5``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"dist": "fixed", "value": value}
    return value


Arrivals = Annotated[
    PoissonArrivals | BurstyArrivals | ClosedArrivals,
    Field(discriminator="process"),
    _bare("process"),
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


class TraceSize(_Strict):
    """Items replayed from a JSONL or CSV file (see :mod:`hetero.sim.trace` for the columns).

    The trace is read on first use (``parse_workload`` reads it at once to report problems).
    If its rows carry ``arrival`` times, those replace the arrival process.
    """

    dist: Literal["trace"]
    path: Path
    _trace: Trace | None = PrivateAttr(default=None)

    def trace(self) -> Trace:
        """The loaded trace; raises ``ConfigError`` naming the file, line and field if bad."""
        if self._trace is None:
            trace, problems = read_trace(self.path)
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


#: The longest prompt a workload may give, in blocks: generating and matching prompts costs time
#: in their length, and a typo (``turns: 100000``) should not make a run crawl.
MAX_PROMPT_BLOCKS = 4096


class _Prompts(_Strict):
    """Prompts whose prefixes items share, so that a device's prefix cache can spare their
    prefill. Each prompt is ``blocks`` (one hash each, ``hetero.sched.prefix``); an item costs
    its prompt's blocks × ``block_work`` plus an output drawn from ``size``."""

    block_work: float = Field(default=64.0, gt=0, description="work units of one block's prefill")

    @property
    def longest(self) -> int:
        """Blocks in the longest prompt."""
        raise NotImplementedError

    @property
    def mean_blocks(self) -> float:
        """Blocks per prompt on average, over a long run."""
        raise NotImplementedError

    @model_validator(mode="after")
    def _not_too_long(self) -> _Prompts:
        if self.longest > MAX_PROMPT_BLOCKS:
            raise ValueError(
                f"the longest prompt would be {self.longest} blocks; at most "
                f"{MAX_PROMPT_BLOCKS} allowed"
            )
        return self


class ChatPrompts(_Prompts):
    """Multi-turn chats: ``sessions`` conversations in progress at once, interleaved (each item
    is the next turn of one picked at random). A conversation starts with one of ``systems``
    system prompts (``system_blocks`` long) and each turn adds ``turn_blocks`` to its history,
    so its k-th prompt extends its (k-1)-th; after ``turns`` turns a new one takes its place."""

    kind: Literal["chat"]
    systems: int = Field(default=20, ge=1, description="distinct system prompts")
    system_blocks: int = Field(default=16, ge=0)
    turn_blocks: int = Field(default=4, ge=1, description="blocks each turn adds")
    turns: int = Field(default=6, ge=1, description="turns per conversation")
    sessions: int = Field(default=500, ge=1, description="conversations in progress at once")

    @property
    def longest(self) -> int:
        return self.system_blocks + self.turns * self.turn_blocks

    @property
    def mean_blocks(self) -> float:
        # Every conversation runs turns 1 .. turns, so each turn is equally common.
        return self.system_blocks + self.turn_blocks * (self.turns + 1) / 2


class SinglePrompts(_Prompts):
    """Single-turn requests that share nothing: every prompt is ``blocks`` blocks of its own."""

    kind: Literal["single"]
    blocks: int = Field(default=20, ge=1, description="blocks per prompt")

    @property
    def longest(self) -> int:
        return self.blocks

    @property
    def mean_blocks(self) -> float:
        return self.blocks


class HotPrompts(_Prompts):
    """A few hot prefixes: a ``share`` of the requests start with one of ``systems`` prefixes
    (``system_blocks`` long), the rest with one of their own as long; each then adds
    ``turn_blocks`` of its own. What piles every request onto one device if a policy lets it."""

    kind: Literal["hot"]
    systems: int = Field(default=2, ge=1, description="hot prefixes")
    system_blocks: int = Field(default=16, ge=1)
    turn_blocks: int = Field(default=4, ge=0)
    share: float = Field(default=0.9, ge=0, le=1, description="of requests with a hot prefix")

    @property
    def longest(self) -> int:
        return self.system_blocks + self.turn_blocks

    @property
    def mean_blocks(self) -> float:
        return self.longest


Prompts = Annotated[
    ChatPrompts | SinglePrompts | HotPrompts,
    Field(discriminator="kind"),
    _bare("kind"),
]


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
    prompts: Prompts | None = None
    memory: Annotated[int, BeforeValidator(memory_size)] | None = None
    kind: str = Field(default="default", min_length=1)
    priorities: dict[int, float] | None = None
    slo: SLO | None = None
    failures: list[DeviceFailure] = Field(default_factory=list)
    seed: int = 0

    @field_validator("prompts")
    @classmethod
    def _not_with_a_trace(cls, value: _Prompts | None, info: ValidationInfo) -> _Prompts | None:
        if value is not None and isinstance(info.data.get("size"), TraceSize):
            raise ValueError("cannot be combined with size: trace (a trace gives each item's cost)")
        return value

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
