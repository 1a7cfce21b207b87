"""The OpenAI API of an emulated replica: chat and text completions (whole or streamed as
server-sent events, paced as a replica of its speed would), embeddings and the model list, with
the faults it is told to inject."""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import json
import random
import struct
import time
from typing import Any, Final

from aiohttp import web

from hetero.serve.emulator.config import draw_output_length
from hetero.serve.emulator.replica_engine import EngineRun
from hetero.serve.emulator.request_bodies import (
    EMBEDDING_DIM,
    BadRequest,
    Generation,
    chat_prompt_tokens,
    completion_prompt_tokens,
    count_tokens,
    embed,
    flag,
    json_object,
    max_tokens,
    openai_error,
    prompt_text,
    show,
)
from hetero.serve.emulator.state import EmulatorState

__all__ = ["OpenAIRoutes"]

_TOKEN = " tok"  # the text of every generated token
_COMPACT: Final = (",", ":")
_SSE_HEADERS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class OpenAIRoutes:
    """The handlers of ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and
    ``/v1/models`` over a replica's shared state."""

    def __init__(self, state: EmulatorState) -> None:
        self._state = state
        config = state.config
        self._lengths = random.Random(config.seed)
        # Faults draw from a stream of their own, so turning them on leaves the lengths alone.
        self._faults = random.Random(f"{config.seed}/faults")
        self._ids = itertools.count(1)
        self._started = int(state.created)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        self._state.requests += 1
        arrival = asyncio.get_running_loop().time()
        cfg = self._state.config
        try:
            body = json_object(await request.read())
            model = self._model(body)
            prompt_tokens = chat_prompt_tokens(body) if chat else completion_prompt_tokens(body)
            cap = max_tokens(body, cfg.default_max_tokens)
            stream = flag(body, "stream")
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            # sglang's and vLLM's switch for benchmarks: generate exactly max_tokens
            ignore_eos = flag(body, "ignore_eos")
        except BadRequest as exc:
            self._state.failed += 1
            return openai_error(exc.status, exc.message, code=exc.code)
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
        job = Generation(
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
        limit = self._state.engine.max_context
        if limit is not None and prompt_tokens + cap > limit:  # as vLLM refuses it
            self._state.failed += 1
            return openai_error(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + cap} tokens ({prompt_tokens} in the prompt, {cap} in the "
                "completion). Please reduce the length of the prompt or completion.",
            )
        text = functools.partial(prompt_text, body, chat=chat)
        async with self._state.run(prompt_tokens, job.out_tokens, text) as run:
            if stream:
                return await self._stream(request, job, run, arrival)
            await run.wait()
            self._finished(job, run.first_token_at, arrival)
            return web.json_response(self._completion(job))

    def _finished(self, job: Generation, first_token_at: float, arrival: float) -> None:
        self._state.completed += 1
        self._state.tokens_out += job.out_tokens
        self._state.finish(job, first_token_at, arrival)

    def _model(self, body: dict[str, Any]) -> str:
        model = body.get("model")
        served = ", ".join(self._state.config.models)
        if not isinstance(model, str):
            raise BadRequest(
                400, f"'model' must be a string naming one of: {served}; got {show(model)}"
            )
        if model not in self._state.config.models:
            raise BadRequest(
                404,
                f"The model {model!r} does not exist; this replica serves: {served}",
                "model_not_found",
            )
        return model

    async def _refuse(self, request: web.Request, *, stream: bool) -> web.StreamResponse | None:
        """The injected fault, or the 429 of a full queue, for a valid request; else None."""
        cfg, engine = self._state.config, self._state.engine
        fail, garbage = self._faults.random(), self._faults.random()  # two draws, always
        if fail < cfg.fail_rate:
            self._state.failed += 1
            return openai_error(500, "injected failure (fail_rate)", kind="server_error")
        if garbage < cfg.garbage_rate:
            self._state.failed += 1
            if not stream:
                return web.Response(
                    body=b'{"id": "garbage", "choices": [{"te', content_type="application/json"
                )
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(b'data: {"id": "garbage", "choices": [{"delta": {"cont\n\n')
            await resp.write_eof()  # and no [DONE]
            return resp
        if cfg.queue_limit is not None and engine.must_wait and engine.waiting >= cfg.queue_limit:
            self._state.failed += 1
            return openai_error(
                429,
                f"the replica is full: {engine.in_flight} requests running and "
                f"{engine.waiting} waiting (queue_limit {cfg.queue_limit}); retry later",
                kind="rate_limit_error",
                headers={"Retry-After": "1"},
            )
        return None

    def _completion(self, job: Generation) -> dict[str, Any]:
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
        self,
        request: web.Request,
        job: Generation,
        run: EngineRun,
        arrival: float,
    ) -> web.StreamResponse:
        """Server-sent events: a chunk of the tokens each of the run's wake-ups brings, the
        finish chunk, the usage chunk if asked, ``[DONE]``."""
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

        alike: dict[int, bytes] = {}  # most chunks are alike: each size encoded once
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await resp.prepare(request)
            sent = 0
            async for n in run.tokens():
                data = alike.get(n) if sent else chunk(n, first=True)
                if data is None:
                    data = alike[n] = chunk(n)
                await resp.write(data)
                sent += n
                self._state.tokens_out += n
            await resp.write(chunk(0, finish=job.finish_reason))
            if job.include_usage:
                usage = json.dumps(self._usage(job), separators=_COMPACT)
                await resp.write(f'data: {head},"choices":[],"usage":{usage}}}\n\n'.encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionError:  # the client left mid-stream; its place is freed on return
            self._state.cancelled += 1
            return resp
        self._state.completed += 1
        self._state.finish(job, run.first_token_at, arrival)
        return resp

    def _usage(self, job: Generation) -> dict[str, int]:
        return {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": job.out_tokens,
            "total_tokens": job.prompt_tokens + job.out_tokens,
        }

    def _id(self, chat: bool) -> str:
        return f"{'chatcmpl' if chat else 'cmpl'}-mock{next(self._ids)}"

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        self._state.requests += 1
        try:
            body = json_object(await request.read())
            model = self._model(body)
            texts = body.get("input")
            if isinstance(texts, str):
                texts = [texts]
            if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
                raise BadRequest(
                    400,
                    f"'input' must be a string or a non-empty list of strings, got "
                    f"{show(body.get('input'))}",
                )
            encoding = body.get("encoding_format") or "float"
            if encoding not in ("float", "base64"):
                raise BadRequest(
                    400, f"'encoding_format' must be float or base64, got {show(encoding)}"
                )
        except BadRequest as exc:
            self._state.failed += 1
            return openai_error(exc.status, exc.message, code=exc.code)
        tokens = sum(count_tokens(len(t)) for t in texts)
        refused = await self._refuse(request, stream=False)
        if refused is not None:
            return refused
        limit = self._state.engine.max_context
        if limit is not None and tokens + 1 > limit:
            self._state.failed += 1
            return openai_error(
                400,
                f"This model's maximum context length is {limit} tokens. However, the input "
                f"has {tokens} tokens. Please reduce the length of the input.",
            )
        async with self._state.run(tokens, 0, lambda: "".join(texts)) as run:  # a prompt alone
            await run.wait()
        vectors: list[Any] = [embed(t) for t in texts]
        if encoding == "base64":  # what the openai client asks for by default
            vectors = [
                base64.b64encode(struct.pack(f"<{EMBEDDING_DIM}f", *v)).decode() for v in vectors
            ]
        self._state.completed += 1
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

    async def models(self, request: web.Request) -> web.StreamResponse:
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
                    for m in self._state.config.models
                ],
            }
        )
