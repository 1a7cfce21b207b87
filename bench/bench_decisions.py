"""Decision cost: microseconds per ``pick`` for every policy as the fleet grows.

Each device count gets a fleet of mixed catalog models with random load in the view (queues
ordered by size, as the dispatcher keeps them by default), and items of random cost; the figure
is the median over repeats of the mean time per decision.
Prints JSON; ``--out`` saves it.

    python bench/bench_decisions.py --out bench/results/decisions.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np
from _common import emit

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.sched import FleetView, ManualClock, PerfModel, WorkItem
from hetero.sched.registry import make_policy, policy_names

MODELS = ["T4", "V100-32GB", "A100-80GB", "H100-SXM-80GB"]
OPTIONS: dict[str, dict[str, Any]] = {
    "tiered": {"thresholds": [1.0, 3.0], "tiers": [["T4"], ["V100-32GB"], ["gpu"]]},
    "affinity": {"rules": {"big": ["A100-80GB", "H100-SXM-80GB"]}},
}


def make_view(n: int, rng: np.random.Generator) -> FleetView:
    catalog = get_catalog()
    models = [MODELS[i % len(MODELS)] for i in range(n)]  # every model present, even at n=4
    devices = [
        Device(id=f"dev{i}", spec=catalog.get(m), emulated=True) for i, m in enumerate(models)
    ]
    view = FleetView(devices, PerfModel(devices), ManualClock())
    # Size-ordered queues, as the dispatcher keeps them by default: one running item (part
    # done) and up to seven queued ones per device, lognormal costs.
    view.size_order = True
    queued = rng.integers(0, 8, n)
    view.in_flight[:] = queued + 1
    view.running_work[:] = rng.lognormal(0, 1, n)
    view.outstanding[:] = view.running_work
    view.running[:] = 1
    # started a random part of its service time ago (the clock is at 0)
    view.running_since[:] = -rng.random(n) * view.running_work / view.speed()
    for i, count in enumerate(queued.tolist()):
        for cost in rng.lognormal(0, 1, count).tolist():
            view.note_queued(i, view.size_class(cost), cost, 1)
            view.outstanding[i] += cost
    view.mem_used[:] = (view.mem_total * rng.random(n) * 0.5).astype(np.int64)
    return view


def measure(policy_name: str, n: int, decisions: int, repeats: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    view = make_view(n, rng)
    policy = make_policy(policy_name, OPTIONS.get(policy_name, {}))
    policy.bind(view)
    items = [
        WorkItem(cost=float(c), memory=int(m), tags=frozenset({"big"}) if b else frozenset())
        for c, m, b in zip(
            rng.lognormal(0, 1, decisions),
            rng.integers(0, 2**30, decisions),
            rng.random(decisions) < 0.3,
            strict=True,
        )
    ]
    pick = policy.pick
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        for item in items:
            pick(item, view, None)
        runs.append((time.perf_counter() - started) / decisions * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", default="4,16,64,256,1024,4096")
    parser.add_argument("--policies", default=",".join(policy_names()))
    parser.add_argument("--decisions", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.decisions, args.repeats = "4,64", 200, 1
    rows = []
    for name in args.policies.split(","):
        for n in (int(x) for x in args.devices.split(",")):
            us = measure(name, n, args.decisions, args.repeats, args.seed)
            rows.append({"policy": name, "devices": n, "us_per_decision": round(us, 2)})
            print(json.dumps(rows[-1]), file=sys.stderr)
    doc = {
        "benchmark": "decision cost",
        "results": rows,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
