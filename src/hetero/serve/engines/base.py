"""What an engine adapter reads from a replica, and how a read fails.

An adapter knows one engine's load endpoints (vLLM's ``/metrics``, SGLang's
``/get_server_info`` and ``/get_load``) and turns a read into a ``LoadSample``. Every read is
bounded in size and time, and every value is checked: an engine that lies (a negative count,
NaN, a 10 MB page) gives a ``LoadError`` naming what was wrong, which the router shows as
"load unknown" and logs; it never reaches the scheduling core.
"""

from __future__ import annotations

import asyncio
import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp

from hetero.serve.bounded import read_at_most
from hetero.serve.cost import brief

__all__ = [
    "MAX_BODY",
    "MAX_COUNT",
    "MAX_JSON",
    "EngineAdapter",
    "LoadError",
    "LoadSample",
    "count",
    "fraction",
    "get_body",
    "parse_json",
]

#: Largest load page read (vLLM's /metrics is tens of KB; its histograms grow with models).
MAX_BODY = 2 * 2**20
#: Largest JSON load page parsed (SGLang's are a few KB a rank): JSON numbers parse at about
#: 15 MB/s, and a page is parsed on the router's event loop, which must not stall on it.
MAX_JSON = 256 * 1024
#: The largest count read: the largest integer a Prometheus sample (a float64) holds exactly.
#: No engine counts that far, and a larger one overflows the float arithmetic it feeds.
MAX_COUNT = 2**53


class LoadError(Exception):
    """A load read that failed or answered something that cannot be right; the message says
    which endpoint and what."""


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One read of a replica's load, as its engine publishes it (``None``: not published)."""

    running: int | None = None
    """Requests the engine is running now (in its batch)."""
    waiting: int | None = None
    """Requests the engine holds and has not started."""
    cap: int | None = None
    """Requests it runs at once at most (SGLang's ``max_running_requests``)."""
    kv_usage: float | None = None
    """Fraction of its KV cache in use, 0 to 1."""
    kv_tokens: int | None = None
    """Tokens its KV cache holds (SGLang's ``max_total_num_tokens``)."""
    prefix_hit_rate: float | None = None
    """Prefix-cache hits over queries since it started, 0 to 1."""
    prefix_queries: int | None = None
    """Prompt tokens looked up in its prefix cache since it started (a counter)."""
    prefix_hits: int | None = None
    """Of those, the tokens found cached."""

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}


class EngineAdapter(ABC):
    """One engine's load endpoints. ``detect`` says whether a replica runs it; ``read`` reads
    its load. Both raise ``LoadError`` (or return ``False``), never anything else."""

    name: ClassVar[str]

    @abstractmethod
    async def detect(self, session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
        """Whether the server at ``url`` runs this engine."""

    @abstractmethod
    async def read(self, session: aiohttp.ClientSession, url: str, timeout: float) -> LoadSample:
        """The replica's load now."""


async def get_body(
    session: aiohttp.ClientSession, url: str, timeout: float, *, missing_ok: bool = False
) -> bytes | None:
    """GET ``url``'s body, at most ``MAX_BODY`` bytes within ``timeout`` seconds. A 404 gives
    ``None`` when ``missing_ok``; any other failure raises ``LoadError``."""
    path = "/" + url.split("/", 3)[-1] if url.count("/") >= 3 else url
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as reply:
            if reply.status == 404 and missing_ok:
                return None
            if reply.status != 200:
                raise LoadError(f"{path} answered HTTP {reply.status}")
            body = await read_at_most(reply.content, MAX_BODY)
    except asyncio.TimeoutError:
        raise LoadError(f"{path} did not answer within {timeout:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise LoadError(f"{path}: {type(exc).__name__}: {exc}") from None
    if len(body) > MAX_BODY:
        raise LoadError(f"{path} is over {MAX_BODY // 2**20} MB; not read")
    return body


def parse_json(body: bytes, path: str) -> Any:
    """``body`` as JSON; ``LoadError`` naming ``path`` when it is not (nesting too deep too)
    or is over ``MAX_JSON``."""
    if len(body) > MAX_JSON:
        raise LoadError(f"{path} is over {MAX_JSON // 1024} KiB of JSON; not parsed")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise LoadError(f"{path} is not JSON: {body[:60]!r}") from None


def count(value: object, what: str) -> int:
    """A published count: a finite number from 0 to ``MAX_COUNT`` (engines write integers as
    floats)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LoadError(f"{what} is {brief(value)}; expected a count >= 0")
    if value < 0:
        raise LoadError(f"{what} is {brief(value)}; a count cannot be negative")
    if value > MAX_COUNT:
        raise LoadError(f"{what} is {brief(value)}; a count is at most 2**53")
    return int(value)


def fraction(value: object, what: str) -> float:
    """A published fraction: a finite number from 0 to 1."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise LoadError(f"{what} is {brief(value)}; expected a fraction from 0 to 1")
    if not 0 <= value <= 1.000001:
        raise LoadError(f"{what} is {brief(value)}; expected a fraction from 0 to 1")
    return min(float(value), 1.0)
