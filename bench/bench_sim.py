"""Simulator speed: events per second and seconds per run as the fleet grows.

The headline run is 1,000,000 requests over 1,000 devices with ``shortest_expected_delay``
(Poisson arrivals at 85% of fleet capacity, lognormal sizes). Prints JSON; ``--out`` saves it.

    python bench/bench_sim.py --out bench/results/sim.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
from _common import emit

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.sched.registry import make_policy
from hetero.sim.engine import Simulator
from hetero.sim.run import expected_duration
from hetero.sim.workload import generate, parse_workload

MODELS = ["T4", "V100-32GB", "A100-80GB", "H100-SXM-80GB"]


def fleet(n: int, seed: int = 0) -> list[Device]:
    """``n`` emulated devices, a mix of catalog models."""
    rng = np.random.default_rng(seed)
    catalog = get_catalog()
    picks = rng.choice(len(MODELS), size=n)
    return [
        Device(id=f"dev{i}", spec=catalog.get(MODELS[k]), emulated=True)
        for i, k in enumerate(picks.tolist())
    ]


def run_one(devices: int, requests: int, policy: str, load: float, seed: int) -> dict[str, Any]:
    workload = parse_workload(
        {
            "requests": requests,
            "arrivals": {"process": "poisson", "load": load},
            "size": {"dist": "lognormal", "mean": 1.0, "sigma": 1.0},
            "seed": seed,
        }
    )
    sim = Simulator(fleet(devices, seed), make_policy(policy))
    started = time.perf_counter()
    result = sim.run(
        generate(workload, sim.capacity),
        expected_duration=expected_duration(workload, sim.capacity),
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
        "p99_latency": round(result.metrics.p99, 4),
        "makespan_efficiency": round(result.metrics.makespan_efficiency, 4),
    }


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
    parser.add_argument("--policy", default="shortest_expected_delay")
    parser.add_argument("--load", type=float, default=0.85, help="fraction of fleet capacity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small runs, for a smoke test")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.requests, args.headline = "10,100", 5_000, 0
    runs = []
    if args.headline:
        runs.append(run_one(1000, args.headline, args.policy, args.load, args.seed))
        print(json.dumps(runs[-1]), file=sys.stderr)
    for n in (int(x) for x in args.devices.split(",") if x):
        runs.append(run_one(n, args.requests, args.policy, args.load, args.seed))
        print(json.dumps(runs[-1]), file=sys.stderr)
    doc = {
        "benchmark": "simulator",
        "runs": runs,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
