"""``hetero serve``'s HTTP side: the OpenAI-compatible front, the admin API, health checks.

The front (``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/models``,
``/status``, ``/metrics``, ``/health``) listens where the user says; the admin API
(``/admin/replicas``...) listens on its own address, 127.0.0.1 unless told otherwise, and only
when an admin key is set. Here: the settings, the life of the listeners and the front's routes;
a request is read and checked in ``client_requests.py``, the listeners are ``listener.py``'s, the
admin routes ``admin.py``'s, the health checks ``probes.py``'s; ``proxy.py`` forwards one
attempt and says how it went (``outcomes.py``), and ``_serve`` alone tells the router.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from hetero.errors import ConfigError, NoReplica, QueueFull, UnknownModel
from hetero.sched import Cause, Finish
from hetero.serve.admin import AdminApi
from hetero.serve.client_requests import (
    Completion,
    Refused,
    api_key,
    error_response,
    read_completion,
    same_key,
)
from hetero.serve.cost import prompt_tokens
from hetero.serve.engine_probe import measure_engine
from hetero.serve.listener import ADMIN_CONNECTIONS, connection_cap, listen
from hetero.serve.logs import RepeatFilter
from hetero.serve.metrics import ServeMetrics
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
from hetero.serve.poller import LoadPoller
from hetero.serve.probes import HealthChecks
from hetero.serve.proxy import (
    RequestContext,
    client_gone,
    end_stopped,
    end_stream,
    forward,
    forward_stream,
)
from hetero.serve.ratelimit import RateLimiter
from hetero.serve.records import ReplicaState
from hetero.serve.router import Router, Ticket
from hetero.serve.upstream import Upstream

if TYPE_CHECKING:
    from hetero.serve.autoscale.controller import AutoscaleController

__all__ = ["LOAD_INTERVAL", "SLO_LOAD_INTERVAL", "ServeOptions", "Server"]

log = logging.getLogger("hetero.serve")
access_log = logging.getLogger("hetero.serve.access")

_COMPLETIONS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
#: Loggers whose repeated messages are written once per interval (their children are not:
#: the access log keeps every line).
_FLOODABLE = ("asyncio", "aiohttp.server", "aiohttp.web", "hetero.serve")
#: The status of a request whose client hung up before its answer (nginx's "client closed").
_CLIENT_GONE = 499
#: Seconds a connection to a replica is kept idle for reuse: under uvicorn's 5.
_IDLE_CONNECTION_S = 4.0
#: Seconds between reads of a replica's published load: often enough for the learned capacity
#: to see a queue form within a few requests.
LOAD_INTERVAL = 0.1
#: The same under strategy slo, whose own books track what each replica runs: the reads give
#: its KV size, cap and prefix-cache counters, none of which changes by the tenth of a second,
#: and each costs the engine's server CPU (vLLM's CPU build: 4.1 ms to render its 50 KB
#: /metrics, measured beside this change; at ten reads a second 4% of its core).
SLO_LOAD_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """The HTTP side's settings (``hetero serve`` flags of the same names)."""

    host: str = "127.0.0.1"
    port: int = 8080
    admin_host: str = "127.0.0.1"
    admin_port: int | None = None  # None: port + 1 (or a free port when port is 0)
    admin_key: str | None = None
    max_body: int = 8 * 2**20
    # A replica's answer to a request that is not a stream, in bytes at most (then 502): the
    # router holds it whole before passing it on.
    max_reply: int = 64 * 2**20
    rate_limit: float | None = None  # requests per second per client (see RateLimiter)
    health_interval: float = 2.0
    # Seconds between reads of each replica's published load; None: LOAD_INTERVAL, or
    # SLO_LOAD_INTERVAL under strategy slo.
    load_interval: float | None = None
    load_reads: float = 50.0  # reads per second over the whole fleet at most (their budget)
    drain_timeout: float = 30.0
    # Seconds a connection has to send a request's headers, from its opening or its previous
    # answer (so also how long an idle keep-alive connection stays open).
    header_timeout: float = 15.0
    # Client connections open at once at most (None: as many as the descriptor limit,
    # RLIMIT_NOFILE, allows; never more).
    max_connections: int | None = None

    def __post_init__(self) -> None:
        problems = []
        for name in ("health_interval", "load_interval", "load_reads", "header_timeout"):
            value = getattr(self, name)
            if value is None and name == "load_interval":
                continue  # the default: chosen by the strategy
            if not (isinstance(value, int | float) and 0 < value < 1e9):
                problems.append((name, f"must be a number > 0, got {value!r}"))
        cap = self.max_connections
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            problems.append(("max_connections", f"must be an integer >= 1, got {cap!r}"))
        reply = self.max_reply
        if isinstance(reply, bool) or not isinstance(reply, int) or reply < 1:
            problems.append(("max_reply", f"must be a number of bytes >= 1, got {reply!r}"))
        if problems:
            raise ConfigError(problems)


class _Answer:
    """One client request's answer as it goes: what the access log and the metrics learn of
    it (also when the client hangs up mid-way), and its stream once under way. As the proxy's
    ``StreamWatch``, it tells the router of the stream's first event and pace."""

    __slots__ = ("output_tokens", "router", "stream", "ticket", "ttft")

    def __init__(self, router: Router, ticket: Ticket) -> None:
        self.router = router
        self.ticket = ticket
        self.output_tokens: int | None = None
        self.ttft: float | None = None
        self.stream: web.StreamResponse | None = None

    def began(self, response: web.StreamResponse, ttft: float) -> None:
        self.ticket.answering = True  # the router no longer moves it elsewhere
        self.ttft = ttft
        self.stream = response
        self.router.first_token(self.ticket)

    def progress(self, chunks: int) -> None:
        self.router.progress(self.ticket, chunks)


class Server:
    """The router behind its HTTP listeners. ``start()``, then ``stop()`` (or ``drain()``)."""

    def __init__(self, router: Router, options: ServeOptions | None = None) -> None:
        self.router = router
        self.options = options = options or ServeOptions()
        self.metrics = ServeMetrics(router)
        self.limiter = RateLimiter(options.rate_limit) if options.rate_limit else None
        self.session: aiohttp.ClientSession | None = None  # health checks and load reads
        self.upstream = Upstream(idle_timeout=_IDLE_CONNECTION_S)  # the requests
        self._runners: list[web.AppRunner] = []
        self._checks: HealthChecks | None = None
        self._health: asyncio.Task[None] | None = None
        self._measuring: set[asyncio.Task[None]] = set()  # probes of replicas that joined
        self.poller: LoadPoller | None = None
        self.url = ""
        self.admin_url: str | None = None
        self._repeats = RepeatFilter()
        self.autoscaler: AutoscaleController | None = None  # shown in /status when set
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
            # Idle connections are dropped before the engines' servers drop them (uvicorn, under
            # vLLM and SGLang, after 5 s): one reused as the server closes it fails its write,
            # which would read as the replica's fault.
            connector=aiohttp.TCPConnector(
                limit=0, ttl_dns_cache=300, keepalive_timeout=_IDLE_CONNECTION_S
            ),
            cookie_jar=aiohttp.DummyCookieJar(),  # replicas set no cookies worth keeping
            # No total: the dispatcher's deadline ends a request (a Stop). A second timer of
            # the same length fires in the same loop turn, and aiohttp then turns the Stop's
            # cancellation into a TimeoutError that would read as the replica's fault.
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )
        self._checks = checks = HealthChecks(
            self.router, self.session, self.metrics, o.health_interval
        )
        await asyncio.gather(*(checks.probe(s, models=True) for s in self.router.replicas))
        await asyncio.gather(*(self._measure(s) for s in self.router.replicas))
        every = o.load_interval
        if every is None:
            every = SLO_LOAD_INTERVAL if self.router.slo_policy is not None else LOAD_INTERVAL
        self.poller = LoadPoller(self.router, self.session, every, max_reads=o.load_reads)
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
        # A client of the front that hangs up cancels its handler, and with it the request
        # upstream (an admin call runs to its end).
        self.url = await self._listen(
            self.app, o.host, o.port, min(o.max_connections or cap, cap), cancel_on_hangup=True
        )
        if o.admin_key:
            admin = AdminApi(self.router, o.admin_key, self.replica_added).app()
            port = o.admin_port if o.admin_port is not None else (o.port + 1 if o.port else 0)
            self.admin_url = await self._listen(admin, o.admin_host, port, ADMIN_CONNECTIONS)
        self._health = asyncio.create_task(checks.run())
        return self.url

    async def _listen(
        self, app: web.Application, host: str, port: int, cap: int, cancel_on_hangup: bool = False
    ) -> str:
        runner, url = await listen(
            app,
            host,
            port,
            cap,
            cancel_on_hangup=cancel_on_hangup,
            header_timeout=self.options.header_timeout,
        )
        self._runners.append(runner)
        return url

    async def replica_added(self, state: ReplicaState) -> None:
        """A replica added while serving (the admin API, the autoscaler): learn what it
        serves, read its load."""
        assert self._checks is not None
        await self._checks.probe(state, models=True)
        if self.poller is not None:
            self.poller.watch(state)
        # Timed meanwhile, not before it serves: the policy's slow start covers a replica
        # that joins under traffic, and a joining replica is counted warm once added.
        if self.router.slo_policy is not None:
            task = asyncio.create_task(self._measure(state))
            self._measuring.add(task)
            task.add_done_callback(self._measuring.discard)

    async def _measure(self, state: ReplicaState) -> None:
        """Under strategy slo, time one lone request on a replica that answers
        (``hetero.serve.engine_probe``)."""
        models = state.replica.models
        if self.router.slo_policy is None or not models or state.removed:
            return
        sample = await measure_engine(self.upstream, state.replica.url, min(models))
        if sample is not None:
            self.router.measured(state, sample)

    async def drain(self) -> None:
        """Graceful shutdown: refuse new requests (503), let admitted ones finish (up to
        ``drain_timeout`` seconds), then stop."""
        self.router.closing = True
        deadline = time.monotonic() + self.options.drain_timeout
        while self.router.tickets and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self) -> None:
        for task in list(self._measuring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
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
        await self.upstream.close()
        self._checks = None
        for name in _FLOODABLE:
            logging.getLogger(name).removeFilter(self._repeats)

    # ------------------------------------------------------------------ the front

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        arrived = time.monotonic()
        try:
            call = await read_completion(request, self.options.max_body, self.router.prefix_aware)
            self._limit(request)
            ticket = self._admit(call)
        except Refused as refused:
            # Answered before any replica saw the request: counted under replica "-".
            self.metrics.answered("-", refused.status, time.monotonic() - arrived, None, None)
            return refused.response()
        answer = _Answer(self.router, ticket)
        try:
            response = await self._serve(request, ticket, call, answer)
        except asyncio.CancelledError:  # the client hung up (its request has ended upstream)
            self._answered(request, ticket, _CLIENT_GONE, answer, arrived, call)
            raise
        self._answered(request, ticket, response.status, answer, arrived, call)
        return response

    def _limit(self, request: web.Request) -> None:
        """``Refused`` (429) when the request's API key is over the rate limit."""
        if self.limiter is None:
            return
        wait = self.limiter.take(api_key(request), request.remote or "")
        if wait:
            raise Refused(
                429,
                f"rate limit reached ({self.limiter.rate:g} requests/s per client address; "
                "an API key counts against the address it was first used from)",
                "rate_limit_error",
                {"Retry-After": str(max(1, round(wait)))},
            )

    def _admit(self, call: Completion) -> Ticket:
        """The router's ticket for ``call``; ``Refused`` with the status its refusal maps to."""
        try:
            return self.router.admit(
                call.model,
                prompt_tokens(call.payload),
                call.max_tokens,
                call.priority,
                text=call.text,
                session=call.session,
            )
        except UnknownModel as exc:
            raise Refused(404, str(exc), "model_not_found") from exc
        except NoReplica as exc:
            raise Refused(503, str(exc), "service_unavailable") from exc
        except QueueFull as exc:
            raise Refused(
                429,
                f"the router's queue is full ({self.router.options.queue_size} waiting)",
                "rate_limit_error",
                {"Retry-After": "1"},
            ) from exc

    async def _serve(
        self, request: web.Request, ticket: Ticket, call: Completion, answer: _Answer
    ) -> web.StreamResponse:
        """Forward ``ticket`` wherever the router places it until an attempt ends it: each
        attempt's outcome is reported here, and nowhere else; one that failed (or met a 429)
        is placed again or ended by the router, and ``ticket.waiter`` says which."""
        router = self.router
        context = RequestContext(self.upstream, request, call.body, self.options.max_reply)
        try:
            while True:
                # The waiter says where the ticket runs (a replica's position) or how it ended;
                # a Stop between a Run and this task's waking gives it a fresh one, which says.
                waiter = ticket.waiter
                placed = await waiter
                if waiter is not ticket.waiter:
                    continue
                if isinstance(placed, Finish):
                    status = 504 if placed.cause is Cause.TIMED_OUT else 502
                    return error_response(
                        status, f"request failed: {placed.reason}", "upstream_error"
                    )
                replica = router.replicas[placed].replica
                ticket.task = asyncio.current_task()
                try:
                    if call.stream:
                        outcome = await forward_stream(context, replica, answer)
                    else:
                        outcome = await forward(context, replica)
                except asyncio.CancelledError:
                    stream = answer.stream
                    if not ticket.stopped or (stream is None and client_gone(request)):
                        raise  # the client hung up: its request ends below
                    # The router stopped the attempt (a timeout, a circuit opening) by
                    # cancelling this task, which goes on (see _uncancel).
                    _uncancel()
                    if stream is None:
                        continue  # placed again, or ended: the waiter says
                    await end_stopped(stream, ticket.stopped, ticket.stop_cause)
                    router.cancel(ticket, ticket.stopped)
                    return stream
                finally:
                    ticket.task = None
                response = self._report(ticket, replica.name, outcome, answer)
                if call.stream:
                    await end_stream(outcome, replica.name)
                if response is not None:
                    return response
        finally:
            if not ticket.ended:
                router.cancel(ticket, "client disconnected")

    def _report(
        self, ticket: Ticket, replica: str, outcome: Outcome, answer: _Answer
    ) -> web.StreamResponse | None:
        """Tell the router how the attempt on ``replica`` went. Returns the response that ends
        the request, or None when the router places it again (or ends it)."""
        router = self.router
        match outcome:
            case Answered():
                answer.output_tokens = outcome.output_tokens
                router.complete(
                    ticket,
                    outcome.output_tokens,
                    outcome.latency,
                    outcome.ttft,
                    outcome.prompt_tokens,
                )
                return outcome.response
            case ReplicaRefused():
                router.complete(ticket, 0, outcome.latency)  # no output: nothing to learn
                return outcome.response
            case Failed():
                router.fail(ticket, outcome.reason, outcome.retryable)
            case Busy():
                router.busy(ticket, outcome.retry_after)
            case StreamBroke():
                self.metrics.errors.labels(replica, "stream").inc()
                router.fail(ticket, outcome.reason, retryable=False)
                return outcome.response
            case ClientGone():
                router.cancel(ticket, "client disconnected")
                return outcome.response
            case OutOfResources():
                reason = f"hetero serve ran out of resources: {outcome.what}"
                router.cancel(ticket, reason, failed=True)
                return outcome.response
        self.metrics.errors.labels(replica, "attempt").inc()
        return None

    def _answered(
        self,
        request: web.Request,
        ticket: Ticket,
        status: int,
        answer: _Answer,
        arrived: float,
        call: Completion,
    ) -> None:
        latency = time.monotonic() - arrived
        replica = self.router.replicas[ticket.replica].replica.name if ticket.replica >= 0 else "-"
        self.metrics.answered(replica, status, latency, answer.output_tokens, answer.ttft)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                json.dumps(
                    {
                        "time": round(time.time(), 3),
                        "path": request.path,
                        "model": call.model,
                        "status": status,
                        "replica": replica,
                        "attempts": ticket.attempts,
                        "latency_s": round(latency, 4),
                        "ttft_s": None if answer.ttft is None else round(answer.ttft, 4),
                        "prompt_tokens_est": ticket.prompt,
                        "output_tokens": answer.output_tokens,
                        "priority": call.priority,
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
        # Where the replicas are and what went wrong there is the admin key's to see, when
        # there is one; without one, the front shows all as before.
        key = self.options.admin_key
        full = not key or same_key(api_key(request), key)
        status = self.router.status(full)
        if self.autoscaler is not None and full:
            status["autoscale"] = self.autoscaler.status()
        return web.json_response(status)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), content_type="text/plain", charset="utf-8")

    async def _healthz(self, request: web.Request) -> web.Response:
        if self.router.closing or not self.router.any_up():
            return error_response(
                503,
                "no healthy replica" if not self.router.closing else "shutting down",
                "service_unavailable",
            )
        return web.json_response({"status": "ok"})


def _uncancel() -> None:
    """Take back the cancellation by which the router stopped this task's attempt, handled.
    Python (3.11 on) counts a task's pending cancellations, and asyncio.timeout (aiohttp's
    connect timeout is one) and TaskGroup tell from that count whether a CancelledError is
    theirs to handle or the task's: left raised, a timeout in the next attempt could come out
    as a CancelledError, which ``_serve`` reads as the client having hung up. (An attempt run as
    a task of its own, cancelled in this one's place, would need none: it costs every request a
    task, and a client that hung up just as its attempt ended would lose the attempt's
    outcome.)"""
    task = asyncio.current_task()
    if task is not None and sys.version_info >= (3, 11):
        task.uncancel()
