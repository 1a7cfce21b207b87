"""Forwarding one attempt of a request to its replica, and judging the answer.

``forward`` and ``forward_stream`` do the I/O and return the attempt's outcome
(``outcomes.py``); the router is none of their business: ``Server._serve`` reports each outcome
to it. While a stream runs, its first event and its pace go to the caller's ``StreamWatch``.
Once a stream has started, a failure ends it with an error event instead of a retry: tokens
already sent cannot be unsent.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from hetero._checks import is_integer
from hetero.sched import Cause
from hetero.sched.policies.slo import FIRST_PACE_REPORT
from hetero.serve.bounded import read_at_most
from hetero.serve.outcomes import (
    Answered,
    Busy,
    ClientGone,
    Failed,
    Outcome,
    OutOfResources,
    ReplicaRefused,
    StreamBroke,
)
from hetero.serve.replicas import Replica
from hetero.serve.upstream import Upstream, UpstreamError, UpstreamReply

__all__ = [
    "RequestContext",
    "StreamWatch",
    "client_gone",
    "describe_failure",
    "end_stopped",
    "end_stream",
    "error_json",
    "event_problem",
    "exhausted",
    "forward",
    "forward_stream",
    "retry_after",
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
#: What breaks an exchange on the replica's side.
_FAULTS = (UpstreamError, asyncio.TimeoutError, OSError)
#: Replies up to this size are parsed whole (a few milliseconds). A longer one could hold the
#: event loop for seconds (JSON numbers parse at about 15 MB/s): it is checked by its shape,
#: and its usage read from its tail, where OpenAI-compatible servers write it.
_PARSED_REPLY = 256 * 1024
_TAIL = 4096
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d{1,18})\b')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens"\s*:\s*(\d{1,18})\b')


@dataclass(slots=True)  # not frozen: one per request, and a frozen one costs 4x to build
class RequestContext:
    """What every attempt of one client request takes along."""

    upstream: Upstream  # to the replicas
    request: web.Request  # the client's: its path, and where a stream is written
    body: bytes
    max_reply: int  # bytes of a whole reply held at most (``hetero serve --max-reply``)


class StreamWatch(Protocol):
    """What a stream's caller hears while it runs (``Server._serve`` tells the router)."""

    def began(self, response: web.StreamResponse, ttft: float) -> None:
        """The first event goes to the client through ``response``, ``ttft`` seconds after the
        attempt started: from now on the attempt is the request's last."""

    def progress(self, chunks: int) -> None:
        """The stream has brought ``chunks`` content chunks so far (told at 8, 16, 32...)."""


def retry_after(value: str | None) -> float:
    """Seconds from a ``Retry-After`` header's value (1 when absent or not a number)."""
    try:
        return min(max(float(value or 1), 0.05), 60.0)
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
    if isinstance(exc, UpstreamError):
        return str(exc)  # says what the replica did, in words written for it
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


def _unreached(exc: BaseException) -> Failed | OutOfResources:
    """An attempt that could not reach its replica: the replica's failure, unless the router
    itself ran out of resources (then the request ends with a 503, no replica blamed)."""
    what = exhausted(exc)
    if what is None:
        return Failed(describe_failure(exc))
    message = f"hetero serve is out of resources ({what}); retry later"
    return OutOfResources(
        what,
        web.Response(
            status=503,
            text=error_json(message, "service_unavailable", 503),
            headers={**_JSON, "Retry-After": "1"},
        ),
    )


async def forward(context: RequestContext, replica: Replica) -> Outcome:
    """One attempt of a request that is not a stream; a reply over ``max_reply`` bytes fails
    the request (502)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    max_reply = context.max_reply
    try:
        reply = await context.upstream.post(replica.url, context.request.path, context.body)
        try:
            data = await read_at_most(reply, max_reply)
        finally:
            reply.release()
    except _FAULTS as exc:
        return _unreached(exc)
    latency = loop.time() - started
    status = reply.status
    if status != 200 or len(data) > max_reply:
        return _not_ok(status, data, reply.headers, latency, max_reply)
    try:
        tokens, prompt = _usage(data)
    except ValueError:
        return Failed(f"answered something that is not a JSON object: {_short(data)!r}")
    return Answered(web.Response(body=data, headers=_JSON), tokens, latency, None, prompt)


def _usage(data: bytes) -> tuple[int | None, int | None]:
    """A reply's ``usage.completion_tokens`` and ``usage.prompt_tokens`` (None where it gives
    none); ``ValueError`` when the reply is not a JSON object (a long one is judged by its
    shape, see ``_PARSED_REPLY``)."""
    if len(data) > _PARSED_REPLY:
        if data[:_TAIL].lstrip()[:1] != b"{" or data[-_TAIL:].rstrip()[-1:] != b"}":
            raise ValueError("not a JSON object")
        found = _COMPLETION_TOKENS.search(data, len(data) - _TAIL)
        prompt = _PROMPT_TOKENS.search(data, len(data) - _TAIL)
        return (int(found[1]) if found else None), (int(prompt[1]) if prompt else None)
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError("not a JSON object")
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return None, None
    return _count(usage.get("completion_tokens")), _count(usage.get("prompt_tokens"))


def _count(value: object) -> int | None:
    """A token count from a usage: an integer >= 0, else None."""
    return value if is_integer(value) and value >= 0 else None  # type: ignore[return-value,operator]


def _not_ok(
    status: int, data: bytes, headers: dict[str, str], latency: float, max_reply: int
) -> Outcome:
    """A replica's answer other than 200, or one over ``max_reply`` bytes: an answer too long
    fails the request (the client gets a 502 naming the limit); 429 holds the replica and
    places the request again, 5xx fails the attempt; any other is the request's own fault (bad
    parameters), passed on to the client."""
    if len(data) > max_reply:
        # Not retried: the same request would as likely bring the same answer elsewhere.
        reason = f"answered more than {max_reply} bytes (the limit of hetero serve --max-reply)"
        return Failed(reason, retryable=False)
    if status == 429:
        return Busy(retry_after(headers.get("retry-after")))
    if status >= 500:
        return Failed(f"HTTP {status}: {_short(data)}")
    return ReplicaRefused(web.Response(status=status, body=data, headers=_JSON), latency)


async def _first_event(reply: UpstreamReply) -> list[bytes]:
    """The lines of the first SSE event (up to its blank line), or what came before EOF."""
    lines: list[bytes] = []
    while True:
        line = await reply.readline()
        if not line:
            return lines
        lines.append(line)
        if line in (b"\n", b"\r\n") and len(lines) > 1:
            return lines


def event_problem(line: bytes, counts: list[int]) -> str | None:
    """Check one SSE line; counts[0] gathers content chunks, counts[1] and counts[2] the
    usage's completion and prompt tokens (-1 until seen; streams carry a usage where the client
    asked for it, ``stream_options.include_usage``). Returns what is wrong with the line, if
    anything."""
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
    if isinstance(usage, dict):
        for k, key in ((1, "completion_tokens"), (2, "prompt_tokens")):
            if (seen := _count(usage.get(key))) is not None:
                counts[k] = seen
    return None


async def forward_stream(context: RequestContext, replica: Replica, watch: StreamWatch) -> Outcome:
    """One streaming attempt, passed through chunk by chunk (an answer other than a stream is
    read up to ``max_reply`` bytes). A stream that began comes back open, for ``end_stream``."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        reply = await context.upstream.post(replica.url, context.request.path, context.body)
    except _FAULTS as exc:
        return _unreached(exc)
    counts = [0, -1, -1]
    try:
        if reply.status != 200:
            try:
                data = await read_at_most(reply, context.max_reply)
            except _FAULTS as exc:
                return _unreached(exc)  # as ``forward`` takes it: the replica's, retried
            latency = loop.time() - started
            return _not_ok(reply.status, data, reply.headers, latency, context.max_reply)
        try:
            first = await _first_event(reply)
        except _FAULTS as exc:
            return Failed(f"stream broke before its first event: {describe_failure(exc)}")
        problem = next((p for p in (event_problem(x, counts) for x in first) if p), None)
        if not first or problem:
            return Failed(problem or "closed the stream before its first event")
        # Committed: from here a failure ends the stream instead of retrying it.
        ttft = loop.time() - started
        response = web.StreamResponse(headers=_SSE_HEADERS)
        watch.began(response, ttft)
        try:
            await response.prepare(context.request)
            await response.write(b"".join(first))
            mark = FIRST_PACE_REPORT  # the stream's pace is told at 8, 16, 32... chunks
            # Lines that came together go out together: an event's data line and the blank
            # line that ends it, or the events of a burst, in one write (a write is a send
            # to the client's socket, most of a line's cost).
            lines: list[bytes] = []
            while line := await reply.readline():
                problem = event_problem(line, counts)
                if problem:
                    if lines:  # what came before it in the same read
                        await response.write(b"".join(lines))
                    return StreamBroke(response, problem)
                if counts[0] >= mark:
                    watch.progress(counts[0])
                    mark *= 2
                lines.append(line)
                if not reply.has_line():  # the last line of a body is always written here
                    await response.write(b"".join(lines))
                    lines.clear()
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            # Writing to a client that hung up; with the client still there, the replica's
            # connection reset under the read.
            if client_gone(context.request):
                return ClientGone(response)
            return StreamBroke(response, f"stream broke: {describe_failure(exc)}")
        except _FAULTS as exc:
            return StreamBroke(response, f"stream broke: {describe_failure(exc)}")
    finally:
        reply.release()
    tokens = counts[1] if counts[1] >= 0 else counts[0]
    prompt = counts[2] if counts[2] >= 0 else None
    return Answered(response, tokens, loop.time() - started, ttft, prompt)


async def end_stream(outcome: Outcome, replica: str) -> None:
    """End the stream of a streaming attempt on ``replica`` (its name) once its outcome is
    reported (the router hears before the client does): the EOF of one that ran to its end,
    the error event of one that broke; any other outcome has no stream open."""
    if isinstance(outcome, Answered):
        await outcome.response.write_eof()
    elif isinstance(outcome, StreamBroke):
        message = f"replica {replica} failed mid-stream: {outcome.reason}"
        await _end_with_error(outcome.response, message, "upstream")


async def end_stopped(response: web.StreamResponse, reason: str, cause: Cause | None) -> None:
    """End a stream under way that the router stopped (it timed out, say) with an error event
    saying why."""
    kind = "timeout" if cause is Cause.TIMED_OUT else "upstream"
    await _end_with_error(response, f"request stopped: {reason}", kind)


def client_gone(request: web.Request) -> bool:
    """Whether the client's connection is closed (or closing)."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def _end_with_error(response: web.StreamResponse, message: str, kind: str) -> None:
    try:
        await response.write(b"data: " + error_json(message, kind).encode() + b"\n\n")
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        pass  # the client is gone too
