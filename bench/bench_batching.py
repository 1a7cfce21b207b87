"""Dynamic batching: a small torch model served through the engine, one request per task call,
batched (``@hetero.task(batch=BatchOptions(...))``) against unbatched, on an emulated mixed
fleet.

The model is an MLP 512 -> 2048 -> 2048 -> 512 (ReLU, float32, 6.3 M parameters, fixed seed)
that every worker builds once; a request is one row of 512 floats. Unbatched, each call runs
the model on its row; batched, each call of a batch brings its row and the function runs the
model once on the stacked rows. The fleet is three emulated GPUs of relative speeds 4, 2 and 1
(``d0``..``d2``): no cost is declared, so each device takes the CPU time the call really used
here, scaled by its speed (the engine's host-timed emulation), and a batch shows what batching
saves on this CPU. Per device, a batch holds ``max_size`` calls scaled by the device's speed
relative to the fastest (32, 16 and 8 at ``max_size=32``).

Modes: ``unbatched``; ``batched`` (``max_size=32, max_wait=2 ms``); ``batched_nowait``
(``max_size=32, max_wait=0``: whatever is queued on a device when it starts a batch). Loads:
``burst`` (every request submitted at once: throughput = requests / makespan) and open-loop
Poisson arrivals at 0.5x and 1.5x the unbatched burst throughput (latency = from a request's
scheduled arrival to its future's completion; throughput = requests / time to the last).
Each device's worker is started and its model built before any timing. Outputs are checked
against the model run here (largest absolute difference in the JSON).

    python bench/bench_batching.py --out bench/results/batching.json
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import wait
from typing import Any

import _common
import numpy as np
from _common import calibration_seconds, emit
from _engine_util import emulated_config

import hetero

SPEEDS = (4.0, 2.0, 1.0)
DIMS = (512, 2048, 2048, 512)  # the MLP's layer widths
MAX_SIZE = 32
MODES = ("unbatched", "batched", "batched_nowait")
RATES = (0.5, 1.5)  # offered load, times the unbatched burst throughput

_MODEL: dict[str, Any] = {}  # the model, built once per worker process (and here)


def model() -> Any:
    net = _MODEL.get("net")
    if net is None:
        import torch

        torch.set_num_threads(1)  # three workers share this machine's cores
        torch.manual_seed(0)
        layers: list[Any] = []
        for width_in, width_out in itertools.pairwise(DIMS):
            layers += [torch.nn.Linear(width_in, width_out), torch.nn.ReLU()]
        net = torch.nn.Sequential(*layers[:-1]).eval()  # no ReLU after the last layer
        _MODEL["net"] = net
    return net


def infer_rows(rows: np.ndarray) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model()(torch.from_numpy(rows)).numpy()  # type: ignore[no-any-return]


def one(x: np.ndarray) -> tuple[np.ndarray, int, str]:
    """One request: its output, the batch size it ran in (1) and the device."""
    return infer_rows(x[None])[0], 1, hetero.get_current_device().id


def many(xs: list[np.ndarray]) -> list[tuple[np.ndarray, int, str]]:
    """A batch of requests: one model call on the stacked rows."""
    out = infer_rows(np.stack(xs))
    device = hetero.get_current_device().id
    return [(row, len(xs), device) for row in out]


def task_for(mode: str) -> hetero.TaskFunction[Any, Any]:
    if mode == "unbatched":
        return hetero.task(name="mlp")(one)
    wait_s = 0.002 if mode == "batched" else 0.0
    return hetero.task(name="mlp", batch=hetero.BatchOptions(MAX_SIZE, wait_s))(many)


def run_load(
    ctx: hetero.Context, fn: hetero.TaskFunction[Any, Any], rows: np.ndarray, rate: float | None
) -> dict[str, Any]:
    """Submit every row (all at once, or Poisson arrivals at ``rate`` per second) and time
    each request from its (scheduled) arrival to its future's completion."""
    n = len(rows)
    arrivals = np.zeros(n)
    if rate is not None:
        gaps = np.random.default_rng(1).exponential(1 / rate, n)
        arrivals = np.cumsum(gaps) - gaps[0]
    ends = np.zeros(n)
    lock = threading.Lock()

    def finished(i: int) -> Callable[[Any], None]:
        def record(_: Any) -> None:
            with lock:
                ends[i] = time.monotonic()

        return record

    futures = []
    start = time.monotonic()
    for i in range(n):
        delay = start + arrivals[i] - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        f = ctx.submit(fn, rows[i])
        f.add_done_callback(finished(i))
        futures.append(f)
    wait(futures)
    results = [f.result() for f in futures]
    latency = (ends - (start + arrivals)) * 1e3
    makespan = float(ends.max() - start)
    served: dict[str, list[int]] = {}
    for _, size, device in results:
        served.setdefault(device, []).append(size)
    reference = infer_rows(rows[:64])
    error = max(float(np.abs(results[i][0] - reference[i]).max()) for i in range(min(n, 64)))
    return {
        "requests": n,
        "offered_rps": None if rate is None else round(rate, 1),
        "throughput_rps": round(n / makespan, 1),
        "makespan_s": round(makespan, 3),
        "p50_ms": round(float(np.percentile(latency, 50)), 2),
        "p99_ms": round(float(np.percentile(latency, 99)), 2),
        "requests_per_device": {d: len(s) for d, s in sorted(served.items())},
        "mean_batch_per_device": {
            d: round(float(np.mean(s)), 2) for d, s in sorted(served.items())
        },
        "max_abs_error": error,
    }


def warm(ctx: hetero.Context, fn: hetero.TaskFunction[Any, Any], rows: np.ndarray) -> None:
    """Start every worker and build its model, untimed."""
    ctx.start()
    for device in ctx.devices:
        pinned = fn.with_options(devices=[device.id])
        wait([ctx.submit(pinned, rows[k]) for k in range(4)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=1500, help="requests per run")
    parser.add_argument("--quick", action="store_true", help="300 requests per run")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    n = 300 if args.quick else args.requests
    rows = np.random.default_rng(0).standard_normal((n, DIMS[0])).astype(np.float32)
    revision = _common.revision()
    calibration = calibration_seconds()
    load = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    started = time.perf_counter()
    unbatched_rps: float | None = None
    for load_name in ("burst", *(f"{r}x" for r in RATES)):
        for mode in MODES:
            if load_name == "burst":
                rate = None
            else:
                assert unbatched_rps is not None
                rate = unbatched_rps * float(load_name[:-1])
            fn = task_for(mode)
            with hetero.Context(emulated_config(SPEEDS)) as ctx:
                warm(ctx, fn, rows)
                row = {"mode": mode, "load": load_name, **run_load(ctx, fn, rows, rate)}
            if mode == "unbatched" and load_name == "burst":
                unbatched_rps = row["throughput_rps"]
            runs.append(row)
            print(
                f"{mode:15} {load_name:6} {row['throughput_rps']:8.1f} req/s "
                f"p50 {row['p50_ms']:8.2f} ms p99 {row['p99_ms']:8.2f} ms "
                f"batches {row['mean_batch_per_device']}",
                file=sys.stderr,
            )
    doc: dict[str, Any] = {
        "benchmark": "dynamic batching",
        "command": _common.command("bench/bench_batching.py", argv),
        "revision": revision,
        "revision_after": _common.revision(),
        "fleet_speeds": list(SPEEDS),
        "model_dims": list(DIMS),
        "max_size": MAX_SIZE,
        "rates_of_unbatched_burst": list(RATES),
        "calibration_seconds": calibration,
        "load_average_before": round(load, 2),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "runs": runs,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
