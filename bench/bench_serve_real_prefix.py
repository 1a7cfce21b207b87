"""Prefix-cache affinity on real engines: ``hetero serve`` beside sglang-router's and
vllm-router's ``cache_aware`` and client-side round robin, in one run on this machine, every
router told the replicas' URLs and nothing else.

- Fleet: the two real vLLM CPU replicas of ``bench_serve_real.py`` (a small Llama on core 0, a
  large one on core 1, some ten times slower), prefix caching on (vLLM's default), each cache
  emptied before every run.
- Workload: multi-turn chat. ``--systems`` system prompts of about ``--system-tokens`` tokens,
  ``--sessions`` conversations in progress at once; each request is the next turn of one of
  them, picked at random: its whole history (the system prompt, the earlier turns and the
  assistant's replies as the client kept them) plus a new user message of ``--turn-tokens``
  tokens; after ``--turns`` turns a conversation ends and a new one takes its place. The OpenAI
  ``user`` field names the conversation. Streams with ``ignore_eos`` and ``--max-tokens``
  output tokens; Poisson arrivals at ``--loads`` × capacity, the send times and bodies the same
  for every configuration.
- Capacity: a closed loop of ``--capacity-concurrency`` streams of the same turns straight to
  each replica, both at once (each replica then sees whole conversations, so its cache serves
  them as well as it can).
- Per configuration and load: SLO attainment (TTFT ≤ ``--ttft-slo`` and TPOT ≤
  ``--tpot-slo``), goodput, latency percentiles, each replica's share, and the prefix-cache hit
  rate from vLLM's own counters (``vllm:prefix_cache_hits_total`` over
  ``vllm:prefix_cache_queries_total``, tokens, summed over both replicas), and the cores each
  replica's processes (its API server, engine core and worker) and the router used while the
  load ran.
- ``--single-turn``: the same runs with single-turn prompts that share nothing (those of
  ``bench_serve_real.py``): affinity must cost nothing there.
- ``--max-rate``: ``hetero serve``'s (the default first), each hetero variant's and each
  anchor's highest Poisson rate with 98% of its requests within the SLO, by bisection on a grid
  of 0.05 × the fleet's capacity (``bench_serve_real.max_rate``). ``--replica-rates``: each
  replica's own, every request sent straight to it while the others idle; their sum is the mark
  for a router's.

The comparison judges each hetero configuration against the anchors: hit rate ≥ the best
``cache_aware`` anchor's − 0.02, SLO attainment ≥ 0.98 and ≥ every anchor's, p99 latency ≤ 0.5×
the best anchor's. ``--lock PATH`` takes an exclusive ``flock`` around each heavy phase. Prints
JSON; ``--out`` saves it.

    python bench/bench_serve_real_prefix.py --lock /tmp/hetero-bench.lock \\
        --out bench/results/serve_real_prefix.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import random
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import _common
import bench_serve_real as real
import numpy as np
from _common import calibration_seconds, emit
from _serve_procs import Children
from bench_serve_prefix import conversations
from bench_serve_real import MODEL, Settings, Turns, vllm_engine

import hetero
from hetero.serve.emulator.tiny_llama import corpus
from hetero.serve.router import DEFAULT_STRATEGY

ANCHOR_KINDS = ("sglang", "vllm-router", "client", "alone")  # alone: no router at all
#: ``--replica-rates``: each replica's grid, in multiples of its own capacity (the fast replica
#: alone kept the SLO at some 1.35 of its closed loop's rate), and the requests each of its runs
#: sends at that rate at least (a slow replica's run lasts longer than ``--duration``).
REPLICA_RATE_STEP = 0.05
REPLICA_RATE_TOP = 1.6
REPLICA_RATE_REQUESTS = 300


@dataclasses.dataclass(frozen=True)
class Chat:
    systems: int = 4
    system_tokens: int = 400
    sessions: int = 16
    turns: int = 6
    turn_tokens: int = 40


def chat_bodies(s: Settings, chat: Chat, n: int, tokenizer: Path) -> tuple[list[str], list[int]]:
    """``n`` chat turns (JSON bodies) and the tokens of each one's messages."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    vocabulary = " ".join(corpus(s.seed + 2000, 2000)).split()
    rng = random.Random(s.seed)

    def text(tokens: int) -> str:
        ids = tok.encode(" ".join(rng.choice(vocabulary) for _ in range(tokens))).ids
        return str(tok.decode(ids[:tokens]))

    # The assistant's turns the client keeps are as long as a reply is on average.
    reply = round(s.output_mean) if s.output_mean is not None else s.max_tokens
    turns = conversations(rng, text, n, **dataclasses.asdict(chat), max_tokens=reply)
    outputs = real.output_lengths(s, n)
    bodies = [
        json.dumps(
            {
                "model": MODEL,
                "messages": messages,
                "max_tokens": output,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
                "user": name,
            }
        )
        for (messages, name), output in zip(turns, outputs, strict=True)
    ]
    lengths = [sum(len(tok.encode(m["content"]).ids) for m in messages) for messages, _ in turns]
    return bodies, lengths


def hit_rate(rows: Sequence[dict[str, Any]]) -> float | None:
    queries = sum(r["prefix_queries"] for r in rows)
    return round(sum(r["prefix_hits"] for r in rows) / queries, 4) if queries else None


def _seconds(value: float) -> float | None:
    return round(value, 4) if math.isfinite(value) else None  # None: never answered


def _ratio(a: float, b: float) -> float | None:
    if math.isinf(b):
        return 0.0 if math.isfinite(a) else None  # the anchors left 1% unanswered
    return round(a / b, 3) if math.isfinite(a) else None


def judge(block: dict[str, Any]) -> dict[str, Any]:
    """Each hetero configuration of one load against the anchors, by the issue's targets."""
    rows = [r for r in block["configs"] if "skipped" not in r]
    anchors = [r for r in rows if r["kind"] in ANCHOR_KINDS]
    cache_aware = [r["hit_rate"] for r in anchors if r["name"] == "cache_aware" and r["hit_rate"]]
    # p99 over every request sent, one never answered counted as never (None: it reaches p99)
    p99s = [r["latency_all_p99_s"] or math.inf for r in anchors]
    best_slo = max((r["slo_attainment"] or 0.0 for r in anchors), default=None)
    out = []
    for r in rows:
        if r["kind"] != "hetero":
            continue
        p99 = r["latency_all_p99_s"] or math.inf
        checks = {
            "hit_rate": r["hit_rate"],
            "hit_rate_target": round(max(cache_aware) - 0.02, 4) if cache_aware else None,
            "slo_attainment": r["slo_attainment"],
            "best_anchor_slo": best_slo,
            "p99_latency_s": _seconds(p99),
            "best_anchor_p99_s": _seconds(min(p99s, default=math.inf)),
            "p99_over_best_anchor": _ratio(p99, min(p99s, default=math.inf)),
        }
        checks["met"] = {
            "hit_rate": None
            if checks["hit_rate_target"] is None
            else (r["hit_rate"] or 0.0) >= checks["hit_rate_target"],
            "slo": (r["slo_attainment"] or 0.0) >= max(0.98, best_slo or 0.0),
            "p99": None
            if checks["p99_over_best_anchor"] is None
            else checks["p99_over_best_anchor"] <= 0.5,
        }
        out.append({"config": r["config"], **checks})
    return {"load": block["load"], "hetero": out}


def measure(
    s: Settings,
    chat: Chat,
    single_turn: bool,
    max_rate: bool,
    replica_rates: bool,
    turns: Turns,
    children: Children,
    reasons: dict[str, str | None],
    doc: dict[str, Any],
) -> None:
    replicas = real.fleet(children, s.fleet)
    try:
        with turns.held("vLLM start, warm-up and capacity"):
            doc["fleet"] = real.start_fleet(replicas)
            tokenizer = replicas[0].model / "tokenizer.json"
            needed = int(max(s.loads, default=0) * 40 * s.duration) + 4000
            if single_turn:
                texts, lengths = real.make_prompts(s, needed, tokenizer)
                outputs = real.output_lengths(s, len(texts))
                bodies = [real.chat_body(t, m) for t, m in zip(texts, outputs, strict=True)]
            else:
                bodies, lengths = chat_bodies(s, chat, needed, tokenizer)
            real.warm(children, s, bodies, replicas)
            real.wait_idle([r.url for r in replicas])
            real.reset_prefix_cache([r.url for r in replicas])
            cap = real.capacity(children, s, bodies, replicas)
            doc["capacity"] = cap
            print(f"capacity: {json.dumps(cap)}", file=sys.stderr)
        doc["workload"] = {
            "kind": "single-turn, nothing shared" if single_turn else "multi-turn chat",
            **({} if single_turn else dataclasses.asdict(chat)),
            "prompt_tokens_mean": round(float(np.mean(lengths)), 1),
            "max_tokens": s.max_tokens,
            "output_tokens": "max_tokens for every request"
            if s.output_mean is None
            else f"lognormal, mean {s.output_mean:g}, sigma 1, from 2 to max_tokens "
            f"(mean drawn {real.mean_output(bodies):.1f}), with ignore_eos",
            "duration_s": s.duration,
            "arrivals": "poisson, send times and bodies the same for every configuration",
        }
        doc["slo"] = {"ttft_s": s.ttft_slo, "tpot_s": s.tpot_slo}
        doc["loads"] = []
        doc["comparison"] = []
        known: dict[str, dict[int, dict[str, Any]]] = {c.label: {} for c in real.configs(s)}
        for load in s.loads:
            run = real.make_run(s, load, cap["requests_per_second"], bodies)
            block: dict[str, Any] = {
                "load": load,
                "rate_rps": round(run.rate, 3),
                "requests": run.requests,
                "configs": [],
            }
            for config in real.configs(s):
                row = real._measure_one(children, turns, s, config, run, replicas, reasons)
                if "skipped" not in row:
                    row["hit_rate"] = hit_rate(row["replicas"])
                    k = real.grid_step(load, s.step)
                    if k is not None:
                        known[config.label][k] = row
                block["configs"].append(row)
                print(
                    f"{load:.0%} {config.label}: hit {row.get('hit_rate')} {real.brief(row)}",
                    file=sys.stderr,
                )
            doc["loads"].append(block)
            doc["comparison"].append(judge(block))
        if max_rate:
            capacity_rps = cap["requests_per_second"]
            rates = [
                real.max_rate(
                    children, turns, s, c, replicas, reasons, capacity_rps, bodies, known[c.label]
                )
                for c in real.configs(s)
            ]
            doc["max_rate"] = max_rates(s, doc["loads"], rates, capacity_rps)
        if replica_rates:
            doc["replica_rates"] = each_alone(s, turns, children, reasons, replicas, cap, bodies)
    finally:
        vllm_engine.stop_replicas(replicas)


def max_rates(
    s: Settings, loads: list[dict[str, Any]], rates: list[dict[str, Any]], capacity_rps: float
) -> dict[str, Any]:
    """``--max-rate``: each configuration's highest rate, and the first hetero one's (the
    default where it runs) over each anchor's and the best one's
    (``bench_serve_real.comparison``)."""
    judged = real.comparison(s, loads, rates, capacity_rps)
    return {
        "definition": f"the highest Poisson load (a multiple of {s.step:g} × the fleet's "
        f"capacity, up to {s.top:g}) at which ≥ {s.target:g} of requests meet the SLO, by "
        "bisection (the runs at --loads on that grid reused); 0 when the lowest step misses it",
        "target": s.target,
        "step": s.step,
        "top": s.top,
        "capacity_rps": capacity_rps,
        "configs": rates,
        "ratio": judged.get("max_rate_ratio"),
        "vs_best_anchor": judged.get("targets", {}).get("goodput_vs_best_anchor"),
    }


def each_alone(
    s: Settings,
    turns: Turns,
    children: Children,
    reasons: dict[str, str | None],
    replicas: Sequence[real.Replica],
    cap: dict[str, Any],
    bodies: Sequence[str],
) -> dict[str, Any]:
    """Each replica's own highest Poisson rate within the SLO, every request sent straight to
    it while the others idle: what the fleet could carry were the stream split among them with
    none overloaded. Their sum is the mark for a router's highest rate (not a bound: a router
    that holds requests back sends a replica a smoother stream than Poisson)."""
    rows = []
    for k, (replica, measured) in enumerate(zip(replicas, cap["replicas"], strict=True)):
        rate = measured["requests_per_s"]
        own = dataclasses.replace(
            s,
            step=REPLICA_RATE_STEP,
            top=REPLICA_RATE_TOP,
            duration=max(s.duration, math.ceil(REPLICA_RATE_REQUESTS / rate)),
        )
        config = real.Config(f"{replica.label} alone (no router)", "alone", replica.label, (), k)
        row = real.max_rate(children, turns, own, config, replicas, reasons, rate, bodies)
        rows.append(
            {"replica": replica.label, "capacity_rps": rate, "duration_s": own.duration, **row}
        )
    found = [r for r in rows if "skipped" not in r]
    total = sum(r["max_rate_rps"] for r in found) if len(found) == len(rows) else None
    fastest = rows[0].get("max_rate_rps")
    return {
        "definition": f"each replica alone, the others idle: the highest Poisson rate (a "
        f"multiple of {REPLICA_RATE_STEP:g} × its own capacity, up to {REPLICA_RATE_TOP:g}) at "
        f"which ≥ {s.target:g} of requests meet the SLO, by bisection; each run at least "
        f"--duration and {REPLICA_RATE_REQUESTS} requests at its capacity's rate long",
        "target": s.target,
        "replicas": rows,
        "sum_rps": None if total is None else round(total, 3),
        "sum_over_fastest": _ratio(total, fastest) if total is not None and fastest else None,
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line (``bench_sim_to_real.py`` reads a run's own back with it)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    c = Chat()
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--lock", help="flock this file around each heavy phase")
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's logs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--single-turn", action="store_true", help="prompts that share nothing")
    parser.add_argument("--ttft-slo", type=float, default=2.0, help="seconds (2)")
    parser.add_argument("--tpot-slo", type=float, default=0.1, help="seconds (0.1)")
    parser.add_argument("--loads", type=real._floats, default=(0.5, 0.8), help="× capacity")
    parser.add_argument("--duration", type=float, default=40.0, help="s of arrivals per run")
    parser.add_argument("--max-tokens", type=int, default=32, help="output tokens (32)")
    parser.add_argument("--capacity-concurrency", type=int, default=16, help="per replica")
    parser.add_argument("--systems", type=int, default=c.systems, help="system prompts")
    parser.add_argument("--system-tokens", type=int, default=c.system_tokens)
    parser.add_argument("--sessions", type=int, default=c.sessions, help="conversations at once")
    parser.add_argument("--turns", type=int, default=c.turns, help="turns a conversation")
    parser.add_argument("--turn-tokens", type=int, default=c.turn_tokens)
    parser.add_argument(
        "--sglang-policies", type=real._names, default=("cache_aware", "round_robin")
    )
    parser.add_argument("--vllm-router-policies", type=real._names, default=("cache_aware",))
    parser.add_argument("--no-client", action="store_true", help="skip client-side routing")
    parser.add_argument(
        "--alone", action="store_true", help="also send everything to the fastest replica alone"
    )
    parser.add_argument(
        "--max-rate",
        action="store_true",
        help="also find the highest rate within the SLO of each --hetero-variant and each "
        "anchor, on a grid of 0.05 × the fleet's capacity (the --loads on it reused)",
    )
    parser.add_argument(
        "--replica-rates",
        action="store_true",
        help="also find each replica's own highest rate within the SLO, alone (their sum is "
        "the mark for a router's)",
    )
    parser.add_argument("--fleet", choices=sorted(real.FLEETS), default="two-models")
    parser.add_argument(
        "--output-mean",
        type=float,
        help="lognormal output lengths of this mean (sigma 1), capped at --max-tokens",
    )
    parser.add_argument(
        "--hetero-variant",
        action="append",
        default=None,
        metavar="FLAGS",
        help="hetero serve flags to run beside its default (repeatable; default: "
        "'--strategy prefix_affinity')",
    )
    return parser


def settings_of(args: argparse.Namespace) -> tuple[Settings, Chat]:
    """The run's settings and chats from its parsed command line."""
    s = dataclasses.replace(
        Settings(),
        seed=args.seed,
        ttft_slo=args.ttft_slo,
        tpot_slo=args.tpot_slo,
        loads=tuple(args.loads),
        duration=args.duration,
        max_tokens=args.max_tokens,
        capacity_concurrency=args.capacity_concurrency,
        sglang_policies=args.sglang_policies,
        vllm_router_policies=args.vllm_router_policies,
        client=not args.no_client,
        alone=args.alone,
        fleet=args.fleet,
        output_mean=args.output_mean,
        hetero_variants=tuple(
            ["--strategy prefix_affinity"] if args.hetero_variant is None else args.hetero_variant
        ),
    )
    chat = Chat(args.systems, args.system_tokens, args.sessions, args.turns, args.turn_tokens)
    return s, chat


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    for name in ("systems", "system_tokens", "sessions", "turns", "turn_tokens", "max_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    s, chat = settings_of(args)
    signal.signal(signal.SIGTERM, real._interrupt)
    started = time.perf_counter()
    vllm_reason, reasons, versions = real.what_runs()
    if vllm_reason is None and real.shared(s.fleet):
        vllm_reason = real.cpu_shares_reason()  # its speeds are made by CPU quotas
    doc: dict[str, Any] = {
        "benchmark": "serve_real_prefix",
        "command": _common.command("bench/bench_serve_real_prefix.py", argv),
        "machine_note": "2 cores, no GPU",
        "hetero": hetero.__version__,
        "hetero_default_strategy": DEFAULT_STRATEGY,
        "versions": versions,
        "skipped": {k: v for k, v in reasons.items() if v},
        "revision": _common.revision(),
        "calibration_seconds": calibration_seconds(),
    }
    real.run_measured(
        doc,
        vllm_reason,
        args,
        lambda turns, children: measure(
            s,
            chat,
            args.single_turn,
            args.max_rate,
            args.replica_rates,
            turns,
            children,
            reasons,
            doc,
        ),
        started,
    )
    return emit(doc, args.out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
