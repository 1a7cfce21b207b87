"""Prefix-cache affinity on an emulated fleet of two GPU types: ``hetero serve`` against
sglang-router, in one run on this machine.

The replicas are engine-faithful mocks (``hetero mock-replica --engine-model continuous``: the
same LLM on each, continuous batching, a paged KV cache, a prefix cache), ``--fast`` of one
device and ``--slow`` of another, all in one process. The load is multi-turn chat: ``--systems``
system prompts of about ``--system-tokens`` tokens, ``--sessions`` conversations in progress at
once, each turn adding ``--turn-tokens`` tokens to its history (the OpenAI ``user`` field names
the conversation); Poisson arrivals at ``--rate`` requests/s for ``--duration`` seconds, the same
send times and bodies for every configuration, each on a fresh mock process and router. A
request meets the SLO when it is answered within ``--slo`` seconds; goodput is the requests
meeting it per second of offered duration. The prefix-cache hit rate is the replicas' own
(``vllm:prefix_cache_hits_total`` over ``vllm:prefix_cache_queries_total``, in tokens, summed
over the fleet, read from their ``/metrics`` after the run). Anchors that are missing
(sglang-router not installed) are recorded as skipped. Prints JSON; ``--out`` saves it.

    python bench/bench_serve_prefix.py --out bench/results/serve_prefix.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from _common import calibration_seconds, emit
from _serve_procs import Children, StartError, hetero_serve_available, sglang_router_version
from bench_prefix import WORDS
from bench_serve import (
    MODEL,
    Config,
    _percentiles,
    poisson_times,
    run_load,
    start_mocks,
    start_router,
)

from hetero.serve.engines.prometheus import samples
from hetero.serve.engines.vllm import PREFIX


def words(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of text (4 characters a token, the mock's count)."""
    text = " ".join(rng.choice(WORDS) for _ in range(tokens))
    return text[: 4 * tokens]


def conversations(
    rng: random.Random,
    text: Callable[[int], str],
    n: int,
    *,
    systems: int,
    system_tokens: int,
    sessions: int,
    turns: int,
    turn_tokens: int,
    max_tokens: int,
) -> list[tuple[list[dict[str, str]], str]]:
    """``n`` chat turns, each as its messages and the name of its conversation: the next turn
    of one of ``sessions`` conversations in progress (picked at random), which starts with one
    of ``systems`` system prompts and ends after ``turns`` turns, a new one taking its place.
    ``text(tokens)`` writes about that many tokens (the replies the client keeps included)."""
    prompts = [text(system_tokens) for _ in range(systems)]
    history: list[list[dict[str, str]]] = [[] for _ in range(sessions)]
    names = [""] * sessions
    started = 0
    out = []
    for _ in range(n):
        j = rng.randrange(sessions)
        if not history[j] or len(history[j]) > 2 * turns:
            history[j] = [{"role": "system", "content": rng.choice(prompts)}]
            names[j] = f"conversation-{started}"
            started += 1
        history[j].append({"role": "user", "content": text(turn_tokens)})
        out.append((list(history[j]), names[j]))
        history[j].append({"role": "assistant", "content": text(max_tokens)})
    return out


def chat_bodies(
    args: argparse.Namespace, n: int, *, reply_tokens: int | None = None, stream: bool = False
) -> list[str]:
    """``n`` chat requests of ``conversations``, the conversation named in ``user``; the
    assistant turns kept are ``reply_tokens`` long (default ``max_tokens``); ``stream``: the
    bodies ask for a stream with its usage."""
    rng = random.Random(args.seed)
    turns = conversations(
        rng,
        lambda tokens: words(rng, tokens),
        n,
        systems=args.systems,
        system_tokens=args.system_tokens,
        sessions=args.sessions,
        turns=args.turns,
        turn_tokens=args.turn_tokens,
        max_tokens=args.max_tokens if reply_tokens is None else reply_tokens,
    )
    extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
    return [
        json.dumps(
            {
                "model": MODEL,
                "messages": messages,
                "max_tokens": args.max_tokens,
                "user": name,
                **extra,
            }
        )
        for messages, name in turns
    ]


def mock_configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    devices = [args.fast_device] * args.fast + [args.slow_device] * args.slow
    return [
        {
            "models": [MODEL],
            "engine": "vllm",
            "engine_model": "continuous",
            "model_shape": args.model_shape,
            "device": device,
            "slots": args.max_seqs,
            "seed": args.seed + k,
            "default_max_tokens": args.max_tokens,
        }
        for k, device in enumerate(devices)
    ]


def hit_rate(urls: Sequence[str]) -> float | None:
    """The fleet's prefix-cache hits over queries (in tokens), from each replica's vLLM page."""
    queries_name, hits_name = PREFIX[0]
    queries = hits = 0.0
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
            found = samples(reply.read(), (queries_name, hits_name))
        queries += sum(found[queries_name])
        hits += sum(found[hits_name])
    return round(hits / queries, 4) if queries else None


def run_config(
    args: argparse.Namespace, config: Config, send_at: list[float], bodies: list[str]
) -> dict[str, Any]:
    with Children() as children:
        _, urls = start_mocks(children, mock_configs(args))
        router, targets = start_router(children, config, urls)
        spec = {
            "mode": "open",
            "targets": targets,
            "path": "/v1/chat/completions",
            "bodies": bodies,
            "send_at": send_at,
            "grace": args.grace,
            "usage": True,
        }
        watch = {"router": router} if router is not None else {}
        records = run_load(children, spec, 1, watch, config.name)
        rate = hit_rate(urls)
    ok = [s == 200 for s in records["status"]]
    latency = [lat for lat, good in zip(records["latency"], ok, strict=True) if good]
    met = sum(1 for lat in latency if lat is not None and lat <= args.slo)
    n = len(records["status"])
    return {
        "label": config.label,
        "kind": config.kind,
        "policy": config.name,
        "requests": n,
        "answered": sum(ok),
        "slo_attainment": round(met / n, 4) if n else None,
        "goodput_rps": round(met / args.duration, 3),
        "latency_s": _percentiles([lat for lat in latency if lat is not None], 1.0, 3),
        "prefix_hit_rate": rate,
        "errors": records["errors"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fast", type=int, default=2, help="replicas of the fast device")
    parser.add_argument("--slow", type=int, default=4, help="replicas of the slow device")
    parser.add_argument("--fast-device", default="H100-SXM-80GB")
    parser.add_argument("--slow-device", default="L4")
    parser.add_argument("--model-shape", default="llama-3-8b")
    parser.add_argument("--max-seqs", type=int, default=32, help="requests a replica runs at once")
    parser.add_argument("--systems", type=int, default=8)
    parser.add_argument("--system-tokens", type=int, default=2000)
    parser.add_argument("--turn-tokens", type=int, default=200)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rate", type=float, default=12.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--slo", type=float, default=5.0, help="seconds per request")
    parser.add_argument(
        "--strategies", default="prefix_affinity,shortest_expected_delay", help="hetero serve's"
    )
    parser.add_argument("--sglang-policies", default="cache_aware,round_robin")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a short run, for a smoke test")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.grace, args.rate = 6.0, 15.0, 4.0
    send_at = poisson_times(args.rate, args.duration, args.seed)
    bodies = chat_bodies(args, len(send_at))
    configs = [Config(f"hetero serve, {s}", "hetero", s) for s in args.strategies.split(",")]
    configs += [Config(f"sglang-router, {p}", "sglang", p) for p in args.sglang_policies.split(",")]
    hetero_missing = hetero_serve_available()
    sglang, sglang_missing = sglang_router_version()
    rows = []
    for config in configs:
        missing = hetero_missing if config.kind == "hetero" else sglang_missing
        if missing:
            rows.append({"label": config.label, "skipped": missing})
            print(f"skipping {config.label}: {missing}", file=sys.stderr)
            continue
        try:
            rows.append(run_config(args, config, send_at, bodies))
        except StartError as exc:
            rows.append({"label": config.label, "skipped": f"could not start: {exc}"})
        print(json.dumps(rows[-1]), file=sys.stderr)
    doc = {
        "benchmark": "prefix-cache affinity on an emulated two-type fleet",
        "command": " ".join(["python", "bench/bench_serve_prefix.py", *(argv or sys.argv[1:])]),
        "setup": {k: v for k, v in vars(args).items() if k != "out"},
        "requests": len(send_at),
        "prompt_tokens_mean": round(
            float(np.mean([len(b) / 4 for b in bodies])) if bodies else 0.0, 1
        ),
        "sglang_router": sglang,
        "results": rows,
        "calibration_seconds": calibration_seconds(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
