"""Forwarding one attempt of a request to its replica, and judging the answer.

Each function returns the response for the client when the request ended (well or badly), or
``None`` when the attempt failed before anything reached the client: the router has then been
told (``fail``/``busy``) and the ticket's waiter says where the retry goes. Once a stream has
started, a failure ends it with an error event instead: tokens already sent cannot be unsent.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import LineTooLong

from hetero.sched import Cause
from hetero.serve.bounded import read_at_most
from hetero.serve.records import ReplicaState, Ticket
from hetero.serve.router import Router

if TYPE_CHECKING:
    from hetero.serve.metrics import ServeMetrics

__all__ = [
    "Outcome",
    "client_gone",
    "describe_failure",
    "error_json",
    "exhausted",
    "forward",
    "forward_stream",
    "retry_after",
    "uncancel",
]

log = logging.getLogger("hetero.serve")

_JSON = {"Content-Type": "application/json"}
_SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
#: What a process runs out of (descriptors, buffers, memory): its own fault, not a replica's.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Content chunks after which a stream's pace is first reported to the router (then at twice
#: as many each time): the engine model learns a replica's step time from the first of them.
_FIRST_MARK = 8
#: What breaks a stream on the replica's side. aiohttp's LineTooLong (a line over its read
#: limit) is no ClientError, but the replica's fault all the same.
_STREAM_FAULTS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, LineTooLong)
#: Replies up to this size are parsed whole (a few milliseconds). A longer one could hold the
#: event loop for seconds (JSON numbers parse at about 15 MB/s): it is checked by its shape,
#: and its usage read from its tail, where OpenAI-compatible servers write it.
_PARSED_REPLY = 256 * 1024
_TAIL = 4096
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,18})\b')


class Outcome:
    """What the access log and the metrics learn about one answered request."""

    __slots__ = ("output_tokens", "ttft")

    def __init__(self) -> None:
        self.output_tokens: int | None = None
        self.ttft: float | None = None


def retry_after(headers: Any) -> float:
    """Seconds from a ``Retry-After`` header (1 when absent or not a number)."""
    try:
        return min(max(float(headers.get("Retry-After", 1)), 0.05), 60.0)
    except ValueError:
        return 1.0


def _short(data: bytes) -> str:
    return data[:200].decode("utf-8", "replace").strip()


def error_json(message: str, kind: str, code: int | None = None) -> str:
    """An OpenAI-style error object (with ``code`` when given)."""
    error: dict[str, Any] = {"message": message, "type": kind}
    if code is not None:
        error["code"] = code
    return json.dumps({"error": error})


def describe_failure(exc: BaseException) -> str:
    """Why an attempt or a health check failed, in words a client may read (they reach its
    error answers): never the replica's address, which a connection error's own message gives
    (the replica is named by whoever reports it)."""
    if isinstance(exc, LineTooLong):
        return f"sent a line over {exc.args[1]} bytes"
    if isinstance(exc, aiohttp.ClientConnectorError):
        code = exc.errno
        return f"{type(exc).__name__}: cannot connect" + (
            f" ({os.strerror(code)})" if code and code > 0 else ""
        )
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def exhausted(exc: BaseException) -> str | None:
    """What this process ran out of, when that is why ``exc`` happened ("Too many open
    files"; then it is logged: the router's fault, never a replica's), else None."""
    seen: BaseException | None = exc
    for _ in range(8):  # an exception's causes, a few deep
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in _EXHAUSTED:
            what = os.strerror(seen.errno)
            log.warning(
                "hetero serve ran out of resources (%s): requests are refused (503) and no "
                "replica is blamed; for descriptors, raise its limit (ulimit -n)",
                what,
            )
            return what
        seen = seen.__cause__ or seen.__context__
    return None


def _attempt_error(router: Router, ticket: Ticket, exc: BaseException) -> web.Response | None:
    """An attempt that could not reach its replica: when the router itself ran out of
    resources, the request ends (failed, no replica blamed) with this 503; otherwise the
    replica is blamed (``fail``: it is retried elsewhere) and the answer is None."""
    what = exhausted(exc)
    if what is None:
        router.fail(ticket, describe_failure(exc))
        return None
    router.cancel(ticket, f"hetero serve ran out of resources: {what}", failed=True)
    message = f"hetero serve is out of resources ({what}); retry later"
    return web.Response(
        status=503,
        text=error_json(message, "service_unavailable", 503),
        headers={**_JSON, "Retry-After": "1"},
    )


async def forward(
    session: aiohttp.ClientSession,
    router: Router,
    ticket: Ticket,
    state: ReplicaState,
    path: str,
    body: bytes,
    outcome: Outcome,
    max_reply: int,
) -> web.Response | None:
    """One non-streaming attempt; a reply over ``max_reply`` bytes fails the request (502)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        async with session.post(state.replica.url + path, data=body, headers=_JSON) as reply:
            data = await read_at_most(reply.content, max_reply)
            status = reply.status
            headers = reply.headers
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return _attempt_error(router, ticket, exc)
    latency = loop.time() - started
    if status != 200 or len(data) > max_reply:
        return _not_ok(router, ticket, status, data, headers, latency, max_reply)
    try:
        tokens = _output_tokens(data)
    except ValueError:
        router.fail(ticket, f"answered something that is not a JSON object: {_short(data)!r}")
        return None
    outcome.output_tokens = tokens
    router.complete(ticket, tokens, latency)
    return web.Response(body=data, headers=_JSON)


def _output_tokens(data: bytes) -> int | None:
    """A reply's ``usage.completion_tokens`` (None when it gives none); ``ValueError`` when the
    reply is not a JSON object (a long one is judged by its shape, see ``_PARSED_REPLY``)."""
    if len(data) > _PARSED_REPLY:
        if data[:_TAIL].lstrip()[:1] != b"{" or data[-_TAIL:].rstrip()[-1:] != b"}":
            raise ValueError("not a JSON object")
        found = _COMPLETION_TOKENS.search(data, len(data) - _TAIL)
        return int(found[1]) if found else None
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError("not a JSON object")
    usage = answer.get("usage")
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if isinstance(tokens, int) and tokens >= 0 else None


def _not_ok(
    router: Router,
    ticket: Ticket,
    status: int,
    data: bytes,
    headers: Any,
    latency: float,
    max_reply: int,
) -> web.Response | None:
    """A replica's answer other than 200, or one over ``max_reply`` bytes: an answer too long
    fails the request (the client gets a 502 naming the limit); 429 holds the replica and
    places the request again, 5xx fails the attempt (``None`` in each case); any other is the
    request's own fault (bad parameters), passed on to the client."""
    if len(data) > max_reply:
        # Not retried: the same request would as likely bring the same answer elsewhere.
        reason = f"answered more than {max_reply} bytes (the limit of hetero serve --max-reply)"
        router.fail(ticket, reason, retryable=False)
        return None
    if status == 429:
        router.busy(ticket, retry_after(headers))
        return None
    if status >= 500:
        router.fail(ticket, f"HTTP {status}: {_short(data)}")
        return None
    router.complete(ticket, 0, latency)
    return web.Response(status=status, body=data, headers=_JSON)


async def _first_event(content: aiohttp.StreamReader) -> list[bytes]:
    """The lines of the first SSE event (up to its blank line), or what came before EOF."""
    lines: list[bytes] = []
    while True:
        line = await content.readline()
        if not line:
            return lines
        lines.append(line)
        if line in (b"\n", b"\r\n") and len(lines) > 1:
            return lines


def _event_problem(line: bytes, counts: list[int]) -> str | None:
    """Check one SSE line; counts[0] gathers content chunks and counts[1] the usage's
    completion tokens (-1 until seen). Returns what is wrong with the line, if anything."""
    stripped = line.strip()
    if not stripped:
        return None
    if not stripped.startswith(_SSE_FIELDS):
        return f"answered a line that is not server-sent events: {_short(stripped)!r}"
    if not stripped.startswith(b"data:"):
        return None
    payload = stripped[5:].strip()
    if payload == b"[DONE]":
        return None
    try:
        chunk = json.loads(payload)
    except ValueError:
        return f"answered an event that is not JSON: {_short(payload)!r}"
    if not isinstance(chunk, dict):
        return f"answered an event that is not a JSON object: {_short(payload)!r}"
    if "error" in chunk:
        return f"sent an error event: {_short(payload)}"
    if chunk.get("choices"):
        counts[0] += 1
    usage = chunk.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        counts[1] = usage["completion_tokens"]
    return None


async def forward_stream(
    session: aiohttp.ClientSession,
    router: Router,
    ticket: Ticket,
    state: ReplicaState,
    path: str,
    body: bytes,
    request: web.Request,
    outcome: Outcome,
    max_reply: int,
    metrics: ServeMetrics | None = None,
) -> web.StreamResponse | None:
    """One streaming attempt, passed through chunk by chunk (an answer other than a stream is
    read up to ``max_reply`` bytes)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    name = state.replica.name
    try:
        reply = await session.post(state.replica.url + path, data=body, headers=_JSON)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return _attempt_error(router, ticket, exc)
    response: web.StreamResponse | None = None
    counts = [0, -1]
    try:
        if reply.status != 200:
            data = await read_at_most(reply.content, max_reply)
            latency = loop.time() - started
            return _not_ok(router, ticket, reply.status, data, reply.headers, latency, max_reply)
        try:
            first = await _first_event(reply.content)
        except _STREAM_FAULTS as exc:
            router.fail(ticket, f"stream broke before its first event: {describe_failure(exc)}")
            return None
        problem = next((p for p in (_event_problem(x, counts) for x in first) if p), None)
        if not first or problem:
            router.fail(ticket, problem or "closed the stream before its first event")
            return None
        # Committed: from here a failure ends the stream instead of retrying it.
        ticket.answering = True
        outcome.ttft = loop.time() - started
        router.first_token(ticket)
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        await response.write(b"".join(first))
        mark = _FIRST_MARK  # the stream's pace is reported at 8, 16, 32... chunks
        async for line in reply.content:
            problem = _event_problem(line, counts)
            if problem:
                raise _BrokenStream(problem)
            if counts[0] >= mark:
                router.progress(ticket, counts[0])
                mark *= 2
            await response.write(line)
    except asyncio.CancelledError:
        if not ticket.stopped or response is None:
            raise
        uncancel()
        kind = "timeout" if ticket.stop_cause is Cause.TIMED_OUT else "upstream"
        await _end_with_error(response, f"request stopped: {ticket.stopped}", kind)
        router.cancel(ticket, ticket.stopped)
        return response
    except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
        if response is None or not client_gone(request):
            raise _BrokenStream(str(exc)) from exc
        router.cancel(ticket, "client disconnected")
        return response
    except (_BrokenStream, *_STREAM_FAULTS) as exc:
        assert response is not None
        broke = isinstance(exc, _BrokenStream)
        reason = str(exc) if broke else f"stream broke: {describe_failure(exc)}"
        if metrics is not None:
            metrics.errors.labels(name, "stream").inc()
        router.fail(ticket, reason, retryable=False)
        await _end_with_error(response, f"replica {name} failed mid-stream: {reason}", "upstream")
        return response
    finally:
        reply.release()
    tokens = counts[1] if counts[1] >= 0 else counts[0]
    outcome.output_tokens = tokens
    router.complete(ticket, tokens, loop.time() - started, outcome.ttft)
    await response.write_eof()
    return response


class _BrokenStream(Exception):
    pass


def client_gone(request: web.Request) -> bool:
    """Whether the client's connection is closed (or closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def uncancel() -> None:
    # The router cancelled this task on purpose (a Stop); Python 3.11+ counts cancellations.
    task = asyncio.current_task()
    if task is not None and hasattr(task, "uncancel"):
        task.uncancel()


async def _end_with_error(response: web.StreamResponse, message: str, kind: str) -> None:
    try:
        await response.write(b"data: " + error_json(message, kind).encode() + b"\n\n")
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass  # the client is gone too
