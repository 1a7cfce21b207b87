"""SLO attainment near and past the fast replica's limit, on an emulated fleet of one model at
speeds 5 : 1 : 1: ``hetero serve`` beside the fast replica alone, client round robin and
sglang-router, every router told the replicas' URLs and nothing else, each started cold.

- Fleet: ``--fast`` engine-faithful mock replicas (``hetero mock-replica --engine-model
  continuous``: vLLM's scheduler, continuous batching, chunked prefill, a paged KV and prefix
  cache; vLLM's ``/metrics``) at ``--fast-speed`` and ``--slow`` at ``--slow-speed``, all of one
  model shape on one device, step times stretched by the speed; each step costs
  ``--request-overhead`` per request in it besides the roofline, so a replica's TPOT grows with
  its batch as a CPU engine's does and the choice of where a request goes decides whether it
  meets its TPOT.
- Workload (the hard regime): multi-turn chats whose system prompts run to ``--system-tokens``
  tokens (``bench_serve_prefix.conversations``; the conversation named in ``user``), output
  lengths drawn by each replica from a lognormal of mean ``--output-mean`` (sigma 1: a few
  tokens to several hundred, capped at ``--max-tokens``; the router knows only the cap),
  streamed; Poisson arrivals at each of ``--rates`` for ``--duration`` seconds, the same send
  times and bodies for every configuration, each on fresh mock processes and a fresh router.
- Per request: TTFT (to its first content chunk, from the scheduled send), TPOT ((latency −
  TTFT) / (output tokens − 1)); it meets the SLO when both are within ``--ttft-slo`` and
  ``--tpot-slo`` (a failed or unfinished request never does). Shares come from the replicas'
  own counters; the prefix-cache hit rate is theirs (vLLM's counters, in tokens).

Prints JSON; ``--out`` saves it.

    python bench/bench_serve_slo.py --out bench/results/serve_slo.json
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from collections.abc import Sequence
from typing import Any

import _common
import numpy as np
from _common import calibration_seconds, emit
from _serve_procs import (
    Child,
    Children,
    StartError,
    hetero_serve_available,
    sglang_router_version,
    start_hetero_serve,
)
from bench_serve import MODEL, Config, poisson_times, run_load, start_mocks, start_router
from bench_serve_prefix import chat_bodies, hit_rate

from hetero.serve.engines.prometheus import samples

SUCCESS = "vllm:request_success_total"


def mock_configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    speeds = [args.fast_speed] * args.fast + [args.slow_speed] * args.slow
    return [
        {
            "models": [MODEL],
            "engine": "vllm",
            "engine_model": "continuous",
            "model_shape": args.model_shape,
            "device": args.device,
            "speed": speed,
            "slots": args.max_seqs,
            "request_overhead": args.request_overhead,
            "output_dist": "lognormal",
            "output_mean": args.output_mean,
            "seed": args.seed + k,
            "default_max_tokens": args.max_tokens,
        }
        for k, speed in enumerate(speeds)
    ]


def served(urls: Sequence[str]) -> list[float]:
    """Requests each replica finished, from its own vLLM page."""
    out = []
    for url in urls:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
            out.append(sum(samples(reply.read(), (SUCCESS,))[SUCCESS]))
    return out


def attainment(
    records: dict[str, Any], ttft_slo: float, tpot_slo: float
) -> tuple[int, list[float], list[float]]:
    """Requests within both bounds, and the TTFTs and TPOTs of those answered."""
    met, ttfts, tpots = 0, [], []
    for status, latency, ttft, tokens in zip(
        records["status"],
        records["latency"],
        records["ttft"],
        records["completion_tokens"],
        strict=True,
    ):
        if status != 200 or ttft is None or latency is None:
            continue
        tpot = (latency - ttft) / (tokens - 1) if tokens and tokens > 1 else 0.0
        ttfts.append(ttft)
        tpots.append(tpot)
        met += ttft <= ttft_slo and tpot <= tpot_slo
    return met, ttfts, tpots


def _p(values: Sequence[float], q: float, digits: int) -> float | None:
    return round(float(np.percentile(values, q)), digits) if values else None


def run_config(
    args: argparse.Namespace,
    config: Config,
    rate: float,
    send_at: list[float],
    bodies: list[str],
    slo_flags: Sequence[str],
) -> dict[str, Any]:
    with Children() as children:
        _, urls = start_mocks(children, mock_configs(args))
        router: Child | None
        if config.kind == "alone":
            router, targets = None, urls[:1]
        elif config.kind == "hetero":
            # Strategy slo is told the SLO the benchmark judges by; the others have no use for it.
            flags = slo_flags if config.name == "slo" else ()
            router, url = start_hetero_serve(children, urls, config.name, flags)
            targets = [url]
        else:
            router, targets = start_router(children, config, urls)
        spec = {
            "mode": "open",
            "targets": targets,
            "path": "/v1/chat/completions",
            "bodies": bodies,
            "send_at": send_at,
            "grace": args.grace,
            "usage": True,
            "stream": True,
        }
        watch = {"router": router} if router is not None else {}
        records = run_load(children, spec, 1, watch, f"{config.name}-{rate}")
        rate_hit = hit_rate(urls)
        shares = served(urls)
    n = len(records["status"])
    met, ttfts, tpots = attainment(records, args.ttft_slo, args.tpot_slo)
    total = sum(shares) or 1.0
    return {
        "label": config.label,
        "rate": rate,
        "requests": n,
        "answered": sum(1 for s in records["status"] if s == 200),
        "slo_attainment": round(met / n, 4) if n else None,
        "ttft_s": {"p50": _p(ttfts, 50, 4), "p99": _p(ttfts, 99, 4)},
        "tpot_s": {"p50": _p(tpots, 50, 5), "p99": _p(tpots, 99, 5)},
        "prefix_hit_rate": rate_hit,
        "shares": [round(s / total, 3) for s in shares],
        "router_cpu_s": records["cpu_seconds"].get("router"),
        "errors": records["errors"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fast", type=int, default=1, help="replicas at --fast-speed")
    parser.add_argument("--slow", type=int, default=2, help="replicas at --slow-speed")
    parser.add_argument("--fast-speed", type=float, default=1.5)
    parser.add_argument("--slow-speed", type=float, default=0.3)
    parser.add_argument("--device", default="H100-SXM-80GB")
    parser.add_argument("--model-shape", default="llama-3-8b")
    parser.add_argument("--request-overhead", type=float, default=0.002, help="seconds a step")
    parser.add_argument("--max-seqs", type=int, default=256, help="requests a replica runs")
    parser.add_argument("--systems", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=800)
    parser.add_argument("--turn-tokens", type=int, default=60)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--output-mean", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--rates", default="5,8,10,12", help="requests per second, comma-separated")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals")
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--ttft-slo", type=float, default=1.0)
    parser.add_argument("--tpot-slo", type=float, default=0.05)
    parser.add_argument(
        "--strategies", default="slo,shortest_expected_delay", help="hetero serve strategies"
    )
    parser.add_argument("--sglang-policies", default="cache_aware,power_of_two")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    slo_flags = ["--slo-ttft", str(args.ttft_slo), "--slo-tpot", str(args.tpot_slo)]
    configs = [Config("the fast replica alone (no router)", "alone", "alone")]
    configs += [Config(f"hetero serve, {s}", "hetero", s) for s in args.strategies.split(",") if s]
    configs.append(Config("client-side round robin (no router)", "client", "round_robin"))
    configs += [
        Config(f"sglang-router, {p}", "sglang", p) for p in args.sglang_policies.split(",") if p
    ]
    hetero_missing = hetero_serve_available()
    sglang, sglang_missing = sglang_router_version()
    rows: list[dict[str, Any]] = []
    for rate in [float(r) for r in args.rates.split(",")]:
        send_at = poisson_times(rate, args.duration, args.seed)
        bodies = chat_bodies(args, len(send_at), reply_tokens=args.output_mean, stream=True)
        for config in configs:
            missing = {"hetero": hetero_missing, "sglang": sglang_missing}.get(config.kind)
            if missing:
                rows.append({"label": config.label, "rate": rate, "skipped": missing})
                continue
            try:
                rows.append(run_config(args, config, rate, send_at, bodies, slo_flags))
            except StartError as exc:
                rows.append({"label": config.label, "rate": rate, "skipped": f"{exc}"})
            print(json.dumps(rows[-1]), file=sys.stderr)
    doc = {
        "benchmark": "SLO attainment, one model at speeds 5:1:1, emulated continuous engines",
        "command": " ".join(["python", "bench/bench_serve_slo.py", *(argv or sys.argv[1:])]),
        "revision": _common.revision(),
        "setup": {k: v for k, v in vars(args).items() if k != "out"},
        "sglang_router": sglang,
        "results": rows,
        "calibration_seconds": calibration_seconds(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
