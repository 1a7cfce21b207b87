"""Sim-to-real: the simulator set the real-engine benchmark's fleet and workload, its SLO
attainment beside the real runs', for each router and load.

- Real runs: ``bench_serve_real_prefix.py --fleet one-model`` (and ``one-model-narrow``)
  JSONs, single-turn and multi-turn (``--real``, repeatable): three vLLM CPU replicas of the
  2.6M test model, the whole of one core, 40% and 20% of the other (75% of one, 45% and 30%
  of the other).
- Fleet, simulated: each replica the emulator's engine model (``hetero.serve.engine_model``)
  of that model on the catalog's generic CPU, calibrated to vLLM's CPU build on one core
  (``bench/results/emulator_small_bound.json``: ``bench_emulator.py --model small``, the
  engine bound whole to its core as the fleet's replicas are), with the
  engine's KV capacity and its CPU defaults (128 requests running, 2,048 tokens a step); each
  replica's **pace** (a factor on every step's time) set so that the run's capacity loop
  (``--capacity-concurrency`` streams of the run's requests straight to it, the first
  ``settle_s`` left out) gives the requests/s the real replica gave in that run. The routers
  are told none of it: hetero knows its replicas by URL alone (the generic prior), as the real
  ``hetero serve`` did.
- Workload: the real run's own requests, rebuilt from its command line (the same seeds and
  draws, the real benchmark's functions): Poisson send times at each load's rate, output
  lengths, prompts in the engine's tokens (the chat template's 4 a message and 3 more
  added). Multi-turn, each request also carries its prompt (``hetero.sim.engine_fleet.
  Prompt``): the text the router reads, its conversation, and its blocks of 16 tokens as the
  engine caches them (the prompt tokenized as vLLM does, with the model's own tokenizer,
  made locally as for the real run), so the engines share prefixes and the routers see them.
- Routers, simulated: hetero serve with each strategy a run used (its default, ``slo`` since
  the run at ``serve_real_slo_default.json``, ``shortest_expected_delay`` before), each
  ``hetero.sim.engine_fleet``'s mirror of the router; sglang-router's and
  vllm-router's ``cache_aware`` and sglang-router's ``power_of_two`` (``_anchor_policies``:
  their rules, every request forwarded at once, the engine queueing what it cannot run);
  client-side round robin; the fast replica alone (every request to its engine).
- Reported, per load and router: the real and simulated SLO attainment and their difference
  (the target: within ``--target``, 0.05), each replica's share of the requests and the
  engines' prefix-cache hit rate both ways; the fitted paces and the capacity loop's TTFT and
  TPOT medians beside the real ones. For a run with ``--replica-rates``, each replica alone
  at the rates the real run tried, and its simulated highest rate on the real run's grid.

Not simulated: the HTTP path, the router's and the load generator's own time.

Prints JSON; ``--out`` saves it.

    python bench/bench_sim_to_real.py --out bench/results/sim_to_real.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import bench_serve_real as real
import bench_serve_real_prefix as prefix
import numpy as np
from _anchor_policies import NO_ROUTER
from _common import command, emit, revision

from hetero.plan.models import ModelShape
from hetero.sched.clock import ManualClock
from hetero.sched.prefix import BLOCK_CHARS, MAX_BLOCKS, prefix_blocks
from hetero.serve.cost import prompt_text
from hetero.serve.emulator.tiny_llama import MAX_MODEL_LEN, SHAPES, VOCAB
from hetero.serve.engine_model import (
    BLOCK_SIZE,
    Calibration,
    EngineModel,
    EngineRequest,
    EngineSpec,
)
from hetero.serve.engine_model import engine_spec as make_spec
from hetero.serve.records import RouterOptions
from hetero.sim.engine_fleet import EngineFleetSimulator, FleetResult, Prompt

RESULTS = Path(__file__).resolve().with_name("results")
REAL_RUNS = (
    RESULTS / "serve_real_single_turn_slo.json",
    RESULTS / "serve_real_single_turn_slo_loads_80_120.json",
    RESULTS / "serve_real_single_turn_slo_loads_90_110.json",
    RESULTS / "serve_real_single_turn_slo_loads_115_125.json",
    RESULTS / "serve_real_single_turn_slo_loads_115_125_limit.json",
    RESULTS / "serve_real_single_turn_slo_loads_105_110.json",
    RESULTS / "serve_real_single_turn_slo_loads_85_115.json",
    RESULTS / "serve_real_single_turn_replica_rates.json",
    RESULTS / "serve_real_single_turn_slo_loads_100_110_rates.json",
    RESULTS / "serve_real_single_turn_slo_max_rate.json",
    RESULTS / "serve_real_single_turn_slo_default_max_rate.json",
    RESULTS / "serve_real_single_turn_slo_held_max_rate.json",
    RESULTS / "serve_real_single_turn_slo_knee_max_rate.json",
    RESULTS / "serve_real_slo_f996922.json",
    RESULTS / "serve_real_slo_loads_80.json",
    RESULTS / "serve_real_slo_loads_100.json",
    RESULTS / "serve_real_slo_cache_wait.json",
    RESULTS / "serve_real_slo.json",
    RESULTS / "serve_real_slo_limit.json",
    RESULTS / "serve_real_slo_stretch.json",
    RESULTS / "serve_real_slo_default.json",
    RESULTS / "serve_real_slo_held.json",
    RESULTS / "serve_real_slo_held_max_rate.json",
    RESULTS / "serve_real_slo_knee.json",
    RESULTS / "serve_real_slo_knee_run2.json",
    RESULTS / "serve_real_slo_knee_max_rate.json",
    RESULTS / "serve_real_narrow_slo.json",
    RESULTS / "serve_real_narrow_slo_run2.json",
    RESULTS / "serve_real_narrow_single_turn_slo.json",
)
CALIBRATION = RESULTS / "emulator_small_bound.json"
MAX_NUM_SEQS = 128  # vLLM's CPU defaults, as the real replicas ran
MAX_BATCHED_TOKENS = 2048
PACE_ROUNDS = 6


@dataclasses.dataclass(frozen=True)
class Run:
    """A real run as the simulator needs it."""

    doc: dict[str, Any]
    s: real.Settings
    chat: prefix.Chat | None  # None: single-turn
    skipped: str | None  # why it cannot be simulated


@dataclasses.dataclass(frozen=True)
class Workload:
    """A run's requests, in the order sent: (prompt tokens, output tokens), and multi-turn
    their prompts (empty: single-turn prompts share nothing)."""

    jobs: list[tuple[int, int]]
    prompts: list[Prompt]


def read_run(path: Path) -> Run:
    """The real run, its settings from its own command line, and why it cannot be simulated."""
    doc = json.loads(path.read_text())
    args = prefix.build_parser().parse_args(shlex.split(doc["command"])[2:])
    s, chat = prefix.settings_of(args)
    why = None
    if any(size != "small" for size, _, _ in real.FLEETS[s.fleet]):
        why = f"fleet {s.fleet!r}: only fleets of the small model are calibrated"
    elif "capacity" not in doc or not (doc.get("loads") or doc.get("replica_rates")):
        why = "the run measured nothing (skipped)"
    return Run(doc, s, None if args.single_turn else chat, why)


def template_tokens(messages: int) -> int:
    """The tokens the test model's chat template adds: ``<s>``, each message's role, line
    ends and ``</s>``, the assistant's role to come."""
    return 4 * messages + 3


def workload(run: Run, n: int) -> Workload:
    """The run's first ``n`` requests."""
    s = run.s
    if run.chat is None:
        prompts = real.prompt_lengths(s, n)
        outputs = real.output_lengths(s, n)
        jobs = [(p + template_tokens(1), o) for p, o in zip(prompts, outputs, strict=True)]
        return Workload(jobs, [])
    from tokenizers import Tokenizer

    model = real.vllm_engine.make_model(real.vllm_engine.models_dir() / "small", size="small")
    bodies, _ = prefix.chat_bodies(s, run.chat, n, model / "tokenizer.json")
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    special = {t: tok.token_to_id(t) for t in ("<s>", "</s>")}
    roles = {r: tok.token_to_id(f"<|{r}|>") for r in ("system", "user", "assistant")}
    (newline,) = tok.encode("\n").ids
    jobs, out = [], []
    for body in bodies:
        payload = json.loads(body)
        ids = [special["<s>"]]
        for m in payload["messages"]:
            ids += [roles[m["role"]], newline, *tok.encode(m["content"]).ids]
            ids += [special["</s>"], newline]
        ids += [roles["assistant"], newline]
        engine_text = "".join(f"{i % 0x10000:04x}" for i in ids)  # 4 characters a token
        blocks = prefix_blocks(engine_text, 4 * BLOCK_SIZE, limit=len(ids) // BLOCK_SIZE)
        text = prompt_text(payload, MAX_BLOCKS * BLOCK_CHARS)
        jobs.append((len(ids), int(payload["max_tokens"])))
        out.append(Prompt(text, payload.get("user"), blocks))
    return Workload(jobs, out)


def shape(size: str) -> ModelShape:
    d = SHAPES[size]
    return ModelShape(
        name=size,
        layers=d["num_hidden_layers"],
        hidden=d["hidden_size"],
        heads=d["num_attention_heads"],
        kv_heads=d["num_key_value_heads"],
        head_dim=d["hidden_size"] // d["num_attention_heads"],
        intermediate=d["intermediate_size"],
        vocab=VOCAB,
        max_positions=MAX_MODEL_LEN,
        weights_dtype="fp32",
    )


def paced(base: Calibration, pace: float) -> Calibration:
    """``base`` with every step taking ``pace`` times as long (a share of the core)."""
    attention = base.attention_efficiency
    return Calibration(
        compute_efficiency=base.compute_efficiency / pace,
        bandwidth_efficiency=base.bandwidth_efficiency / pace,
        step_overhead=base.step_overhead * pace,
        request_overhead=base.request_overhead * pace,
        attention_efficiency=None if attention is None else attention / pace,
    )


def spec(size: str, base: Calibration, pace: float, kv_tokens: int) -> EngineSpec:
    return make_spec(
        shape(size),
        "CPU",
        calibration=paced(base, pace),
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_BATCHED_TOKENS,
        kv_tokens=kv_tokens,
    )


def closed_loop(
    engine: EngineSpec,
    work: Workload,
    concurrency: int,
    settle: float,
    window: float,
    mean_output: float,
) -> dict[str, Any]:
    """The real capacity loop on the engine model: ``concurrency`` streams, each sending the
    next of ``jobs`` when its last ends; output tokens over the window after ``settle`` s."""
    clock = ManualClock()
    set_time = clock.setter()
    model = EngineModel(engine, clock.now)
    end = settle + window
    sent = tokens = 0
    ttft: list[float] = []
    tpot: list[float] = []

    def send() -> None:
        nonlocal sent
        while True:
            k = sent % len(work.jobs)
            sent += 1
            prompt, output = work.jobs[k]
            blocks = work.prompts[k].blocks if work.prompts else ()
            if prompt + output <= engine.max_context:  # else vLLM refuses it at once
                model.submit(EngineRequest(prompt, output, blocks))
                return

    for _ in range(concurrency):
        send()
    while (step := model.step()) is not None and step.start < end:
        set_time(step.end)
        if settle <= step.end < end:
            tokens += len(step.progressed)
        for r in step.finished:
            assert r.first_token_at is not None and r.finished_at is not None
            ttft.append(r.first_token_at - r.arrival)
            if r.output_tokens > 1:
                tpot.append((r.finished_at - r.first_token_at) / (r.output_tokens - 1))
            send()
    return {
        "requests_per_s": round(tokens / window / mean_output, 3),
        "ttft_p50_s": round(float(np.median(ttft)), 4),
        "tpot_p50_s": round(float(np.median(tpot)), 5),
    }


def fit_paces(run: Run, work: Workload, base: Calibration, kv_tokens: int) -> list[dict[str, Any]]:
    """Each replica's pace, from its capacity in the run (secant steps on the loop's rate,
    which falls as about 1 / pace). ``work``: every request the run made (the loop's)."""
    cap = run.doc["capacity"]
    mean_output = float(np.mean([o for _, o in work.jobs]))
    out = []
    for replica, measured in zip(run.doc["fleet"]["replicas"], cap["replicas"], strict=True):
        target = measured["requests_per_s"]
        pace = 1.0 / replica["cpu_share"]
        for _ in range(PACE_ROUNDS):
            got = closed_loop(
                spec("small", base, pace, kv_tokens),
                work,
                cap["concurrency"],
                cap["settle_s"],
                cap["window_s"],
                mean_output,
            )
            if abs(got["requests_per_s"] / target - 1) < 0.005:
                break
            pace *= got["requests_per_s"] / target
        out.append(
            {
                "replica": replica["name"],
                "cpu_share": replica["cpu_share"],
                "pace": round(pace, 4),
                "real": {
                    "requests_per_s": target,
                    "ttft_p50_s": measured["ttft_s"]["p50"],
                    "tpot_p50_s": measured["tpot_s"]["p50"],
                },
                "simulated": got,
            }
        )
    return out


def simulate(
    row: dict[str, Any],
    fleet: list[tuple[str, EngineSpec]],
    arrived: list[tuple[float, int, int]],
    prompts: list[Prompt],
    slo: tuple[float, float],
    *,
    renders: bool,
) -> FleetResult:
    """The real configuration ``row``, simulated; ``renders``: the engines answered
    vllm-router's render (started with ``--enable-scale-out``)."""
    kind, name = row["kind"], row["name"]
    anchors = {
        ("sglang", "cache_aware"): "_anchor_policies:CacheAware",
        ("vllm-router", "cache_aware"): "_anchor_policies:VllmRouterCacheAware",
        ("sglang", "power_of_two"): "_anchor_policies:PowerOfTwo",
        ("client", "round_robin"): "round_robin",
    }
    if kind == "alone":
        sim = EngineFleetSimulator(fleet[:1], options=NO_ROUTER, capacity="none")
    elif kind == "hetero":
        flags = shlex.split(name) if name.startswith("--") else ["--strategy", name]
        sim = EngineFleetSimulator(fleet, options=RouterOptions(**hetero_options(flags)))
    elif (kind, name) in anchors:
        told = {"tokens": renders} if kind == "vllm-router" else {}
        options = RouterOptions(strategy=anchors[kind, name], strategy_options=told)
        sim = EngineFleetSimulator(fleet, options=options, capacity="none")
    else:
        raise ValueError(f"{kind} {name}: not modelled")
    return sim.run(arrived, slo=slo, prompts=prompts)


def hetero_options(flags: list[str]) -> dict[str, Any]:
    """RouterOptions fields of the hetero serve flags a run used (those the runs use)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--strategy")
    parser.add_argument("--slo-ttft", type=float)
    parser.add_argument("--slo-tpot", type=float)
    args = parser.parse_args(flags)
    return {k: v for k, v in vars(args).items() if v is not None}


def shares(result: FleetResult, names: list[str]) -> dict[str, float]:
    placed = result.replica[result.replica >= 0]
    counts = np.bincount(placed, minlength=len(names)) / max(1, len(placed))
    return {n: round(float(c), 4) for n, c in zip(names, counts, strict=False)}


def hit_rate(result: FleetResult) -> float | None:
    queries = sum(r.prefix_queries for r in result.replicas)
    return round(sum(r.prefix_hits for r in result.replicas) / queries, 4) if queries else None


def compare(path: Path, base: Calibration, kv_tokens: int, target: float) -> dict[str, Any]:
    run = read_run(path)
    doc, s = run.doc, run.s
    head: dict[str, Any] = {"real_run": str(path.relative_to(RESULTS.parent.parent))}
    if run.skipped is not None:
        return {**head, "skipped": run.skipped}
    head["real_revision"] = doc["revision"]["commit"][:7]
    head["fleet"] = s.fleet
    head["workload"] = "single-turn" if run.chat is None else "multi-turn"
    # As many requests as the real run made (its capacity loop cycles through them all).
    work = workload(run, int(max(s.loads, default=0) * 40 * s.duration) + 4000)
    paces = fit_paces(run, work, base, kv_tokens)
    names = [r["name"] for r in doc["fleet"]["replicas"]]
    fleet = [
        (n, spec("small", base, p["pace"], kv_tokens)) for n, p in zip(names, paces, strict=True)
    ]
    slo = (doc["slo"]["ttft_s"], doc["slo"]["tpot_s"])
    renders = bool(doc["fleet"].get("scale_out"))  # the engines answered vllm-router's render
    rows = []
    for block in doc["loads"]:
        arrived, prompts = arrivals(work, block["rate_rps"], s.duration, s.seed)
        configs = []
        for row in block["configs"]:
            if "skipped" in row:
                continue
            result = simulate(row, fleet, arrived, prompts, slo, renders=renders)
            simulated = round(result.attainment(*slo), 4)
            configs.append(
                {
                    "config": row["config"],
                    "real": row["slo_attainment"],
                    "simulated": simulated,
                    "difference": round(simulated - row["slo_attainment"], 4),
                    "within_target": abs(simulated - row["slo_attainment"]) <= target,
                    "shares_real": {r["replica"]: r["share_of_completed"] for r in row["replicas"]},
                    "shares_simulated": shares(result, names),
                    "hit_rate_real": row.get("hit_rate"),
                    "hit_rate_simulated": hit_rate(result),
                }
            )
            print(
                f"{path.name} {block['load']:.0%} {row['config']}: real "
                f"{row['slo_attainment']:.1%} simulated {simulated:.1%}",
                file=sys.stderr,
            )
        rows.append(
            {
                "load": block["load"],
                "rate_rps": block["rate_rps"],
                "requests_real": block["requests"],
                "requests_simulated": len(arrived),
                "configs": configs,
            }
        )
    out = {**head, "paces": paces, "loads": rows}
    if doc["loads"]:
        first = doc["loads"][0]
        out["prompt_tokens_mean"] = {
            "real (vLLM's prefix-cache queries a request, the first load's first router)": round(
                sum(r["prefix_queries"] for r in first["configs"][0]["replicas"])
                / first["requests"],
                1,
            ),
            "simulated": round(float(np.mean([p for p, _ in work.jobs[: first["requests"]]])), 1),
        }
    if "replica_rates" in doc:
        out["replica_rates"] = replica_rates(run, work, fleet, slo, target)
    return out


def alone(
    engine: tuple[str, EngineSpec],
    rate: float,
    duration: float,
    seed: int,
    work: Workload,
    slo: tuple[float, float],
) -> float:
    """The SLO attainment of ``engine`` sent the run's requests alone at ``rate`` for
    ``duration`` s (the real benchmark's send times)."""
    arrived, prompts = arrivals(work, rate, duration, seed)
    sim = EngineFleetSimulator([engine], options=NO_ROUTER, capacity="none")
    result = sim.run(arrived, slo=slo, prompts=prompts)
    return round(result.attainment(*slo), 4)


def arrivals(
    work: Workload, rate: float, duration: float, seed: int
) -> tuple[list[tuple[float, int, int]], list[Prompt]]:
    """The run's requests as the real benchmark sent them at ``rate`` for ``duration`` s: (send
    time, prompt tokens, output tokens) each, and their prompts (multi-turn)."""
    times = real.poisson_times(rate, duration, seed)
    arrived = [(t, p, o) for t, (p, o) in zip(times, work.jobs, strict=False)]
    return arrived, work.prompts[: len(arrived)]


def replica_rates(
    run: Run,
    work: Workload,
    fleet: list[tuple[str, EngineSpec]],
    slo: tuple[float, float],
    target: float,
) -> dict[str, Any]:
    """``--replica-rates``: each replica alone, simulated at the rates the real run tried (its
    own send times), and its simulated highest rate on the real run's grid."""
    rates = run.doc["replica_rates"]
    rows = []
    for engine, row in zip(fleet, rates["replicas"], strict=True):
        if "skipped" in row:
            continue
        capacity, duration = row["capacity_rps"], row["duration_s"]
        probes = []
        for p in row["probes"]:
            simulated = alone(engine, p["load"] * capacity, duration, run.s.seed, work, slo)
            probes.append(
                {
                    "load": p["load"],
                    "rate_rps": p["rate_rps"],
                    "real": p["slo_attainment"],
                    "simulated": simulated,
                    "within_target": abs(simulated - p["slo_attainment"]) <= target,
                }
            )
        steps = round(prefix.REPLICA_RATE_TOP / prefix.REPLICA_RATE_STEP)
        k = real.highest_step(
            lambda j, e=engine, c=capacity, d=duration: alone(
                e, j * prefix.REPLICA_RATE_STEP * c, d, run.s.seed, work, slo
            ),
            {},
            steps,
            rates["target"],
        )
        rows.append(
            {
                "replica": row["replica"],
                "max_rate_rps": {
                    "real": row["max_rate_rps"],
                    "simulated": round(k * prefix.REPLICA_RATE_STEP * capacity, 3),
                },
                "probes": probes,
            }
        )
        print(f"{row['replica']} alone: {json.dumps(rows[-1]['max_rate_rps'])}", file=sys.stderr)
    return {
        "sum_rps": {
            side: round(sum(r["max_rate_rps"][side] for r in rows), 3)
            for side in ("real", "simulated")
        },
        "replicas": rows,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--real",
        action="append",
        type=Path,
        help="a real run's JSON (repeatable; default: the committed SLO runs on the one-model "
        "fleet, single-turn and multi-turn)",
    )
    parser.add_argument("--calibration", type=Path, default=CALIBRATION)
    parser.add_argument("--target", type=float, default=0.05, help="largest |difference|")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if not 0 < args.target < 1:
        parser.error(f"--target must be a fraction in (0, 1), got {args.target}")
    for name, path in [("--calibration", args.calibration)] + [
        ("--real", p) for p in args.real or []
    ]:
        if not path.is_file():
            parser.error(f"{name}: no file {str(path)!r} (a benchmark's JSON result)")
    emulated = json.loads(args.calibration.read_text())
    base = Calibration(**emulated["calibration"])
    kv_tokens = emulated["engine"]["kv_tokens"]
    started = time.perf_counter()
    runs = [compare(p.resolve(), base, kv_tokens, args.target) for p in args.real or REAL_RUNS]
    # Each cell with its run's fleet, in the runs' order.
    placed = [(r["fleet"], c) for r in runs for load in r.get("loads", []) for c in load["configs"]]
    cells = [c for _, c in placed]
    by_router: dict[str, list[float]] = {}
    by_fleet: dict[str, list[bool]] = {}
    for fleet, c in placed:
        by_router.setdefault(c["config"], []).append(abs(c["difference"]))
        by_fleet.setdefault(fleet, []).append(c["within_target"])
    doc = {
        "benchmark": "sim_to_real",
        "command": command("bench/bench_sim_to_real.py", argv),
        "revision": revision(),
        "calibration": {
            "from": emulated["command"],
            "at": emulated["revision"]["commit"][:7],
            **emulated["calibration"],
        },
        "target": args.target,
        "runs": runs,
        "within_target": sum(c["within_target"] for c in cells),
        "cells": len(cells),
        "largest_difference": max((abs(c["difference"]) for c in cells), default=math.nan),
        "by_fleet": {k: {"cells": len(v), "within_target": sum(v)} for k, v in by_fleet.items()},
        "by_router": {
            k: {
                "cells": len(v),
                "within_target": sum(d <= args.target for d in v),
                "mean_abs_difference": round(float(np.mean(v)), 4),
            }
            for k, v in by_router.items()
        },
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
