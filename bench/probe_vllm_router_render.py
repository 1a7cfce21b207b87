"""Whether vllm-router's ``cache_aware`` follows prefixes in front of vLLM, with and without the
render it asks every worker for.

vllm-router 0.1.17's ``cache_aware`` keeps token ids in its prefix tree, not text: for each chat
request it first asks every worker ``POST /v1/chat/completions/render`` and routes by the
token ids they answer. vLLM 0.32 serves that endpoint only when started with
``--enable-scale-out``; without it, it answers 403 ("Scale-out endpoints are disabled").

Each variant starts three fake OpenAI-compatible workers in this process, each answering
``POST /v1/chat/completions`` after its own delay (``--delays``, each request's drawn between
half and one and a half times it; by default one worker 5x slower than the other two), with a
reply whose id names the worker, and answering the router's start-up probes as vLLM's OpenAI
server does (``/health``, ``/v1/models``, ``/version``, ``/load`` -> ``{"server_load": 0}``,
404 for the rest). The variants differ in the render:

- ``refused``: 403 with vLLM's error body, as vLLM without ``--enable-scale-out`` (the
  benchmark's engines);
- ``rendered``: token ids in vLLM's response shape (its ``GenerateRequest``: ``request_id``,
  ``token_ids``, ``sampling_params``, ``model``, ...), the prompt tokenized as a chat template
  does (a role marker, the content's words, an end marker per message, then the assistant's
  marker), so that each turn's tokens begin with the previous turn's;
- ``refused-held``: as ``refused``, the last worker holding its 403 ``--render-hold`` seconds
  (an engine slow to answer the render too), for what the render's round trip adds to a request;
- ``sglang``: the same workers as ``refused`` behind sglang-router's ``cache_aware``, which
  matches text and asks for no render.

The routers run with the benchmark's flags (``bench/_serve_procs.py``). The workload:
``--conversations`` conversations of ``--turns`` turns (a user message of 200 characters, the
assistant's reply of 300 sent back with the next turn), a system prompt of ``--system-chars``
characters shared by each ``--group`` conversations, ``--concurrency`` conversations at once,
the turns of one in sequence (after a think time drawn up to ``--think`` seconds). Reported per
variant: the requests each worker served and its share; the continuing turns (all but each
conversation's first) served by the worker of the conversation's previous turn, of how many;
the router's ``vllm_router_prefix_routing_decisions_total`` by ``outcome`` and
``vllm_router_kv_routing_inputs_total`` by ``result``, scraped from its metrics port at the end
(sglang-router has neither); the render calls each worker got (and every path it was asked);
how many requests reached a worker with the fewest in flight as they arrived, how many of those
were ties, and how many of the ties went to the first of the tied in the router's worker order
(its ``Router ready`` line); the requests' mean time at the client.

The speeds change none of the findings (an earlier, rougher version of this probe ran equal
speeds and one worker 5x slower, streamed or not, with the OpenAI ``user`` field or not, all
alike); the default is one slower worker, the benchmark's fleets being uneven. Under
``refused`` the continuing turns that stay on their worker do so by chance, and their count
moves with the speeds, the draws of service and think times (``--seed``) and the router's
worker order.

Each variant runs ``--repeats`` times, each with a router of its own: vllm-router lists its
workers in a hash map's order, drawn anew at each start, and its ties go to the first of them.
sglang-router, starting, sends each worker HTTP/2 prefaces, which these workers refuse (aiohttp
prints a traceback for each) as vLLM's HTTP/1.1 server does.

Every process is stopped at the end (``_serve_procs.Children``); each request has a timeout
and each variant a deadline. Prints JSON; ``--out`` saves it.

    python bench/probe_vllm_router_render.py --out bench/results/probe_vllm_router_render.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import random
import re
import sys
import time
import urllib.request
import zlib
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from _common import command, emit, revision
from _serve_procs import Child, Children, StartError, start_sglang_router, start_vllm_router
from aiohttp import web
from probe_sglang_p2c import ANSI, MODEL, Fleet, completion, fleet_options, vllm_basics

VARIANTS = ("refused", "rendered", "refused-held", "sglang")
RENDER_PATH = "/v1/chat/completions/render"
# vLLM 0.32's answer without --enable-scale-out (vllm/entrypoints/scale_out/factories.py).
REFUSAL = (
    "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
)
READY = re.compile(r"Router ready \| workers: \[([^\]]*)\]")
METRIC = re.compile(r"^(\w+)\{([^}]*)\}\s+(\S+)$", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')
ROLES = {"system": 1, "user": 2, "assistant": 3}


@dataclass
class RenderWorker:
    """One fake vLLM worker: its handlers and what it saw. ``fleet`` is every worker, for the
    loads each request found as it arrived."""

    index: int
    delay: float
    render: str  # "refused" or "rendered"
    render_hold: float
    draws: random.Random
    fleet: list[RenderWorker]
    in_flight: int = 0
    served: int = 0
    arrivals: list[list[int]] = field(default_factory=list)  # each request's loads found
    paths: collections.Counter[str] = field(default_factory=collections.Counter)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.paths[f"{request.method} {request.path}"] += 1
        path = request.path
        if request.method == "POST" and path == "/v1/chat/completions":
            await request.read()
            self.arrivals.append([w.in_flight for w in self.fleet])
            self.in_flight += 1
            try:
                await asyncio.sleep(self.delay * self.draws.uniform(0.5, 1.5))
            finally:
                self.in_flight -= 1
            self.served += 1
            return web.json_response(completion(f"chatcmpl-w{self.index}-{self.served}"))
        if request.method == "POST" and path == RENDER_PATH:
            body = await request.json()
            await asyncio.sleep(self.render_hold)
            if self.render == "rendered":
                return web.json_response(_rendered(body))
            error = {"message": REFUSAL, "type": "PermissionDeniedError", "param": None}
            return web.json_response({"error": {**error, "code": 403}}, status=403)
        if (answer := vllm_basics(path)) is not None:
            return answer
        if path == "/load":
            return web.json_response({"server_load": 0})
        return web.json_response({"detail": "Not Found"}, status=404)


class RenderFleet(Fleet):
    """``probe_sglang_p2c``'s fleet (an event loop on a thread of its own) of ``RenderWorker``s."""

    def __init__(self, workers: list[RenderWorker]) -> None:
        super().__init__([], "vllm")
        self.workers = workers


def tokens(messages: list[dict[str, Any]]) -> list[int]:
    """The prompt's token ids as a chat template makes them: a start token; per message its
    role's marker, a token per word, an end marker; the assistant's marker to generate after."""
    ids = [0]
    for m in messages:
        ids.append(ROLES.get(m.get("role", ""), 4))
        ids += [zlib.crc32(w.encode()) % 30000 + 100 for w in str(m.get("content", "")).split()]
        ids.append(5)
    return [*ids, ROLES["assistant"]]


def _rendered(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's answer to the render (``GenerateRequest.model_dump()``), its sampling
    parameters cut to the few the request set."""
    sampling = {"max_tokens": body.get("max_tokens"), "temperature": 1.0, "top_p": 1.0, "n": 1}
    return {
        "request_id": f"render-{time.monotonic_ns()}",
        "token_ids": tokens(body.get("messages") or []),
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling,
        "model": body.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": bool(body.get("stream", False)),
        "stream_options": None,
        "cache_salt": None,
        "priority": 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


def words(rng: random.Random, chars: int) -> str:
    """Random lowercase words, ``chars`` characters in all."""
    out: list[str] = []
    n = 0
    while n < chars:
        w = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def conversations(args: argparse.Namespace) -> list[tuple[str, list[tuple[str, str]]]]:
    """Each conversation's system prompt and its turns (the user's message, the reply)."""
    rng = random.Random(args.seed)
    n_systems = -(-args.conversations // args.group)
    systems = [f"System {k}. " + words(rng, args.system_chars) for k in range(n_systems)]
    return [
        (
            systems[c // args.group],
            [(words(rng, 200), words(rng, 300)) for _ in range(args.turns)],
        )
        for c in range(args.conversations)
    ]


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """The conversations, ``args.concurrency`` at once, each turn sent once the last is
    answered: which worker served each turn (-1: failed), the statuses, the times taken."""
    convs = conversations(args)
    think = random.Random(args.seed + 1)
    served: dict[int, list[int]] = {}
    statuses: collections.Counter[str] = collections.Counter()
    seconds: list[tuple[int, float]] = []
    left = iter(range(len(convs)))

    async def client(session: aiohttp.ClientSession) -> None:
        for c in left:
            system, turns = convs[c]
            messages = [{"role": "system", "content": system}]
            served[c] = []
            for user, reply in turns:
                messages.append({"role": "user", "content": user})
                body = {"model": MODEL, "messages": messages, "max_tokens": 5}
                worker = -1
                started = time.monotonic()
                try:
                    async with session.post(url + "/v1/chat/completions", json=body) as resp:
                        text = await resp.text()
                        statuses[str(resp.status)] += 1
                    found = re.search(r"chatcmpl-w(\d+)-", text)
                    if resp.status == 200 and found:
                        worker = int(found.group(1))
                        seconds.append((worker, time.monotonic() - started))
                except (aiohttp.ClientError, TimeoutError) as exc:
                    statuses[type(exc).__name__] += 1
                served[c].append(worker)
                messages.append({"role": "assistant", "content": reply})
                await asyncio.sleep(think.uniform(0, args.think))

    limit = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=limit) as session:
        await asyncio.gather(*(client(session) for _ in range(args.concurrency)))
    return {"served": served, "statuses": dict(statuses), "seconds": seconds}


def scrape(router: Child) -> dict[str, dict[str, float]]:
    """The router's counters by their labels, from its metrics port (``_serve_procs`` gives
    each router one of its own)."""
    port = router.command[router.command.index("--prometheus-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for name, labels, value in METRIC.findall(text):
        key = ",".join(f"{k}={v}" for k, v in LABEL.findall(labels))
        found[name][key] = float(value)
    return found


def by_label(counter: dict[str, float], label: str) -> dict[str, int]:
    """A counter's values summed by one of its labels."""
    out: collections.Counter[str] = collections.Counter()
    for key, value in counter.items():
        labels = dict(part.split("=", 1) for part in key.split(",") if "=" in part)
        out[labels.get(label, "")] += int(value)
    return dict(sorted(out.items()))


def least_loaded(workers: list[RenderWorker], order: list[int] | None) -> dict[str, Any]:
    """How many requests reached a worker with the fewest in flight as they arrived; of those,
    the ties, and the ties that went to the first of the tied in the router's ``order``."""
    at_least = ties = first = 0
    for w in workers:
        for loads in w.arrivals:
            fewest = min(loads)
            if loads[w.index] != fewest:
                continue
            at_least += 1
            tied = [i for i, n in enumerate(loads) if n == fewest]
            if len(tied) > 1:
                ties += 1
                if order is not None:
                    first += min(tied, key=order.index) == w.index
    return {
        "at_least_loaded": at_least,
        "ties": ties,
        "ties_to_router_first": first if order is not None else None,
    }


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    n = len(args.delays)
    draws = random.Random(args.seed + 2)
    workers: list[RenderWorker] = []
    for i, delay in enumerate(args.delays):
        hold = args.render_hold if variant == "refused-held" and i == n - 1 else 0.0
        render = "rendered" if variant == "rendered" else "refused"
        workers.append(RenderWorker(i, delay, render, hold, draws, workers))
    fleet = RenderFleet(workers)
    with Children() as children:
        try:
            urls = fleet.start()
            start = start_sglang_router if variant == "sglang" else start_vllm_router
            router, url = start(children, urls, "cache_aware")
            started = time.monotonic()
            done = asyncio.run(asyncio.wait_for(drive(url, args), args.deadline))
            wall = time.monotonic() - started
            try:
                metrics, metrics_error = scrape(router), None
            except (OSError, ValueError) as exc:
                metrics, metrics_error = {}, f"{type(exc).__name__}: {exc}"
            log = ANSI.sub("", router.output() + "\n" + router.stderr.read_text(errors="replace"))
        finally:
            fleet.stop()
    ready = READY.search(log)
    listed = [u.strip().strip('"') for u in ready.group(1).split(",")] if ready else []
    order = [urls.index(u) for u in listed] if sorted(listed) == sorted(urls) else None
    served = [w.served for w in workers]
    total = max(1, sum(served))
    turns = [ws for _, ws in sorted(done["served"].items())]
    pairs = [(a, b) for ws in turns for a, b in itertools.pairwise(ws)]
    seconds = done["seconds"]
    per_worker = [[s for w, s in seconds if w == i] for i in range(n)]
    decisions = by_label(metrics.get("vllm_router_policy_decisions_total", {}), "worker")
    return {
        "variant": variant,
        "router": "sglang-router" if variant == "sglang" else "vllm-router",
        "render_hold_s": [w.render_hold for w in workers],
        "statuses": done["statuses"],
        "wall_s": round(wall, 2),
        "requests": sum(served),
        "served": served,
        "shares": [round(s / total, 4) for s in served],
        "continuing_turns": len(pairs),
        "continuing_on_previous_worker": sum(a == b and a >= 0 for a, b in pairs),
        "prefix_routing_decisions": by_label(
            metrics.get("vllm_router_prefix_routing_decisions_total", {}), "outcome"
        ),
        "kv_routing_inputs": by_label(
            metrics.get("vllm_router_kv_routing_inputs_total", {}), "result"
        ),
        "metrics_error": metrics_error,
        "router_decisions_by_worker": [decisions.get(u, 0) for u in urls] if decisions else None,
        "render_calls": [w.paths[f"POST {RENDER_PATH}"] for w in workers],
        "paths_asked": [dict(sorted(w.paths.items())) for w in workers],
        "router_worker_order": order,
        **least_loaded(workers, order),
        "mean_request_s": round(sum(s for _, s in seconds) / max(1, len(seconds)), 3),
        "mean_request_s_by_worker": [round(sum(s) / len(s), 3) if s else None for s in per_worker],
        "workers_by_conversation": ["".join(str(w) if w >= 0 else "x" for w in ws) for ws in turns],
    }


def summary(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    """Per variant, each figure over its repeats, in their order (failed runs left out)."""
    keys = (
        "requests",
        "continuing_turns",
        "continuing_on_previous_worker",
        "prefix_routing_decisions",
        "render_calls",
        "served",
        "router_worker_order",
        "ties",
        "ties_to_router_first",
        "mean_request_s",
        "mean_request_s_by_worker",
    )
    out: dict[str, Any] = {}
    for variant in variants:
        done = [r for r in runs if r["variant"] == variant and "error" not in r]
        out[variant] = {k: [r[k] for r in done] for k in keys}
        out[variant]["failed"] = sum(r["variant"] == variant and "error" in r for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="default: all"
    )
    fleet_options(parser, [0.2, 0.2, 1.0])
    parser.add_argument("--conversations", type=int, default=30, help="default 30")
    parser.add_argument("--turns", type=int, default=5, help="per conversation (default 5)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="conversations at once (default 4)"
    )
    parser.add_argument(
        "--system-chars", type=int, default=3000, help="a system prompt's length (default 3000)"
    )
    parser.add_argument(
        "--group", type=int, default=8, help="conversations per system prompt (default 8)"
    )
    parser.add_argument(
        "--think", type=float, default=0.1, help="most seconds between turns (default 0.1)"
    )
    parser.add_argument(
        "--render-hold",
        type=float,
        default=0.5,
        help="refused-held: seconds the last worker holds its 403 (default 0.5)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each variant, each with a fresh router (default 3): vllm-router's "
        "worker order, which decides its ties, is drawn anew at each start",
    )
    parser.add_argument("--seed", type=int, default=0, help="the workload's (default 0)")
    args = parser.parse_args(argv)
    from importlib import metadata

    runs = []
    for repeat in range(args.repeats):  # the variants in turn, so the machine's drift is shared
        for variant in args.variants:
            try:
                runs.append({"repeat": repeat, **run_variant(variant, args)})
            except (StartError, TimeoutError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"[-2000:]
                runs.append({"repeat": repeat, "variant": variant, "error": error})
    doc = {
        "benchmark": "probe_vllm_router_render",
        "command": command("bench/probe_vllm_router_render.py", argv or []),
        "vllm_router": metadata.version("vllm-router"),
        "sglang_router": metadata.version("sglang-router"),
        "revision": revision(),
        "policy": "cache_aware",
        "delays_s": args.delays,
        "conversations": args.conversations,
        "turns": args.turns,
        "concurrency": args.concurrency,
        "system_chars": args.system_chars,
        "group": args.group,
        "think_s": args.think,
        "render_hold_s": args.render_hold,
        "seed": args.seed,
        "repeats": args.repeats,
        "summary": summary(runs, args.variants),
        "runs": runs,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
