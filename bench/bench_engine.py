"""Execution engine: the local backend (one worker process per device) against Ray, in one run on
one machine. Four figures, each run alone with ``--only NAME``:

- ``throughput``: tiny tasks. ``--tasks`` no-op tasks submitted with ``ctx.submit``, then waited
  for, on ``hetero.Context()`` (this machine's one CPU device), at the default ``prefetch`` and
  at 1, 2 and 4; Ray: ``noop.remote()`` as often, then ``ray.get``. One warm-up round each is
  left out; the hetero contexts take turns within each repeat, so drift hits them alike.
- ``map``: ``ctx.map`` makespan on emulated devices of relative speeds 2.5, 2.5, 1, 1, 0.2
  (``time_scale`` 1: an item of cost c holds its device c / speed seconds); lognormal item costs
  (mean 8 ms, sigma 1, fixed seed) declared with ``@hetero.task(cost=lambda c: c)``.
  Efficiency = ideal / makespan, ideal = sum of costs / sum of speeds. Against: the default
  strategy's rival ``round_robin`` (the dispatcher's stealing on, as by default); an equal
  static split (the items cut into one contiguous chunk of equal count per device, each run as
  one task pinned there with ``devices=[id]``: what a speed-blind data-parallel split does);
  and Ray, one sleep-paced actor per device at the same speeds fed one item per call by
  ``ActorPool.map_unordered`` (Ray's way to let idle actors pull work). Per-device utilization
  comes from ``ctx.profile``. The equal split is run once: its makespan is one sleep.
- ``roundtrip``: ``ctx.run(identity, a)`` of a 1 MiB and a 100 MiB float64 array (argument out,
  result back), median and p90 after 3 warm-up calls; Ray: ``ray.get(identity.remote(
  ray.put(a)))``, timed after hetero with hetero closed (not in turns: with Ray's object store
  up beside it, hetero's large round trips slow down); a ``np.copyto`` of the same array as
  the host's memory reference.
- ``overhead``: µs per no-op task of zero declared cost (``@hetero.task(cost=0)``), submitted in
  bursts and waited for, at 1, 4, 16 and 64 emulated devices, under the default strategy and
  under ``round_robin`` (the default breaks the tie between zero-cost tasks by tasks in flight,
  round robin takes turns), with the local backend and with an in-process
  fake backend that answers every order at once (the engine and dispatcher alone).

Ray runs locally (``ray.init(num_cpus=2)``), only while its own anchors are measured; without
Ray its anchors are recorded as null with the reason. Prints JSON; ``--out`` saves it (with
``--only``, into the figures already there).

    python bench/bench_engine.py --out bench/results/engine.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import inspect
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import numpy as np
import psutil
from _common import calibration_seconds, emit
from _engine_util import (
    FakeBackend,
    emulated_config,
    latency,
    lognormal_costs,
    ray_module,
    ray_session,
    summary,
    wait_all,
)

import hetero

FIGURES = ("throughput", "map", "roundtrip", "overhead")
SPEEDS = (2.5, 2.5, 1.0, 1.0, 0.2)
MiB = 1024 * 1024


@dataclass(frozen=True)
class Sizes:
    repeats: int = 3
    tasks: int = 10_000  # throughput
    items: int = 3_000  # map
    mean_cost: float = 0.008
    sigma: float = 1.0
    roundtrip: tuple[tuple[int, int], ...] = ((1 * MiB, 30), (100 * MiB, 10))
    fleet_sizes: tuple[int, ...] = (1, 4, 16, 64)
    overhead_tasks: int = 3_000  # local backend
    fake_tasks: int = 5_000  # fake backend
    overhead_warmup: int = 1_000

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            repeats=1,
            tasks=1_000,
            items=300,
            roundtrip=((1 * MiB, 5), (100 * MiB, 2)),
            fleet_sizes=(1, 4),
            overhead_tasks=500,
            fake_tasks=1_000,
            overhead_warmup=200,
        )


# ------------------------------------------------------------------------- task functions
# Defined here, in __main__, so workers (and Ray) receive them by value.


def noop() -> None:
    return None


free_noop = hetero.task(cost=0)(noop)


@hetero.task(cost=lambda c: c)
def item(c: float) -> float:
    return c


@hetero.task(cost=lambda chunk: math.fsum(chunk))
def block(chunk: list[float]) -> list[float]:
    return chunk


def identity(a: Any) -> Any:
    return a


class Paced:
    """Ray's stand-in for an emulated device: holds each call cost / speed seconds, paced from
    where the previous call was due to end when calls come back to back (as hetero's emulated
    workers are, so neither side loses the sleep's overshoot)."""

    def __init__(self, speed: float, time_scale: float) -> None:
        self.speed, self.time_scale, self.until = speed, time_scale, -1.0

    def ready(self) -> bool:
        return True

    def work(self, cost: float) -> float:
        now = time.monotonic()
        base = self.until if 0 <= now - self.until < 0.002 else now
        self.until = base + cost / self.speed * self.time_scale
        delay = self.until - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return cost


# ---------------------------------------------------------------------------------- helpers


def burst(ctx: hetero.Context, fn: Any, n: int) -> tuple[float, list[hetero.TaskFuture]]:
    """Seconds to submit ``n`` calls of ``fn`` and see them all done; the futures."""
    started = time.perf_counter()
    futures = [ctx.submit(fn) for _ in range(n)]
    wait_all(futures)
    return time.perf_counter() - started, futures


def start_all_workers(ctx: hetero.Context, run: Callable[[], Any], tries: int = 10) -> None:
    """Run ``run`` until every device has its worker process (they start on their first task);
    a benchmark of steady state must not time process start-up."""
    for _ in range(tries):
        run()
        if all(p is not None for p in ctx.backend.pids()):
            return
    started = sum(p is not None for p in ctx.backend.pids())
    raise RuntimeError(f"only {started} of {len(ctx.devices)} workers started in the warm-up")


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


# ------------------------------------------------------------------------------ throughput


def _cpu_seconds(pids: Sequence[int | None]) -> float:
    total = 0.0
    for pid in pids:
        if pid is not None:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def throughput(sizes: Sizes, ray: Any) -> dict[str, Any]:
    n, repeats = sizes.tasks, sizes.repeats
    default = inspect.signature(hetero.Context).parameters["prefetch"].default
    prefetches = sorted({default, 1, 2, 4})
    rates: dict[Any, list[float]] = {p: [] for p in [*prefetches, "ray"]}
    # CPU µs per task: of the driver process (its threads included) and of hetero's worker.
    driver_cpu: dict[Any, list[float]] = {p: [] for p in rates}
    worker_cpu: dict[Any, list[float]] = {p: [] for p in prefetches}
    with contextlib.ExitStack() as stack:
        contexts = {p: stack.enter_context(hetero.Context(prefetch=p)) for p in prefetches}
        remote: Any = ray.remote(noop) if stack.enter_context(ray_session(ray)) else None

        def ray_burst() -> float:
            started = time.perf_counter()
            ray.get([remote.remote() for _ in range(n)])
            return time.perf_counter() - started

        for ctx in contexts.values():
            burst(ctx, noop, n)  # warm-up round: the worker starts, code is shipped
        if remote is not None:
            ray_burst()
        for _ in range(repeats):  # in turns, so the machine's drift hits each alike
            for p, ctx in contexts.items():
                pids = ctx.backend.pids()
                cpu0, w0 = time.process_time(), _cpu_seconds(pids)
                rates[p].append(n / burst(ctx, noop, n)[0])
                driver_cpu[p].append((time.process_time() - cpu0) / n * 1e6)
                worker_cpu[p].append((_cpu_seconds(pids) - w0) / n * 1e6)
            if remote is not None:
                cpu0 = time.process_time()
                rates["ray"].append(n / ray_burst())
                driver_cpu["ray"].append((time.process_time() - cpu0) / n * 1e6)
    anchor = summary(rates["ray"], 0) if rates["ray"] else None
    target = 2.0
    rows = []
    for p in prefetches:
        s = summary(rates[p], 0)
        vs = ratio(s["median"], anchor["median"]) if anchor else None
        rows.append(
            {
                "prefetch": p,
                "default": p == default,
                "tasks_per_second": s,
                "vs_ray": vs,
                "meets_target": None if vs is None else vs >= target,
                "driver_cpu_us_per_task": summary(driver_cpu[p], 1),
                "worker_cpu_us_per_task": summary(worker_cpu[p], 1),
            }
        )
    return {
        "tasks": n,
        "repeats": repeats,
        "warmup_rounds": 1,
        "device": "hetero.Context(): this machine's CPU device",
        "target_vs_ray": target,
        "hetero": rows,
        "ray": anchor,
        "ray_driver_cpu_us_per_task": summary(driver_cpu["ray"], 1) if anchor else None,
    }


# ------------------------------------------------------------------------------------- map


def _map_all(ctx: hetero.Context, values: list[float]) -> list[float]:
    return list(ctx.map(item, values, progress=False))


def _profile_row(s: Any) -> dict[str, Any]:
    return {
        "efficiency_measured_speeds": None if s.efficiency is None else round(s.efficiency, 4),
        "ideal_makespan_measured_speeds": None
        if s.ideal_makespan is None
        else round(s.ideal_makespan, 4),
        "load_balance": None if s.load_balance is None else round(s.load_balance, 4),
        "devices": [
            {
                "id": d.id,
                "measured_speed": round(d.speed, 4),
                "tasks": d.tasks,
                "busy_seconds": round(d.busy, 4),
                "utilization": round(d.utilization, 4),
            }
            for d in s.devices
        ],
    }


def _median_run(runs: list[tuple[float, Any]]) -> tuple[float, Any]:
    return sorted(runs, key=lambda r: r[0])[(len(runs) - 1) // 2]


def _scheduler_row(label: str, makespans: Sequence[float], ideal: float) -> dict[str, Any]:
    s = summary(makespans, 4)
    return {
        "scheduler": label,
        "makespan_seconds": s,
        "efficiency": round(ideal / s["median"], 4),
        "efficiency_runs": [round(ideal / m, 4) for m in makespans],
    }


def makespan(sizes: Sizes, ray: Any, seed: int) -> dict[str, Any]:
    time_scale = 1.0
    costs = lognormal_costs(sizes.items, sizes.mean_cost, sizes.sigma, seed)
    warm = costs[: max(len(costs) // 10, 50)]
    work = math.fsum(costs) * time_scale
    ideal = work / sum(SPEEDS)
    config = emulated_config(SPEEDS)
    rows: list[dict[str, Any]] = []
    ray_makespans: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="hetero-bench-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        contexts = {
            "hetero default": stack.enter_context(hetero.Context(config, time_scale=time_scale)),
            "hetero round_robin": stack.enter_context(
                hetero.Context(config, time_scale=time_scale, strategy="round_robin")
            ),
        }
        pool = _RayPool(ray, time_scale) if stack.enter_context(ray_session(ray)) else None
        runs: dict[str, list[tuple[float, Any]]] = {k: [] for k in contexts}
        # Once cold: the first map on a fresh Context, whose workers start inside it.
        started = time.perf_counter()
        if _map_all(contexts["hetero default"], costs) != costs:
            raise AssertionError("cold map results differ from the input")
        cold = time.perf_counter() - started
        for ctx in contexts.values():
            start_all_workers(ctx, functools.partial(_map_all, ctx, warm))
        if pool is not None:
            pool.run(warm)
        for r in range(sizes.repeats):
            for label, ctx in contexts.items():  # in turns, so drift hits each alike
                with ctx.profile(f"map-{ctx.strategy}-{r}", tmp) as p:
                    started = time.perf_counter()
                    out = list(ctx.map(item, costs, progress=False))
                    elapsed = time.perf_counter() - started
                if out != costs:
                    raise AssertionError(f"{label}: map results differ from the input")
                runs[label].append((elapsed, p.profile.summary()))
            if pool is not None:
                ray_makespans.append(pool.run(costs))
        for label, ctx in contexts.items():
            row = _scheduler_row(label, [e for e, _ in runs[label]], ideal)
            row["strategy"] = ctx.strategy
            row["profile_of_median_run"] = _profile_row(_median_run(runs[label])[1])
            rows.append(row)
        split = _equal_split(contexts["hetero default"], costs, tmp)
    cold_row = _scheduler_row("hetero default, cold", [cold], ideal)
    cold_row["note"] = "the first map on a fresh Context: its workers start inside it"
    rows.append(cold_row)
    chunks = split["chunks"]
    expected_split = max(math.fsum(c) / s * time_scale for c, s in zip(chunks, SPEEDS, strict=True))
    split_row = _scheduler_row("equal static split", [split["elapsed"]], ideal)
    split_row["profile_of_median_run"] = _profile_row(split["summary"])
    split_row["expected_makespan_seconds"] = round(expected_split, 4)
    split_row["chunk_items"] = [len(c) for c in split["chunks"]]
    split_row["chunk_cost"] = [round(math.fsum(c), 4) for c in split["chunks"]]
    rows.append(split_row)
    if ray_makespans:
        ray_row = _scheduler_row("Ray ActorPool", ray_makespans, ideal)
        ray_row["note"] = "one sleep-paced actor per device, one item per call, map_unordered"
        rows.append(ray_row)
    else:
        rows.append({"scheduler": "Ray ActorPool", "makespan_seconds": None, "efficiency": None})
    return {
        "speeds": list(SPEEDS),
        "model": "A100-80GB (emulated, speed set explicitly)",
        "items": len(costs),
        "cost": {
            "distribution": "lognormal",
            "mean": sizes.mean_cost,
            "sigma": sizes.sigma,
            "seed": seed,
            "sum": round(work, 4),
        },
        "time_scale": time_scale,
        "repeats": sizes.repeats,
        "ideal_makespan_seconds": round(ideal, 4),
        "targets": {"hetero default": 0.95, "equal static split": 0.5},
        "schedulers": rows,
    }


def _equal_split(ctx: hetero.Context, costs: list[float], tmp: str) -> dict[str, Any]:
    n = len(ctx.devices)
    bounds = [round(i * len(costs) / n) for i in range(n + 1)]
    chunks = [costs[a:b] for a, b in itertools.pairwise(bounds)]
    pinned = [block.with_options(devices=[d.id]) for d in ctx.devices]
    with ctx.profile("map-equal-split", tmp) as p:
        started = time.perf_counter()
        futures = [ctx.submit(task, chunk) for task, chunk in zip(pinned, chunks, strict=True)]
        wait_all(futures)
        elapsed = time.perf_counter() - started
    for f, d, chunk in zip(futures, ctx.devices, chunks, strict=True):
        if f.device != d.id or f.result() != chunk:
            raise AssertionError(f"the chunk pinned to {d.id} ran on {f.device}")
    return {"elapsed": elapsed, "chunks": chunks, "summary": p.profile.summary()}


class _RayPool:
    """One sleep-paced Ray actor per device, fed one item per call by
    ``ActorPool.map_unordered``: idle actors pull the next item."""

    def __init__(self, ray: Any, time_scale: float) -> None:
        from ray.util import ActorPool

        actor = ray.remote(num_cpus=0)(Paced)  # they sleep: all five fit on 2 CPUs
        actors = [actor.remote(s, time_scale) for s in SPEEDS]
        ray.get([a.ready.remote() for a in actors])
        self.pool = ActorPool(actors)

    def run(self, values: list[float]) -> float:
        started = time.perf_counter()
        out = list(self.pool.map_unordered(lambda a, c: a.work.remote(c), values))
        elapsed = time.perf_counter() - started
        if sorted(out) != sorted(values):
            raise AssertionError("Ray ActorPool results differ from the input")
        return elapsed


# ------------------------------------------------------------------------------- roundtrip


def roundtrip(sizes: Sizes, ray: Any, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    arrays = [(rng.random(nbytes // 8), n) for nbytes, n in sizes.roundtrip]
    warmups = 3
    rows: list[dict[str, Any]] = []
    # Unlike the other figures, hetero and Ray are timed one after the other, the other one
    # shut down: both move the arrays through /dev/shm, and with Ray's object store up beside
    # it hetero's 100 MiB calls slowed down by a fifth at the median and by 5x at p90.
    with tempfile.TemporaryDirectory(prefix="hetero-bench-") as tmp, hetero.Context() as ctx:
        for a, n in arrays:
            for _ in range(warmups):
                ctx.run(identity, a)
            times = []
            with ctx.profile(f"roundtrip-{a.nbytes}", tmp) as p:
                for _ in range(n):
                    started = time.perf_counter()
                    b = ctx.run(identity, a)
                    times.append(time.perf_counter() - started)
                    if not np.array_equal(a, b):
                        raise AssertionError("the hetero round trip changed the array")
                    del b
            traces = [t for t in p.profile.traces if t.status == "done"]
            dst = np.empty_like(a)
            copies = []
            for _ in range(warmups + n):
                started = time.perf_counter()
                np.copyto(dst, a)
                copies.append(time.perf_counter() - started)
            del dst
            rows.append(
                {
                    "bytes": a.nbytes,
                    "label": f"{a.nbytes // MiB} MiB",
                    "hetero": latency(times),
                    "hetero_split_ms": {
                        # the profiler's definitions: driver pack + worker unpack + driver
                        # unpack; worker pack of the result
                        "transfer_in": round(
                            statistics.median(t.transfer_in for t in traces) * 1e3, 3
                        ),
                        "transfer_out": round(
                            statistics.median(t.transfer_out for t in traces) * 1e3, 3
                        ),
                    },
                    "ray": None,
                    "copy": latency(copies[warmups:]),
                    "target_median_ms": 2.0 if a.nbytes <= MiB else 150.0,
                }
            )
    if ray is not None:
        with ray_session(ray):
            remote = ray.remote(identity)
            for row, (a, n) in zip(rows, arrays, strict=True):
                for _ in range(warmups):
                    ray.get(remote.remote(ray.put(a)))
                times = []
                for _ in range(n):
                    started = time.perf_counter()
                    b = ray.get(remote.remote(ray.put(a)))
                    times.append(time.perf_counter() - started)
                    if not np.array_equal(a, b):
                        raise AssertionError("the Ray round trip changed the array")
                    del b
                row["ray"] = latency(times)
    for row in rows:
        ray_row = row["ray"]
        med = row["hetero"]["median_ms"]
        row["vs_ray"] = ratio(med, ray_row["median_ms"]) if ray_row else None
        row["meets_target"] = med <= row["target_median_ms"]
    return {"warmup_calls": warmups, "dtype": "float64", "sizes": rows, "order": "hetero, then Ray"}


# -------------------------------------------------------------------------------- overhead


def overhead(sizes: Sizes) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for backend in ("fake", "local"):
        tasks = sizes.fake_tasks if backend == "fake" else sizes.overhead_tasks
        for strategy in ("default", "round_robin"):
            for n in sizes.fleet_sizes:
                rows.append(_overhead_one(backend, strategy, n, tasks, sizes))
                print(json.dumps(rows[-1]), file=sys.stderr)
    smallest = min(sizes.fleet_sizes)
    base = {
        (r["backend"], r["strategy"]): r["us_per_task"]["median"]
        for r in rows
        if r["devices"] == smallest
    }
    for r in rows:
        r["vs_smallest_fleet"] = ratio(
            r["us_per_task"]["median"], base[(r["backend"], r["strategy"])]
        )
    return {
        "tasks": {"fake": sizes.fake_tasks, "local": sizes.overhead_tasks},
        "warmup_tasks": sizes.overhead_warmup,
        "repeats": {"fake": max(sizes.repeats, 5), "local": sizes.repeats},
        "cost": 0,
        "rows": rows,
    }


def _overhead_one(backend: str, strategy: str, n: int, tasks: int, sizes: Sizes) -> dict[str, Any]:
    config = emulated_config([1.0] * n)
    ctx = hetero.Context(
        config,
        strategy=None if strategy == "default" else strategy,
        backend=FakeBackend() if backend == "fake" else "local",
    )
    try:
        spread = strategy == "round_robin" and backend == "local"
        if spread:  # every device gets tasks: start every worker first
            start_all_workers(ctx, lambda: burst(ctx, free_noop, max(sizes.overhead_warmup, n)))
        else:
            burst(ctx, free_noop, sizes.overhead_warmup)
        us = []
        used: set[str | None] = set()
        # The fake's bursts are short and in one process: more of them, against the noise.
        for _ in range(max(sizes.repeats, 5) if backend == "fake" else sizes.repeats):
            elapsed, futures = burst(ctx, free_noop, tasks)
            us.append(elapsed / tasks * 1e6)
            used |= {getattr(f, "device", None) for f in futures}
        workers = sum(p is not None for p in ctx.backend.pids())
        name = ctx.strategy
    finally:
        ctx.close()
    return {
        "backend": backend,
        "strategy": name if strategy != "default" else f"{name} (default)",
        "devices": n,
        "us_per_task": summary(us, 1),
        "devices_used": len(used),
        "workers": workers if backend == "local" else None,
    }


# ------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=FIGURES, help="run one figure")
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    parser.add_argument("--repeats", type=int, help="repeats of each measurement (default 3)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray anchors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.repeats is not None:
        sizes = dataclasses.replace(sizes, repeats=args.repeats)
    reason: str | None
    if args.no_ray:
        ray, reason = None, "skipped: --no-ray"
    else:
        ray, reason = ray_module()
        if ray is None:
            print(f"Ray anchors skipped: {reason}", file=sys.stderr)
    command = _common.command("bench/bench_engine.py", argv)
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "throughput": lambda: throughput(sizes, ray),
        "map": lambda: makespan(sizes, ray, args.seed),
        "roundtrip": lambda: roundtrip(sizes, ray, args.seed),
        "overhead": lambda: overhead(sizes),
    }
    figures: dict[str, Any] = {}
    revision = _common.revision()
    started = time.perf_counter()
    for name in [args.only] if args.only else FIGURES:
        calibration = calibration_seconds()
        load = os.getloadavg()[0]  # other work on this shared machine, for the record
        t0 = time.perf_counter()
        figures[name] = runners[name]()
        figures[name]["calibration_seconds"] = calibration
        figures[name]["load_average_before"] = round(load, 2)
        figures[name]["wall_seconds"] = round(time.perf_counter() - t0, 1)
        figures[name]["command"] = command
        figures[name]["revision"] = revision
        print(f"{name}: {figures[name]['wall_seconds']} s", file=sys.stderr)
    doc: dict[str, Any] = {
        "benchmark": "execution engine",
        "command": command,
        "quick": args.quick,
        "ray": {"version": ray.__version__, "init": "ray.init(num_cpus=2)"} if ray else None,
        "ray_reason": reason,
        "hetero": hetero.__version__,
        "revision": revision,
        "revision_after": _common.revision(),
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    if args.only and args.out and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        old.pop("machine", None)
        figures = {**old.get("figures", {}), **figures}
        doc["command"] = old.get("command", command)
    doc["figures"] = figures
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
