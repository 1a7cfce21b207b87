"""The load endpoints of the engine an emulated replica speaks, with figures true to its own
state: SGLang's ``/get_load``, ``/v1/loads``, ``/server_info`` and ``/model_info``, vLLM's
``/version`` and ``/load``, and either's ``/metrics``; under ``load_fault`` they answer wrong."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from datetime import UTC, datetime
from typing import Any, Final

from aiohttp import web

from hetero.serve.emulator.engine_metrics import PROM_TYPE, huge_padding, loads_prometheus
from hetero.serve.emulator.state import EmulatorState

__all__ = ["SGLANG_VERSION", "VLLM_VERSION", "LoadRoutes"]

#: The releases whose load endpoints are emulated (and whose version they report).
SGLANG_VERSION: Final = "0.5.23"
VLLM_VERSION: Final = "0.33.0"
_GARBAGE: Final = "<html><body>502 Bad Gateway: not the format {\n"


class LoadRoutes:
    """The handlers of the engine's own endpoints over a replica's shared state; ``host`` and
    ``port`` are what ``/server_info`` reports it was launched with."""

    def __init__(self, state: EmulatorState, host: str, port: int) -> None:
        self._state = state
        self._host = host
        self._port = port

    async def _load_fault(self, content_type: str) -> web.Response | None:
        """What a load endpoint answers instead of its figures under load_fault, else None
        (after the delay under "slow"). The fault is read as the request comes in."""
        fault = self._state.config.load_fault
        if fault == "slow":
            await asyncio.sleep(self._state.config.load_delay)
        elif fault == "error":
            return web.Response(status=500, text="injected failure (load_fault=error)\n")
        elif fault == "garbage":
            return web.Response(text=_GARBAGE, headers={"Content-Type": content_type})
        return None

    def _json(self, body: Any) -> web.Response:
        # allow_nan: under load_fault="nan" the gauges are written as NaN, which is not JSON
        return web.json_response(body, dumps=functools.partial(json.dumps, allow_nan=True))

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        faulty = await self._load_fault(PROM_TYPE)
        if faulty is not None:
            return faulty
        state, cfg, engine = self._state, self._state.config, self._state.engine
        page_of = state.metrics.vllm_page if cfg.engine == "vllm" else state.metrics.sglang_page
        page = page_of(
            engine.load_now(), cfg.kv_capacity, state.gauge, state.cancelled, engine.cache_figures()
        )
        if cfg.load_fault == "huge":
            page = huge_padding() + page
        return web.Response(body=page.encode(), headers={"Content-Type": PROM_TYPE})

    async def get_load(self, request: web.Request) -> web.StreamResponse:
        # SGLang's /get_load up to 0.5.20 (a shim over /v1/loads, removed in 0.5.21), one entry
        # per data-parallel rank; sglang-router 0.3 polls it and reads num_tokens.
        faulty = await self._load_fault("application/json")
        if faulty is not None:
            return faulty
        engine = self._state.engine
        running, waiting, used, _ = engine.load_now()
        total = used + engine.waiting_tokens  # held, plus the prompts of the queue
        g = self._state.gauge
        return self._json(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": g(running + waiting),
                    "num_waiting_reqs": g(waiting),
                    "num_tokens": g(total),
                    "num_pending_tokens": g(total - used),
                    "ts_tic": time.perf_counter(),
                }
            ]
        )

    def _load_snapshot(self) -> dict[str, Any]:
        """One rank's entry of SGLang's /v1/loads (``LoadSnapshot.to_dict`` in
        ``sglang/srt/managers/load_snapshot.py``), core fields in its order."""
        cfg, engine = self._state.config, self._state.engine
        running, waiting, used, rate = engine.load_now()
        total = used + engine.waiting_tokens
        g = self._state.gauge
        cache = engine.cache_figures()
        return {
            "timestamp": time.time(),
            "dp_rank": 0,
            "num_running_reqs": g(running),
            "num_waiting_reqs": g(waiting),
            "num_waiting_uncached_tokens": g(engine.waiting_tokens),
            "num_used_tokens": g(used),
            "num_total_tokens": g(total),
            "num_active_tokens": g(total),
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": cfg.kv_capacity,
            "max_running_requests": cfg.slots,
            "token_usage": g(round(min(1.0, used / cfg.kv_capacity), 4)),
            "gen_throughput": g(round(rate, 2)),
            "cache_hit_rate": g(0.0 if cache is None else cache.hit_rate),
            "utilization": g(0.0),
            "total_prefill_uncached_tokens": self._state.metrics.prompt_total,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
            "memory": {
                "weight_gb": 0.0,
                "kv_cache_gb": 0.0,
                "graph_gb": 0.0,
                "token_capacity": cfg.kv_capacity,
            },
            "disaggregation": {
                "mode": "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
            "queues": {
                "waiting": g(waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        }

    async def v1_loads(self, request: web.Request) -> web.StreamResponse:
        # sglang/srt/entrypoints/v1_loads.py: ?dp_rank= filters, ?include= picks the sections,
        # ?format=prometheus writes each number as a gauge sglang_<field>{dp_rank="0"}.
        include = request.query.get("include")
        sections = {s.strip() for s in include.split(",")} if include else None
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if sections is not None and not sections <= valid:
            return web.json_response(
                {
                    "detail": f"Invalid include sections: {sections - valid}. "
                    f"Valid options: {sorted(valid)}"
                },
                status=400,
            )
        fmt = request.query.get("format")
        faulty = await self._load_fault(PROM_TYPE if fmt == "prometheus" else "application/json")
        if faulty is not None:
            return faulty
        load = self._load_snapshot()
        if sections is not None and "all" not in sections:
            named = {"memory": "memory", "disagg": "disaggregation", "queues": "queues"}
            for section, key in named.items():
                if section not in sections:
                    del load[key]
        dp_rank = request.query.get("dp_rank")
        loads = [load] if dp_rank is None or dp_rank == "0" else []
        if fmt == "prometheus":
            return web.Response(text=loads_prometheus(loads), headers={"Content-Type": PROM_TYPE})
        return self._json(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": SGLANG_VERSION,
                "accelerator": None,  # SGLang's answer where it finds no device name
                "num_accelerators": 1,
                "loads": loads,
            }
        )

    async def model_info(self, request: web.Request) -> web.StreamResponse:
        model = self._state.config.models[0]
        return web.json_response(
            {
                "model_path": model,
                "served_model_name": model,
                "tokenizer_path": model,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": "null",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "mock",
                "architectures": ["MockForCausalLM"],
            }
        )

    async def server_info(self, request: web.Request) -> web.StreamResponse:
        # SGLang 0.5.23's shape, cut to the fields routers read: the resolved server arguments,
        # the scheduler's figures, one internal state per data-parallel rank, the version. Here
        # max_running_requests is set, as by --max-running-requests (SGLang leaves it null
        # unless so launched; internal_states carries the cap it chose).
        faulty = await self._load_fault("application/json")
        if faulty is not None:
            return faulty
        cfg = self._state.config
        model = cfg.models[0]
        args: dict[str, Any] = {
            "model_path": model,
            "tokenizer_path": model,
            "served_model_name": model,
            "context_length": None,
            "max_running_requests": cfg.slots,
            "max_total_tokens": cfg.kv_capacity,
            "page_size": 1,
            "tp_size": 1,
            "pp_size": 1,
            "dp_size": 1,
            "attn_dp_size": 1,
            "enable_dp_attention": False,
            "disaggregation_mode": "null",
            "host": self._host,
            "port": self._port,
        }
        rate = self._state.engine.load_now().gen_rate
        return self._json(
            {
                **args,
                "launch_command": None,
                "status": "ready",
                "max_total_num_tokens": cfg.kv_capacity,
                "max_req_input_len": cfg.kv_capacity,
                "kv_events": None,
                "startup_time": 0.0,
                "internal_states": [
                    {
                        **args,
                        "world_size": 1,
                        "startup_time": 0.0,
                        "effective_max_running_requests_per_dp": cfg.slots,
                        "last_gen_throughput": self._state.gauge(rate),
                        "memory_usage": {
                            "weight": 0.0,
                            "kvcache": 0.0,
                            "startup_available": 0.0,
                            "token_capacity": cfg.kv_capacity,
                            "token_capacity_swa": None,
                            "graph": {},
                        },
                    }
                ],
                "version": SGLANG_VERSION,
                "frontend": "python",
                "mock": self._state.settings(),
            }
        )

    async def version(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"version": VLLM_VERSION})

    async def vllm_load(self, request: web.Request) -> web.StreamResponse:
        # vLLM counts the requests in flight on its API routes here when launched with
        # --enable-server-load-tracking (else it answers 0): the mock tracks them.
        faulty = await self._load_fault("application/json")
        if faulty is not None:
            return faulty
        engine = self._state.engine
        return self._json({"server_load": self._state.gauge(engine.in_flight + engine.waiting)})
