"""The router's TCP listeners: at most so many connections open at once, the cap read from the
descriptor limit, and one more connection answered 503 and closed at once."""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import cast

from aiohttp import web

from hetero.serve.proxy import error_json

__all__ = ["ADMIN_CONNECTIONS", "CappedSite", "connection_cap", "http_url", "listen"]

log = logging.getLogger("hetero.serve")

#: Descriptors kept, besides two per client connection (its own and one to a replica), for the
#: listeners, load reads, health checks, the admin API and files.
_SPARE_DESCRIPTORS = 64
#: Connections the admin API keeps open at most.
ADMIN_CONNECTIONS = 16


def connection_cap(replicas: int) -> int:
    """Client connections to keep open at most: each may hold one to a replica as well, so
    half of what the descriptor limit leaves once the rest of the process has its share."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**20
    return max(1, (soft - _SPARE_DESCRIPTORS - ADMIN_CONNECTIONS - 4 * replicas) // 2)


class _Refused(asyncio.Protocol):
    """A connection over the cap: answered 503 and closed at once (a client that has already
    sent its request may see the connection reset instead)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport writes: asyncio's subclasses WriteTransport, uvloop's does not.
        writer = cast(asyncio.WriteTransport, transport)
        writer.write(self.answer)
        writer.close()


class CappedSite(web.BaseSite):
    """A TCP listener that keeps at most ``cap`` connections open; one more is refused at
    once. Without a cap, connections that send nothing use up the process's descriptors:
    ``accept()`` then fails in a loop, and every client waits."""

    __slots__ = ("_answer", "_cap", "_host", "_port")

    def __init__(self, runner: web.BaseRunner, host: str, port: int, cap: int) -> None:
        super().__init__(runner)
        self._host, self._port, self._cap = host, port, cap
        message = (
            f"hetero serve has {cap} connections open, its limit (--max-connections, by "
            "default from the descriptor limit); retry later"
        )
        body = error_json(message, "service_unavailable", 503).encode()
        self._answer = (
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) < self._cap:
                return server()
            log.warning(
                "refusing connections: %d open, the limit (--max-connections; a higher "
                "descriptor limit, ulimit -n, raises it)",
                self._cap,
            )
            return _Refused(self._answer)

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(protocol, self._host, self._port)


async def listen(
    app: web.Application,
    host: str,
    port: int,
    cap: int,
    *,
    cancel_on_hangup: bool,
    header_timeout: float,
) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on ``host:port`` with at most ``cap`` connections; returns its runner (to
    clean up) and the URL it listens on (the port bound, where ``port`` is 0).

    ``cancel_on_hangup``: a client that hangs up cancels its handler. ``header_timeout``:
    seconds a connection has to send a request's headers, from its opening or its previous
    answer.
    """
    runner = web.AppRunner(
        app,
        access_log=None,
        handle_signals=False,
        handler_cancellation=cancel_on_hangup,
        # aiohttp closes a connection idle this long, from its opening on: one whose headers
        # do not come in time too.
        keepalive_timeout=header_timeout,
    )
    await runner.setup()
    site = CappedSite(runner, host, port, cap)
    await site.start()
    server = site._server
    assert server is not None
    sock = server.sockets[0]  # type: ignore[attr-defined]
    bound_host, bound_port = sock.getsockname()[:2]
    return runner, http_url(bound_host, bound_port)


def http_url(host: str, port: int) -> str:
    """The URL of a server on ``host:port`` (an IPv6 address in brackets)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"
