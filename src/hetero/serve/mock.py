"""An emulated OpenAI-compatible inference replica.

A real aiohttp server that answers ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings`` and ``/v1/models`` in OpenAI's wire format and takes as long as a replica of a
given relative speed would: prefill time per prompt token, decode time per output token, both
divided by ``speed``. Routers and benchmarks run against it on machines without accelerators.

It also answers what sglang-router asks of a worker (``/health``, ``/get_load``,
``/get_server_info``, ``/get_model_info``), and ``/mock/config`` changes its speed or injects
failures while it runs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
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
from typing import Any, Final, Literal, get_args

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from hetero._version import __version__
from hetero.errors import ConfigError

__all__ = [
    "EMBEDDING_DIM",
    "OUTPUT_DISTS",
    "MockConfig",
    "MockReplica",
    "OutputDist",
    "draw_output_length",
]

OutputDist = Literal["lognormal", "pareto", "exponential", "fixed"]
OUTPUT_DISTS: Final[tuple[str, ...]] = get_args(OutputDist)
EMBEDDING_DIM: Final = 16

_LOGNORMAL_SIGMA = 1.0
_PARETO_ALPHA = 1.5
_CHARS_PER_TOKEN = 4
_TOKEN = " tok"  # the text of every generated token
# Below this pace, tokens share a chunk: a fast replica writes at most one chunk per millisecond
# per stream, which keeps a benchmark's CPU in the router instead of the mock.
_MIN_CHUNK_S = 0.001
_MAX_BODY = 64 * 1024 * 1024  # long prompts are part of the workloads
_STOP_GRACE_S = 0.01
_TUNABLE: Final = ("speed", "slowdown", "fail_rate", "garbage_rate")
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
        if problems:
            raise ConfigError(problems)


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
        self._started = int(time.time())
        self._load_tokens = 0  # prompt + output tokens of the requests admitted and not done
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
    ) -> MockConfig:
        """Change these settings now; requests that start service later see them (a stream
        already running keeps its pace). Returns the new config; bad values raise
        :class:`~hetero.errors.ConfigError` and change nothing."""
        changes: dict[str, Any] = {
            "speed": speed,
            "slowdown": slowdown,
            "fail_rate": fail_rate,
            "garbage_rate": garbage_rate,
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
        app.add_routes(
            [
                web.post("/v1/chat/completions", self._chat),
                web.post("/v1/completions", self._completions),
                web.post("/v1/embeddings", self._embeddings),
                web.get("/v1/models", self._models),
                web.get("/health", self._health),
                web.get("/health_generate", self._health),
                web.get("/get_load", self._get_load),
                web.get("/server_info", self._server_info),
                web.get("/get_server_info", self._server_info),  # the older name, still asked for
                web.get("/model_info", self._model_info),
                web.get("/get_model_info", self._model_info),
                web.post("/mock/config", self._mock_config),
                web.get("/mock/stats", self._mock_stats),
            ]
        )
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
        async with self._slot(prompt_tokens + job.out_tokens) as now:
            scale = now.slowdown / now.speed
            prefill_s = prompt_tokens * now.prefill_time * scale
            token_s = now.decode_time * scale
            if stream:
                return await self._stream(request, job, prefill_s, token_s)
            delay = prefill_s + job.out_tokens * token_s
            if delay > 0:
                await asyncio.sleep(delay)
            self._completed += 1
            self._tokens_out += job.out_tokens
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
    async def _slot(self, tokens: int) -> AsyncIterator[MockConfig]:
        """Hold a slot for the body of the ``with``; yields the config as service starts."""
        self._load_tokens += tokens
        try:
            await self._slots.acquire()
            try:
                yield self._config
            finally:
                self._slots.release()
        except asyncio.CancelledError:
            self._cancelled += 1
            raise
        finally:
            self._load_tokens -= tokens

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
        self, request: web.Request, job: _Generation, prefill_s: float, token_s: float
    ) -> web.StreamResponse:
        """Server-sent events: token chunks paced from the start on the loop's clock (so the
        pace does not drift), the finish chunk, the usage chunk if asked, ``[DONE]``."""
        loop = asyncio.get_running_loop()
        start = loop.time()
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
        async with self._slot(tokens) as now:
            delay = tokens * now.prefill_time * now.slowdown / now.speed
            if delay > 0:
                await asyncio.sleep(delay)
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

    # --- what sglang-router asks of a worker ----------------------------------------------------

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response()

    async def _get_load(self, request: web.Request) -> web.StreamResponse:
        # sglang's shape: one entry per data-parallel rank; the router reads num_tokens.
        waiting = self._slots.waiting
        running = self._slots.size - self._slots.free
        return web.json_response(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": running + waiting,
                    "num_waiting_reqs": waiting,
                    "num_tokens": self._load_tokens,
                }
            ]
        )

    async def _model_info(self, request: web.Request) -> web.StreamResponse:
        model = self._config.models[0]
        return web.json_response(
            {
                "model_path": model,
                "tokenizer_path": model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "mock",
                "architectures": ["MockForCausalLM"],
            }
        )

    async def _server_info(self, request: web.Request) -> web.StreamResponse:
        cfg = self._config
        return web.json_response(
            {
                "model_path": cfg.models[0],
                "tokenizer_path": cfg.models[0],
                "served_model_name": cfg.models[0],
                "tp_size": 1,
                "dp_size": 1,
                "max_running_requests": cfg.slots,
                "version": f"hetero-mock {__version__}",
                "mock": self._settings(),
            }
        )

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
