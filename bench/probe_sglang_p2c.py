"""Which load signal sglang-router's ``power_of_two`` compares, in front of fake workers.

Each variant starts three fake OpenAI-compatible workers in this process, each answering
``POST /v1/chat/completions`` after its own fixed delay (``--delays``; by default 5:2:1 in
speed, as the real benchmark's vLLM fleet), and answering the router's start-up probes as vLLM
0.32's OpenAI server does: ``/health`` 200, ``/v1/models``, ``/version``; 404 for
``/server_info`` (vLLM serves it only in dev mode), ``/model_info`` and their ``/get_*``
fallbacks. The variants differ only in the load endpoints:

- ``vllm``: ``GET /load`` -> ``{"server_load": 0}``, ``/get_load`` 404 -- what vLLM answers
  with server load tracking off (its default);
- ``no-load``: ``/load`` and ``/get_load`` both 404;
- ``load-inflight``: ``/load`` -> ``{"server_load": N}``, N the worker's requests in flight
  (vLLM with ``--enable-server-load-tracking``), ``/get_load`` 404;
- ``get-load-inflight``: ``/get_load`` answered in SGLang's shape (one data-parallel rank,
  ``num_reqs`` and ``num_tokens`` both N), ``/load`` 404.

Then the router (the benchmark's flags, ``bench/_serve_procs.py``, at ``--log-level debug``)
gets ``--requests`` requests from ``--concurrency`` clients, and each worker's share of them is
counted where it served them. Reported per variant: the shares, the paths each worker was asked
for (the load monitor's polls among them), and from the router's log the loads its
``Power-of-two selection`` lines compared (how many were ties, how often the first drawn worker
won) and its load monitor's lines.

Every process is stopped at the end (``_serve_procs.Children``); each request has a timeout
and each variant a deadline. Prints JSON; ``--out`` saves it.

    python bench/probe_sglang_p2c.py --out /tmp/probe_sglang_p2c.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from _common import command, emit, revision
from _serve_procs import Children, StartError, _router_command, _start_rust_router
from aiohttp import web

VARIANTS = ("vllm", "no-load", "load-inflight", "get-load-inflight")
MODEL = "fake-model"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SELECTION = re.compile(r"Power-of-two selection: (\S+)=(-?\d+) vs (\S+)=(-?\d+) -> selected (\S+)")
MONITOR = re.compile(
    r"(Starting load monitoring[^\n]*|Started LoadMonitor[^\n]*|No loads fetched[^\n]*"
    r"|Fetched loads from[^\n]*)"
)


@dataclass
class FakeWorker:
    """One fake vLLM worker's handlers and what it saw."""

    delay: float
    variant: str
    in_flight: int = 0
    served: int = 0
    paths: collections.Counter[str] = field(default_factory=collections.Counter)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.paths[f"{request.method} {request.path}"] += 1
        path, variant = request.path, self.variant
        if request.method == "POST" and path == "/v1/chat/completions":
            await request.read()
            self.in_flight += 1
            try:
                await asyncio.sleep(self.delay)
            finally:
                self.in_flight -= 1
            self.served += 1
            return web.json_response(completion())
        if (answer := vllm_basics(path)) is not None:
            return answer
        if path == "/load" and variant in ("vllm", "load-inflight"):
            load = self.in_flight if variant == "load-inflight" else 0
            return web.json_response({"server_load": load})
        if path == "/get_load" and variant == "get-load-inflight":
            n = self.in_flight
            rank = {"dp_rank": 0, "num_reqs": n, "num_waiting_reqs": 0, "num_tokens": n}
            return web.json_response([rank])
        return web.json_response({"detail": "Not Found"}, status=404)


def vllm_basics(path: str) -> web.Response | None:
    """vLLM 0.32's answer to a router's start-up probes of ``path`` (/health, /v1/models,
    /version); None for any other path."""
    if path == "/health":
        return web.Response(status=200)
    if path == "/v1/models":
        model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "vllm"}
        return web.json_response({"object": "list", "data": [{**model, "root": MODEL}]})
    if path == "/version":
        return web.json_response({"version": "0.32.0"})
    return None


def completion(rid: str = "chatcmpl-fake") -> dict[str, Any]:
    """A fake worker's one-token chat answer, id ``rid``."""
    message = {"role": "assistant", "content": "ok"}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }


class Fleet:
    """The fake workers, served from an event loop on a thread of their own (the router's
    start-up wait blocks the main thread)."""

    def __init__(self, delays: list[float], variant: str) -> None:
        self.workers = [FakeWorker(d, variant) for d in delays]
        self.urls: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runners: list[web.AppRunner] = []

    def start(self) -> list[str]:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self.urls

    async def _start(self) -> None:
        for worker in self.workers:
            app = web.Application()
            app.router.add_route("*", "/{path:.*}", worker.handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self._runners.append(runner)
            host, port = runner.addresses[0][:2]
            self.urls.append(f"http://{host}:{port}")

    def stop(self) -> None:
        async def cleanup() -> None:
            for runner in self._runners:
                await runner.cleanup()

        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(cleanup(), self._loop).result(15)
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(15)


async def drive(url: str, requests: int, concurrency: int, timeout: float) -> dict[str, Any]:
    """``requests`` chat requests from ``concurrency`` clients, each sending its next as its
    last is answered; the statuses."""
    statuses: collections.Counter[str] = collections.Counter()
    left = iter(range(requests))
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in left:
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    statuses[str(resp.status)] += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                statuses[type(exc).__name__] += 1

    limit = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=limit) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return dict(statuses)


def selections(log: str, urls: list[str]) -> dict[str, Any]:
    """What the router's ``Power-of-two selection`` lines say it compared."""
    picks = SELECTION.findall(log)
    loads: collections.Counter[str] = collections.Counter()
    ties = first = 0
    chosen: collections.Counter[int] = collections.Counter()
    for a, la, _b, lb, picked in picks:
        loads[la] += 1
        loads[lb] += 1
        ties += la == lb
        first += picked == a
        chosen[urls.index(picked) if picked in urls else -1] += 1
    n = len(picks)
    return {
        "lines": n,
        "ties": round(ties / n, 4) if n else None,
        "first_drawn_won": round(first / n, 4) if n else None,
        "loads_compared": dict(loads.most_common(8)),
        "picks_by_worker": [chosen[k] for k in range(len(urls))],
    }


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    fleet = Fleet(args.delays, variant)
    with Children() as children:
        try:
            urls = fleet.start()

            def router_command(
                worker_urls: Any, policy: str, port: int | str, metrics: int | str
            ) -> list[str]:
                module = "sglang_router.launch_router"
                return _router_command(module, "debug", worker_urls, policy, port, metrics)

            router, url = _start_rust_router(
                children, "sglang-router", router_command, urls, args.policy
            )
            time.sleep(args.settle)  # the load monitor's first polls
            started = time.monotonic()
            statuses = asyncio.run(
                asyncio.wait_for(
                    drive(url, args.requests, args.concurrency, args.request_timeout),
                    args.deadline,
                )
            )
            wall = time.monotonic() - started
            log = ANSI.sub("", router.output() + "\n" + router.stderr.read_text(errors="replace"))
        finally:
            fleet.stop()
    served = [w.served for w in fleet.workers]
    total = max(1, sum(served))
    monitor = collections.Counter(re.sub(r"\d+", "N", m) for m in MONITOR.findall(log))
    interval = re.search(r"Starting load monitoring with interval: (\S+)", log)
    return {
        "variant": variant,
        "statuses": statuses,
        "wall_s": round(wall, 2),
        "served": served,
        "shares": [round(s / total, 4) for s in served],
        "paths_asked": [dict(sorted(w.paths.items())) for w in fleet.workers],
        "router_selections": selections(log, urls),
        "router_load_monitor_interval": interval.group(1) if interval else None,
        "router_load_monitor_lines": dict(monitor.most_common(12)),
    }


def fleet_options(parser: argparse.ArgumentParser, delays: list[float]) -> None:
    """The options every probe of fake workers takes: their delays, the timeouts, --out."""
    default = ",".join(f"{d:g}" for d in delays)
    parser.add_argument(
        "--delays",
        type=lambda s: [float(x) for x in s.split(",")],
        default=delays,
        help=f"seconds each worker takes to answer, comma-separated (default {default})",
    )
    parser.add_argument("--request-timeout", type=float, default=30.0)
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds per variant")
    parser.add_argument("--out", help="also save the JSON here")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="load endpoints"
    )
    fleet_options(parser, [0.1, 0.25, 0.5])
    parser.add_argument("--policy", default="power_of_two", help="sglang-router's --policy")
    parser.add_argument("--requests", type=int, default=400, help="per variant (default 400)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients (default 16)")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds before sending")
    args = parser.parse_args(argv)
    from importlib import metadata

    runs = []
    for variant in args.variants:
        try:
            runs.append(run_variant(variant, args))
        except (StartError, TimeoutError) as exc:
            runs.append({"variant": variant, "error": f"{type(exc).__name__}: {exc}"[-2000:]})
    doc = {
        "benchmark": "probe_sglang_p2c",
        "command": command("bench/probe_sglang_p2c.py", argv or []),
        "sglang_router": metadata.version("sglang-router"),
        "revision": revision(),
        "delays_s": args.delays,
        "policy": args.policy,
        "requests": args.requests,
        "concurrency": args.concurrency,
        "runs": runs,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
