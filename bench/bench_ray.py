"""The Ray backend: hetero on a three-node Ray cluster made on this machine
(``hetero.runtime.ray_cluster.local_cluster``), every node declaring its own emulated devices,
against Ray's own ways to do the same work on the same devices, in one run. Two figures:

- ``map``: makespan efficiency of ``ctx.map`` on ``hetero.Context(backend="ray")`` (one actor
  per device), lognormal item costs declared with ``@hetero.task(cost=lambda c: c)``. An
  emulated device of speed s holds an item of cost c for c × time_scale / s seconds.
  Efficiency = ideal / makespan, ideal = the sum of costs × time_scale / the sum of speeds.
  Against, on the same devices, paced the same way (``bench_engine.Paced``: one sleep per call
  of cost / speed × time_scale, from where the previous call was due to end when calls come
  back to back, as hetero's workers pace) and with the same items:

  - Ray Data: ``from_items`` (Ray Data's default block count) then ``map_batches`` of one
    callable class over ``ActorPoolStrategy(size=<devices>)``, whole blocks as batches: Ray
    Data hands each block to the least busy actor (at most its default number of blocks in
    flight per actor). Every actor is built from the same class with the same arguments; each
    gets one device's ``hetero:<model>`` resource (``ray_remote_args_fn``), so it lands on that
    device's node, and claims a device of that model from a small named registry actor at
    construction. The registry holds every claim until the whole pool has claimed: the
    makespan runs from the first block's start after that instant (the pool's start is Ray
    Data's own, as the cluster's and hetero's actors' starts are left out); the wall time from
    the call and the wait from the whole pool's claim to the first block are recorded too.
  - Ray tasks: one ``@ray.remote`` task per item, pinned in turns to each device by its
    ``hetero:<model>`` resource (one unit per device, so a device runs one item at a time and
    Ray queues the rest). Ray has no notion of a device's speed and a task must name the
    resource it needs, so an equal share per device is what plain Ray tasks do; one task per
    item (not one per equal chunk, whose expected makespan is the same) is the idiomatic
    ``[f.remote(x) for x in items]`` and lets the devices of one model share a queue.

  The hetero Context is opened afresh in every round (its actors hold the ``hetero:<model>``
  resources the anchors ask for), started and warmed with a small map before it is timed; the
  Ray tasks get a small warm-up round before theirs (their worker processes start in it).
- ``overhead``: per-task overhead against plain Ray tasks: bursts of no-op tasks of zero
  declared cost (``@hetero.task(cost=0)``) submitted with ``ctx.submit`` and waited for, on the
  same Context, against ``noop.remote()`` as often then ``ray.get`` (``@ray.remote`` at its
  defaults), two bursts each per round in turns; then sequential round trips, ``ctx.run(noop)``
  against ``ray.get(noop.remote())``. A warm-up burst and warm-up calls each in every round
  first (as bench_engine.py's ``throughput`` and ``roundtrip``).

Rounds take turns (hetero, Ray Data, Ray tasks) so the machine's drift hits each alike; figures
are medians of the rounds. Without Ray, or without a working Ray backend in hetero, or without
Ray Data (it needs pandas and pyarrow), that side is recorded as skipped with the reason.

    python bench/bench_ray.py --out bench/results/ray.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import bench_engine
import cloudpickle
import yaml
from _common import calibration_seconds, emit
from _engine_util import latency, lognormal_costs, ray_module, summary
from bench_engine import Paced, _profile_row, _scheduler_row, burst, free_noop, item, ratio

import hetero
from hetero.config import parse_config
from hetero.runtime.ray_cluster import resource_name

# hetero's actors and Ray's workers unpickle bench_engine's task functions and Paced by value:
# bench/ is not on their path.
cloudpickle.register_pickle_by_value(bench_engine)

REGISTRY = "hetero-bench-devices"

#: One Ray node per entry, each declaring its own emulated devices as (catalog model, relative
#: speed). A model lives on one node at one speed, so its ``hetero:<model>`` resource names a
#: speed too.
NODES: tuple[tuple[tuple[str, float], ...], ...] = (
    (("H100-SXM-80GB", 4.0),),
    (("A100-80GB", 2.0), ("A100-80GB", 2.0)),
    (("V100-32GB", 1.0), ("T4", 0.5)),
)


@dataclass(frozen=True)
class Emulated:
    name: str
    model: str
    speed: float
    node: int


DEVICES = tuple(
    Emulated(f"n{n}-{model.split('-')[0].lower()}-{i}", model, speed, n)
    for n, node in enumerate(NODES)
    for i, (model, speed) in enumerate(node)
)


@dataclass(frozen=True)
class Sizes:
    repeats: int = 3
    items: int = 480  # map
    warm_items: int = 40  # each runner's warm-up, every round
    mean_cost: float = 1.0
    sigma: float = 1.0
    time_scale: float = 0.1  # a mean item: 25 ms on the fastest device, 200 ms on the slowest
    tasks: int = 2_000  # overhead: a burst
    bursts: int = 2  # overhead: bursts per round, in turns
    calls: int = 200  # overhead: sequential round trips
    warmup_tasks: int = 200
    warmup_calls: int = 20

    @classmethod
    def quick(cls) -> Sizes:
        return cls(repeats=1, items=120, warm_items=20, tasks=300, calls=40, warmup_tasks=50)


# ---------------------------------------------------------------- Ray's side (by value, __main__)


def noop() -> None:
    return None


_PACERS: dict[float, Paced] = {}  # per Ray worker process: one pacer per speed it has run at


def paced_item(cost: float, speed: float, time_scale: float) -> float:
    """A plain Ray task holding its device (the resource it was pinned by) as hetero's worker
    would: ``Paced`` carries the pacing over from this worker's previous item."""
    pacer = _PACERS.get(speed)
    if pacer is None:
        pacer = _PACERS[speed] = Paced(speed, time_scale)
    return pacer.work(cost)


class Registry:
    """Ray Data's pool's devices: each actor claims a distinct one of its model at construction;
    every claim is answered once the whole pool has claimed, so the pool starts work at one
    instant (``started``)."""

    def __init__(self, devices: list[tuple[str, str, float]]) -> None:
        self.devices = devices
        self.free: list[tuple[str, str, float]] = []
        self.everyone = asyncio.Event()
        self.started: float | None = None

    async def reset(self) -> None:
        self.free, self.everyone, self.started = list(self.devices), asyncio.Event(), None

    async def claim(self, model: str | None) -> tuple[str, float]:
        found = [d for d in self.free if model is None or d[1] == model]
        if not found:
            raise RuntimeError(f"no unclaimed device of model {model!r} is left for this actor")
        self.free.remove(found[0])
        if not self.free:
            self.started = time.monotonic()
            self.everyone.set()
        await self.everyone.wait()
        return found[0][0], found[0][2]

    async def start_time(self) -> float | None:
        return self.started


class DataDevice:
    """Ray Data's actor: one class, the same arguments for all; its device is the one it claims
    (of the model whose resource Ray gave it). One sleep per batch for the batch's cost."""

    def __init__(self, time_scale: float) -> None:
        import ray

        context: Any = ray.get_runtime_context()
        held: dict[str, float] = context.get_assigned_resources()
        prefix = resource_name("")
        model = next((k[len(prefix) :] for k in held if k.startswith(prefix)), None)
        registry = ray.get_actor(REGISTRY)
        claimed: Any = ray.get(registry.claim.remote(model), timeout=120)
        self.name: str = claimed[0]
        self.pacer: Paced = Paced(float(claimed[1]), time_scale)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        began = time.monotonic()
        cost = batch["cost"]
        self.pacer.work(math.fsum(cost.tolist()))
        n = len(cost)
        return {"cost": cost, "device": np.full(n, self.name), "began": np.full(n, began)}


# ------------------------------------------------------------------------------------ fleet


def write_node_configs(directory: str) -> list[str]:
    """One fleet config per node, as ``local_cluster`` takes them."""
    paths = []
    for n, _ in enumerate(NODES):
        entries = [
            {"type": "gpu", "model": d.model, "emulate": True, "speed": d.speed, "name": d.name}
            for d in DEVICES
            if d.node == n
        ]
        path = Path(directory) / f"node{n}.yaml"
        path.write_text(yaml.safe_dump({"devices": entries}, sort_keys=False))
        paths.append(str(path))
    return paths


def busy_by_device(costs_by_device: dict[str, float], time_scale: float) -> dict[str, float]:
    speed = {d.name: d.speed for d in DEVICES}
    return {name: c * time_scale / speed[name] for name, c in costs_by_device.items()}


# ---------------------------------------------------------------------------------- anchors


class DataPool:
    """Ray Data's ``map_batches`` over an actor pool of one actor per device."""

    def __init__(self, ray: Any, time_scale: float) -> None:
        from ray.data import ActorPoolStrategy, DataContext, from_items
        from ray.data.context import DEFAULT_ACTOR_MAX_TASKS_IN_FLIGHT_TO_MAX_CONCURRENCY_FACTOR

        self.ray, self.time_scale = ray, time_scale
        context = DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        context.enable_auto_log_stats = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        self.registry = (
            ray.remote(num_cpus=0)(Registry)
            .options(name=REGISTRY)
            .remote([(d.name, d.model, d.speed) for d in DEVICES])
        )
        self.strategy = ActorPoolStrategy(size=len(DEVICES))
        self.from_items = from_items
        # What Ray Data does unless told otherwise: blocks of from_items (one item each below
        # this count) and blocks queued at an actor (per call it runs at once, 1 here).
        self.defaults = {
            "min_blocks": context.read_op_min_num_blocks,
            "max_tasks_in_flight_per_actor": context.max_tasks_in_flight_per_actor
            or DEFAULT_ACTOR_MAX_TASKS_IN_FLIGHT_TO_MAX_CONCURRENCY_FACTOR,
        }

    def run(self, costs: list[float]) -> dict[str, Any]:
        ray = self.ray
        ray.get(self.registry.reset.remote())
        order = itertools.cycle(DEVICES)
        ds = self.from_items([{"cost": c} for c in costs])
        blocks = ds.num_blocks()
        mapped = ds.map_batches(
            DataDevice,
            fn_constructor_args=(self.time_scale,),
            compute=self.strategy,
            batch_size=None,  # whole blocks
            num_cpus=0,  # the actors sleep; the device resource places them
            # Each actor its own device's resource: the one way to vary an actor's options
            # within a pool (deprecated, to be removed in Ray 2.64).
            ray_remote_args_fn=lambda: {"resources": {resource_name(next(order).model): 1}},
        )
        called = time.monotonic()
        rows = mapped.take_all()
        ended = time.monotonic()
        complete = ray.get(self.registry.start_time.remote())
        if complete is None:
            raise RuntimeError("Ray Data ran without every actor of its pool claiming a device")
        started = min(float(r["began"]) for r in rows)
        if sorted(float(r["cost"]) for r in rows) != sorted(costs):
            raise AssertionError("Ray Data results differ from the input")
        per_device: dict[str, float] = defaultdict(float)
        per_block: dict[tuple[str, float], float] = defaultdict(float)
        for r in rows:
            per_device[str(r["device"])] += float(r["cost"])
            per_block[str(r["device"]), float(r["began"])] += float(r["cost"])
        return {
            "makespan": ended - started,
            "wall": ended - called,
            "first_block_wait": started - complete,
            "blocks": blocks,
            "busy": busy_by_device(per_device, self.time_scale),
            "idle_between_blocks": self.idle_between_blocks(per_block),
        }

    def idle_between_blocks(self, blocks: dict[tuple[str, float], float]) -> dict[str, float]:
        """Median seconds each device waited between the end of one block's pacing and the
        start of its next: Ray Data's turnaround per block."""
        speed = {d.name: d.speed for d in DEVICES}
        out = {}
        for name in speed:
            mine = sorted((began, c) for (d, began), c in blocks.items() if d == name)
            gaps = [
                b - (a + c * self.time_scale / speed[name])
                for (a, c), (b, _) in itertools.pairwise(mine)
            ]
            if gaps:
                out[name] = round(statistics.median(gaps), 4)
        return out

    def close(self) -> None:
        self.ray.kill(self.registry)


class TaskSplit:
    """One plain Ray task per item, pinned in turns to each device by its resource."""

    def __init__(self, ray: Any, time_scale: float) -> None:
        self.ray, self.time_scale = ray, time_scale
        remote = ray.remote(num_cpus=0)(paced_item)
        self.pinned = [remote.options(resources={resource_name(d.model): 1}) for d in DEVICES]

    def run(self, costs: list[float]) -> dict[str, Any]:
        n = len(DEVICES)
        started = time.perf_counter()
        refs = [
            self.pinned[i % n].remote(c, DEVICES[i % n].speed, self.time_scale)
            for i, c in enumerate(costs)
        ]
        out = self.ray.get(refs)
        elapsed = time.perf_counter() - started
        if out != costs:
            raise AssertionError("Ray task results differ from the input")
        return {"makespan": elapsed, "busy": self.busy(costs)}

    def busy(self, costs: list[float]) -> dict[str, float]:
        """Busy seconds per device: the devices of one model share their queue, so each gets
        the model's mean."""
        n = len(DEVICES)
        by_model: dict[str, float] = defaultdict(float)
        for i, c in enumerate(costs):
            by_model[DEVICES[i % n].model] += c
        count = {m: sum(d.model == m for d in DEVICES) for m in by_model}
        return busy_by_device(
            {d.name: by_model[d.model] / count[d.model] for d in DEVICES}, self.time_scale
        )

    def expected(self, costs: list[float]) -> float:
        """The makespan the split allows at best: the most loaded model's share over its
        devices' speeds."""
        busy = self.busy(costs)
        return max(busy.values())


# ------------------------------------------------------------------------------ hetero side


def hetero_map(ctx: hetero.Context, costs: list[float], tmp: str, r: int) -> dict[str, Any]:
    with ctx.profile(f"map-ray-{r}", tmp) as p:
        started = time.perf_counter()
        out = list(ctx.map(item, costs, progress=False))
        elapsed = time.perf_counter() - started
    if out != costs:
        raise AssertionError("hetero: map results differ from the input")
    profile = _profile_row(p.profile.summary())
    # hetero's device ids are "<node>/<name>"
    busy = {d["id"].rsplit("/", 1)[-1]: d["busy_seconds"] for d in profile["devices"]}
    return {"makespan": elapsed, "profile": profile, "busy": busy}


def _per_runner() -> dict[str, list[float]]:
    return {"hetero": [], "ray": []}


@dataclass
class Overhead:
    """Per-task seconds of bursts (and driver CPU seconds) and round-trip seconds, per runner."""

    per_task: dict[str, list[float]] = dataclasses.field(default_factory=_per_runner)
    driver_cpu: dict[str, list[float]] = dataclasses.field(default_factory=_per_runner)
    roundtrip: dict[str, list[float]] = dataclasses.field(default_factory=_per_runner)


def overhead_round(
    ctx: hetero.Context | None, ray: Any, sizes: Sizes, acc: Overhead, remote: Any
) -> None:
    """One round of bursts and round trips, hetero then Ray, each after its warm-up."""
    n = sizes.tasks

    def ray_burst(k: int) -> float:
        started = time.perf_counter()
        ray.get([remote.remote() for _ in range(k)])
        return time.perf_counter() - started

    runners: dict[str, tuple[Callable[[int], float], Callable[[], Any]]] = {
        "ray": (ray_burst, lambda: ray.get(remote.remote()))
    }
    if ctx is not None:
        runners = {
            "hetero": (lambda k: burst(ctx, free_noop, k)[0], lambda: ctx.run(free_noop)),
            **runners,
        }
    for run_burst, call in runners.values():
        run_burst(sizes.warmup_tasks)
        for _ in range(sizes.warmup_calls):
            call()
    for _ in range(sizes.bursts):
        for name, (run_burst, _) in runners.items():
            cpu0 = time.process_time()
            acc.per_task[name].append(run_burst(n) / n)
            acc.driver_cpu[name].append((time.process_time() - cpu0) / n)
    for name, (_, call) in runners.items():
        for _ in range(sizes.calls):
            started = time.perf_counter()
            call()
            acc.roundtrip[name].append(time.perf_counter() - started)


# ------------------------------------------------------------------------------------- run


@contextlib.contextmanager
def cluster_session(ray: Any, configs: Sequence[str]) -> Iterator[tuple[Any, float]]:
    """The three-node cluster and this driver connected to it; the seconds the start took."""
    from hetero.runtime.ray_cluster import local_cluster

    started = time.perf_counter()
    with local_cluster(configs, num_cpus=1) as cluster:
        ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            yield cluster, time.perf_counter() - started
        finally:
            ray.shutdown()


def _open_hetero(
    address: str, time_scale: float, queue_order: str = "size"
) -> tuple[hetero.Context | None, str | None]:
    config = parse_config(
        {"backend": {"kind": "ray", "address": address}, "scheduler": {"queue_order": queue_order}}
    )
    try:
        ctx = hetero.Context(config, time_scale=time_scale)
    except Exception as exc:  # the backend is optional: a missing one is recorded, not fatal
        return None, f"{type(exc).__name__}: {exc}"
    return ctx, None


def _device_rows(runs: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Busy seconds and utilization of each device in each runner's median run."""
    rows = []
    for d in DEVICES:
        row: dict[str, Any] = {
            "device": d.name,
            "node": d.node,
            "model": d.model,
            "speed": d.speed,
        }
        for label, run in runs.items():
            if run is None:
                row[label] = None
                continue
            busy = run["busy"].get(d.name, 0.0)
            row[label] = {
                "busy_seconds": round(busy, 4),
                "utilization": round(busy / run["makespan"], 4),
            }
        rows.append(row)
    return rows


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["makespan"])[(len(runs) - 1) // 2]


def bench(ray: Any, sizes: Sizes, seed: int, *, data: bool) -> dict[str, Any]:
    ts = sizes.time_scale
    costs = lognormal_costs(sizes.items, sizes.mean_cost, sizes.sigma, seed)
    warm = lognormal_costs(sizes.warm_items, sizes.mean_cost, sizes.sigma, seed + 1)
    work = math.fsum(costs) * ts
    ideal = work / sum(d.speed for d in DEVICES)
    runs: dict[str, list[dict[str, Any]]] = {
        "hetero": [],
        "hetero_fifo": [],
        "ray_data": [],
        "ray_tasks": [],
    }
    hetero_reason: str | None = None
    data_reason: str | None = None if data else "skipped: --no-data"
    starts: list[float] = []
    acc = Overhead()
    loads, calibrations = [], []
    with (
        tempfile.TemporaryDirectory(prefix="hetero-bench-ray-") as tmp,
        cluster_session(ray, write_node_configs(tmp)) as (cluster, cluster_start),
    ):
        pool: DataPool | None = None
        if data:
            try:
                pool = DataPool(ray, ts)
            except ImportError as exc:
                data_reason = f"import ray.data failed: {exc} (pip install 'ray[data]')"
                print(f"Ray Data anchor skipped: {data_reason}", file=sys.stderr)
        split = TaskSplit(ray, ts)
        remote_noop = ray.remote(noop)
        for r in range(sizes.repeats):
            calibrations.append(calibration_seconds())
            loads.append(round(os.getloadavg()[0], 2))
            # hetero: a fresh Context per round (its actors hold the devices' resources).
            ctx: hetero.Context | None = None
            if hetero_reason is None:
                started = time.perf_counter()
                ctx, hetero_reason = _open_hetero(cluster.address, ts)
                if ctx is None:
                    print(f"hetero side skipped: {hetero_reason}", file=sys.stderr)
            with contextlib.ExitStack() as stack:
                if ctx is not None:
                    stack.enter_context(ctx)
                    ctx.start()
                    starts.append(time.perf_counter() - started)
                    list(ctx.map(item, warm, progress=False))
                    runs["hetero"].append(hetero_map(ctx, costs, tmp, r))
                overhead_round(ctx, ray, sizes, acc, remote_noop)
            if hetero_reason is None:
                # The same map with FIFO device queues: a batch job's makespan, where the
                # default size order (for latency) defers the largest batches to the end.
                fifo, _ = _open_hetero(cluster.address, ts, "fifo")
                assert fifo is not None
                with fifo:
                    fifo.start()
                    list(fifo.map(item, warm, progress=False))
                    runs["hetero_fifo"].append(hetero_map(fifo, costs, tmp, r))
            if pool is not None:
                runs["ray_data"].append(pool.run(costs))
            split.run(warm)
            runs["ray_tasks"].append(split.run(costs))
            print(
                f"round {r}: "
                + ", ".join(f"{k} {v[-1]['makespan']:.3f} s" for k, v in runs.items() if v),
                file=sys.stderr,
            )
        if pool is not None:
            pool.close()
    return {
        "map": map_figure(sizes, seed, costs, ideal, runs, split, pool, hetero_reason, data_reason),
        "overhead": overhead_figure(sizes, acc, hetero_reason),
        "cluster_start_seconds": round(cluster_start, 2),
        "hetero_context_start_seconds": summary(starts, 2) if starts else None,
        "calibration_seconds_per_round": calibrations,
        "load_average_per_round": loads,
    }


def map_figure(
    sizes: Sizes,
    seed: int,
    costs: list[float],
    ideal: float,
    runs: dict[str, list[dict[str, Any]]],
    split: TaskSplit,
    pool: DataPool | None,
    hetero_reason: str | None,
    data_reason: str | None,
) -> dict[str, Any]:
    labels = {
        "hetero": "hetero ctx.map",
        "hetero_fifo": "hetero ctx.map, queue_order: fifo",
        "ray_data": "Ray Data",
        "ray_tasks": "Ray tasks",
    }
    reasons = {
        "hetero": hetero_reason,
        "hetero_fifo": hetero_reason,
        "ray_data": data_reason,
        "ray_tasks": None,
    }
    rows: dict[str, Any] = {}
    for key, label in labels.items():
        if not runs[key]:
            rows[key] = {"scheduler": label, "skipped": reasons[key] or "not run"}
            continue
        rows[key] = _scheduler_row(label, [r["makespan"] for r in runs[key]], ideal)
    for key in ("hetero", "hetero_fifo"):
        if runs[key]:
            rows[key]["profile_of_median_run"] = _median(runs[key])["profile"]
    if runs["ray_data"] and pool is not None:
        rows["ray_data"]["wall_seconds_from_call"] = summary(
            [r["wall"] for r in runs["ray_data"]], 4
        )
        rows["ray_data"]["pool_complete_to_first_block_seconds"] = summary(
            [r["first_block_wait"] for r in runs["ray_data"]], 4
        )
        rows["ray_data"]["blocks"] = runs["ray_data"][0]["blocks"]
        rows["ray_data"]["idle_between_blocks_seconds_median_run"] = _median(runs["ray_data"])[
            "idle_between_blocks"
        ]
        rows["ray_data"]["ray_data_defaults"] = pool.defaults
    rows["ray_tasks"]["expected_makespan_seconds"] = round(split.expected(costs), 4)
    rows["ray_tasks"]["tasks"] = len(costs)
    hetero_eff = rows["hetero"].get("efficiency")
    for key in ("ray_data", "ray_tasks"):
        eff = rows[key].get("efficiency")
        rows[key]["hetero_efficiency_ratio"] = ratio(hetero_eff, eff)
    medians = {k: _median(v) if v else None for k, v in runs.items()}
    target = 0.9
    return {
        "nodes": [
            [{"device": d.name, "model": d.model, "speed": d.speed} for d in DEVICES if d.node == n]
            for n in range(len(NODES))
        ],
        "speeds": [d.speed for d in DEVICES],
        "items": len(costs),
        "cost": {
            "distribution": "lognormal",
            "mean": sizes.mean_cost,
            "sigma": sizes.sigma,
            "seed": seed,
            "sum": round(math.fsum(costs), 4),
        },
        "time_scale": sizes.time_scale,
        "repeats": sizes.repeats,
        "warm_items": sizes.warm_items,
        "ideal_makespan_seconds": round(ideal, 4),
        "target_efficiency": target,
        "meets_target": None if hetero_eff is None else hetero_eff >= target,
        "runners": list(rows.values()),
        "devices_in_median_run": _device_rows({labels[k]: medians[k] for k in labels}),
    }


def overhead_figure(sizes: Sizes, acc: Overhead, hetero_reason: str | None) -> dict[str, Any]:
    target = 1.5
    out: dict[str, Any] = {
        "tasks": sizes.tasks,
        "bursts_per_round": sizes.bursts,
        "calls": sizes.calls,
        "repeats": sizes.repeats,
        "warmup_tasks": sizes.warmup_tasks,
        "warmup_calls": sizes.warmup_calls,
        "hetero_task": "@hetero.task(cost=0) no-op, ctx.submit burst / ctx.run",
        "ray_task": "@ray.remote no-op at its defaults (num_cpus=1), .remote() burst / ray.get",
        "target_vs_ray": target,
        "hetero_skipped": hetero_reason,
    }
    for name in ("hetero", "ray"):
        if not acc.per_task[name]:
            out[name] = None
            continue
        out[name] = {
            "us_per_task": summary([s * 1e6 for s in acc.per_task[name]], 1),
            "tasks_per_second": summary([1 / s for s in acc.per_task[name]], 0),
            "driver_cpu_us_per_task": summary([s * 1e6 for s in acc.driver_cpu[name]], 1),
            "roundtrip": latency(acc.roundtrip[name]),
        }
    if out["hetero"] and out["ray"]:
        per_task = ratio(
            out["hetero"]["us_per_task"]["median"], out["ray"]["us_per_task"]["median"]
        )
        trip = ratio(out["hetero"]["roundtrip"]["median_ms"], out["ray"]["roundtrip"]["median_ms"])
        out["per_task_vs_ray"] = per_task
        out["roundtrip_vs_ray"] = trip
        out["meets_target"] = per_task is not None and per_task <= target
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--repeats", type=int, help="rounds (default 3)")
    parser.add_argument("--items", type=int, help="map items (default 480)")
    parser.add_argument("--no-data", action="store_true", help="skip the Ray Data anchor")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.repeats is not None:
        sizes = dataclasses.replace(sizes, repeats=args.repeats)
    if args.items is not None:
        sizes = dataclasses.replace(sizes, items=args.items)
    command = _common.command("bench/bench_ray.py", argv)
    revision = _common.revision()
    ray, reason = ray_module()
    doc: dict[str, Any] = {
        "benchmark": "Ray backend",
        "command": command,
        "quick": args.quick,
        "hetero": hetero.__version__,
        "revision": revision,
    }
    started = time.perf_counter()
    load = os.getloadavg()[0]
    calibration = calibration_seconds()
    if ray is None:
        print(f"skipped: {reason}", file=sys.stderr)
        doc["skipped"] = reason
    else:
        ray.cloudpickle.register_pickle_by_value(bench_engine)
        doc["ray"] = {"version": ray.__version__, "nodes": len(NODES), "num_cpus_per_node": 1}
        doc.update(bench(ray, sizes, args.seed, data=not args.no_data))
    doc["calibration_seconds"] = calibration
    doc["load_average_before"] = round(load, 2)
    doc["revision_after"] = _common.revision()
    doc["wall_seconds"] = round(time.perf_counter() - started, 1)
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
