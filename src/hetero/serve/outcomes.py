"""What one attempt at a replica came to: the value ``proxy.py`` returns for it, which
``Server._serve`` alone reports to the ``Router`` (``complete``, ``fail``, ``busy``,
``cancel``).

An outcome that ends the request carries the response the client gets. A stream's outcome comes
while the stream is still open: its end (the EOF, or the error event of a stream that broke) is
written once the router has heard (``proxy.end_stream``).

One is built per attempt, so they are slotted but not frozen: a frozen dataclass costs about 4x
as much to build (``hetero.sched.instructions``). Nothing changes one once built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "Answered",
    "Busy",
    "ClientGone",
    "Failed",
    "OutOfResources",
    "Outcome",
    "ReplicaRefused",
    "StreamBroke",
]


@dataclass(slots=True)
class Answered:
    """The replica answered 200: a whole reply, or a stream to its end. ``output_tokens`` is the
    real output length (None: the reply gives none), ``latency`` the time to its end, ``ttft``
    to a stream's first event, ``prompt_tokens`` the prompt's length as the engine counted it
    (its ``usage``; None where the reply gives none)."""

    response: web.StreamResponse
    output_tokens: int | None
    latency: float
    ttft: float | None = None
    prompt_tokens: int | None = None


@dataclass(slots=True)
class ReplicaRefused:
    """The replica refused the request itself (a status other than 200, 429 or 5xx: its
    parameters, say): the request's own fault, passed on to the client; its replica answered,
    but with no output to learn from."""

    response: web.Response
    latency: float


@dataclass(slots=True)
class Failed:
    """The attempt failed before anything reached the client, the replica's fault. When
    ``retryable``, the request may be placed again elsewhere; else it fails (an answer over
    ``--max-reply`` would likely be as long elsewhere)."""

    reason: str
    retryable: bool = True


@dataclass(slots=True)
class Busy:
    """The replica answered 429: it takes nothing new for ``retry_after`` seconds, and the
    request is placed again without being charged an attempt."""

    retry_after: float


@dataclass(slots=True)
class OutOfResources:
    """The router itself ran out of ``what`` (descriptors, buffers, memory) reaching the
    replica: the request ends failed, answered ``response`` (503), and no replica is blamed."""

    what: str
    response: web.Response


@dataclass(slots=True)
class StreamBroke:
    """A stream under way failed, its replica's fault: tokens already sent cannot be unsent,
    so it is not retried; the stream ends with an error event naming the replica."""

    response: web.StreamResponse
    reason: str


@dataclass(slots=True)
class ClientGone:
    """The client hung up while its stream was written."""

    response: web.StreamResponse


Outcome: TypeAlias = (
    Answered | ReplicaRefused | Failed | Busy | OutOfResources | StreamBroke | ClientGone
)
