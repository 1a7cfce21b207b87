"""The request path's HTTP client: keep-alive HTTP/1.1 connections from the router to its
replicas, one POST at a time on each, its answer read as it arrives.

Every client request costs the router one exchange with a replica, so this client's CPU is a
large part of the router's per request (a budget: docs/benchmarks.md, "Router overhead").
aiohttp's client spent about three times as much on the same exchange (a request and a response
object, a cookie jar, tracing hooks and a timer per request); what it does beyond HTTP/1.1
framing the request path never needs. The health checks, load reads and model-list probes, a few
a second, keep aiohttp's client.

What it guards, as aiohttp's did: a connection idle longer than ``idle_timeout`` is not reused
(the engines' servers drop theirs after 5 s; one reused as the server closes it fails its
write); a status line and headers over ``HEAD_LIMIT`` bytes, and a line of a streamed answer
over ``LINE_LIMIT``, are the replica's fault, never read further; a connection is reused only
after its answer was read to the end.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

__all__ = [
    "HEAD_LIMIT",
    "LINE_LIMIT",
    "AnswerCut",
    "BadAnswer",
    "CannotConnect",
    "LineTooLong",
    "Upstream",
    "UpstreamError",
    "UpstreamReply",
]

#: The longest line of a streamed answer read (an SSE event's ``data:`` line); aiohttp's
#: client had the same bound.
LINE_LIMIT = 512 * 1024
#: The most bytes of status line and headers read before an answer's body.
HEAD_LIMIT = 64 * 1024
_READ = 64 * 1024  # bytes asked of the socket at a time, for bodies without a length


class UpstreamError(Exception):
    """An exchange with a replica that broke on the replica's side; its message says how, in
    words a client may read (never the replica's address)."""


class CannotConnect(UpstreamError):
    """No connection could be opened; ``errno`` is the system's reason (0 for a timeout)."""

    def __init__(self, code: int, why: str) -> None:
        super().__init__(f"cannot connect ({why})" if why else "cannot connect")
        self.errno = code


class LineTooLong(UpstreamError):
    """A line of the answer (or its head) over ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"sent a line over {limit} bytes")
        self.limit = limit


class AnswerCut(UpstreamError):
    """The connection closed before the answer's end."""

    def __init__(self) -> None:
        super().__init__("closed the connection before the answer's end")


class BadAnswer(UpstreamError):
    """Something that is not an HTTP/1.1 answer (a status line, a header or a chunk size)."""


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def close(self) -> None:
        self.writer.close()


class _Origin:
    """One replica's address, its request line's parts and its idle connections (the most
    recently used last, so the warmest is taken and the stalest expire from the front)."""

    __slots__ = ("base", "host", "host_header", "idle", "port", "prefix", "tls")

    def __init__(self, base: str) -> None:
        self.base = base
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"replica URL {base!r}: expected http://host[:port][/path]")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/").encode()
        self.host_header = parts.netloc.rsplit("@", 1)[-1].encode("idna")
        self.idle: deque[_Connection] = deque()


class Upstream:
    """Connections to the replicas, by base URL. ``await post(...)``, read the reply, and
    ``release()`` it (in a ``finally``: a reply not read to its end closes its connection)."""

    def __init__(self, connect_timeout: float = 5.0, idle_timeout: float = 4.0) -> None:
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self._origins: dict[str, _Origin] = {}
        self._tls: ssl.SSLContext | None = None
        self._swept = 0.0

    async def post(self, base: str, path: str, body: bytes) -> UpstreamReply:
        """POST ``body`` (JSON) to ``base + path``; returns once the answer's head is read."""
        origin = self._origins.get(base)
        if origin is None:
            origin = self._origins[base] = _Origin(base)
        connection = self._idle(origin)
        if connection is None:
            connection = await self._connect(origin)
        head = b"".join(
            (
                b"POST ",
                origin.prefix,
                path.encode(),
                b" HTTP/1.1\r\nHost: ",
                origin.host_header,
                b"\r\nContent-Type: application/json\r\nContent-Length: ",
                str(len(body)).encode(),
                b"\r\n\r\n",
            )
        )
        try:
            connection.writer.write(head + body)
            status, headers = await _read_head(connection.reader)
        except BaseException:
            connection.close()
            raise
        return UpstreamReply(self, origin, connection, status, headers)

    async def close(self) -> None:
        """Close every idle connection (those in use close as their replies are released)."""
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.pop().close()

    def _idle(self, origin: _Origin) -> _Connection | None:
        idle = origin.idle
        while idle:
            connection = idle.pop()
            if (
                time.monotonic() - connection.idle_since < self.idle_timeout
                and not connection.reader.at_eof()
                and not connection.writer.is_closing()
            ):
                return connection
            connection.close()
        return None

    def _keep(self, origin: _Origin, connection: _Connection) -> None:
        now = time.monotonic()
        connection.idle_since = now
        # Swept away while the connection was in use: registered again.
        self._origins.setdefault(origin.base, origin).idle.append(connection)
        if now - self._swept >= self.idle_timeout:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Close the connections idle past their time, of every replica: one that gets no more
        requests (removed, drained) would hold its descriptors for good."""
        self._swept = now
        for base, origin in list(self._origins.items()):
            idle = origin.idle
            while idle and now - idle[0].idle_since >= self.idle_timeout:
                idle.popleft().close()
            if not idle:
                del self._origins[base]

    async def _connect(self, origin: _Origin) -> _Connection:
        tls: ssl.SSLContext | None = None
        if origin.tls:
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                    limit=LINE_LIMIT,
                ),
                self.connect_timeout,
            )
        except asyncio.TimeoutError as exc:
            raise CannotConnect(0, f"no answer in {self.connect_timeout:g} s") from exc
        except OSError as exc:  # its message names the address, which clients must not see
            code = exc.errno or 0
            raise CannotConnect(
                code, os.strerror(code) if code > 0 else type(exc).__name__
            ) from exc
        sock = writer.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # The request goes in one write; its answer should not wait on Nagle's delay.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Connection(reader, writer)


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The status and headers (names in lower case) of the next answer that is not a 1xx."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            raise AnswerCut() from exc
        except asyncio.LimitOverrunError as exc:
            raise LineTooLong(LINE_LIMIT) from exc
        if len(head) > HEAD_LIMIT:
            raise LineTooLong(HEAD_LIMIT)
        lines = head[:-4].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise BadAnswer(f"answered something that is not HTTP/1.1: {lines[0][:100]!r}")
        status = int(code)
        if 100 <= status < 200:
            continue  # an interim answer: the real one follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise BadAnswer(f"answered a header that is not one: {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
        if version == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"  # HTTP/1.0 closes unless it says otherwise
        return status, headers


class UpstreamReply:
    """An answer whose head is read; its body is read with ``read`` (whole) or ``readline``
    (line by line), then ``release`` hands the connection back or closes it."""

    __slots__ = (
        "_buffer",
        "_chunked",
        "_connection",
        "_ended",
        "_left",
        "_origin",
        "_reusable",
        "_upstream",
        "headers",
        "status",
    )

    def __init__(
        self,
        upstream: Upstream,
        origin: _Origin,
        connection: _Connection,
        status: int,
        headers: dict[str, str],
    ) -> None:
        self.status = status
        self.headers = headers
        self._upstream = upstream
        self._origin = origin
        self._connection: _Connection | None = connection
        self._buffer = b""
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        # Bytes of body left: of the answer, for one of known length; of the chunk under way,
        # for a chunked one (0 between chunks); -1: to the connection's end.
        self._left = -1
        if self._chunked:
            self._left = 0
        elif length is not None:
            if not length.isdigit():
                connection.close()
                self._connection = None
                raise BadAnswer(f"answered a Content-Length that is not one: {length[:40]!r}")
            self._left = int(length)
        self._ended = status in (204, 304) or (self._left == 0 and not self._chunked)
        # Reused only if the replica keeps it open and the body's end is known from its framing.
        self._reusable = headers.get("connection", "").lower() != "close" and (
            self._chunked or self._left >= 0
        )

    async def read(self, most: int = _READ, /) -> bytes:
        """The body's next bytes, up to ``most``: what has arrived (``b""`` at its end). Read
        whole within a bound with ``bounded.read_at_most``."""
        buffer = self._buffer
        if buffer:
            self._buffer = buffer[most:]
            return buffer[:most]
        return await self._more(most)

    async def readline(self) -> bytes:
        """The next line of the body with its ``\\n`` (the last may lack it); ``b""`` at its
        end. ``LineTooLong`` for a line over ``LINE_LIMIT`` bytes."""
        buffer = self._buffer
        while True:
            end = buffer.find(b"\n") + 1
            if end > LINE_LIMIT or (not end and len(buffer) > LINE_LIMIT):
                raise LineTooLong(LINE_LIMIT)
            if end:
                self._buffer = buffer[end:]
                return buffer[:end]
            data = await self._more(_READ)
            if not data:
                self._buffer = b""
                return buffer
            buffer += data

    def has_line(self) -> bool:
        """Whether ``readline`` has a whole line to give without waiting for the replica."""
        return b"\n" in self._buffer

    def release(self) -> None:
        """Hand the connection back for the next request when the answer was read to its end,
        else close it. Idempotent."""
        connection = self._connection
        if connection is None:
            return
        self._connection = None
        if self._ended and self._reusable and not self._buffer:
            self._upstream._keep(self._origin, connection)
        else:
            connection.close()

    async def _more(self, most: int) -> bytes:
        """The body's next bytes, at most ``most`` (at most the rest of the chunk of a chunked
        body); ``b""`` at the body's end."""
        if self._ended:
            return b""
        connection = self._connection
        assert connection is not None, "read after release"
        reader = connection.reader
        try:
            if self._chunked and self._left == 0:  # between chunks: the next one's size
                self._left = await _chunk_size(reader)
                if self._left == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers, unread
                    self._ended = True
                    return b""
            if self._left < 0:  # to the connection's end
                data = await reader.read(_READ)
                self._ended = not data
                return data
            data = await reader.read(min(most, self._left))
            if not data:
                raise AnswerCut()
            self._left -= len(data)
            if self._left == 0:
                if not self._chunked:
                    self._ended = True
                elif await reader.readexactly(2) != b"\r\n":
                    raise BadAnswer("answered a chunk that does not end where its size says")
            return data
        except asyncio.IncompleteReadError as exc:
            raise AnswerCut() from exc
        except asyncio.LimitOverrunError as exc:
            raise LineTooLong(LINE_LIMIT) from exc


async def _chunk_size(reader: asyncio.StreamReader) -> int:
    line = await reader.readuntil(b"\r\n")
    text = line.split(b";", 1)[0].strip()
    try:
        return int(text, 16)
    except ValueError:
        raise BadAnswer(f"answered a chunk size that is not one: {text[:40]!r}") from None
