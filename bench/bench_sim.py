"""Simulator speed and memory: events per second, seconds and peak memory per run as the fleet
grows.

The headline run is 1,000,000 requests over 1,000 devices with ``shortest_expected_delay``
(Poisson arrivals at 85% of fleet capacity, lognormal sizes). The long run is 400,000 such
requests on one V100 without ``expected_duration``: about 470,000 simulated seconds, which once
took 94 million samples at the first 1/200 s interval; it shows that memory stays bounded. Each
run is in a fresh process, so its peak RSS is its own, after a short untimed run of the same
fleet (``WARM_UP`` requests), so that what a process sets up once stays out of its time.
Prints JSON; ``--out`` saves it.

    python bench/bench_sim.py --out bench/results/sim.json

``--check FILE`` is the hot path's guard (``make bench``): it runs 10 and 1,000 devices at
100,000 requests and prints each one's µs per request beside FILE's, with their ratio adjusted
by the machine's calibration loop (this shared machine drifts by tens of percent); it exits 1
when an adjusted ratio is above ``--tolerance`` (1.2).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

import numpy as np
from _common import calibration_seconds, emit

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.sched.registry import make_policy
from hetero.sched.view import KERNEL
from hetero.sim.engine import Simulator
from hetero.sim.run import expected_duration
from hetero.sim.workload import generate, parse_workload

MODELS = ["T4", "V100-32GB", "A100-80GB", "H100-SXM-80GB"]


def fleet(n: int, seed: int = 0, models: Sequence[str] = MODELS) -> list[Device]:
    """``n`` emulated devices, a mix of catalog models."""
    rng = np.random.default_rng(seed)
    catalog = get_catalog()
    picks = rng.choice(len(models), size=n)
    return [
        Device(id=f"dev{i}", spec=catalog.get(models[k]), emulated=True)
        for i, k in enumerate(picks.tolist())
    ]


def peak_rss_mib() -> float:
    """This process's peak resident memory. ``VmHWM`` rather than ``ru_maxrss``: Linux carries
    ``ru_maxrss`` over from the parent across ``exec``, so a fresh process would report at least
    its parent's peak."""
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return round(kib / 1024, 1)


def run_one(
    devices: int,
    requests: int,
    policy: str,
    load: float,
    seed: int,
    *,
    models: Sequence[str] = MODELS,
    sized: bool = True,
) -> dict[str, Any]:
    """One run; ``sized=False`` leaves out ``expected_duration``, so the series starts at 1/200 s
    intervals whatever the run's length."""
    workload = parse_workload(
        {
            "requests": requests,
            "arrivals": {"process": "poisson", "load": load},
            "size": {"dist": "lognormal", "mean": 1.0, "sigma": 1.0},
            "seed": seed,
        }
    )
    sim = Simulator(fleet(devices, seed, models), make_policy(policy))
    rss_before = peak_rss_mib()
    started = time.perf_counter()
    result = sim.run(
        generate(workload, sim.capacity),
        expected_duration=expected_duration(workload, sim.capacity) if sized else None,
    )
    wall = time.perf_counter() - started
    assert result.completed == requests, (result.completed, requests)
    return {
        "policy": policy,
        "devices": devices,
        "requests": requests,
        "load": load,
        "wall_seconds": round(wall, 3),
        "loop_seconds": round(result.wall_seconds, 3),
        "events": result.events,
        "events_per_second": round(result.events / wall),
        "us_per_request": round(wall / requests * 1e6, 2),
        "kernel": KERNEL is not None,  # the C placement kernel, or numpy's fallback
        "p99_latency": round(result.metrics.p99, 4),
        "makespan_efficiency": round(result.metrics.makespan_efficiency, 4),
        "simulated_seconds": round(result.metrics.elapsed, 1),
        "series_points": int(result.series.t.size),
        "rss_before_run_mib": rss_before,
        "peak_rss_mib": peak_rss_mib(),
    }


#: Requests of the untimed run before each timed one in its process.
WARM_UP = 2_000


def warm_run(devices: int, requests: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``run_one`` after a short untimed run of the same fleet, so that the first calls of a
    fresh process stay out of its time (5-10 ms of a 2 s run here), as they do for the later
    runs of an older revision's bench_sim, which ran its configurations in one process."""
    run_one(devices, min(WARM_UP, requests), *args, **kwargs)
    return run_one(devices, requests, *args, **kwargs)


def isolated(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """``warm_run`` in a fresh process, printed to stderr as it finishes."""
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        row = pool.submit(warm_run, *args, **kwargs).result()
    print(json.dumps(row), file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--devices",
        default="10,100,1000,10000",
        help="device counts for the scaling runs, '' for none (default: %(default)s)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=200_000,
        help="requests per scaling run (default: %(default)s)",
    )
    parser.add_argument(
        "--headline",
        type=int,
        default=1_000_000,
        help="requests of the 1,000-device headline run; 0 skips it",
    )
    parser.add_argument(
        "--long",
        type=int,
        default=400_000,
        help="requests of the one-device run without expected_duration; 0 skips it",
    )
    parser.add_argument("--policy", default="shortest_expected_delay")
    parser.add_argument("--load", type=float, default=0.85, help="fraction of fleet capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small runs, for a smoke test")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument(
        "--check",
        metavar="FILE",
        help="compare µs per request with FILE's (e.g. bench/results/sim.json) and exit 1 on a "
        "regression",
    )
    parser.add_argument("--tolerance", type=float, default=1.2, help="for --check")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.check, args.policy, args.load, args.seed, args.tolerance)
    if args.quick:
        args.devices, args.requests, args.headline, args.long = "10,100", 5_000, 0, 20_000
    run = (args.policy, args.load, args.seed)
    runs = []
    if args.headline:
        runs.append(isolated(1000, args.headline, *run))
    runs += [isolated(int(n), args.requests, *run) for n in args.devices.split(",") if n]
    doc: dict[str, Any] = {"benchmark": "simulator", "runs": runs}
    if args.long:
        doc["long_run"] = isolated(1, args.long, *run, models=["V100-32GB"], sized=False)
    return emit(doc, args.out)


def check(path: str, policy: str, load: float, seed: int, tolerance: float) -> int:
    """The committed µs per request beside this run's, at 10 and 1,000 devices."""
    with open(path) as f:
        committed = json.load(f)
    then_cal = committed["machine"]["calibration_seconds"]
    now_cal = calibration_seconds()
    worst = 0.0
    print(f"calibration loop: {then_cal} s committed, {now_cal} s now")
    if KERNEL is None:
        print("the C placement kernel is not built here (no C compiler?): numpy's fallback runs")
    print("devices  committed µs  now µs  ratio  adjusted")
    for devices in (10, 1000):
        then = next(
            r["us_per_request"]
            for r in committed["runs"]
            if r["devices"] == devices and r["policy"] == policy
        )
        now = isolated(devices, 100_000, policy, load, seed)["us_per_request"]
        adjusted = (now / now_cal) / (then / then_cal)
        worst = max(worst, adjusted)
        print(f"{devices:>7}  {then:>12}  {now:>6}  {now / then:>5.2f}  {adjusted:>8.2f}")
    if worst > tolerance:
        print(f"regression: {worst:.2f}x the committed cost per request (tolerance {tolerance})")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
