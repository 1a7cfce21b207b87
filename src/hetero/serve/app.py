"""``hetero serve``'s HTTP side: the OpenAI-compatible front, the admin API, health checks.

The front (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``,
``/status``, ``/metrics``, ``/health``) listens where the user says; the admin API
(``/admin/replicas``...) listens on its own address, 127.0.0.1 unless told otherwise, and only
when an admin key is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from hetero.config import ReplicaConfig
from hetero.errors import ConfigError, QueueFull
from hetero.sched import Cause, Finish
from hetero.sched.prefix import BLOCK_CHARS, MAX_BLOCKS
from hetero.serve.cost import brief, prompt_text, prompt_tokens, requested_max_tokens
from hetero.serve.logs import RepeatFilter
from hetero.serve.metrics import ServeMetrics
from hetero.serve.poller import LoadPoller
from hetero.serve.proxy import (
    Outcome,
    client_gone,
    error_json,
    exhausted,
    forward,
    forward_stream,
    uncancel,
)
from hetero.serve.ratelimit import RateLimiter
from hetero.serve.replicas import replica_from_config
from hetero.serve.router import NoReplica, Router, Ticket, UnknownModel

__all__ = ["ServeOptions", "Server"]

log = logging.getLogger("hetero.serve")
access_log = logging.getLogger("hetero.serve.access")

_COMPLETIONS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: Descriptors kept, besides two per client connection (its own and one to a replica), for the
#: listeners, load reads, health checks, the admin API and files.
_SPARE_DESCRIPTORS = 64
_ADMIN_CONNECTIONS = 16
#: Loggers whose repeated messages are written once per interval (their children are not:
#: the access log keeps every line).
_FLOODABLE = ("asyncio", "aiohttp.server", "aiohttp.web", "hetero.serve")
#: The status of a request whose client hung up before its answer (nginx's "client closed").
_CLIENT_GONE = 499
_PRIORITY_LIMIT = 2**31 - 1
#: The longest session id (header x-session-id, or OpenAI's user field) a request may give.
_MAX_SESSION = 256


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """The HTTP side's settings (``hetero serve`` flags of the same names)."""

    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None  # None: port + 1 (or a free port when port is 0)
    admin_key: str | None = None
    max_body: int = 8 * 2**20
    rate_limit: float | None = None  # requests per second per API key
    health_interval: float = 2.0
    load_interval: float = 0.1  # seconds between reads of each replica's published load
    load_reads: float = 50.0  # reads per second over the whole fleet at most (their budget)
    drain_timeout: float = 30.0
    # Seconds a connection has to send a request's headers, from its opening or its previous
    # answer (so also how long an idle keep-alive connection stays open).
    header_timeout: float = 15.0
    # Client connections open at once at most (None: as many as the descriptor limit,
    # RLIMIT_NOFILE, allows; never more).
    max_connections: int | None = None

    def __post_init__(self) -> None:
        problems = [
            (name, f"must be a number > 0, got {value!r}")
            for name in ("health_interval", "load_interval", "load_reads", "header_timeout")
            if not (isinstance(value := getattr(self, name), int | float) and 0 < value < 1e9)
        ]
        cap = self.max_connections
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            problems.append(("max_connections", f"must be an integer >= 1, got {cap!r}"))
        if problems:
            raise ConfigError(problems)


def connection_cap(replicas: int) -> int:
    """Client connections to keep open at most: each may hold one to a replica as well, so
    half of what the descriptor limit leaves once the rest of the process has its share."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 2**20
    return max(1, (soft - _SPARE_DESCRIPTORS - _ADMIN_CONNECTIONS - 4 * replicas) // 2)


class _Refused(asyncio.Protocol):
    """A connection over the cap: answered 503 and closed at once (a client that has already
    sent its request may see the connection reset instead)."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self.answer)
        transport.close()


class _CappedSite(web.BaseSite):
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


def _error(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = error_json(message, kind, status)
    return web.Response(status=status, text=body, content_type="application/json", headers=headers)


def _api_key(request: web.Request) -> str:
    auth = request.headers.get("Authorization", "")
    if auth.startswith("Bearer "):
        return auth[7:]
    return request.headers.get("x-api-key", "")


class Server:
    """The router behind its HTTP listeners. ``start()``, then ``stop()`` (or ``drain()``)."""

    def __init__(self, router: Router, options: ServeOptions | None = None) -> None:
        self.router = router
        self.options = options = options or ServeOptions()
        self.metrics = ServeMetrics(router)
        self.limiter = RateLimiter(options.rate_limit) if options.rate_limit else None
        self.session: aiohttp.ClientSession | None = None
        self._runners: list[web.AppRunner] = []
        self._health: asyncio.Task[None] | None = None
        self.poller: LoadPoller | None = None
        self.url = ""
        self.admin_url: str | None = None
        self._repeats = RepeatFilter()
        app = web.Application(client_max_size=options.max_body)
        for path in _COMPLETIONS:
            app.router.add_post(path, self._completion)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/status", self._status)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._healthz)
        self.app = app

    # ------------------------------------------------------------------ life

    async def start(self) -> str:
        """Listen, learn what the replicas serve, and start health checks; returns the URL.
        Whatever it opened is closed again when it fails (a port in use)."""
        try:
            return await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> str:
        o = self.options
        for name in _FLOODABLE:
            logging.getLogger(name).addFilter(self._repeats)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            cookie_jar=aiohttp.DummyCookieJar(),  # replicas set no cookies worth keeping
            # No total: the dispatcher's deadline ends a request (a Stop). A second timer of
            # the same length fires in the same loop turn, and aiohttp then turns the Stop's
            # cancellation into a TimeoutError that would read as the replica's fault.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )
        await asyncio.gather(*(self._probe(s, models=True) for s in self.router.replicas))
        self.poller = LoadPoller(self.router, self.session, o.load_interval, max_reads=o.load_reads)
        for state in self.router.replicas:
            self.poller.watch(state)
        cap = connection_cap(len(self.router.replicas))
        if o.max_connections is not None and o.max_connections > cap:
            log.warning(
                "max_connections %d is more than the descriptor limit allows (ulimit -n %d): "
                "%d are kept open at most",
                o.max_connections,
                resource.getrlimit(resource.RLIMIT_NOFILE)[0],
                cap,
            )
        self.url = await self._listen(self.app, o.host, o.port, min(o.max_connections or cap, cap))
        if o.admin_key:
            admin = web.Application()
            admin.router.add_get("/admin/replicas", self._admin_list)
            admin.router.add_post("/admin/replicas", self._admin_add)
            admin.router.add_post("/admin/replicas/{name}/drain", self._admin_drain)
            admin.router.add_post("/admin/replicas/{name}/undrain", self._admin_undrain)
            admin.router.add_delete("/admin/replicas/{name}", self._admin_remove)
            port = o.admin_port if o.admin_port is not None else (o.port + 1 if o.port else 0)
            self.admin_url = await self._listen(admin, o.admin_host, port, _ADMIN_CONNECTIONS)
        self._health = asyncio.create_task(self._health_loop())
        return self.url

    async def _listen(self, app: web.Application, host: str, port: int, cap: int) -> str:
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            # A client of the front that hangs up cancels its handler, and with it the request
            # upstream (an admin call runs to its end).
            handler_cancellation=app is self.app,
            # aiohttp closes a connection idle this long, from its opening on: one whose
            # headers do not come in time too.
            keepalive_timeout=self.options.header_timeout,
        )
        await runner.setup()
        site = _CappedSite(runner, host, port, cap)
        await site.start()
        self._runners.append(runner)
        server = site._server
        assert server is not None
        sock = server.sockets[0]  # type: ignore[attr-defined]
        bound_host, bound_port = sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        return f"http://{shown}:{bound_port}"

    async def drain(self) -> None:
        """Graceful shutdown: refuse new requests (503), let admitted ones finish (up to
        ``drain_timeout`` seconds), then stop."""
        self.router.closing = True
        deadline = time.monotonic() + self.options.drain_timeout
        while self.router.tickets and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self) -> None:
        if self.poller is not None:
            await self.poller.stop()
            self.poller = None
        if self._health is not None:
            self._health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health
            self._health = None
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()
        if self.session is not None:
            await self.session.close()
            self.session = None
        for name in _FLOODABLE:
            logging.getLogger(name).removeFilter(self._repeats)

    # ------------------------------------------------------------------ health

    async def _health_loop(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(self.options.health_interval)
            rounds += 1
            # What the replicas serve is asked again now and then (a replica may load a model).
            learn = rounds % 15 == 0
            await asyncio.gather(
                *(self._probe(s, models=learn) for s in self.router.replicas if not s.removed)
            )

    async def _probe(self, state: Any, models: bool) -> None:
        assert self.session is not None
        replica = state.replica
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.options.health_interval))
        try:
            if models and not replica.declared_models:
                async with self.session.get(replica.url + "/v1/models", timeout=timeout) as r:
                    data = await r.json(content_type=None)
                    if r.status != 200 or not isinstance(data, dict):
                        raise ValueError(f"/v1/models answered HTTP {r.status}")
                    names = {m["id"] for m in data.get("data", []) if isinstance(m, dict)}
                    self.router.set_models(state, names)
            else:
                async with self.session.get(replica.url + "/health", timeout=timeout) as r:
                    if r.status == 404:  # no /health: any answer from /v1/models will do
                        async with self.session.get(
                            replica.url + "/v1/models", timeout=timeout
                        ) as r2:
                            status = r2.status
                    else:
                        status = r.status
                    if status != 200:
                        raise ValueError(f"health check answered HTTP {status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError) as exc:
            if exhausted(exc) is None:  # else the router's own fault: no replica is blamed
                self.metrics.errors.labels(replica.name, "health").inc()
                self.router.replica_failed(state, f"health check: {type(exc).__name__}: {exc}")
            return
        self.router.probe_ok(state)

    # ------------------------------------------------------------------ the front

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refused(
                arrived,
                413,
                f"request body is over the limit of {self.options.max_body} bytes "
                "(hetero serve --max-body)",
                "invalid_request_error",
            )
        try:
            payload = json.loads(body)
        except RecursionError:
            return self._refused(
                arrived,
                400,
                "request body is nested too deeply (JSON arrays and objects within each other)",
                "invalid_request_error",
            )
        except ValueError as exc:
            return self._refused(
                arrived, 400, f"request body is not valid JSON: {exc}", "invalid_request_error"
            )
        if not isinstance(payload, dict):
            return self._refused(
                arrived, 400, "request body must be a JSON object", "invalid_request_error"
            )
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            return self._refused(
                arrived,
                400,
                "field 'model' is required: the name of a served model (GET /v1/models)",
                "invalid_request_error",
            )
        raw_priority = request.headers.get("x-priority", "0")
        try:
            priority = int(raw_priority)
            if abs(priority) > _PRIORITY_LIMIT:
                raise ValueError(raw_priority)
        except ValueError:
            return self._refused(
                arrived,
                400,
                f"header x-priority must be an integer from {-_PRIORITY_LIMIT} to "
                f"{_PRIORITY_LIMIT} (higher first), got {brief(raw_priority)}",
                "invalid_request_error",
            )
        text = session = None
        if self.router.prefix_aware:
            session = request.headers.get("x-session-id", payload.get("user"))
            if session is not None and (
                not isinstance(session, str) or not 0 < len(session) <= _MAX_SESSION
            ):
                return self._refused(
                    arrived,
                    400,
                    "the session (header x-session-id, or field user) must be a string of 1 to "
                    f"{_MAX_SESSION} characters, got {brief(session)}",
                    "invalid_request_error",
                )
            text = prompt_text(payload, MAX_BLOCKS * BLOCK_CHARS)
        embeddings = request.path == "/v1/embeddings"
        try:
            max_tokens = 0 if embeddings else requested_max_tokens(payload)
        except ValueError as exc:
            return self._refused(arrived, 400, str(exc), "invalid_request_error")
        if self.limiter is not None:
            wait = self.limiter.take(_api_key(request), request.remote or "")
            if wait:
                return self._refused(
                    arrived,
                    429,
                    f"rate limit reached ({self.limiter.rate:g} requests/s per API key; "
                    "requests without a key, or with one new to the router, share one per "
                    "client address)",
                    "rate_limit_error",
                    {"Retry-After": str(max(1, round(wait)))},
                )
        try:
            ticket = self.router.admit(
                model, prompt_tokens(payload), max_tokens, priority, text=text, session=session
            )
        except UnknownModel as exc:
            return self._refused(arrived, 404, str(exc), "model_not_found")
        except NoReplica as exc:
            return self._refused(arrived, 503, str(exc), "service_unavailable")
        except QueueFull:
            return self._refused(
                arrived,
                429,
                f"the router's queue is full ({self.router.options.queue_size} waiting)",
                "rate_limit_error",
                {"Retry-After": "1"},
            )
        stream = payload.get("stream") is True and not embeddings
        outcome = Outcome()
        try:
            response = await self._serve(request, ticket, body, stream, outcome)
        except asyncio.CancelledError:  # the client hung up (its request has ended upstream)
            self._answered(request, ticket, _CLIENT_GONE, outcome, arrived, model, priority)
            raise
        self._answered(request, ticket, response.status, outcome, arrived, model, priority)
        return response

    def _refused(
        self,
        arrived: float,
        status: int,
        message: str,
        kind: str,
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        """An answer given before any replica saw the request, counted under replica "-"."""
        self.metrics.answered("-", status, time.monotonic() - arrived, None, None)
        return _error(status, message, kind, headers)

    async def _serve(
        self, request: web.Request, ticket: Ticket, body: bytes, stream: bool, outcome: Outcome
    ) -> web.StreamResponse:
        router = self.router
        assert self.session is not None
        try:
            while True:
                waiter = ticket.waiter
                placed = await waiter
                if waiter is not ticket.waiter:
                    # Stopped (and placed again, or ended) before this task woke up: a Run
                    # that is no longer true. The new waiter says what happens now.
                    continue
                if isinstance(placed, Finish):
                    status = 504 if placed.cause is Cause.TIMED_OUT else 502
                    return _error(status, f"request failed: {placed.reason}", "upstream_error")
                state = router.replicas[placed]
                ticket.task = asyncio.current_task()
                try:
                    if stream:
                        response = await forward_stream(
                            self.session,
                            router,
                            ticket,
                            state,
                            request.path,
                            body,
                            request,
                            outcome,
                            self.metrics,
                        )
                    else:
                        response = await forward(
                            self.session, router, ticket, state, request.path, body, outcome
                        )
                except asyncio.CancelledError:
                    if not ticket.stopped or client_gone(request):
                        raise
                    uncancel()
                    continue  # the dispatcher placed it again, or finished it
                finally:
                    ticket.task = None
                if response is not None:
                    return response
                self.metrics.errors.labels(state.replica.name, "attempt").inc()
        finally:
            if not ticket.ended:
                router.cancel(ticket, "client disconnected")

    def _answered(
        self,
        request: web.Request,
        ticket: Ticket,
        status: int,
        outcome: Outcome,
        arrived: float,
        model: str,
        priority: int,
    ) -> None:
        latency = time.monotonic() - arrived
        replica = self.router.replicas[ticket.replica].replica.name if ticket.replica >= 0 else "-"
        self.metrics.answered(replica, status, latency, outcome.output_tokens, outcome.ttft)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                json.dumps(
                    {
                        "time": round(time.time(), 3),
                        "path": request.path,
                        "model": model,
                        "status": status,
                        "replica": replica,
                        "attempts": ticket.attempts,
                        "latency_s": round(latency, 4),
                        "ttft_s": None if outcome.ttft is None else round(outcome.ttft, 4),
                        "prompt_tokens_est": ticket.prompt,
                        "output_tokens": outcome.output_tokens,
                        "priority": priority,
                        "client": request.remote,
                    }
                )
            )

    async def _models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "owned_by": "hetero"} for m in self.router.served_models()
        ]
        return web.json_response({"object": "list", "data": data})

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.router.status())

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _healthz(self, request: web.Request) -> web.Response:
        if self.router.closing or not self.router.any_up():
            return _error(
                503,
                "no healthy replica" if not self.router.closing else "shutting down",
                "service_unavailable",
            )
        return web.json_response({"status": "ok"})

    # ------------------------------------------------------------------ admin

    def _authorized(self, request: web.Request) -> web.Response | None:
        key = self.options.admin_key or ""
        given = _api_key(request)
        if not given:
            return _error(401, "admin API key missing (Authorization: Bearer KEY)", "auth_error")
        if not hmac.compare_digest(given.encode(), key.encode()):
            return _error(401, "wrong admin API key", "auth_error")
        return None

    async def _admin_list(self, request: web.Request) -> web.Response:
        return self._authorized(request) or web.json_response(self.router.status())

    async def _admin_add(self, request: web.Request) -> web.Response:
        denied = self._authorized(request)
        if denied:
            return denied
        try:
            data = await request.json()
            replica = replica_from_config(ReplicaConfig.model_validate(data))
        except ValueError as exc:  # bad JSON, pydantic's ValidationError, ConfigError
            return _error(400, f"bad replica: {exc}", "invalid_request_error")
        try:
            state = self.router.add(replica)
        except ConfigError as exc:
            return _error(409, str(exc), "conflict")
        await self._probe(state, models=True)
        if self.poller is not None:
            self.poller.watch(state)
        return web.json_response({"added": replica.name}, status=201)

    async def _admin_member(self, request: web.Request, action: str) -> web.Response:
        denied = self._authorized(request)
        if denied:
            return denied
        name = request.match_info["name"]
        try:
            getattr(self.router, action)(name)
        except ConfigError as exc:
            return _error(404, str(exc), "not_found")
        return web.json_response({action: name})

    async def _admin_drain(self, request: web.Request) -> web.Response:
        return await self._admin_member(request, "drain")

    async def _admin_undrain(self, request: web.Request) -> web.Response:
        return await self._admin_member(request, "undrain")

    async def _admin_remove(self, request: web.Request) -> web.Response:
        return await self._admin_member(request, "remove")
