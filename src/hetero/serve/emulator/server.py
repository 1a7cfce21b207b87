"""An emulated OpenAI-compatible inference replica.

A real aiohttp server that answers ``/v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings`` and ``/v1/models`` in OpenAI's wire format and takes as long as a replica of a
given relative speed would: prefill time per prompt token, decode time per output token, both
divided by ``speed``. Routers and benchmarks run against it on machines without accelerators.

It speaks the load endpoints of the engine it emulates (``engine``), with figures true to its
own state, so that routers' engine adapters can be tested without the engine:

- ``sglang`` (SGLang 0.5.23): ``/get_server_info`` and ``/server_info``, ``/v1/loads``,
  ``/get_model_info`` and ``/model_info``, ``/metrics`` (``sglang:*``), ``/health_generate``, and
  ``/get_load`` (gone from SGLang since 0.5.21, kept because sglang-router 0.3 polls it);
- ``vllm`` (vLLM 0.33.0): ``/metrics`` (``vllm:*``, v1 engine), ``/version``, ``/load``;
- ``openai``: the OpenAI API and ``/health`` alone.

``/mock/config`` changes its speed or injects failures while it runs, on the API routes
(``fail_rate``, ``garbage_rate``, ``slowdown``) or on the load endpoints (``load_fault``).

It is built of parts, each in a module of its own in this package: :class:`MockConfig`
(``config``), the shared state of config and counters (``state``) around the engine that paces
the requests (``replica_engine``: ``slots`` or ``continuous``), the OpenAI routes
(``openai_routes``) and the request bodies they read (``request_bodies``), the engine's load
endpoints (``load_routes``) and its Prometheus pages (``engine_metrics``). This module ties them
to one aiohttp server.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Final

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from hetero.errors import ConfigError
from hetero.serve.emulator.config import (
    ENGINES,
    LOAD_FAULTS,
    OUTPUT_DISTS,
    Engine,
    LoadFault,
    MockConfig,
    OutputDist,
    draw_output_length,
)
from hetero.serve.emulator.load_routes import SGLANG_VERSION, VLLM_VERSION, LoadRoutes
from hetero.serve.emulator.openai_routes import OpenAIRoutes
from hetero.serve.emulator.request_bodies import (
    EMBEDDING_DIM,
    BadRequest,
    json_object,
    openai_error,
)
from hetero.serve.emulator.state import EmulatorState
from hetero.serve.listener import http_url

# The emulator's public names, wherever they are defined: this module is the import path.
__all__ = [
    "EMBEDDING_DIM",
    "ENGINES",
    "LOAD_FAULTS",
    "OUTPUT_DISTS",
    "SGLANG_VERSION",
    "VLLM_VERSION",
    "Engine",
    "LoadFault",
    "MockConfig",
    "MockReplica",
    "OutputDist",
    "draw_output_length",
]

_MAX_BODY = 64 * 1024 * 1024  # long prompts are part of the workloads
_STOP_GRACE_S = 0.01
_TUNABLE: Final = ("speed", "slowdown", "fail_rate", "garbage_rate", "load_fault", "load_delay")


class _QuietProbes(logging.Filter):
    """Drops the traceback aiohttp logs for each gRPC probe: sglang-router opens every worker
    with an HTTP/2 preface (``PRI * HTTP/2.0``) to find out whether it speaks gRPC, and the 400
    answered to it is that probe's expected outcome, not a fault."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, BadHttpMessage) and "PRI" in str(exc))


_server_log = logging.getLogger(__name__)
_server_log.addFilter(_QuietProbes())


class MockReplica:
    """An emulated replica on ``host:port`` (port 0: a free one), serving until :meth:`stop`.

    Usage::

        rep = MockReplica(MockConfig(speed=2.5), port=0)
        url = await rep.start()  # "http://127.0.0.1:PORT"
        ...
        await rep.stop()
    """

    def __init__(self, config: MockConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._url: str | None = None
        self._runner: web.AppRunner | None = None
        self._state = EmulatorState(config)
        self._openai = OpenAIRoutes(self._state)
        self._load = LoadRoutes(self._state, host, port)

    @property
    def config(self) -> MockConfig:
        return self._state.config

    @property
    def url(self) -> str:
        """``http://HOST:PORT``, once started."""
        if self._url is None:
            raise RuntimeError("the MockReplica is not started: await start() first")
        return self._url

    @property
    def stats(self) -> dict[str, int]:
        """Counters since start: ``requests`` received on the API routes, ``completed``,
        ``failed`` (an error or garbage answered), ``cancelled`` (the client left or the replica
        stopped), ``in_flight`` (being served: holding a slot, or running in the engine),
        ``waiting`` (for a slot, or in the engine's queue), ``tokens_out``."""
        state = self._state
        return {
            "requests": state.requests,
            "completed": state.completed,
            "failed": state.failed,
            "cancelled": state.cancelled,
            "in_flight": state.engine.in_flight,
            "waiting": state.engine.waiting,
            "tokens_out": state.tokens_out,
        }

    def configure(
        self,
        *,
        speed: float | None = None,
        slowdown: float | None = None,
        fail_rate: float | None = None,
        garbage_rate: float | None = None,
        load_fault: LoadFault | None = None,
        load_delay: float | None = None,
    ) -> MockConfig:
        """Change these settings now; requests that start service later see them (a stream
        already running keeps its pace). Returns the new config; bad values raise
        :class:`~hetero.errors.ConfigError` and change nothing."""
        changes: dict[str, Any] = {
            "speed": speed,
            "slowdown": slowdown,
            "fail_rate": fail_rate,
            "garbage_rate": garbage_rate,
            "load_fault": load_fault,
            "load_delay": load_delay,
        }
        self._state.config = dataclasses.replace(
            self._state.config, **{k: v for k, v in changes.items() if v is not None}
        )
        return self._state.config

    async def start(self) -> str:
        """Listen and return the URL; ``OSError`` when the address cannot be bound."""
        if self._runner is not None:
            raise RuntimeError(f"the MockReplica is already listening on {self._url}")
        app = web.Application(client_max_size=_MAX_BODY)
        api, load, engine = self._openai, self._load, self._state.config.engine
        routes = [
            web.post("/v1/chat/completions", api.chat),
            web.post("/v1/completions", api.completions),
            web.post("/v1/embeddings", api.embeddings),
            web.get("/v1/models", api.models),
            web.get("/health", self._health),
            web.post("/mock/config", self._mock_config),
            web.get("/mock/stats", self._mock_stats),
        ]
        if engine == "sglang":
            routes += [
                web.get("/health_generate", self._health),
                web.get("/get_load", load.get_load),
                web.get("/v1/loads", load.v1_loads),
                web.get("/server_info", load.server_info),
                web.get("/get_server_info", load.server_info),  # deprecated, still answered
                web.get("/model_info", load.model_info),
                web.get("/get_model_info", load.model_info),
                web.get("/metrics", load.metrics),
            ]
        elif engine == "vllm":
            routes += [
                web.get("/metrics", load.metrics),
                web.get("/version", load.version),
                web.get("/load", load.vllm_load),
            ]
        app.add_routes(routes)
        # handler_cancellation: a client that leaves cancels its handler, which frees its slot.
        # stop() cuts in-flight requests, as a replica that dies would; aiohttp reads a timeout of
        # 0 as none at all, so the shortest grace is a small positive one.
        runner = web.AppRunner(
            app,
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=_STOP_GRACE_S,
            logger=_server_log,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._host, self._port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        port = runner.addresses[0][1]
        self._url = http_url(self._host, port)
        return self._url

    async def stop(self) -> None:
        """Close the server; requests still running are cut. Safe to call twice."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            await self._state.close()

    async def _health(self, request: web.Request) -> web.StreamResponse:
        return web.Response()

    # --- control --------------------------------------------------------------------------------

    async def _mock_config(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json_object(await request.read())
        except BadRequest as exc:
            return openai_error(exc.status, exc.message)
        unknown = sorted(set(body) - set(_TUNABLE))
        if unknown:
            return openai_error(
                400, f"cannot change {', '.join(unknown)}; settable: {', '.join(_TUNABLE)}"
            )
        try:
            self.configure(**body)
        except ConfigError as exc:
            return openai_error(400, str(exc))
        return web.json_response(self._state.settings())

    async def _mock_stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(self.stats)
