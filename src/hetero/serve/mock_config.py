"""The emulated replica's settings: :class:`MockConfig`, checked as it is built, and the
output length distributions it draws from."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final, Literal, get_args

from hetero.errors import ConfigError

__all__ = [
    "ENGINES",
    "LOAD_FAULTS",
    "OUTPUT_DISTS",
    "Engine",
    "LoadFault",
    "MockConfig",
    "OutputDist",
    "draw_output_length",
    "is_integer",
]

OutputDist = Literal["lognormal", "pareto", "exponential", "fixed"]
OUTPUT_DISTS: Final[tuple[str, ...]] = get_args(OutputDist)
Engine = Literal["sglang", "vllm", "openai"]
ENGINES: Final[tuple[str, ...]] = get_args(Engine)
LoadFault = Literal["none", "garbage", "nan", "negative", "huge", "slow", "error"]
LOAD_FAULTS: Final[tuple[str, ...]] = get_args(LoadFault)

_LOGNORMAL_SIGMA = 1.0
_PARETO_ALPHA = 1.5
_KV_TOKENS_PER_SLOT = 2048


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value: object) -> bool:
    """An ``int`` and not a ``bool`` (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class MockConfig:
    """How an emulated replica behaves. Times are seconds at speed 1; invalid fields raise
    :class:`~hetero.errors.ConfigError` listing every one."""

    models: tuple[str, ...] = ("mock-llm",)
    """Model names served (listed by ``/v1/models``); a request naming another gets 404."""
    speed: float = 1.0
    """Relative speed: service time is divided by it."""
    slots: int = 16
    """Requests served at once; more wait first come, first served."""
    seed: int = 0
    """Seeds the output lengths (drawn per request in arrival order) and the injected faults."""
    decode_time: float = 0.02
    """Seconds per output token."""
    prefill_time: float = 0.0005
    """Seconds per prompt token."""
    output_mean: float = 128
    """Mean output length in tokens, before the ``max_tokens`` cap."""
    output_dist: OutputDist = "lognormal"
    """Output length distribution: lognormal (sigma 1), pareto (alpha 1.5), exponential, fixed."""
    default_max_tokens: int = 256
    """The cap when a request gives no ``max_tokens``."""
    fail_rate: float = 0.0
    """Probability of answering 500 before any work."""
    garbage_rate: float = 0.0
    """Probability of answering 200 with a body that is not JSON (or a broken SSE stream)."""
    slowdown: float = 1.0
    """Service time is multiplied by it: a gray failure."""
    queue_limit: int | None = None
    """Requests that may wait for a slot; one more gets 429 with ``Retry-After: 1``."""
    engine: Engine = "sglang"
    """Whose load endpoints it answers besides the OpenAI API: sglang, vllm or openai (none)."""
    kv_tokens: int | None = None
    """KV cache capacity in tokens, the denominator of the reported KV usage (None: slots ×
    2048). Admission is by slots alone: prompts that overflow it read as a full cache."""
    load_fault: LoadFault = "none"
    """A fault of the load endpoints (never the API): ``garbage`` (200, not the format), ``nan``
    or ``negative`` (gauges), ``huge`` (``/metrics`` of about 10 MB), ``slow`` (answer after
    ``load_delay``), ``error`` (500)."""
    load_delay: float = 5.0
    """Seconds a load endpoint takes to answer under ``load_fault="slow"``."""

    def __post_init__(self) -> None:
        if isinstance(self.models, list):  # a list from a caller or a parsed file reads the same
            object.__setattr__(self, "models", tuple(self.models))
        problems: list[tuple[str, str]] = []

        def check(name: str, ok: bool, allowed: str) -> None:
            if not ok:
                problems.append((name, f"must be {allowed}, got {getattr(self, name)!r}"))

        models = self.models
        check(
            "models",
            isinstance(models, tuple)
            and bool(models)
            and all(isinstance(m, str) and m.strip() for m in models)
            and len(set(models)) == len(models),
            "a non-empty list of distinct, non-blank model names",
        )
        check("speed", _real(self.speed) and self.speed > 0, "a positive finite number")
        check("slots", is_integer(self.slots) and self.slots >= 1, "an integer >= 1")
        check("seed", is_integer(self.seed), "an integer")
        for name in ("decode_time", "prefill_time"):
            value = getattr(self, name)
            check(name, _real(value) and value >= 0, "a finite number of seconds >= 0")
        check(
            "output_mean",
            _real(self.output_mean) and self.output_mean >= 1,
            "a finite number of tokens >= 1",
        )
        check("output_dist", self.output_dist in OUTPUT_DISTS, f"one of {', '.join(OUTPUT_DISTS)}")
        check(
            "default_max_tokens",
            is_integer(self.default_max_tokens) and self.default_max_tokens >= 1,
            "an integer >= 1",
        )
        for name in ("fail_rate", "garbage_rate"):
            value = getattr(self, name)
            check(name, _real(value) and 0 <= value <= 1, "a probability from 0 to 1")
        check(
            "slowdown",
            _real(self.slowdown) and self.slowdown > 0,
            "a positive finite number (1: no slowdown)",
        )
        check(
            "queue_limit",
            self.queue_limit is None or (is_integer(self.queue_limit) and self.queue_limit >= 0),
            "None (no limit) or an integer >= 0",
        )
        check("engine", self.engine in ENGINES, f"one of {', '.join(ENGINES)}")
        check(
            "kv_tokens",
            self.kv_tokens is None or (is_integer(self.kv_tokens) and self.kv_tokens >= 1),
            "None (slots × 2048) or an integer >= 1",
        )
        check("load_fault", self.load_fault in LOAD_FAULTS, f"one of {', '.join(LOAD_FAULTS)}")
        check(
            "load_delay",
            _real(self.load_delay) and self.load_delay >= 0,
            "a finite number of seconds >= 0",
        )
        if problems:
            raise ConfigError(problems)

    @property
    def kv_capacity(self) -> int:
        """KV cache capacity in tokens: ``kv_tokens``, or slots × 2048."""
        return self.kv_tokens if self.kv_tokens is not None else self.slots * _KV_TOKENS_PER_SLOT


def draw_output_length(rng: random.Random, dist: str, mean: float) -> int:
    """One output length in tokens (at least 1) from ``dist`` with mean ``mean``."""
    if dist == "lognormal":
        x = rng.lognormvariate(math.log(mean) - _LOGNORMAL_SIGMA**2 / 2, _LOGNORMAL_SIGMA)
    elif dist == "pareto":  # scale so that the mean, alpha * scale / (alpha - 1), is ``mean``
        x = mean * (_PARETO_ALPHA - 1) / _PARETO_ALPHA * rng.paretovariate(_PARETO_ALPHA)
    elif dist == "exponential":
        x = rng.expovariate(1 / mean)
    else:
        x = mean
    return max(1, round(x))
