"""An emulated OpenAI-compatible inference replica.

A real aiohttp server that answers ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings`` and ``/v1/models`` in OpenAI's wire format and takes as long as a replica of a
given relative speed would: prefill time per prompt token, decode time per output token, both
divided by ``speed``. Routers and benchmarks run against it on machines without accelerators.

It speaks the load endpoints of the engine it emulates (``engine``), with figures true to its
own state, so that routers' engine adapters can be tested without the engine:

- ``sglang`` (SGLang 0.5.23): ``/get_server_info`` and ``/server_info``, ``/v1/loads``,
  ``/get_model_info`` and ``/model_info``, ``/metrics`` (``sglang:*``), ``/health_generate``, and
  ``/get_load`` (gone from SGLang since 0.5.21, kept because sglang-router 0.3 polls it);
- ``vllm`` (vLLM 0.33.0): ``/metrics`` (``vllm:*``, v1 engine), ``/version``, ``/load``;
- ``openai``: the OpenAI API and ``/health`` alone.

``/mock/config`` changes its speed or injects failures while it runs, on the API routes
(``fail_rate``, ``garbage_rate``, ``slowdown``) or on the load endpoints (``load_fault``).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import dataclasses
import functools
import hashlib
import itertools
import json
import logging
import math
import random
import struct
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, get_args

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from hetero.errors import ConfigError

__all__ = [
    "EMBEDDING_DIM",
    "ENGINES",
    "LOAD_FAULTS",
    "OUTPUT_DISTS",
    "SGLANG_VERSION",
    "VLLM_VERSION",
    "Engine",
    "LoadFault",
    "MockConfig",
    "MockReplica",
    "OutputDist",
    "draw_output_length",
]

OutputDist = Literal["lognormal", "pareto", "exponential", "fixed"]
OUTPUT_DISTS: Final[tuple[str, ...]] = get_args(OutputDist)
Engine = Literal["sglang", "vllm", "openai"]
ENGINES: Final[tuple[str, ...]] = get_args(Engine)
LoadFault = Literal["none", "garbage", "nan", "negative", "huge", "slow", "error"]
LOAD_FAULTS: Final[tuple[str, ...]] = get_args(LoadFault)
EMBEDDING_DIM: Final = 16
#: The releases whose load endpoints are emulated (and whose version they report).
SGLANG_VERSION: Final = "0.5.23"
VLLM_VERSION: Final = "0.33.0"

_LOGNORMAL_SIGMA = 1.0
_PARETO_ALPHA = 1.5
_CHARS_PER_TOKEN = 4
_TOKEN = " tok"  # the text of every generated token
# Below this pace, tokens share a chunk: a fast replica writes at most one chunk per millisecond
# per stream, which keeps a benchmark's CPU in the router instead of the mock.
_MIN_CHUNK_S = 0.001
_MAX_BODY = 64 * 1024 * 1024  # long prompts are part of the workloads
_STOP_GRACE_S = 0.01
_TUNABLE: Final = ("speed", "slowdown", "fail_rate", "garbage_rate", "load_fault", "load_delay")
_KV_TOKENS_PER_SLOT = 2048
_COMPACT: Final = (",", ":")
_SSE_HEADERS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class _QuietProbes(logging.Filter):
    """Drops the traceback aiohttp logs for each gRPC probe: sglang-router opens every worker
    with an HTTP/2 preface (``PRI * HTTP/2.0``) to find out whether it speaks gRPC, and the 400
    answered to it is that probe's expected outcome, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, BadHttpMessage) and "PRI" in str(exc))


_server_log = logging.getLogger(__name__)
_server_log.addFilter(_QuietProbes())


def _real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: object) -> bool:
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
        check("slots", _integer(self.slots) and self.slots >= 1, "an integer >= 1")
        check("seed", _integer(self.seed), "an integer")
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
            _integer(self.default_max_tokens) and self.default_max_tokens >= 1,
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
            self.queue_limit is None or (_integer(self.queue_limit) and self.queue_limit >= 0),
            "None (no limit) or an integer >= 0",
        )
        check("engine", self.engine in ENGINES, f"one of {', '.join(ENGINES)}")
        check(
            "kv_tokens",
            self.kv_tokens is None or (_integer(self.kv_tokens) and self.kv_tokens >= 1),
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


def _tokens(chars: int) -> int:
    return max(1, round(chars / _CHARS_PER_TOKEN))


class _Slots:
    """``size`` slots handed out first come, first served; a waiter that is cancelled leaves the
    line, and a slot granted to it just as it was cancelled goes to the next one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self._line: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._line)

    @property
    def must_wait(self) -> bool:
        return self.free == 0 or bool(self._line)

    async def acquire(self) -> None:
        if not self.must_wait:
            self.free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if not turn.cancelled():  # release() handed it the slot before the cancellation landed
                self.release()
            elif turn in self._line:
                self._line.remove(turn)
            raise

    def release(self) -> None:
        while self._line:
            turn = self._line.popleft()
            if not turn.done():  # a cancelled waiter's turn stays in line until it runs again
                turn.set_result(None)
                return
        self.free += 1


class _BadRequest(Exception):
    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def _show(value: object) -> str:
    """A value parsed from the request, as JSON, cut short if long."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _BadRequest(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest(400, f"the request body must be a JSON object, got {_show(body)}")
    return body


def _chat_prompt_tokens(body: dict[str, Any]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest(
            400, f"'messages' must be a non-empty list of messages, got {_show(messages)}"
        )
    chars = 0
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _BadRequest(400, f"'messages[{i}]' must be an object, got {_show(message)}")
        content = message.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):  # content parts: only text parts count
            chars += sum(
                len(part["text"])
                for part in content
                if isinstance(part, dict) and isinstance(part.get("text"), str)
            )
        elif content is not None:
            raise _BadRequest(
                400,
                f"'messages[{i}].content' must be a string, a list of parts or null, "
                f"got {_show(content)}",
            )
    return _tokens(chars)


def _completion_prompt_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _tokens(len(prompt))
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return _tokens(sum(len(p) for p in prompt))
        if all(_integer(p) for p in prompt):  # token ids
            return len(prompt)
    raise _BadRequest(
        400,
        f"'prompt' must be a string, a list of strings or a list of token ids, got {_show(prompt)}",
    )


def _max_tokens(body: dict[str, Any], default: int) -> int:
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not _integer(value) or value < 1:
            raise _BadRequest(400, f"'{key}' must be an integer >= 1, got {_show(value)}")
        return int(value)
    return default


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _BadRequest(400, f"'{key}' must be true or false, got {_show(value)}")
    return value


def _error(
    status: int,
    message: str,
    *,
    kind: str = "invalid_request_error",
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """An error in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def _embed(text: str) -> list[float]:
    """A deterministic unit vector of :data:`EMBEDDING_DIM` floats for ``text``."""
    digest = hashlib.blake2b(text.encode(), digest_size=4 * EMBEDDING_DIM).digest()
    raw = [n / 2**31 - 1 for n in struct.unpack(f"<{EMBEDDING_DIM}I", digest)]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]


@dataclass(frozen=True, slots=True)
class _Generation:
    """A parsed completion request and the length drawn for it."""

    chat: bool
    model: str
    prompt_tokens: int
    out_tokens: int
    finish_reason: str
    stream: bool
    include_usage: bool


@dataclass(slots=True)
class _Service:
    """A request holding a slot, from the start of its service (on the loop's clock)."""

    prompt_tokens: int
    out_tokens: int
    start: float
    prefill_s: float
    token_s: float

    def held(self, now: float) -> int:
        """Tokens it holds in the KV cache at ``now``: its prompt, then each token generated."""
        decoding = now - self.start - self.prefill_s
        if decoding <= 0:
            return self.prompt_tokens
        if self.token_s <= 0:
            return self.prompt_tokens + self.out_tokens
        return self.prompt_tokens + min(self.out_tokens, int(decoding / self.token_s))


# --- Prometheus text exposition (format 0.0.4), written as prometheus_client writes it ----------

_PROM_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Bucket bounds of the engines' default histograms.
_VLLM_TTFT_BOUNDS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_VLLM_E2E_BOUNDS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_SGLANG_TTFT_BOUNDS: Final = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
_SGLANG_E2E_BOUNDS: Final = (*_SGLANG_TTFT_BOUNDS, 600, 1200, 1800, 2400)
_VLLM_FINISH_REASONS: Final = ("stop", "length", "abort", "error", "repetition")
_HUGE_BYTES = 10 * 1024 * 1024


def _num(value: float) -> str:
    """A sample value as prometheus_client writes it (Go's float format)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _labels(labels: dict[str, str]) -> str:
    """``{a="x",b="y"}``, sorted by name as prometheus_client writes them."""
    escaped = (
        (k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"'))
        for k, v in sorted(labels.items())
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped) + "}"


def _head(name: str, kind: str, doc: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class _Histogram:
    """One labelled series of a histogram; its sample names are built once."""

    __slots__ = ("_bounds", "_buckets", "_count", "_counts", "_sum", "_sum_first", "total")

    def __init__(
        self,
        name: str,
        bounds: tuple[float, ...],
        labels: dict[str, str],
        *,
        sum_first: bool,  # prometheus_client's multiprocess collector writes _sum first
    ) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        les = [*(_num(b) for b in bounds), "+Inf"]
        self._buckets = [f"{name}_bucket{_labels({**labels, 'le': le})} " for le in les]
        plain = _labels(labels)
        self._count = f"{name}_count{plain} "
        self._sum = f"{name}_sum{plain} "
        self._sum_first = sum_first

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1  # buckets are "<= le"
        self.total += value

    def lines(self, out: list[str]) -> None:
        if self._sum_first:
            out.append(f"{self._sum}{_num(self.total)}\n")
        seen = 0
        for sample, n in zip(self._buckets, self._counts, strict=True):
            seen += n
            out.append(f"{sample}{_num(seen)}\n")
        out.append(f"{self._count}{_num(seen)}\n")
        if not self._sum_first:
            out.append(f"{self._sum}{_num(self.total)}\n")


@dataclass(slots=True)
class _Tally:
    """SGLang's tokenizer counters and histograms of one ``is_streaming`` value."""

    ttft: _Histogram
    e2e: _Histogram
    requests: int = 0
    prompt_tokens: int = 0
    generated: int = 0


@functools.cache
def _huge_padding() -> str:
    """About 10 MB of comment and sample lines that parse, ahead of the real page."""
    lines: list[str] = []
    size = 0
    while size < _HUGE_BYTES:
        i = len(lines)
        lines.append(
            f"# hetero mock padding {i}: a comment line, as long as some engines' HELP texts\n"
            f'hetero_mock_padding{{line="{i}"}} 0.0\n'
        )
        size += len(lines[-1])
    return "".join(lines)


_GARBAGE: Final = "<html><body>502 Bad Gateway: not the format {\n"


def _loads_prometheus(loads: list[dict[str, Any]]) -> str:
    """SGLang's /v1/loads?format=prometheus: a gauge per number, sections prefixed."""
    prefixes = {"disaggregation": "disagg"}
    samples: dict[str, list[tuple[int, float]]] = {}
    for load in loads:
        rank = load["dp_rank"]
        for key, value in load.items():
            if key == "dp_rank":
                continue
            if isinstance(value, dict):
                prefix = prefixes.get(key, key)
                for sub, number in value.items():
                    if isinstance(number, int | float):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append((rank, number))
            elif isinstance(value, int | float):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values]
    return "\n".join(lines) + "\n"


async def _sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    delay = when - loop.time()
    if delay > 0:  # an instant replica never sleeps, not even sleep(0)
        await asyncio.sleep(delay)


class MockReplica:
    """An emulated replica on ``host:port`` (port 0: a free one), serving until :meth:`stop`.

    Usage::

        rep = MockReplica(MockConfig(speed=2.5), port=0)
        url = await rep.start()  # "http://127.0.0.1:PORT"
        ...
        await rep.stop()
    """

    def __init__(self, config: MockConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self._config = config
        self._host = host
        self._port = port
        self._url: str | None = None
        self._runner: web.AppRunner | None = None
        self._slots = _Slots(config.slots)
        self._lengths = random.Random(config.seed)
        # Faults draw from a stream of their own, so turning them on leaves the lengths alone.
        self._faults = random.Random(f"{config.seed}/faults")
        self._ids = itertools.count(1)
        self._created = time.time()
        self._started = int(self._created)
        self._waiting_tokens = 0  # prompt tokens of the requests waiting for a slot
        self._running: dict[int, _Service] = {}
        self._keys = itertools.count()
        self._prompt_total = 0  # prompt and output tokens of the requests completed
        self._generated_total = 0
        self._finished: dict[str, int] = {}  # completed requests by finish reason
        model = {"model_name": config.models[0]}
        vllm = {**model, "engine": "0"}
        self._vllm_ttft = _Histogram(
            "vllm:time_to_first_token_seconds", _VLLM_TTFT_BOUNDS, vllm, sum_first=False
        )
        self._vllm_e2e = _Histogram(
            "vllm:e2e_request_latency_seconds", _VLLM_E2E_BOUNDS, vllm, sum_first=False
        )
        self._vllm_labels = _labels(vllm)
        self._sglang_tokenizer = {**model, "engine_type": "unified"}
        self._sglang_labels = _labels(
            {**self._sglang_tokenizer, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        )
        self._sglang_tallies: dict[bool, _Tally] = {}  # by is_streaming, once one is seen
        self._requests = 0
        self._completed = 0
        self._failed = 0
        self._cancelled = 0
        self._tokens_out = 0

    @property
    def config(self) -> MockConfig:
        return self._config

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, once started."""
        if self._url is None:
            raise RuntimeError("the MockReplica is not started: await start() first")
        return self._url

    @property
    def stats(self) -> dict[str, int]:
        """Counters since start: ``requests`` received on the API routes, ``completed``,
        ``failed`` (an error or garbage answered), ``cancelled`` (the client left or the replica
        stopped), ``in_flight`` (holding a slot), ``waiting`` (for a slot), ``tokens_out``."""
        return {
            "requests": self._requests,
            "completed": self._completed,
            "failed": self._failed,
            "cancelled": self._cancelled,
            "in_flight": self._slots.size - self._slots.free,
            "waiting": self._slots.waiting,
            "tokens_out": self._tokens_out,
        }

    def configure(
        self,
        *,
        speed: float | None = None,
        slowdown: float | None = None,
        fail_rate: float | None = None,
        garbage_rate: float | None = None,
        load_fault: LoadFault | None = None,
        load_delay: float | None = None,
    ) -> MockConfig:
        """Change these settings now; requests that start service later see them (a stream
        already running keeps its pace). Returns the new config; bad values raise
        :class:`~hetero.errors.ConfigError` and change nothing."""
        changes: dict[str, Any] = {
            "speed": speed,
            "slowdown": slowdown,
            "fail_rate": fail_rate,
            "garbage_rate": garbage_rate,
            "load_fault": load_fault,
            "load_delay": load_delay,
        }
        self._config = dataclasses.replace(
            self._config, **{k: v for k, v in changes.items() if v is not None}
        )
        return self._config

    async def start(self) -> str:
        """Listen and return the URL; ``OSError`` when the address cannot be bound."""
        if self._runner is not None:
            raise RuntimeError(f"the MockReplica is already listening on {self._url}")
        app = web.Application(client_max_size=_MAX_BODY)
        routes = [
            web.post("/v1/chat/completions", self._chat),
            web.post("/v1/completions", self._completions),
            web.post("/v1/embeddings", self._embeddings),
            web.get("/v1/models", self._models),
            web.get("/health", self._health),
            web.post("/mock/config", self._mock_config),
            web.get("/mock/stats", self._mock_stats),
        ]
        if self._config.engine == "sglang":
            routes += [
                web.get("/health_generate", self._health),
                web.get("/get_load", self._get_load),
                web.get("/v1/loads", self._v1_loads),
                web.get("/server_info", self._server_info),
                web.get("/get_server_info", self._server_info),  # deprecated, still answered
                web.get("/model_info", self._model_info),
                web.get("/get_model_info", self._model_info),
                web.get("/metrics", self._metrics),
            ]
        elif self._config.engine == "vllm":
            routes += [
                web.get("/metrics", self._metrics),
                web.get("/version", self._version),
                web.get("/load", self._vllm_load),
            ]
        app.add_routes(routes)
        # handler_cancellation: a client that leaves cancels its handler, which frees its slot.
        # stop() cuts in-flight requests, as a replica that dies would; aiohttp reads a timeout of
        # 0 as none at all, so the shortest grace is a small positive one.
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_STOP_GRACE_S,
            logger=_server_log,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        port = runner.addresses[0][1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._url = f"http://{host}:{port}"
        return self._url

    async def stop(self) -> None:
        """Close the server; requests still running are cut. Safe to call twice."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    # --- OpenAI routes --------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self._requests += 1
        arrival = asyncio.get_running_loop().time()
        cfg = self._config
        try:
            body = _json_object(await request.read())
            model = self._model(body)
            prompt_tokens = _chat_prompt_tokens(body) if chat else _completion_prompt_tokens(body)
            cap = _max_tokens(body, cfg.default_max_tokens)
            stream = _flag(body, "stream")
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            # sglang's and vLLM's switch for benchmarks: generate exactly max_tokens
            ignore_eos = _flag(body, "ignore_eos")
        except _BadRequest as exc:
            self._failed += 1
            return _error(exc.status, exc.message, code=exc.code)
        # OpenAI's ``seed`` makes a request's length its own (the same on every replica, for
        # benchmarks that compare routers); without it lengths follow arrival order.
        seed = body.get("seed")
        lengths = (
            random.Random(f"{cfg.seed}/{seed}")
            if isinstance(seed, int) and not isinstance(seed, bool)
            else self._lengths
        )
        natural = draw_output_length(lengths, cfg.output_dist, cfg.output_mean)
        capped = ignore_eos or natural > cap
        job = _Generation(
            chat=chat,
            model=model,
            prompt_tokens=prompt_tokens,
            out_tokens=cap if capped else natural,
            finish_reason="length" if capped else "stop",
            stream=stream,
            include_usage=include_usage,
        )
        refused = await self._refuse(request, stream=stream)
        if refused is not None:
            return refused
        async with self._slot(prompt_tokens, job.out_tokens) as service:
            if stream:
                return await self._stream(request, job, service, arrival)
            delay = service.prefill_s + job.out_tokens * service.token_s
            if delay > 0:
                await asyncio.sleep(delay)
            self._completed += 1
            self._tokens_out += job.out_tokens
            self._finish(job, service, arrival)
            return web.json_response(self._completion(job))

    def _model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        served = ", ".join(self._config.models)
        if not isinstance(model, str):
            raise _BadRequest(
                400, f"'model' must be a string naming one of: {served}; got {_show(model)}"
            )
        if model not in self._config.models:
            raise _BadRequest(
                404,
                f"The model {model!r} does not exist; this replica serves: {served}",
                "model_not_found",
            )
        return model

    async def _refuse(self, request: web.Request, *, stream: bool) -> web.StreamResponse | None:
        """The injected fault, or the 429 of a full queue, for a valid request; else None."""
        cfg = self._config
        fail, garbage = self._faults.random(), self._faults.random()  # two draws, always
        if fail < cfg.fail_rate:
            self._failed += 1
            return _error(500, "injected failure (fail_rate)", kind="server_error")
        if garbage < cfg.garbage_rate:
            self._failed += 1
            if not stream:
                return web.Response(
                    body=b'{"id": "garbage", "choices": [{"te', content_type="application/json"
                )
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(b'data: {"id": "garbage", "choices": [{"delta": {"cont\n\n')
            await resp.write_eof()  # and no [DONE]
            return resp
        if (
            cfg.queue_limit is not None
            and self._slots.must_wait
            and self._slots.waiting >= cfg.queue_limit
        ):
            self._failed += 1
            return _error(
                429,
                f"the replica is full: {self._slots.size} requests running and "
                f"{self._slots.waiting} waiting (queue_limit {cfg.queue_limit}); retry later",
                kind="rate_limit_error",
                headers={"Retry-After": "1"},
            )
        return None

    @contextlib.asynccontextmanager
    async def _slot(self, prompt_tokens: int, out_tokens: int) -> AsyncIterator[_Service]:
        """Hold a slot for the body of the ``with``; yields the service as it starts, paced by
        the config of that moment."""
        try:
            self._waiting_tokens += prompt_tokens
            try:
                await self._slots.acquire()
            finally:
                self._waiting_tokens -= prompt_tokens
            cfg = self._config
            scale = cfg.slowdown / cfg.speed
            service = _Service(
                prompt_tokens=prompt_tokens,
                out_tokens=out_tokens,
                start=asyncio.get_running_loop().time(),
                prefill_s=prompt_tokens * cfg.prefill_time * scale,
                token_s=cfg.decode_time * scale,
            )
            key = next(self._keys)
            self._running[key] = service
            try:
                yield service
            finally:
                del self._running[key]
                self._slots.release()
        except asyncio.CancelledError:
            self._cancelled += 1
            raise

    def _finish(self, job: _Generation, service: _Service, arrival: float) -> None:
        """Count a completed generation in the engines' counters and histograms."""
        now = asyncio.get_running_loop().time()
        first_token = service.start + service.prefill_s + service.token_s - arrival
        self._prompt_total += job.prompt_tokens
        self._generated_total += job.out_tokens
        self._finished[job.finish_reason] = self._finished.get(job.finish_reason, 0) + 1
        if self._config.engine == "vllm":
            self._vllm_ttft.observe(first_token)
            self._vllm_e2e.observe(now - arrival)
        elif self._config.engine == "sglang":
            tally = self._sglang_tallies.get(job.stream)
            if tally is None:
                labels = {**self._sglang_tokenizer, "is_streaming": str(job.stream).lower()}
                tally = self._sglang_tallies[job.stream] = _Tally(
                    ttft=_Histogram(
                        "sglang:time_to_first_token_seconds",
                        _SGLANG_TTFT_BOUNDS,
                        labels,
                        sum_first=True,
                    ),
                    e2e=_Histogram(
                        "sglang:e2e_request_latency_seconds",
                        _SGLANG_E2E_BOUNDS,
                        labels,
                        sum_first=True,
                    ),
                )
            tally.requests += 1
            tally.prompt_tokens += job.prompt_tokens
            tally.generated += job.out_tokens
            tally.ttft.observe(first_token)
            tally.e2e.observe(now - arrival)

    def _completion(self, job: _Generation) -> dict[str, Any]:
        text = _TOKEN * job.out_tokens
        choice: dict[str, Any] = {"index": 0}
        if job.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice |= {"logprobs": None, "finish_reason": job.finish_reason}
        return {
            "id": self._id(job.chat),
            "object": "chat.completion" if job.chat else "text_completion",
            "created": int(time.time()),
            "model": job.model,
            "choices": [choice],
            "usage": self._usage(job),
        }

    async def _stream(
        self, request: web.Request, job: _Generation, service: _Service, arrival: float
    ) -> web.StreamResponse:
        """Server-sent events: token chunks paced from the start on the loop's clock (so the
        pace does not drift), the finish chunk, the usage chunk if asked, ``[DONE]``."""
        loop = asyncio.get_running_loop()
        start, prefill_s, token_s = service.start, service.prefill_s, service.token_s
        head = json.dumps(
            {
                "id": self._id(job.chat),
                "object": "chat.completion.chunk" if job.chat else "text_completion",
                "created": int(time.time()),
                "model": job.model,
            },
            separators=_COMPACT,
        )[:-1]  # the closing brace: each event adds its choices

        def chunk(n: int, *, first: bool = False, finish: str | None = None) -> bytes:
            choice: dict[str, Any] = {"index": 0}
            if job.chat:
                delta = {"role": "assistant"} if first else {}
                if n:
                    delta["content"] = _TOKEN * n
                choice["delta"] = delta
            else:
                choice["text"] = _TOKEN * n
            choice |= {"logprobs": None, "finish_reason": finish}
            return (
                f'data: {head},"choices":[{json.dumps(choice, separators=_COMPACT)}]}}\n\n'.encode()
            )

        per_chunk = job.out_tokens if token_s == 0 else max(1, math.ceil(_MIN_CHUNK_S / token_s))
        full = chunk(per_chunk)  # most chunks are alike: encode once
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await resp.prepare(request)
            sent = 0
            while sent < job.out_tokens:
                n = min(per_chunk, job.out_tokens - sent)
                await _sleep_until(loop, start + prefill_s + (sent + n) * token_s)
                await resp.write(full if n == per_chunk and sent else chunk(n, first=not sent))
                sent += n
                self._tokens_out += n
            await resp.write(chunk(0, finish=job.finish_reason))
            if job.include_usage:
                usage = json.dumps(self._usage(job), separators=_COMPACT)
                await resp.write(f'data: {head},"choices":[],"usage":{usage}}}\n\n'.encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:  # the client left mid-stream; the slot is freed on return
            self._cancelled += 1
            return resp
        self._completed += 1
        self._finish(job, service, arrival)
        return resp

    def _usage(self, job: _Generation) -> dict[str, int]:
        return {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.out_tokens,
            "total_tokens": job.prompt_tokens + job.out_tokens,
        }

    def _id(self, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-mock{next(self._ids)}"

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        self._requests += 1
        try:
            body = _json_object(await request.read())
            model = self._model(body)
            texts = body.get("input")
            if isinstance(texts, str):
                texts = [texts]
            if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
                raise _BadRequest(
                    400,
                    f"'input' must be a string or a non-empty list of strings, got "
                    f"{_show(body.get('input'))}",
                )
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise _BadRequest(
                    400, f"'encoding_format' must be float or base64, got {_show(encoding)}"
                )
        except _BadRequest as exc:
            self._failed += 1
            return _error(exc.status, exc.message, code=exc.code)
        tokens = sum(_tokens(len(t)) for t in texts)
        refused = await self._refuse(request, stream=False)
        if refused is not None:
            return refused
        async with self._slot(tokens, 0) as service:
            if service.prefill_s > 0:
                await asyncio.sleep(service.prefill_s)
        vectors: list[Any] = [_embed(t) for t in texts]
        if encoding == "base64":  # what the openai client asks for by default
            vectors = [
                base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *v)).decode() for v in vectors
            ]
        self._completed += 1
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(vectors)
                ],
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": m,
                        "object": "model",
                        "created": self._started,
                        "owned_by": "hetero-mock",
                    }
                    for m in self._config.models
                ],
            }
        )

    # --- the engines' own endpoints -------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response()

    def _load_now(self) -> tuple[int, int, int, float]:
        """``(running, waiting, KV tokens held, tokens generated per second now)``: a pass over
        the requests holding a slot, none at idle."""
        now = asyncio.get_running_loop().time()
        used = 0
        rate = 0.0
        for service in self._running.values():
            used += service.held(now)
            if service.token_s > 0 and now >= service.start + service.prefill_s:
                rate += 1 / service.token_s
        return len(self._running), self._slots.waiting, used, rate

    def _gauge(self, value: float) -> float:
        """A gauge as load_fault has it read: NaN, negative (even at 0), or itself."""
        fault = self._config.load_fault
        if fault == "nan":
            return math.nan
        if fault == "negative":
            return -(abs(value) + 1.0)
        return value

    async def _load_fault(self, content_type: str) -> web.Response | None:
        """What a load endpoint answers instead of its figures under load_fault, else None
        (after the delay under "slow"). The fault is read as the request comes in."""
        fault = self._config.load_fault
        if fault == "slow":
            await asyncio.sleep(self._config.load_delay)
        elif fault == "error":
            return web.Response(status=500, text="injected failure (load_fault=error)\n")
        elif fault == "garbage":
            return web.Response(text=_GARBAGE, headers={"Content-Type": content_type})
        return None

    def _json(self, body: Any) -> web.Response:
        # allow_nan: under load_fault="nan" the gauges are written as NaN, which is not JSON
        return web.json_response(body, dumps=functools.partial(json.dumps, allow_nan=True))

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        faulty = await self._load_fault(_PROM_TYPE)
        if faulty is not None:
            return faulty
        page = self._vllm_metrics() if self._config.engine == "vllm" else self._sglang_metrics()
        if self._config.load_fault == "huge":
            page = _huge_padding() + page
        return web.Response(body=page.encode(), headers={"Content-Type": _PROM_TYPE})

    def _vllm_metrics(self) -> str:
        """vLLM's v1 engine page (``vllm/v1/metrics/loggers.py``, PrometheusStatLogger): its
        scheduler gauges, prefix cache, token and request counters (each with the ``_created``
        sample prometheus_client adds) and two of its histograms, labelled engine and
        model_name."""
        running, waiting, used, _ = self._load_now()
        usage = min(1.0, used / self._config.kv_capacity)
        labels = self._vllm_labels
        created = _num(self._created)
        out: list[str] = []

        def gauge(name: str, doc: str, value: float, extra: str = "") -> None:
            lab = labels[:-1] + extra + "}" if extra else labels
            out.append(f"{_head(name, 'gauge', doc)}{name}{lab} {_num(self._gauge(value))}\n")

        def counter(name: str, doc: str, values: list[tuple[str, float]]) -> None:
            out.append(_head(f"{name}_total", "counter", doc))
            for extra, value in values:
                lab = labels[:-1] + extra + "}" if extra else labels
                out.append(f"{name}_total{lab} {_num(value)}\n")
            out.append(_head(f"{name}_created", "gauge", doc))
            for extra, _ in values:
                lab = labels[:-1] + extra + "}" if extra else labels
                out.append(f"{name}_created{lab} {created}\n")

        def histogram(name: str, doc: str, histo: _Histogram) -> None:
            out.append(_head(name, "histogram", doc))
            histo.lines(out)
            out.append(
                f"{_head(f'{name}_created', 'gauge', doc)}{name}_created{labels} {created}\n"
            )

        gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", running
        )
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        name = "vllm:num_requests_waiting_by_reason"
        out.append(
            _head(
                name,
                "gauge",
                "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
                "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
                "budget, KV transfer, blocked status). Sum of all reasons equals "
                "vllm:num_requests_waiting.",
            )
        )
        for reason, value in (("capacity", waiting), ("deferred", 0)):
            lab = f'{labels[:-1]},reason="{reason}"}}'
            out.append(f"{name}{lab} {_num(self._gauge(value))}\n")
        name = "vllm:engine_sleep_state"
        out.append(
            _head(
                name,
                "gauge",
                "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
                "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
                "sleep level 2.",
            )
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            out.append(f'{name}{labels[:-1]},sleep_state="{state}"}} {_num(value)}\n')
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [("", self._prompt_total)],
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            [("", 0)],  # the mock caches no prefix
        )
        counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [("", 0)]
        )
        counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", [("", self._prompt_total)]
        )
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            [("", self._generated_total)],
        )
        finished = {**self._finished, "abort": self._cancelled}
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [(f',finished_reason="{r}"', finished.get(r, 0)) for r in _VLLM_FINISH_REASONS],
        )
        histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self._vllm_ttft,
        )
        histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            self._vllm_e2e,
        )
        return "".join(out)

    def _sglang_metrics(self) -> str:
        """SGLang's page (``sglang/srt/observability/metrics_collector.py``), as its
        multiprocess prometheus registry writes it (labels sorted, no ``_created``): the
        scheduler's gauges, then the tokenizer's counters and histograms by is_streaming once a
        request of that kind has completed."""
        running, waiting, used, rate = self._load_now()
        capacity = self._config.kv_capacity
        labels = self._sglang_labels
        out: list[str] = []
        for name, doc, value in (
            ("sglang:num_running_reqs", "The number of running requests.", running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting),
            (
                "sglang:num_grammar_queue_reqs",
                "The number of requests in the grammar waiting queue.",
                0,
            ),
            ("sglang:gen_throughput", "The generation throughput (token/s).", rate),
            ("sglang:cache_hit_rate", "The prefix cache hit rate.", 0.0),
            ("sglang:token_usage", "The token usage.", min(1.0, used / capacity)),
            ("sglang:num_used_tokens", "The number of used tokens.", used),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                capacity,
            ),
            ("sglang:utilization", "The utilization.", 0.0),  # SGLang's stays 0 too
        ):
            out.append(f"{_head(name, 'gauge', doc)}{name}{labels} {_num(self._gauge(value))}\n")
        tallies = sorted(self._sglang_tallies.items())
        if not tallies:
            return "".join(out)
        tokenizer = self._sglang_tokenizer
        for name, doc, field in (
            ("sglang:prompt_tokens_total", "Number of prefill tokens processed.", "prompt_tokens"),
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                "generated",
            ),
            ("sglang:num_requests_total", "Number of requests processed.", "requests"),
        ):
            out.append(_head(name, "counter", doc))
            for stream, tally in tallies:
                lab = _labels({**tokenizer, "is_streaming": str(stream).lower()})
                out.append(f"{name}{lab} {_num(getattr(tally, field))}\n")
        if self._cancelled:
            name = "sglang:num_aborted_requests_total"
            out.append(_head(name, "counter", "Number of requests aborted."))
            out.append(f"{name}{_labels(tokenizer)} {_num(self._cancelled)}\n")
        for name, doc, attr in (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                "ttft",
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                "e2e",
            ),
        ):
            out.append(_head(name, "histogram", doc))
            for _, tally in tallies:
                histo: _Histogram = getattr(tally, attr)
                histo.lines(out)
        return "".join(out)

    async def _get_load(self, request: web.Request) -> web.StreamResponse:
        # SGLang's /get_load up to 0.5.20 (a shim over /v1/loads, removed in 0.5.21), one entry
        # per data-parallel rank; sglang-router 0.3 polls it and reads num_tokens.
        faulty = await self._load_fault("application/json")
        if faulty is not None:
            return faulty
        running, waiting, used, _ = self._load_now()
        total = used + self._waiting_tokens  # held, plus the prompts of the queue
        g = self._gauge
        return self._json(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": g(running + waiting),
                    "num_waiting_reqs": g(waiting),
                    "num_tokens": g(total),
                    "num_pending_tokens": g(total - used),
                    "ts_tic": time.perf_counter(),
                }
            ]
        )

    def _load_snapshot(self) -> dict[str, Any]:
        """One rank's entry of SGLang's /v1/loads (``LoadSnapshot.to_dict`` in
        ``sglang/srt/managers/load_snapshot.py``), core fields in its order."""
        cfg = self._config
        running, waiting, used, rate = self._load_now()
        total = used + self._waiting_tokens
        g = self._gauge
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": g(running),
            "num_waiting_reqs": g(waiting),
            "num_waiting_uncached_tokens": g(self._waiting_tokens),
            "num_used_tokens": g(used),
            "num_total_tokens": g(total),
            "num_active_tokens": g(total),
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cfg.kv_capacity,
            "max_running_requests": cfg.slots,
            "token_usage": g(round(min(1.0, used / cfg.kv_capacity), 4)),
            "gen_throughput": g(round(rate, 2)),
            "cache_hit_rate": g(0.0),
            "utilization": g(0.0),
            "total_prefill_uncached_tokens": self._prompt_total,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
            "memory": {
                "weight_gb": 0.0,
                "kv_cache_gb": 0.0,
                "graph_gb": 0.0,
                "token_capacity": cfg.kv_capacity,
            },
            "disaggregation": {
                "mode": "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
            "queues": {
                "waiting": g(waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        }

    async def _v1_loads(self, request: web.Request) -> web.StreamResponse:
        # sglang/srt/entrypoints/v1_loads.py: ?dp_rank= filters, ?include= picks the sections,
        # ?format=prometheus writes each number as a gauge sglang_<field>{dp_rank="0"}.
        include = request.query.get("include")
        sections = {s.strip() for s in include.split(",")} if include else None
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if sections is not None and not sections <= valid:
            return web.json_response(
                {
                    "detail": f"Invalid include sections: {sections - valid}. "
                    f"Valid options: {sorted(valid)}"
                },
                status=400,
            )
        fmt = request.query.get("format")
        faulty = await self._load_fault(_PROM_TYPE if fmt == "prometheus" else "application/json")
        if faulty is not None:
            return faulty
        load = self._load_snapshot()
        if sections is not None and "all" not in sections:
            named = {"memory": "memory", "disagg": "disaggregation", "queues": "queues"}
            for section, key in named.items():
                if section not in sections:
                    del load[key]
        dp_rank = request.query.get("dp_rank")
        loads = [load] if dp_rank is None or dp_rank == "0" else []
        if fmt == "prometheus":
            return web.Response(text=_loads_prometheus(loads), headers={"Content-Type": _PROM_TYPE})
        return self._json(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": SGLANG_VERSION,
                "accelerator": None,  # SGLang's answer where it finds no device name
                "num_accelerators": 1,
                "loads": loads,
            }
        )

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        model = self._config.models[0]
        return web.json_response(
            {
                "model_path": model,
                "served_model_name": model,
                "tokenizer_path": model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "mock",
                "architectures": ["MockForCausalLM"],
            }
        )

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        # SGLang 0.5.23's shape, cut to the fields routers read: the resolved server arguments,
        # the scheduler's figures, one internal state per data-parallel rank, the version. Here
        # max_running_requests is set, as by --max-running-requests (SGLang leaves it null
        # unless so launched; internal_states carries the cap it chose).
        faulty = await self._load_fault("application/json")
        if faulty is not None:
            return faulty
        cfg = self._config
        model = cfg.models[0]
        args: dict[str, Any] = {
            "model_path": model,
            "tokenizer_path": model,
            "served_model_name": model,
            "context_length": None,
            "max_running_requests": cfg.slots,
            "max_total_tokens": cfg.kv_capacity,
            "page_size": 1,
            "tp_size": 1,
            "pp_size": 1,
            "dp_size": 1,
            "attn_dp_size": 1,
            "enable_dp_attention": False,
            "disaggregation_mode": "null",
            "host": self._host,
            "port": self._port,
        }
        _, _, _, rate = self._load_now()
        return self._json(
            {
                **args,
                "launch_command": None,
                "status": "ready",
                "max_total_num_tokens": cfg.kv_capacity,
                "max_req_input_len": cfg.kv_capacity,
                "kv_events": None,
                "startup_time": 0.0,
                "internal_states": [
                    {
                        **args,
                        "world_size": 1,
                        "startup_time": 0.0,
                        "effective_max_running_requests_per_dp": cfg.slots,
                        "last_gen_throughput": self._gauge(rate),
                        "memory_usage": {
                            "weight": 0.0,
                            "kvcache": 0.0,
                            "startup_available": 0.0,
                            "token_capacity": cfg.kv_capacity,
                            "token_capacity_swa": None,
                            "graph": {},
                        },
                    }
                ],
                "version": SGLANG_VERSION,
                "frontend": "python",
                "mock": self._settings(),
            }
        )

    async def _version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"version": VLLM_VERSION})

    async def _vllm_load(self, request: web.Request) -> web.StreamResponse:
        # vLLM counts the requests in flight on its API routes here when launched with
        # --enable-server-load-tracking (else it answers 0): the mock tracks them.
        faulty = await self._load_fault("application/json")
        if faulty is not None:
            return faulty
        return self._json({"server_load": self._gauge(len(self._running) + self._slots.waiting)})

    # --- control --------------------------------------------------------------------------------

    async def _mock_config(self, request: web.Request) -> web.StreamResponse:
        try:
            body = _json_object(await request.read())
        except _BadRequest as exc:
            return _error(exc.status, exc.message)
        unknown = sorted(set(body) - set(_TUNABLE))
        if unknown:
            return _error(
                400, f"cannot change {', '.join(unknown)}; settable: {', '.join(_TUNABLE)}"
            )
        try:
            self.configure(**body)
        except ConfigError as exc:
            return _error(400, str(exc))
        return web.json_response(self._settings())

    async def _mock_stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.stats)

    def _settings(self) -> dict[str, Any]:
        settings = dataclasses.asdict(self._config)
        settings["models"] = list(self._config.models)
        return settings
