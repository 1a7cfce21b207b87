"""``hetero serve`` against the routers a user would pick instead, on emulated replicas
(``hetero.serve.emulator``), in one run on this machine. Three figures, each run alone with
``--only``:

- ``goodput``: three mock replicas of relative speeds 1 : 2.5 : 6 with slots in proportion to
  their memory (a 16, a 40 and an 80 GB card: 4 : 10 : 20), all in one process. Poisson arrivals
  at ``--load`` (85%) of the fleet's capacity for ``--duration`` seconds, the same send times
  and prompts for every configuration; non-streaming chat requests with lognormal prompt
  lengths and a fixed ``max_tokens``; the mock draws each output length (lognormal, sigma 1,
  capped by ``max_tokens``). Capacity = Σ slots_i × speed_i / (prefill_time × E[prompt tokens]
  + decode_time × E[output tokens]), the expectation of the output taken over the mock's own
  draw. A request meets the SLO when latency / completion_tokens ≤ ``--slo-slack`` × (decode_time
  + prefill_time × prompt_tokens / completion_tokens) / slowest speed: at most 1.5× (the
  default slack) as slow per output token as it would run alone on the slowest replica, so
  that every replica meets the bound unloaded (or ``--slo-per-token`` seconds flat).
  Goodput = requests meeting the SLO per second of offered duration. Configurations, each on a
  fresh mock process: ``hetero serve`` with each ``--strategies`` (a fresh router each),
  client-side round robin straight to the replicas (no router), and sglang-router with each of
  its ``--sglang-policies``.
- ``max_rate``: goodput as serving papers (DistServe) define it: the highest load at which a
  configuration still keeps ``--targets`` (0.98 and 0.9) of its requests within the SLO. Same
  fleet, requests and SLO as ``goodput``; for hetero serve's default and every baseline, loads
  on a grid of ``--step`` (5%) of capacity up to 120% are bisected, ``--rate-duration`` s of
  arrivals each, on a fresh mock process and router every time.
- ``overhead``: one instant mock (no prefill or decode time, 1024 slots) straight, behind
  ``hetero serve`` (its default, ``slo``, and ``shortest_expected_delay``) and behind
  sglang-router: an open loop of
  ``--rate`` requests/s (Poisson) → latency percentiles, added latency = routed minus direct;
  then a closed loop of ``--concurrency`` clients → requests/s sustained, and each process's
  CPU per request.

The load generator runs in processes of its own (bench/_serve_load.py): open loop with send
times fixed in advance, every request recorded with its status, latency and ``usage``; it stops
by itself after the last send plus ``--grace`` seconds, and what is not back by then counts as
unfinished (a failure). Anchors that are missing (sglang-router not installed, ``hetero serve``
not there yet) are recorded as skipped with the reason. Every process started is stopped at the
end, also on errors and Ctrl-C. Prints JSON; ``--out`` saves it (with ``--only``, into the
figures already there).

    python bench/bench_serve.py --out bench/results/serve.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import _common
import numpy as np
from _common import calibration_seconds, emit
from _serve_procs import (
    URL,
    Child,
    Children,
    StartError,
    hetero_serve_available,
    hetero_serve_command,
    sglang_router_command,
    sglang_router_version,
    start_hetero_serve,
    start_mocks,
    start_sglang_router,
    warm_up,
)

import hetero
from hetero.serve.app import ServeOptions
from hetero.serve.router import DEFAULT_STRATEGY

FIGURES = ("goodput", "max_rate", "overhead", "poller")
MODEL = "mock-llm"
#: The strategy that counts slots measured beside the default (the default before ``slo``).
SLOT_STRATEGY = "shortest_expected_delay"
HETERO_STRATEGIES = tuple(
    dict.fromkeys(
        (
            DEFAULT_STRATEGY,
            SLOT_STRATEGY,
            "round_robin",
            "least_connections",
            "power_of_two",
        )
    )
)
# sglang-router's policies but ``manual``, which routes by a routing key the client sends
# (sticky sessions) and without one picks at random.
SGLANG_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
#: SLO bounds (× a request's service time alone on the slowest replica) reported beside the
#: chosen one, so that the comparison can be read at any bound.
SLO_CURVE = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
SGLANG_DEFAULT = "cache_aware"
LOAD_SCRIPT = Path(__file__).resolve().with_name("_serve_load.py")
RECORD_COLUMNS = (
    "index",
    "target",
    "status",
    "start",
    "latency",
    "lag",
    "prompt_tokens",
    "completion_tokens",
    "ttft",
    "chunks",
)
WARM_BODY = json.dumps(
    {"model": MODEL, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1}
).encode()


@dataclass(frozen=True)
class Goodput:
    speeds: tuple[float, ...] = (1.0, 2.5, 6.0)
    slots: tuple[int, ...] = (4, 10, 20)
    memory_gb: tuple[int, ...] = (16, 40, 80)  # what the slots stand for
    decode_time: float = 0.02
    prefill_time: float = 0.0005
    output_mean: float = 128
    output_dist: str = "lognormal"
    prompt_mean: float = 256  # tokens (the mock counts 4 characters a token)
    prompt_sigma: float = 0.5
    max_tokens: int = 1024
    load: float = 0.85
    duration: float = 40.0
    grace: float | None = None  # None: long enough for any request that could meet the SLO
    slo_slack: float = 1.5
    slo_per_token: float | None = None
    strategies: tuple[str, ...] = HETERO_STRATEGIES
    sglang_policies: tuple[str, ...] = SGLANG_POLICIES
    seed: int = 0

    def slo_bound(
        self, prompt_tokens: int, completion_tokens: int, slack: float | None = None
    ) -> float:
        """Seconds a request may take (its per-token bound times its completion tokens);
        ``slack`` overrides ``slo_slack``."""
        if self.slo_per_token is not None and slack is None:
            return self.slo_per_token * completion_tokens
        work = self.prefill_time * prompt_tokens + self.decode_time * completion_tokens
        return (self.slo_slack if slack is None else slack) * work / min(self.speeds)


@dataclass(frozen=True)
class Overhead:
    rate: float = 500.0
    duration: float = 10.0  # open loop
    concurrency: int = 64
    closed_duration: float = 10.0
    closed_warmup: float = 1.0  # completions before this are left out of the throughput
    generators: int = 1  # load-generator processes in the closed loop
    slots: int = 1024
    output_mean: float = 16
    prompt_chars: int = 64
    stream_tokens: int = 64  # each streamed reply's chunks (ignore_eos) in the streamed loop
    stream_decode_time: float = 0.001  # s a token of the streamed loop's mock
    grace: float = 10.0
    sglang_policies: tuple[str, ...] = ("round_robin", SGLANG_DEFAULT)
    repeats: int = 3
    seed: int = 0
    trees: tuple[str, ...] = ()  # other checkouts whose hetero serve runs in turns with this one


def quick_sizes(
    goodput: Goodput, rates: MaxRate, overhead: Overhead
) -> tuple[Goodput, MaxRate, Overhead]:
    return (
        dataclasses.replace(goodput, duration=10.0, grace=8.0),
        dataclasses.replace(rates, duration=5.0, step=0.25),
        dataclasses.replace(overhead, duration=3.0, closed_duration=3.0, rate=200.0, repeats=1),
    )


# ------------------------------------------------------------------------------- workload


def poisson_times(rate: float, duration: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of a Poisson process of ``rate`` over ``duration``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, size=int(rate * duration * 1.5) + 100)
    times = np.cumsum(gaps)
    return [round(float(t), 6) for t in times[times < duration]]


def chat_body(content: str, max_tokens: int, seed: int | None = None, stream: bool = False) -> str:
    """A chat request; ``stream``: streamed, with its usage, every one of ``max_tokens``."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
    }
    if seed is not None:
        body["seed"] = seed  # the mock draws this request's output length from it
    if stream:
        body |= {"ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body)


def prompt_lengths(w: Goodput, n: int, seed: int) -> list[int]:
    """``n`` lognormal prompt lengths in tokens, mean ``prompt_mean``."""
    rng = np.random.default_rng(seed)
    mu = math.log(w.prompt_mean) - w.prompt_sigma**2 / 2
    return [max(1, round(x)) for x in rng.lognormal(mu, w.prompt_sigma, n).tolist()]


def prompts(w: Goodput, n: int) -> tuple[list[str], list[int]]:
    """``n`` request bodies and their prompt tokens. The text is random letters, 4 a token (the
    mock's count), so there are no shared prefixes for a cache-aware router to find."""
    tokens = prompt_lengths(w, n, w.seed + 1)
    rng = np.random.default_rng(w.seed + 2)
    bodies = [
        chat_body(
            rng.integers(97, 123, size=4 * t, dtype=np.uint8).tobytes().decode(),
            w.max_tokens,
            seed=i,
        )
        for i, t in enumerate(tokens)
    ]
    return bodies, tokens


def expected_output_tokens(w: Goodput, draws: int = 400_000) -> float:
    """E[completion tokens]: the mock's own draw, capped by ``max_tokens``, averaged."""
    # The mock's own sampler, so the capacity follows the mock if its distribution changes.
    from hetero.serve.emulator.config import draw_output_length

    rng = random.Random(12345)
    total = sum(
        min(draw_output_length(rng, w.output_dist, w.output_mean), w.max_tokens)
        for _ in range(draws)
    )
    return total / draws


def mock_configs(w: Goodput) -> list[dict[str, Any]]:
    return [
        {
            "models": [MODEL],
            "speed": speed,
            "slots": slots,
            "seed": w.seed + k,
            "decode_time": w.decode_time,
            "prefill_time": w.prefill_time,
            "output_mean": w.output_mean,
            "output_dist": w.output_dist,
            "default_max_tokens": w.max_tokens,
        }
        for k, (speed, slots) in enumerate(zip(w.speeds, w.slots, strict=True))
    ]


# ------------------------------------------------------------------------------ load runs


def run_load(
    children: Children,
    spec: dict[str, Any],
    parts: int,
    watch: dict[str, Child],
    name: str,
) -> dict[str, Any]:
    """Run the generator in ``parts`` processes on ``spec``; merged records, CPU seconds of
    the generator and of each watched process over the run."""
    spec_path = children.log_dir / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    outs = [children.log_dir / f"{name}.{k}.json" for k in range(parts)]
    gens = [
        children.start(
            f"load-{name}-{k}",
            [sys.executable, str(LOAD_SCRIPT), str(spec_path), str(out), str(k), str(parts)],
            stdin=True,
        )
        for k, out in enumerate(outs)
    ]
    for g in gens:
        g.wait_for_line(re.compile(r"^ready$", re.M), 60)
    cpu0 = {k: c.cpu_seconds() for k, c in watch.items()}
    start = time.time() + 0.2
    for g in gens:
        assert g.proc.stdin is not None
        g.proc.stdin.write(f"{start!r}\n".encode())
        g.proc.stdin.flush()
    length = spec["send_at"][-1] if spec["mode"] == "open" else spec["duration"]
    limit = length + spec["grace"] + 60  # the generator stops by itself well before
    for g in gens:
        try:
            g.proc.wait(max(1.0, start + limit - time.time()))
        except subprocess.TimeoutExpired:
            raise StartError(f"load generator {g.name} still running after {limit:g} s") from None
        if g.proc.returncode != 0:
            raise StartError(f"load generator {g.name} failed:\n{g.tail()}")
    cpu = {k: round(c.cpu_seconds() - cpu0[k], 3) for k, c in watch.items()}
    results = [json.loads(out.read_text()) for out in outs]
    for g in gens:
        children.stop(g)
    merged: dict[str, Any] = {key: [v for r in results for v in r[key]] for key in RECORD_COLUMNS}
    errors: dict[str, int] = {}
    for r in results:
        for kind, count in r["errors"].items():
            errors[kind] = errors.get(kind, 0) + count
    merged["errors"] = errors
    merged["error_samples"] = [s for r in results for s in r["error_samples"]][:10]
    cpu["generator"] = round(sum(r["cpu_seconds"] for r in results), 3)
    merged["cpu_seconds"] = cpu
    merged["event_loop"] = results[0]["event_loop"]
    return merged


def _percentiles(values: Sequence[float], scale: float, digits: int) -> dict[str, Any]:
    if not values:
        return {"p50": None, "p99": None, "mean": None, "max": None}
    a = np.asarray(values) * scale
    return {
        "p50": round(float(np.percentile(a, 50)), digits),
        "p99": round(float(np.percentile(a, 99)), digits),
        "mean": round(float(a.mean()), digits),
        "max": round(float(a.max()), digits),
    }


def _fetch_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


# -------------------------------------------------------------------------------- goodput


@dataclass(frozen=True)
class Config:
    label: str
    kind: str  # hetero | client | sglang
    name: str  # strategy or policy
    flags: tuple[str, ...] = ()  # hetero serve's further flags
    tree: str | None = None  # hetero serve from another checkout (--tree)


def goodput_configs(w: Goodput) -> list[Config]:
    configs = [
        Config(f"hetero serve, {s}" + (" (default)" if s == DEFAULT_STRATEGY else ""), "hetero", s)
        for s in w.strategies
    ]
    configs.append(Config("client-side round robin (no router)", "client", "round_robin"))
    configs += [
        Config(
            f"sglang-router, {p}" + (" (its default)" if p == SGLANG_DEFAULT else ""), "sglang", p
        )
        for p in w.sglang_policies
    ]
    return configs


def start_router(
    children: Children, config: Config, urls: Sequence[str]
) -> tuple[Child | None, list[str]]:
    """The router of ``config`` in front of ``urls``: it and the targets to send to. Every
    router is told the replicas' URLs and nothing else: hetero serve learns their speed and
    capacity as sglang-router must."""
    if config.kind == "hetero":
        child, url = start_hetero_serve(
            children, list(urls), config.name, config.flags, config.tree
        )
        return child, [url]
    if config.kind == "sglang":
        child, url = start_sglang_router(children, urls, config.name)
        return child, [url]
    return None, list(urls)


def _predicted(model: dict[str, Any]) -> dict[str, Any]:
    """An slo engine fit's predictions for its typical request, as ``/status`` shows them."""
    keys = ("typical_request", "predicted_ttft_s", "predicted_tpot_s", "replies_fitted")
    return {k: model[k] for k in keys}


def summarize_goodput(
    w: Goodput, records: dict[str, Any], prompt_tokens: Sequence[int], duration: float
) -> dict[str, Any]:
    n = len(records["index"])
    ok_latency, met, unfinished, failed = [], 0, 0, 0
    per_token = []
    curve = dict.fromkeys(SLO_CURVE, 0)
    for i, status, latency, pt, ct in zip(
        records["index"],
        records["status"],
        records["latency"],
        records["prompt_tokens"],
        records["completion_tokens"],
        strict=True,
    ):
        if status == 0:
            unfinished += 1
            continue
        if status != 200:
            failed += 1
            continue
        ok_latency.append(latency)
        ct = max(1, ct)
        per_token.append(latency / ct)
        # The mock's prompt count is the one it paced by; ours is the same number.
        pt = pt if pt is not None else prompt_tokens[i]
        if latency <= w.slo_bound(pt, ct):
            met += 1
        for slack in curve:
            curve[slack] += latency <= w.slo_bound(pt, ct, slack)
    lag = records["lag"]
    return {
        "requests": n,
        "ok": len(ok_latency),
        "failed": failed,
        "unfinished": unfinished,
        "errors": records["errors"],
        "error_samples": records["error_samples"],
        "slo_met": met,
        "slo_attainment": round(met / n, 4) if n else None,
        "goodput_rps": round(met / duration, 3),
        "slo_curve": {f"{k:g}": round(v / n, 4) if n else None for k, v in curve.items()},
        "throughput_rps": round(len(ok_latency) / duration, 3),
        "latency_s": _percentiles(ok_latency, 1.0, 4),
        "seconds_per_output_token": _percentiles(per_token, 1.0, 5),
        "mean_completion_tokens": round(
            float(np.mean([c for c in records["completion_tokens"] if c is not None] or [0])), 2
        ),
        "send_lag_ms": _percentiles(lag, 1e3, 3),
        "cpu_seconds": records["cpu_seconds"],
    }


def run_goodput_config(
    children: Children,
    w: Goodput,
    config: Config,
    spec: dict[str, Any],
    prompt_tokens: Sequence[int],
    duration: float,
) -> dict[str, Any]:
    started = time.perf_counter()
    mocks, urls = start_mocks(children, mock_configs(w))
    router: Child | None = None
    try:
        router, targets = start_router(children, config, urls)
        for t in targets:
            warm_up(t, WARM_BODY, len(urls) if router else 1)
        watch = {"mocks": mocks} | ({"router": router} if router else {})
        before = [_fetch_json(u + "/mock/stats") for u in urls]  # the warm-up's requests
        records = run_load(children, {**spec, "targets": targets}, 1, watch, "goodput")
        after = [_fetch_json(u + "/mock/stats") for u in urls]
        stats = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
        # What hetero serve learned of the replicas it was given by URL alone.
        learned = (
            _fetch_json(targets[0] + "/status")["replicas"] if config.kind == "hetero" else None
        )
    finally:
        if router is not None:
            children.stop(router)
        children.stop(mocks)
    row = {"config": config.label, "kind": config.kind, "name": config.name}
    row |= summarize_goodput(w, records, prompt_tokens, duration)
    if learned is not None:
        row["learned"] = [
            {
                "slots": r["slots"],
                "why": r["capacity"]["why"],
                "engine": r["engine"],
                "speed": r["learned_speed"],
            }
            # Under slo, what it routes by: its engine fit's predictions for a typical request.
            | ({"engine_model": _predicted(r["engine_model"])} if "engine_model" in r else {})
            for r in learned
        ]
    done = sum(s["completed"] for s in stats)
    row["replicas"] = [
        {
            "speed": speed,
            "slots": slots,
            "requests": s["requests"],
            "completed": s["completed"],
            "cancelled": s["cancelled"],
            "share_of_completed": round(s["completed"] / done, 4) if done else None,
        }
        for speed, slots, s in zip(w.speeds, w.slots, stats, strict=True)
    ]
    row["wall_seconds"] = round(time.perf_counter() - started, 1)
    return row


@dataclass(frozen=True)
class OpenLoad:
    """One open-loop workload of the goodput figures: ``w``'s requests at ``load``."""

    mean_prompt: float
    mean_out: float
    service: float  # mean seconds of a request at speed 1
    capacity: float  # requests/s of the whole fleet
    rate: float
    send_at: list[float]
    tokens: list[int]
    grace: float
    spec: dict[str, Any]


def open_load(w: Goodput, load: float) -> OpenLoad:
    """Poisson arrivals at ``load`` × the fleet's capacity for ``w.duration``; the same prompts
    and seeds (so the same output lengths) for the first requests of every load."""
    mean_out = expected_output_tokens(w)
    mean_prompt = float(np.mean(prompt_lengths(w, 200_000, w.seed + 3)))
    service = w.prefill_time * mean_prompt + w.decode_time * mean_out
    capacity = sum(n * s for n, s in zip(w.slots, w.speeds, strict=True)) / service
    rate = load * capacity
    send_at = poisson_times(rate, w.duration, w.seed)
    bodies, tokens = prompts(w, len(send_at))
    # Long enough for the largest request that could still meet the SLO: cutting off a
    # straggler then never costs a configuration goodput.
    grace = (
        w.grace if w.grace is not None else math.ceil(w.slo_bound(max(tokens), w.max_tokens)) + 5
    )
    spec = {
        "mode": "open",
        "path": "/v1/chat/completions",
        "bodies": bodies,
        "send_at": send_at,
        "grace": grace,
        "usage": True,
    }
    return OpenLoad(mean_prompt, mean_out, service, capacity, rate, send_at, tokens, grace, spec)


def _skip_reason(
    config: Config, hetero_reason: str | None, sglang_reason: str | None
) -> str | None:
    return {"hetero": hetero_reason, "sglang": sglang_reason}.get(config.kind)


def goodput(
    children: Children, w: Goodput, hetero_reason: str | None, sglang_reason: str | None
) -> dict[str, Any]:
    work = open_load(w, w.load)
    rows: list[dict[str, Any]] = []
    for config in goodput_configs(w):
        head = {"config": config.label, "kind": config.kind, "name": config.name}
        reason = _skip_reason(config, hetero_reason, sglang_reason)
        if reason is not None:
            rows.append(head | {"skipped": reason})
            print(f"goodput: {config.label}: skipped ({reason})", file=sys.stderr)
            continue
        try:
            row = run_goodput_config(children, w, config, work.spec, work.tokens, w.duration)
        except StartError as exc:
            row = head | {"skipped": f"failed: {exc}"[:3000]}
        rows.append(row)
        print(f"goodput: {json.dumps(_brief(row))}", file=sys.stderr)
    return {
        "fleet": {
            "speeds": list(w.speeds),
            "slots": list(w.slots),
            "memory_gb": list(w.memory_gb),
            "slots_note": "in proportion to the memory of the cards they stand for",
        },
        "mock": {
            "decode_time": w.decode_time,
            "prefill_time": w.prefill_time,
            "output_mean": w.output_mean,
            "output_dist": w.output_dist,
            "process": "all replicas in one process, started afresh for every configuration",
        },
        "workload": {
            "arrivals": "poisson",
            "load": w.load,
            "rate_rps": round(work.rate, 3),
            "duration_s": w.duration,
            "requests": len(work.send_at),
            "seed": w.seed,
            "request": "POST /v1/chat/completions, one user message, not streamed",
            "prompt_tokens": {
                "dist": "lognormal",
                "mean": w.prompt_mean,
                "sigma": w.prompt_sigma,
                "sample_mean": round(float(np.mean(work.tokens)), 2),
            },
            "max_tokens": w.max_tokens,
            "same_for_every_configuration": "send times, prompts, max_tokens and output "
            "lengths (each request carries a seed the mock draws its length from)",
            "grace_s": work.grace,
            "generator_processes": 1,
        },
        "capacity": {
            "formula": "Σ slots_i × speed_i / (prefill_time × E[prompt_tokens] + decode_time × "
            "E[completion_tokens])",
            "expected_prompt_tokens": round(work.mean_prompt, 2),
            "expected_completion_tokens": round(work.mean_out, 2),
            "completion_tokens_note": "the mock's draw capped by max_tokens, averaged",
            "service_seconds_at_speed_1": round(work.service, 4),
            "requests_per_second": round(work.capacity, 3),
        },
        "slo": _slo_doc(w),
        "configs": rows,
        "ratios": goodput_ratios(rows),
    }


# ------------------------------------------------------------------------------- max rate


@dataclass(frozen=True)
class MaxRate:
    """The highest load each configuration serves within the SLO: goodput as serving papers
    (DistServe) define it, the largest request rate at which the SLO attainment still reaches a
    target. Loads are searched on a grid of ``step`` up to ``top`` × capacity."""

    targets: tuple[float, ...] = (0.98, 0.9)
    step: float = 0.05
    top: float = 1.2
    duration: float = 20.0


def max_rate_configs(w: Goodput) -> list[Config]:
    """hetero serve's default and every baseline (the ablations are left out)."""
    return [c for c in goodput_configs(w) if c.kind != "hetero" or c.name == DEFAULT_STRATEGY]


def highest_step(attainment: Callable[[int], float], steps: int, target: float) -> int:
    """The highest step ``k`` in 1..``steps`` whose attainment reaches ``target``, by bisection
    (attainment falls as the load rises); 0 when even step 1 misses it."""
    lo, hi = 0, steps + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attainment(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def search_config(
    children: Children, w: Goodput, m: MaxRate, config: Config, capacity: float
) -> dict[str, Any]:
    """Bisect ``config``'s load for each target; every load tried is run once and kept."""
    probes: dict[int, dict[str, Any]] = {}

    def attainment(k: int) -> float:
        if k not in probes:
            work = open_load(w, k * m.step)
            row = run_goodput_config(children, w, config, work.spec, work.tokens, w.duration)
            probes[k] = {
                "load": round(k * m.step, 4),
                "rate_rps": round(work.rate, 3),
                "requests": row["requests"],
                "slo_attainment": row["slo_attainment"],
                "p99_s": row["latency_s"]["p99"],
                "failed": row["failed"],
                "unfinished": row["unfinished"],
            }
            print(f"max_rate: {config.label}: {json.dumps(probes[k])}", file=sys.stderr)
        return float(probes[k]["slo_attainment"] or 0.0)

    steps = round(m.top / m.step)
    highest = {target: highest_step(attainment, steps, target) for target in m.targets}
    return {
        "max_load": {f"{t:g}": round(k * m.step, 4) for t, k in highest.items()},
        "max_rate_rps": {f"{t:g}": round(k * m.step * capacity, 3) for t, k in highest.items()},
        "probes": [probes[k] for k in sorted(probes)],
    }


def max_rate(
    children: Children,
    w: Goodput,
    m: MaxRate,
    hetero_reason: str | None,
    sglang_reason: str | None,
) -> dict[str, Any]:
    w = dataclasses.replace(w, duration=m.duration)
    capacity = open_load(w, 1.0).capacity
    rows: list[dict[str, Any]] = []
    for config in max_rate_configs(w):
        head = {"config": config.label, "kind": config.kind, "name": config.name}
        reason = _skip_reason(config, hetero_reason, sglang_reason)
        if reason is None:
            try:
                rows.append(head | search_config(children, w, m, config, capacity))
            except StartError as exc:
                rows.append(head | {"skipped": f"failed: {exc}"[:3000]})
        else:
            rows.append(head | {"skipped": reason})
    return {
        "definition": "the highest Poisson load (a multiple of step × the fleet's capacity, up "
        "to top) at which the share of requests within the SLO reaches each target, found by "
        "bisection; 0 when the lowest step misses it",
        "targets": list(m.targets),
        "step": m.step,
        "top": m.top,
        "duration_s": m.duration,
        "capacity_rps": round(capacity, 3),
        "slo": _slo_doc(w),
        "same_as_goodput": "fleet, mock, requests and SLO of the goodput figure; a fresh mock "
        "process and router for every load tried",
        "configs": rows,
        "ratios": max_rate_ratios(rows, m, capacity),
    }


def max_rate_ratios(rows: Sequence[dict[str, Any]], m: MaxRate, capacity: float) -> dict[str, Any]:
    default = _row_of(rows, "hetero", DEFAULT_STRATEGY)
    if default is None:
        return {"note": "hetero serve's default strategy was not measured"}
    baselines = [r for r in rows if "skipped" not in r and r is not default]
    out: dict[str, Any] = {}
    for target in (f"{t:g}" for t in m.targets):
        ours = default["max_rate_rps"][target]
        best = max(baselines, key=lambda r: r["max_rate_rps"][target], default=None)
        doc: dict[str, Any] = {"hetero_default_rps": ours}
        if best is not None:
            theirs = best["max_rate_rps"][target]
            doc["best_baseline"] = {"config": best["config"], "rps": theirs}
            # A baseline that misses the target at the lowest load tried served less than one
            # step: the ratio is then at least ours / one step's rate.
            doc["ratio"] = _ratio(ours, theirs)
            doc["ratio_at_least"] = _ratio(ours, theirs or m.step * capacity)
        doc["vs"] = {r["config"]: _ratio(ours, r["max_rate_rps"][target]) for r in baselines}
        out[target] = doc
    out["note"] = (
        "hetero default's max rate / the baseline's, per SLO-attainment target; null where the "
        "baseline's is 0 (it missed the target at the lowest load tried), and ratio_at_least "
        "then divides by one step's rate instead"
    )
    return out


def _slo_doc(w: Goodput) -> dict[str, Any]:
    if w.slo_per_token is not None:
        return {
            "definition": "latency / completion_tokens ≤ per_token_s",
            "per_token_s": w.slo_per_token,
        }
    slowest = min(w.speeds)
    return {
        "definition": "latency / completion_tokens ≤ slack × (decode_time + prefill_time × "
        "prompt_tokens / completion_tokens) / slowest_speed, i.e. latency ≤ slack × the "
        "request's own service time alone on the slowest replica",
        "slack": w.slo_slack,
        "slowest_speed": slowest,
        "decode_share_s_per_token": round(w.slo_slack * w.decode_time / slowest, 6),
        "note": "latency counts from the scheduled send time; at slack 1 a request served "
        "unloaded by the slowest replica would miss the bound by its HTTP round trip, so the "
        "slowest replica could serve no request within it",
    }


def _row_of(rows: Sequence[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    return next(
        (
            r
            for r in rows
            if r["kind"] == kind and r["name"] == name and "skipped" not in r and "tree" not in r
        ),
        None,
    )


def _ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a is not None and b else None


def goodput_ratios(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    default = _row_of(rows, "hetero", DEFAULT_STRATEGY)
    if default is None:
        return {"note": "hetero serve's default strategy was not measured"}
    ours = default["goodput_rps"]
    # Baselines: what routes without hetero: no router, and sglang-router. The speed-blind
    # policies behind hetero's own queue are an ablation (what the queue and the learned
    # capacity alone give), reported but not a baseline.
    baselines = [r for r in rows if "skipped" not in r and r["kind"] != "hetero"]
    best = max(baselines, key=lambda r: r["goodput_rps"], default=None)
    return {
        "hetero_default_goodput_rps": ours,
        "vs_best_baseline": None
        if best is None
        else {
            "baseline": best["config"],
            "goodput_rps": best["goodput_rps"],
            "ratio": _ratio(ours, best["goodput_rps"]),
        },
        "vs": {
            r["config"]: _ratio(ours, r["goodput_rps"])
            for r in rows
            if r is not default and "skipped" not in r
        },
        "note": "hetero default goodput / the row's goodput; null where the row's is 0",
    }


def _brief(row: dict[str, Any]) -> dict[str, Any]:
    keys = ("config", "skipped", "requests", "slo_attainment", "goodput_rps", "failed", "slo_curve")
    brief = {k: row[k] for k in keys if k in row}
    if "latency_s" in row:
        brief |= {"p50": row["latency_s"]["p50"], "p99": row["latency_s"]["p99"]}
        brief["unfinished"] = row["unfinished"]
    return brief


# ------------------------------------------------------------------------------- overhead


#: The issue's targets for the router's cost under strategy slo (#33): added p50 latency in the
#: open loop and router CPU per request in the closed loop.
OVERHEAD_ADDED_P50_MS = 0.7
OVERHEAD_CPU_US = 250.0


def overhead_configs(o: Overhead) -> list[Config]:
    return [
        Config("direct (no router)", "client", "direct"),
        # The default routes by the engine model (issue #33); the strategies that count slots
        # take the path the default took before it.
        Config(f"hetero serve, {DEFAULT_STRATEGY} (default)", "hetero", DEFAULT_STRATEGY),
        Config(
            f"hetero serve, {SLOT_STRATEGY} (--strategy {SLOT_STRATEGY})",
            "hetero",
            SLOT_STRATEGY,
        ),
        # What uvloop (the default where installed) saves: the same router on asyncio's loop.
        Config(
            f"hetero serve, {DEFAULT_STRATEGY}, --loop asyncio",
            "hetero",
            DEFAULT_STRATEGY,
            ("--loop", "asyncio"),
        ),
        *(
            Config(
                f"hetero serve at {_common.short_commit(Path(tree))}, {strategy} (--tree)",
                "hetero",
                strategy,
                tree=tree,
            )
            for tree in o.trees
            for strategy in (DEFAULT_STRATEGY, SLOT_STRATEGY)
        ),
        *(
            Config(
                f"sglang-router, {p}" + (" (its default)" if p == SGLANG_DEFAULT else ""),
                "sglang",
                p,
            )
            for p in o.sglang_policies
        ),
    ]


def _cpu_us(cpu: dict[str, float], requests: int) -> dict[str, float | None]:
    return {k: round(v / requests * 1e6, 1) if requests else None for k, v in cpu.items()}


def _open_summary(records: dict[str, Any]) -> dict[str, Any]:
    ok = [lat for s, lat in zip(records["status"], records["latency"], strict=True) if s == 200]
    return {
        "requests": len(records["status"]),
        "ok": len(ok),
        "errors": records["errors"],
        "unfinished": records["status"].count(0),
        "latency_ms": _percentiles(ok, 1e3, 3),
        "send_lag_ms": _percentiles(records["lag"], 1e3, 3),
        "cpu_us_per_request": _cpu_us(records["cpu_seconds"], len(ok)),
    }


def _streamed_summary(records: dict[str, Any]) -> dict[str, Any]:
    """The streamed closed loop: what the router's CPU comes to a streamed request and a chunk
    passed through (the content chunks the clients read)."""
    ok = [c for s, c in zip(records["status"], records["chunks"], strict=True) if s == 200]
    chunks = sum(ok)
    router = records["cpu_seconds"].get("router")
    return {
        "requests": len(records["status"]),
        "ok": len(ok),
        "errors": records["errors"],
        "chunks": chunks,
        "cpu_us_per_request": _cpu_us(records["cpu_seconds"], len(ok)),
        "router_cpu_us_per_chunk": None
        if router is None or not chunks
        else round(router / chunks * 1e6, 2),
    }


def _closed_summary(records: dict[str, Any], o: Overhead) -> dict[str, Any]:
    window = o.closed_duration - o.closed_warmup
    done = [
        start + lat
        for s, start, lat in zip(
            records["status"], records["start"], records["latency"], strict=True
        )
        if s == 200
    ]
    in_window = sum(o.closed_warmup <= t <= o.closed_duration for t in done)
    ok = [lat for s, lat in zip(records["status"], records["latency"], strict=True) if s == 200]
    return {
        "requests": len(records["status"]),
        "ok": len(ok),
        "errors": records["errors"],
        "throughput_rps": round(in_window / window, 1),
        "latency_ms": _percentiles(ok, 1e3, 3),
        "cpu_us_per_request": _cpu_us(records["cpu_seconds"], len(ok)),
    }


def _loads_behind(
    children: Children,
    config: Config,
    url: str,
    mocks: Child,
    loads: Sequence[tuple[str, dict[str, Any], int]],
) -> list[dict[str, Any]]:
    """Each of ``loads`` (a name, a spec, generator processes) in turn behind a fresh router of
    ``config`` in front of ``url`` (straight to it for the client configuration)."""
    router, targets = start_router(children, config, [url])
    try:
        warm_up(targets[0], WARM_BODY, 50)
        watch = {"mock": mocks} | ({"router": router} if router else {})
        return [
            run_load(children, {**spec, "targets": targets}, parts, watch, name)
            for name, spec, parts in loads
        ]
    finally:
        if router is not None:
            children.stop(router)


def run_overhead_config(
    children: Children,
    o: Overhead,
    config: Config,
    mocks: Child,
    urls: tuple[str, str],
    open_spec: dict[str, Any],
    closed_spec: dict[str, Any],
    streamed_spec: dict[str, Any],
) -> dict[str, Any]:
    """The open and closed loops behind ``config`` in front of the instant mock (``urls[0]``),
    then the streamed loop behind a fresh one in front of the paced mock (``urls[1]``)."""
    opened, closed = _loads_behind(
        children,
        config,
        urls[0],
        mocks,
        [("open", open_spec, 1), ("closed", closed_spec, o.generators)],
    )
    (streamed,) = _loads_behind(
        children, config, urls[1], mocks, [("streamed", streamed_spec, o.generators)]
    )
    return {
        "open": _open_summary(opened),
        "closed": _closed_summary(closed, o),
        "streamed": _streamed_summary(streamed),
    }


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(float(np.median(present)), 3) if present else None


def overhead(
    children: Children, o: Overhead, hetero_reason: str | None, sglang_reason: str | None
) -> dict[str, Any]:
    mock = {
        "models": [MODEL],
        "speed": 1.0,
        "slots": o.slots,
        "seed": o.seed,
        "decode_time": 0.0,
        "prefill_time": 0.0,
        "output_mean": o.output_mean,
        "default_max_tokens": 4 * int(o.output_mean),
    }
    body = chat_body("x" * o.prompt_chars, 4 * int(o.output_mean))
    send_at = poisson_times(o.rate, o.duration, o.seed)
    common = {"path": "/v1/chat/completions", "bodies": [body], "grace": o.grace, "usage": False}
    open_spec = common | {"mode": "open", "send_at": send_at}
    closed_spec = common | {
        "mode": "closed",
        "concurrency": o.concurrency,
        "duration": o.closed_duration,
    }
    streamed_body = chat_body("x" * o.prompt_chars, o.stream_tokens, stream=True)
    streamed_spec = closed_spec | {"bodies": [streamed_body], "stream": True}
    configs = overhead_configs(o)
    runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in configs}
    skipped: dict[str, str] = {}
    # Streamed replies come from a mock of their own: the instant one sends a whole reply in
    # one chunk (a chunk is what one of its wake-ups brings), this one a token a chunk.
    paced = mock | {"decode_time": o.stream_decode_time}
    mocks, (url, paced_url) = start_mocks(children, [mock, paced])
    try:
        for _ in range(o.repeats):  # in turns, so the machine's drift hits each alike
            for config in configs:
                reason = {"hetero": hetero_reason, "sglang": sglang_reason}.get(config.kind)
                if reason is None and config.label in skipped:
                    continue
                if reason is not None:
                    skipped[config.label] = reason
                    continue
                try:
                    run = run_overhead_config(
                        children,
                        o,
                        config,
                        mocks,
                        (url, paced_url),
                        open_spec,
                        closed_spec,
                        streamed_spec,
                    )
                except StartError as exc:
                    skipped[config.label] = f"failed: {exc}"[:3000]
                    continue
                runs[config.label].append(run)
                print(
                    f"overhead: {config.label}: open p50 {run['open']['latency_ms']['p50']} ms, "
                    f"p99 {run['open']['latency_ms']['p99']} ms; closed "
                    f"{run['closed']['throughput_rps']} req/s",
                    file=sys.stderr,
                )
    finally:
        children.stop(mocks)
    rows = []
    for config in configs:
        head = {"config": config.label, "kind": config.kind, "name": config.name}
        if config.tree is not None:
            head["tree"] = config.tree
        got = runs[config.label]
        if not got:
            rows.append(head | {"skipped": skipped.get(config.label, "not run")})
            continue
        rows.append(
            head
            | {
                "p50_ms": _median([r["open"]["latency_ms"]["p50"] for r in got]),
                "p99_ms": _median([r["open"]["latency_ms"]["p99"] for r in got]),
                "throughput_rps": _median([r["closed"]["throughput_rps"] for r in got]),
                "router_cpu_us_per_chunk": _median(
                    [r["streamed"]["router_cpu_us_per_chunk"] for r in got]
                ),
                "runs": got,
            }
        )
    direct = rows[0] if "skipped" not in rows[0] else None
    for row in rows[1:]:
        if direct is not None and "skipped" not in row:
            row["added_p50_ms"] = round(row["p50_ms"] - direct["p50_ms"], 3)
            row["added_p99_ms"] = round(row["p99_ms"] - direct["p99_ms"], 3)
            row["throughput_vs_direct"] = _ratio(row["throughput_rps"], direct["throughput_rps"])
    return {
        "mock": mock,
        "request": {
            "body": body,
            "note": "one user message of prompt_chars characters, not streamed",
        },
        "streamed_loop": {
            "body": streamed_body,
            "concurrency": o.concurrency,
            "duration_s": o.closed_duration,
            "mock_decode_time_s": o.stream_decode_time,
            "note": "the closed loop again with streamed replies of stream_tokens chunks each "
            "(ignore_eos) from a mock of its own that takes mock_decode_time_s a token, behind "
            "a fresh router; the router's CPU over the content chunks its clients read",
        },
        "open_loop": {
            "arrivals": "poisson",
            "rate_rps": o.rate,
            "duration_s": o.duration,
            "requests": len(send_at),
            "generator_processes": 1,
        },
        "closed_loop": {
            "concurrency": o.concurrency,
            "duration_s": o.closed_duration,
            "warmup_s": o.closed_warmup,
            "generator_processes": o.generators,
            "throughput": "requests answered 200 within [warmup, duration], per second",
        },
        "repeats": o.repeats,
        "order": "configurations in turns within each repeat, on one mock process",
        "configs": rows,
        "ratios": overhead_ratios(rows),
    }


def overhead_ratios(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each anchor against hetero serve's default strategy, and each other checkout's hetero
    serve against this one's with the same strategy; and the slo strategy against the issue's
    targets for the router's cost (#33)."""

    def cpu(row: dict[str, Any]) -> float | None:
        values = [run["closed"]["cpu_us_per_request"].get("router") for run in row["runs"]]
        return _median(values)

    vs: dict[str, Any] = {}
    for r in rows:
        if "skipped" in r or not (r["kind"] == "sglang" or "tree" in r):
            continue
        ours = _row_of(rows, "hetero", r["name"] if "tree" in r else DEFAULT_STRATEGY)
        if ours is None:
            continue
        vs[r["config"]] = {
            "hetero": ours["config"],
            "added_p50_ratio": _ratio(ours.get("added_p50_ms"), r.get("added_p50_ms")),
            "added_p99_ratio": _ratio(ours.get("added_p99_ms"), r.get("added_p99_ms")),
            "throughput_ratio": _ratio(ours["throughput_rps"], r["throughput_rps"]),
            "router_cpu_per_request_ratio": _ratio(cpu(ours), cpu(r)),
        }
    slo = _row_of(rows, "hetero", "slo")
    targets = None
    if slo is not None:
        added, used = slo.get("added_p50_ms"), cpu(slo)
        targets = {
            "config": slo["config"],
            "added_p50_ms": added,
            "added_p50_target_ms": OVERHEAD_ADDED_P50_MS,
            "router_cpu_us": used,
            "router_cpu_target_us": OVERHEAD_CPU_US,
            "met": added is not None
            and used is not None
            and added <= OVERHEAD_ADDED_P50_MS
            and used <= OVERHEAD_CPU_US,
        }
    note = "hetero serve's figure / the row's (an anchor, or another checkout's hetero serve)"
    return {"hetero_vs": vs, "slo_targets": targets, "note": note}


# ------------------------------------------------------------------------------- printing


# --------------------------------------------------------------------------------- poller


@dataclass(frozen=True)
class Poller:
    replicas: int = 8
    interval: float = 0.1  # hetero serve's default --load-interval
    duration: float = 30.0
    engine: str = "vllm"  # the mock's /metrics is vLLM's page: the largest one to parse


def poller(children: Children, p: Poller, hetero_reason: str | None) -> dict[str, Any]:
    """The CPU the background load reads cost the router: an idle ``hetero serve`` in front of
    ``p.replicas`` mock engines, once reading their load every ``p.interval`` s and once with
    reads an hour apart (what the router costs idle without them), ``p.duration`` s each."""
    doc: dict[str, Any] = {"replicas": p.replicas, "engine": p.engine, "duration_s": p.duration}
    if hetero_reason is not None:
        return doc | {"skipped": hetero_reason}
    mocks, urls = start_mocks(children, [{"models": [MODEL], "engine": p.engine}] * p.replicas)
    rows = []
    try:
        for interval in (p.interval, 3600.0):
            command = [*hetero_serve_command(urls, None), "--load-interval", f"{interval:g}"]
            child = children.start(f"hetero-serve-poll-{interval:g}", command)
            url = child.wait_for_line(re.compile(r"hetero serve " + URL.pattern), 60).group(1)
            time.sleep(3.0)  # engines detected, the first reads done
            cpu0, t0 = child.cpu_seconds(), time.perf_counter()
            time.sleep(p.duration)
            cpu, wall = child.cpu_seconds() - cpu0, time.perf_counter() - t0
            known = sum(r["load"]["known"] for r in _fetch_json(url + "/status")["replicas"])
            children.stop(child)
            rows.append(
                {
                    "load_interval_s": interval,
                    "cpu_share_of_one_core": round(cpu / wall, 5),
                    "loads_known": known,
                }
            )
    finally:
        children.stop(mocks)
    # The reads' budget stretches the period of a fleet too large for it (hetero.serve.poller).
    period = max(p.interval, p.replicas / ServeOptions().load_reads)
    reads = p.replicas * p.duration / period
    extra = rows[0]["cpu_share_of_one_core"] - rows[1]["cpu_share_of_one_core"]
    return doc | {
        "configs": rows,
        "poller_share_of_one_core": round(extra, 5),
        "period_s": round(period, 4),
        "reads_per_second": round(reads / p.duration, 1),
        "cpu_us_per_read": round(extra * p.duration / reads * 1e6, 1),
        "note": "share of one core: router CPU seconds / wall seconds while idle; the poller's "
        "is the difference between the two rows",
    }


def print_tables(figures: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    if "goodput" in figures:
        fig = figures["goodput"]
        table = Table(
            title=f"goodput: speeds {fig['fleet']['speeds']}, slots {fig['fleet']['slots']}, "
            f"{fig['workload']['rate_rps']} req/s ({fig['workload']['load']:.0%} of capacity) "
            f"for {fig['workload']['duration_s']:g} s"
        )
        for name in (
            "config",
            "SLO",
            "goodput/s",
            "p50 s",
            "p99 s",
            "mean s",
            "failed",
            "unfin.",
            "shares",
        ):
            table.add_column(name, justify="left" if name == "config" else "right")
        for r in fig["configs"]:
            if "skipped" in r:
                table.add_row(r["config"], "skipped: " + r["skipped"].splitlines()[0][:60])
                continue
            lat = r["latency_s"]
            shares = " ".join(
                "-" if x["share_of_completed"] is None else f"{x['share_of_completed']:.0%}"
                for x in r["replicas"]
            )
            table.add_row(
                r["config"],
                f"{r['slo_attainment']:.1%}",
                f"{r['goodput_rps']:g}",
                str(lat["p50"]),
                str(lat["p99"]),
                str(lat["mean"]),
                str(r["failed"]),
                str(r["unfinished"]),
                shares,
            )
        console.print(table)
        console.print(json.dumps(fig["ratios"], indent=1))
    if "max_rate" in figures:
        fig = figures["max_rate"]
        table = Table(title=f"max rate within the SLO (capacity {fig['capacity_rps']} req/s)")
        table.add_column("config")
        for target in fig["targets"]:
            table.add_column(f"≥{target:.0%}: load", justify="right")
            table.add_column("req/s", justify="right")
        for r in fig["configs"]:
            if "skipped" in r:
                table.add_row(r["config"], "skipped: " + r["skipped"].splitlines()[0][:60])
                continue
            cells = []
            for target in (f"{t:g}" for t in fig["targets"]):
                cells += [f"{r['max_load'][target]:.0%}", f"{r['max_rate_rps'][target]:g}"]
            table.add_row(r["config"], *cells)
        console.print(table)
        console.print(json.dumps(fig["ratios"], indent=1))
    if "poller" in figures:
        console.print(json.dumps(figures["poller"], indent=1))
    if "overhead" in figures:
        fig = figures["overhead"]
        table = Table(title="overhead: instant mock")
        for name in ("config", "p50 ms", "p99 ms", "+p50 ms", "+p99 ms", "req/s", "router CPU µs"):
            table.add_column(name, justify="left" if name == "config" else "right")
        for r in fig["configs"]:
            if "skipped" in r:
                table.add_row(r["config"], "skipped: " + r["skipped"].splitlines()[0][:60])
                continue
            cpu = _median([run["closed"]["cpu_us_per_request"].get("router") for run in r["runs"]])
            table.add_row(
                r["config"],
                str(r["p50_ms"]),
                str(r["p99_ms"]),
                str(r.get("added_p50_ms", "-")),
                str(r.get("added_p99_ms", "-")),
                str(r["throughput_rps"]),
                str(cpu or "-"),
            )
        console.print(table)
        console.print(json.dumps(fig["ratios"], indent=1))


# ------------------------------------------------------------------------------------ main


def _template(command: list[str]) -> str:
    """A child's command line for the record, with ``python`` for this interpreter's path."""
    return " ".join(["python", *command[1:]] if command[0] == sys.executable else command)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM: unwind, so every child is stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    g, m, o, pl = Goodput(), MaxRate(), Overhead(), Poller()
    parser.add_argument("--only", choices=FIGURES, help="run one figure")
    parser.add_argument("--quick", action="store_true", help="a short smoke run of everything")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's logs")
    group = parser.add_argument_group("goodput")
    group.add_argument("--duration", type=float, help=f"seconds of arrivals ({g.duration:g})")
    group.add_argument("--load", type=float, default=g.load, help="share of capacity offered")
    group.add_argument("--speeds", type=_floats, default=g.speeds, help="relative speeds: 1,2.5,6")
    group.add_argument("--slots", type=_floats, default=g.slots, help="slots per replica: 4,10,20")
    group.add_argument("--decode-time", type=float, default=g.decode_time, help="s per token")
    group.add_argument("--prefill-time", type=float, default=g.prefill_time, help="s per token")
    group.add_argument("--output-mean", type=float, default=g.output_mean, help="tokens")
    group.add_argument("--prompt-mean", type=float, default=g.prompt_mean, help="tokens")
    group.add_argument("--max-tokens", type=int, default=g.max_tokens, help="sent with each")
    group.add_argument(
        "--grace",
        type=float,
        help="s to wait for stragglers (default: enough "
        "for the largest request that could meet the SLO)",
    )
    group.add_argument(
        "--slo-slack",
        type=float,
        default=g.slo_slack,
        help="the SLO: × a request's service time alone on the slowest replica",
    )
    group.add_argument(
        "--slo-per-token",
        type=float,
        help="the SLO instead: this many seconds per completion token",
    )
    group.add_argument(
        "--strategies",
        type=_names,
        default=g.strategies,
        help="hetero serve strategies, comma-separated",
    )
    group.add_argument(
        "--sglang-policies",
        type=_names,
        default=g.sglang_policies,
        help="sglang-router policies, comma-separated",
    )
    group = parser.add_argument_group("max_rate (the goodput figure's fleet and requests)")
    group.add_argument(
        "--targets", type=_floats, default=m.targets, help="SLO-attainment targets: 0.98,0.9"
    )
    group.add_argument("--step", type=float, help=f"load grid step, × capacity ({m.step:g})")
    group.add_argument(
        "--rate-duration", type=float, help=f"seconds of arrivals per load tried ({m.duration:g})"
    )
    group = parser.add_argument_group("overhead")
    group.add_argument("--rate", type=float, help=f"open-loop requests/s ({o.rate:g})")
    group.add_argument("--overhead-duration", type=float, help=f"seconds per loop ({o.duration:g})")
    group.add_argument("--concurrency", type=int, default=o.concurrency, help="closed-loop clients")
    group.add_argument(
        "--generators",
        type=int,
        default=o.generators,
        help="load-generator processes in the closed loop",
    )
    group.add_argument("--repeats", type=int, help=f"overhead repeats ({o.repeats})")
    group.add_argument(
        "--tree",
        action="append",
        default=[],
        help="another checkout (a git worktree, its C kernel built) whose hetero serve runs in "
        "turns with this one's; repeatable",
    )
    parser.add_argument("--no-hetero", action="store_true", help="skip hetero serve")
    parser.add_argument("--no-sglang", action="store_true", help="skip sglang-router")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv

    g = dataclasses.replace(
        g,
        load=args.load,
        speeds=args.speeds,
        slots=tuple(int(s) for s in args.slots),
        decode_time=args.decode_time,
        prefill_time=args.prefill_time,
        output_mean=args.output_mean,
        prompt_mean=args.prompt_mean,
        max_tokens=args.max_tokens,
        slo_slack=args.slo_slack,
        slo_per_token=args.slo_per_token,
        strategies=args.strategies,
        sglang_policies=args.sglang_policies,
        seed=args.seed,
    )
    o = dataclasses.replace(
        o,
        concurrency=args.concurrency,
        generators=args.generators,
        seed=args.seed,
    )
    if args.quick:
        g, m, o = quick_sizes(g, m, o)
        pl = dataclasses.replace(pl, duration=5.0)
    if args.duration is not None:
        g = dataclasses.replace(g, duration=args.duration)
    m = dataclasses.replace(m, targets=args.targets)
    if args.step is not None:
        m = dataclasses.replace(m, step=args.step)
    if args.rate_duration is not None:
        m = dataclasses.replace(m, duration=args.rate_duration)
    if args.grace is not None:
        g = dataclasses.replace(g, grace=args.grace)
    if args.repeats is not None:
        o = dataclasses.replace(o, repeats=args.repeats)
    if args.rate is not None:
        o = dataclasses.replace(o, rate=args.rate)
    if args.overhead_duration is not None:
        o = dataclasses.replace(
            o, duration=args.overhead_duration, closed_duration=args.overhead_duration
        )
    if len(g.speeds) != len(g.slots):
        parser.error("--speeds and --slots need as many values each")
    for tree in args.tree:
        if not (Path(tree) / "src" / "hetero" / "serve").is_dir():
            parser.error(f"--tree {tree}: no src/hetero/serve there (a checkout of hetero?)")
    o = dataclasses.replace(o, trees=tuple(str(Path(t).resolve()) for t in args.tree))

    hetero_reason = "--no-hetero given" if args.no_hetero else hetero_serve_available()
    if args.no_sglang:
        sglang_version, sglang_reason = None, "--no-sglang given"
    else:
        sglang_version, sglang_reason = sglang_router_version()
    for who, reason in (("hetero serve", hetero_reason), ("sglang-router", sglang_reason)):
        if reason:
            print(f"{who}: {reason}", file=sys.stderr)

    signal.signal(signal.SIGTERM, _interrupt)
    command = _common.command("bench/bench_serve.py", argv)
    revision = _common.revision()
    runners: dict[str, Callable[[Children], dict[str, Any]]] = {
        "goodput": lambda c: goodput(c, g, hetero_reason, sglang_reason),
        "max_rate": lambda c: max_rate(c, g, m, hetero_reason, sglang_reason),
        "overhead": lambda c: overhead(c, o, hetero_reason, sglang_reason),
        "poller": lambda c: poller(c, pl, hetero_reason),
    }
    figures: dict[str, Any] = {}
    started = time.perf_counter()
    with Children(keep_logs=args.keep_logs) as children:
        if args.keep_logs:
            print(f"logs in {children.log_dir}", file=sys.stderr)
        for name in [args.only] if args.only else FIGURES:
            calibration = calibration_seconds()
            load = os.getloadavg()[0]  # other work on this shared machine, for the record
            t0 = time.perf_counter()
            figures[name] = runners[name](children)
            figures[name] |= {
                "calibration_seconds": calibration,
                "load_average_before": round(load, 2),
                "wall_seconds": round(time.perf_counter() - t0, 1),
                "command": command,
                "revision": revision,
            }
            print(f"{name}: {figures[name]['wall_seconds']} s", file=sys.stderr)
    print_tables(figures)
    doc: dict[str, Any] = {
        "benchmark": "serve",
        "command": command,
        "quick": args.quick,
        "hetero": hetero.__version__,
        "hetero_serve": {
            "available": hetero_reason is None,
            "reason": hetero_reason,
            "command": _template(hetero_serve_command(["URL", "..."], "NAME")),
        },
        "sglang_router": {
            "version": sglang_version,
            "reason": sglang_reason,
            "command": _template(
                sglang_router_command(["URL", "..."], "NAME", "PORT", "METRICS_PORT")
            ),
        },
        "revision": revision,
        "revision_after": _common.revision(),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if args.only and args.out and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        figures = {**old.get("figures", {}), **figures}
        # The heading stays the whole run's; the figure run alone names its own revision.
        for key in ("command", "revision", "revision_after"):
            doc[key] = old.get(key, doc[key])
    doc["figures"] = figures
    return emit(doc, args.out)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
