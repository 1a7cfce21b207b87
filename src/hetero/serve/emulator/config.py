"""The emulated replica's settings: :class:`MockConfig`, checked as it is built, and the
output length distributions it draws from."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Final, Literal, get_args

from hetero._checks import is_integer, is_number
from hetero.errors import ConfigError
from hetero.serve.engine_model import (
    DEFAULT_MAX_BATCHED_TOKENS,
    Calibration,
    EngineSpec,
    engine_spec,
    resolve_device,
    resolve_shape,
)

__all__ = [
    "ENGINES",
    "ENGINE_MODELS",
    "LOAD_FAULTS",
    "OUTPUT_DISTS",
    "Engine",
    "EngineModelName",
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
EngineModelName = Literal["simple", "continuous"]
ENGINE_MODELS: Final[tuple[str, ...]] = get_args(EngineModelName)
LoadFault = Literal["none", "garbage", "nan", "negative", "huge", "slow", "error"]
LOAD_FAULTS: Final[tuple[str, ...]] = get_args(LoadFault)

_LOGNORMAL_SIGMA = 1.0
_PARETO_ALPHA = 1.5
_KV_TOKENS_PER_SLOT = 2048
_CALIBRATION = Calibration()


@dataclass(frozen=True)
class MockConfig:
    """How an emulated replica behaves. Times are seconds at speed 1; invalid fields raise
    :class:`~hetero.errors.ConfigError` listing every one."""

    models: tuple[str, ...] = ("mock-llm",)
    """Model names served (listed by ``/v1/models``); a request naming another gets 404."""
    speed: float = 1.0
    """Relative speed: service time is divided by it."""
    slots: int = 16
    """Requests served at once; more wait first come, first served (the continuous model's
    cap on running requests, vLLM's ``max_num_seqs``)."""
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
    """KV cache capacity in tokens, the denominator of the reported KV usage. Simple model: None
    is slots × 2048, and admission is by slots alone (prompts that overflow it read as a full
    cache). Continuous model: None is what the memory fit of ``model_shape`` on ``device``
    leaves for it, and a full cache preempts."""
    load_fault: LoadFault = "none"
    """A fault of the load endpoints (never the API): ``garbage`` (200, not the format), ``nan``
    or ``negative`` (gauges), ``huge`` (``/metrics`` of about 10 MB), ``slow`` (answer after
    ``load_delay``), ``error`` (500)."""
    load_delay: float = 5.0
    """Seconds a load endpoint takes to answer under ``load_fault="slow"``."""
    engine_model: EngineModelName = "simple"
    """How requests are paced. ``simple``: each in a slot of its own, for ``prefill_time`` per
    prompt token and ``decode_time`` per output token. ``continuous``: an engine-faithful model
    (``hetero.serve.engine_model``) of ``model_shape`` on ``device``: continuous batching with
    chunked prefill, step times from the batch, a paged KV cache with preemption and a prefix
    cache; ``prefill_time`` and ``decode_time`` are then unused."""
    model_shape: str = "llama-3-8b"
    """The continuous model's LLM: a name from ``hetero.plan``'s table or a path to a Hugging
    Face config.json."""
    device: str = "H100-SXM-80GB"
    """The continuous model's device: a catalog name (``hetero catalog list``)."""
    compute_efficiency: float = _CALIBRATION.compute_efficiency
    """The share of the device's peak TFLOPS a step's tokens are computed at."""
    bandwidth_efficiency: float = _CALIBRATION.bandwidth_efficiency
    """The share of the device's peak memory bandwidth a step reads weights and KV at."""
    step_overhead: float = _CALIBRATION.step_overhead
    """Seconds each engine step costs besides its compute and memory time."""
    request_overhead: float = _CALIBRATION.request_overhead
    """Seconds each engine step costs per request in its batch."""
    attention_efficiency: float | None = _CALIBRATION.attention_efficiency
    """The share of the device's peak TFLOPS attention over the context runs at (None: the
    compute efficiency)."""
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    """Tokens one engine step computes at most (chunked prefill), as vLLM's option."""

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
        check("speed", is_number(self.speed) and self.speed > 0, "a positive finite number")
        check("slots", is_integer(self.slots) and self.slots >= 1, "an integer >= 1")
        check("seed", is_integer(self.seed), "an integer")
        for name in ("decode_time", "prefill_time"):
            value = getattr(self, name)
            check(name, is_number(value) and value >= 0, "a finite number of seconds >= 0")
        check(
            "output_mean",
            is_number(self.output_mean) and self.output_mean >= 1,
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
            check(name, is_number(value) and 0 <= value <= 1, "a probability from 0 to 1")
        check(
            "slowdown",
            is_number(self.slowdown) and self.slowdown > 0,
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
            is_number(self.load_delay) and self.load_delay >= 0,
            "a finite number of seconds >= 0",
        )
        check(
            "engine_model", self.engine_model in ENGINE_MODELS, f"one of {', '.join(ENGINE_MODELS)}"
        )
        calibration = Calibration(
            self.compute_efficiency,
            self.bandwidth_efficiency,
            self.step_overhead,
            self.request_overhead,
            self.attention_efficiency,
        )
        problems += calibration.problems()
        check(
            "max_num_batched_tokens",
            is_integer(self.max_num_batched_tokens) and self.max_num_batched_tokens >= 1,
            "an integer >= 1",
        )
        # Checked whichever model paces: a name that is wrong is wrong.
        for name, resolve in (("model_shape", resolve_shape), ("device", resolve_device)):
            try:
                resolve(getattr(self, name), name)
            except ConfigError as exc:
                problems += exc.problems
        if problems:
            raise ConfigError(problems)
        spec = None
        if self.engine_model == "continuous":
            spec = engine_spec(
                self.model_shape,
                self.device,
                calibration=calibration,
                max_num_seqs=self.slots,
                max_num_batched_tokens=self.max_num_batched_tokens,
                kv_tokens=self.kv_tokens,
            )
        object.__setattr__(self, "_spec", spec)

    @property
    def engine_spec(self) -> EngineSpec | None:
        """The continuous model's engine (None for the simple model)."""
        spec: EngineSpec | None = self.__dict__["_spec"]
        return spec

    @property
    def time_scale(self) -> float:
        """What a request's service time is multiplied by: ``slowdown / speed``."""
        return self.slowdown / self.speed

    @property
    def kv_capacity(self) -> int:
        """KV cache capacity in tokens: ``kv_tokens``, or slots × 2048 (simple model), or the
        engine's (continuous model)."""
        if self.engine_spec is not None:
            return self.engine_spec.kv_tokens
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
