"""The proxy on its own, no router: each kind of answer a replica gives comes back from
``forward``/``forward_stream`` as its outcome (``hetero.serve.outcomes``), and a stream that
began reaches the client as docs/reliability.md promises. A replica (an aiohttp server on
127.0.0.1 whose URL's first path segment picks its answer) and a front that forwards one
attempt to it and keeps the outcome; every exchange is bounded in time."""

from __future__ import annotations

import ast
import inspect
import json
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

import hetero.serve.proxy
from hetero.serve.outcomes import (
    Answered,
    Busy,
    Failed,
    Outcome,
    ReplicaRefused,
    StreamBroke,
)
from hetero.serve.proxy import RequestContext, end_stream, forward, forward_stream
from hetero.serve.replicas import Replica
from hetero.serve.upstream import Upstream

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
#: Bytes of a whole reply the front holds at most (its --max-reply).
MAX_REPLY = 64 * 1024
#: An SSE line longer than aiohttp reads as one line (512 KiB).
LONG_LINE = b"data: " + json.dumps({"x": "y" * 600 * 1024}).encode() + b"\n\n"
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
USAGE = b'data: {"choices": [], "usage": {"completion_tokens": 9}}\n\n'
DONE = b"data: [DONE]\n\n"
REPLY = {"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 7}}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def answer(status: int, body: bytes, **headers: str) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=status, body=body, headers=headers)

    return handler


def events(*chunks: bytes, cut: bool = False) -> Handler:
    """A stream of ``chunks``; ``cut``: the connection is closed after them, the stream's end
    never sent."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        if cut:
            assert request.transport is not None
            request.transport.close()
        return response

    return handler


def reset(status: int, *chunks: bytes) -> Handler:
    """An answer of ``status`` whose connection is reset (RST, not a close) after ``chunks``:
    a stream under way, or a body shorter than its announced length."""

    async def handler(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream" if status == 200 else "text/plain"}
        response = web.StreamResponse(status=status, headers=headers)
        if status != 200:
            response.content_length = 1 << 20
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        assert request.transport is not None
        sock = request.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.transport.abort()
        return response

    return handler


#: The replica's answers, by the first segment of the path it is asked at.
ANSWERS: dict[str, Handler] = {
    "ok": answer(200, json.dumps(REPLY).encode()),
    "overloaded": answer(503, b"overloaded"),
    "busy": answer(429, b"slow down", **{"Retry-After": "2"}),
    "bad-request": answer(400, b'{"error": {"message": "max_tokens"}}'),
    "too-long": answer(200, b"{" + b" " * MAX_REPLY + b"}"),
    "stream": events(*[EVENT] * 9, USAGE, DONE),
    "cut": events(EVENT, EVENT, cut=True),
    "long-first-line": events(LONG_LINE),
    "long-line-later": events(EVENT, LONG_LINE),
    "reset": reset(200, EVENT, EVENT),
    "reset-error-body": reset(503, b"overload"),
}


@dataclass
class Watch:
    """What a stream tells its caller (``StreamWatch``), kept."""

    began_after: list[float] = field(default_factory=list)
    chunks: list[int] = field(default_factory=list)

    def began(self, response: web.StreamResponse, ttft: float) -> None:
        self.began_after.append(ttft)

    def progress(self, chunks: int) -> None:
        self.chunks.append(chunks)


@dataclass
class Exchange:
    outcome: Outcome
    status: int  # what the client got
    body: bytes
    watch: Watch


Send = Callable[..., Awaitable[Exchange]]


@pytest.fixture
async def send() -> AsyncIterator[Send]:
    """``send(case, stream=False)``: one request through the front to the replica's ``case``
    answer ("refused": to a port where nothing listens)."""
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> str:
        runner = web.AppRunner(app, shutdown_timeout=0.01)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def replica(request: web.Request) -> web.StreamResponse:
        return await ANSWERS[request.match_info["case"]](request)

    app = web.Application()
    app.router.add_post("/{case}" + CHAT, replica)
    replica_url = await serve(app)
    closed = socket.socket()  # bound, never listening: a connection to it is refused
    closed.bind(("127.0.0.1", 0))
    timeout = aiohttp.ClientTimeout(total=10)
    upstream = Upstream()
    kept: list[tuple[Outcome, Watch]] = []

    async def front(request: web.Request) -> web.StreamResponse:
        case = request.headers["x-case"]
        if case == "refused":
            url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        else:
            url = f"{replica_url}/{case}"
        replica = Replica("r", url, 1.0, 4, {"m"}, True)
        context = RequestContext(upstream, request, await request.read(), MAX_REPLY)
        watch = Watch()
        if request.headers.get("x-stream"):
            outcome = await forward_stream(context, replica, watch)
            await end_stream(outcome, replica.name)
        else:
            outcome = await forward(context, replica)
        kept.append((outcome, watch))
        response: web.StreamResponse | None = getattr(outcome, "response", None)
        return response if response is not None else web.Response(status=204)

    app = web.Application()
    app.router.add_post(CHAT, front)
    front_url = await serve(app)
    client = aiohttp.ClientSession(timeout=timeout)

    async def send(case: str, stream: bool = False) -> Exchange:
        headers = {"x-case": case, **({"x-stream": "1"} if stream else {})}
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        async with client.post(front_url + CHAT, json=body, headers=headers) as reply:
            status, data = reply.status, await reply.read()
        outcome, watch = kept.pop()
        return Exchange(outcome, status, data, watch)

    yield send
    await client.close()
    await upstream.close()
    closed.close()
    for runner in runners:
        await runner.cleanup()


def sse(body: bytes) -> list[str]:
    return [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e.strip()]


def test_the_proxy_knows_nothing_of_the_router() -> None:
    tree = ast.parse(inspect.getsource(hetero.serve.proxy))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "hetero.serve.router" not in imported, imported


async def test_a_200_is_answered_with_its_output_length(send: Send) -> None:
    got = await send("ok")
    assert isinstance(got.outcome, Answered), got.outcome
    assert got.outcome.output_tokens == 7 and 0 < got.outcome.latency < 10
    assert got.outcome.ttft is None
    assert got.status == 200 and json.loads(got.body) == REPLY


async def test_a_5xx_fails_the_attempt_to_be_retried(send: Send) -> None:
    got = await send("overloaded")
    assert got.outcome == Failed("HTTP 503: overloaded", retryable=True)


async def test_a_429_is_busy_for_its_retry_after(send: Send) -> None:
    got = await send("busy")
    assert got.outcome == Busy(2.0)


async def test_a_4xx_is_the_requests_own_fault_passed_on(send: Send) -> None:
    got = await send("bad-request")
    assert isinstance(got.outcome, ReplicaRefused), got.outcome
    assert got.status == 400 and b"max_tokens" in got.body


async def test_a_reply_over_max_reply_fails_for_good(send: Send) -> None:
    got = await send("too-long")
    assert isinstance(got.outcome, Failed) and not got.outcome.retryable, got.outcome
    assert f"answered more than {MAX_REPLY} bytes" in got.outcome.reason


async def test_a_refused_connection_fails_the_attempt_without_the_address(send: Send) -> None:
    got = await send("refused")
    assert isinstance(got.outcome, Failed) and got.outcome.retryable, got.outcome
    assert "cannot connect (Connection refused)" in got.outcome.reason
    assert "127.0.0.1" not in got.outcome.reason


async def test_a_stream_is_answered_and_its_first_event_and_pace_told(send: Send) -> None:
    got = await send("stream", stream=True)
    assert isinstance(got.outcome, Answered), got.outcome
    assert got.outcome.output_tokens == 9  # the usage's, not the chunks counted
    assert got.outcome.ttft is not None and got.outcome.ttft <= got.outcome.latency
    assert got.watch.began_after == [got.outcome.ttft] and got.watch.chunks == [8]
    assert got.status == 200 and sse(got.body)[-1] == "[DONE]"


async def test_a_stream_cut_midway_ends_with_an_error_event(send: Send) -> None:
    got = await send("cut", stream=True)
    assert isinstance(got.outcome, StreamBroke), got.outcome
    reason = "stream broke: closed the connection before the answer's end"
    assert got.outcome.reason == reason, got.outcome
    assert len(got.watch.began_after) == 1
    sent = sse(got.body)
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in sent[:2]] == ["a", "a"]
    error = json.loads(sent[-1])["error"]
    assert error["type"] == "upstream"
    assert error["message"] == f"replica r failed mid-stream: {got.outcome.reason}"


async def test_an_sse_line_over_the_limit_before_the_first_event_is_retried(
    send: Send,
) -> None:
    got = await send("long-first-line", stream=True)
    reason = "stream broke before its first event: sent a line over 524288 bytes"
    assert got.outcome == Failed(reason, retryable=True)
    assert got.watch.began_after == []  # nothing reached the client


async def test_an_sse_line_over_the_limit_mid_stream_ends_it_with_an_error_event(
    send: Send,
) -> None:
    got = await send("long-line-later", stream=True)
    assert isinstance(got.outcome, StreamBroke), got.outcome
    assert got.outcome.reason == "stream broke: sent a line over 524288 bytes"
    sent = sse(got.body)
    assert json.loads(sent[0])["choices"][0]["delta"]["content"] == "a"
    message = json.loads(sent[-1])["error"]["message"]
    assert message == "replica r failed mid-stream: stream broke: sent a line over 524288 bytes"


async def test_a_stream_reset_midway_ends_with_an_error_event(send: Send) -> None:
    got = await send("reset", stream=True)
    assert isinstance(got.outcome, StreamBroke), got.outcome
    assert got.outcome.reason.startswith("stream broke: ")
    sent = sse(got.body)
    assert json.loads(sent[0])["choices"][0]["delta"]["content"] == "a"
    error = json.loads(sent[-1])["error"]
    assert error["type"] == "upstream"
    assert error["message"] == f"replica r failed mid-stream: {got.outcome.reason}"


async def test_an_error_answer_reset_before_its_end_fails_the_attempt(send: Send) -> None:
    got = await send("reset-error-body", stream=True)
    assert isinstance(got.outcome, Failed) and got.outcome.retryable, got.outcome
    assert got.watch.began_after == []  # nothing reached the client
