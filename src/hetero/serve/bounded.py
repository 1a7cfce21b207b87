"""Reading a replica's answer within a bound: whatever it sends (a model list, a load page, a
reply), the router holds at most the bound and one byte more, read as it arrives."""

from __future__ import annotations

from typing import Protocol

__all__ = ["read_at_most"]


class Readable(Protocol):
    """What an answer is read from: aiohttp's ``StreamReader``, the request path's
    ``UpstreamReply``."""

    async def read(self, n: int = -1, /) -> bytes: ...


async def read_at_most(content: Readable, limit: int) -> bytes:
    """``content`` up to its end, or its first ``limit + 1`` bytes when it is longer (more than
    ``limit`` bytes back says it was over)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:  # read(n) returns what has arrived, up to n bytes
        chunk = await content.read(limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
