"""Sim-to-real: the simulator set the real-engine benchmark's fleet and workload, its SLO
attainment beside the real runs', for each router and load.

- Real runs: ``bench_serve_real_prefix.py --single-turn --fleet one-model`` JSONs (``--real``,
  repeatable): three vLLM CPU replicas of the 2.6M test model, the whole of one core, 40% and
  20% of the other.
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
  draws, ``bench_serve_real``'s functions): Poisson send times at each load's rate, prompt
  lengths (the chat template's 4 tokens added) and output lengths.
- Routers, simulated: hetero serve's default (``shortest_expected_delay``) and ``--strategy
  slo``, each ``hetero.sim.engine_fleet``'s mirror of the router; sglang-router's and
  vllm-router's ``cache_aware``: a prompt that matches under 30% of what a worker's prefix
  tree holds goes to the worker with the fewest requests in flight, as any request does while
  the fleet is imbalanced, and no single-turn prompt matches that much, so ``least_connections``
  with every request forwarded at once, the engine queueing what it cannot run; the fast
  replica alone (every request to its engine).
- Reported, per load and router: the real and simulated SLO attainment and their difference
  (the target: within ``--target``, 0.05), each replica's share of the requests both ways;
  the fitted paces and the capacity loop's TTFT and TPOT medians beside the real ones.

Not simulated: the multi-turn runs (the simulator's requests carry no prefix), the HTTP path,
the router's and the load generator's own time.

Prints JSON; ``--out`` saves it.

    python bench/bench_sim_to_real.py --out bench/results/sim_to_real.json
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_serve_real as real
import bench_serve_real_prefix as prefix
import numpy as np
from _common import command, emit, revision

from hetero.plan.models import ModelShape
from hetero.sched.clock import ManualClock
from hetero.serve.emulator.tiny_llama import MAX_MODEL_LEN, SHAPES, VOCAB
from hetero.serve.engine_model import Calibration, EngineModel, EngineRequest, EngineSpec
from hetero.serve.engine_model import engine_spec as make_spec
from hetero.serve.records import RouterOptions
from hetero.sim.engine_fleet import EngineFleetSimulator, FleetResult

RESULTS = Path(__file__).resolve().with_name("results")
REAL_RUNS = (
    RESULTS / "serve_real_single_turn_slo.json",
    RESULTS / "serve_real_single_turn_slo_loads_80_120.json",
    RESULTS / "serve_real_single_turn_slo_loads_90_110.json",
    RESULTS / "serve_real_slo.json",
)
CALIBRATION = RESULTS / "emulator_small_bound.json"
TEMPLATE_TOKENS = 4  # the chat template's, around the user's words
MAX_NUM_SEQS = 128  # vLLM's CPU defaults, as the real replicas ran
MAX_BATCHED_TOKENS = 2048
PACE_ROUNDS = 6


def read_run(path: Path) -> tuple[dict[str, Any], real.Settings, str | None]:
    """The real run, its settings from its own command line, and why it cannot be simulated
    (``None``: it can)."""
    doc = json.loads(path.read_text())
    args = prefix.build_parser().parse_args(shlex.split(doc["command"])[2:])
    s, _ = prefix.settings_of(args)
    why = None
    if not args.single_turn:
        why = "multi-turn: the simulator's requests carry no prefix"
    elif s.fleet != "one-model":
        why = f"fleet {s.fleet!r}: only the one-model fleet is calibrated"
    elif "capacity" not in doc or not doc.get("loads"):
        why = "the run measured nothing (skipped)"
    return doc, s, why


def requests_of(s: real.Settings, n: int) -> list[tuple[int, int]]:
    """The run's first ``n`` requests: (prompt tokens, output tokens)."""
    prompts = real.prompt_lengths(s, n)
    outputs = real.output_lengths(s, n)
    return [(p + TEMPLATE_TOKENS, o) for p, o in zip(prompts, outputs, strict=True)]


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
    jobs: Sequence[tuple[int, int]],
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
        prompt, output = jobs[sent % len(jobs)]
        model.submit(EngineRequest(prompt, output))
        sent += 1

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


def fit_paces(
    doc: dict[str, Any], s: real.Settings, base: Calibration, kv_tokens: int
) -> list[dict[str, Any]]:
    """Each replica's pace, from its capacity in the run (secant steps on the loop's rate,
    which falls as about 1 / pace)."""
    cap = doc["capacity"]
    jobs = requests_of(s, int(max(s.loads) * 40 * s.duration) + 4000)
    mean_output = float(np.mean([o for _, o in jobs]))
    out = []
    for replica, measured in zip(doc["fleet"]["replicas"], cap["replicas"], strict=True):
        target = measured["requests_per_s"]
        pace = 1.0 / replica["cpu_share"]
        for _ in range(PACE_ROUNDS):
            got = closed_loop(
                spec("small", base, pace, kv_tokens),
                jobs,
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
    slo: tuple[float, float],
) -> FleetResult:
    """The real configuration ``row``, simulated."""
    kind, name = row["kind"], row["name"]
    if kind == "alone":
        sim = EngineFleetSimulator(fleet[:1], capacity="engine")
    elif kind == "hetero":
        flags = shlex.split(name) if name.startswith("--") else ["--strategy", name]
        options = RouterOptions(**hetero_options(flags))
        sim = EngineFleetSimulator(fleet, options=options)
    elif kind in ("sglang", "vllm-router") and name == "cache_aware":
        # Their cache_aware sends a prompt that matches under 30% of any worker's prefix tree
        # to the worker with the fewest requests in flight (the first on ties), and so does
        # its rule for an imbalanced fleet (sglang-router's src/policies/cache_aware.rs;
        # vllm-router is a fork of it). No single-turn prompt matches that much.
        options = RouterOptions(strategy="least_connections")
        sim = EngineFleetSimulator(fleet, options=options, capacity="none")
    else:
        raise ValueError(f"{kind} {name}: not modelled")
    return sim.run(arrived, slo=slo)


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


def compare(path: Path, base: Calibration, kv_tokens: int, target: float) -> dict[str, Any]:
    doc, s, why = read_run(path)
    head: dict[str, Any] = {"real_run": str(path.relative_to(RESULTS.parent.parent))}
    if why is not None:
        return {**head, "skipped": why}
    head["real_revision"] = doc["revision"]["commit"][:7]
    paces = fit_paces(doc, s, base, kv_tokens)
    names = [r["name"] for r in doc["fleet"]["replicas"]]
    fleet = [
        (n, spec("small", base, p["pace"], kv_tokens)) for n, p in zip(names, paces, strict=True)
    ]
    slo = (doc["slo"]["ttft_s"], doc["slo"]["tpot_s"])
    rows = []
    for block in doc["loads"]:
        times = real.poisson_times(block["rate_rps"], s.duration, s.seed)
        jobs = requests_of(s, len(times))
        arrived = [(t, p, o) for t, (p, o) in zip(times, jobs, strict=True)]
        configs = []
        for row in block["configs"]:
            if "skipped" in row:
                continue
            result = simulate(row, fleet, arrived, slo)
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
    return {
        **head,
        "prompt_tokens_mean": {
            "real": doc["workload"]["prompt_tokens_mean"],
            "simulated": round(float(np.mean([p for _, p, _ in arrived])), 1),
        },
        "paces": paces,
        "loads": rows,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--real",
        action="append",
        type=Path,
        help="a real run's JSON (repeatable; default: the committed single-turn SLO runs)",
    )
    parser.add_argument("--calibration", type=Path, default=CALIBRATION)
    parser.add_argument("--target", type=float, default=0.05, help="largest |difference|")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if not 0 < args.target < 1:
        parser.error(f"--target must be a fraction in (0, 1), got {args.target}")
    emulated = json.loads(args.calibration.read_text())
    base = Calibration(**emulated["calibration"])
    kv_tokens = emulated["engine"]["kv_tokens"]
    started = time.perf_counter()
    runs = [compare(p.resolve(), base, kv_tokens, args.target) for p in args.real or REAL_RUNS]
    cells = [c for run in runs for load in run.get("loads", []) for c in load["configs"]]
    by_router: dict[str, list[float]] = {}
    for c in cells:
        by_router.setdefault(c["config"], []).append(abs(c["difference"]))
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
