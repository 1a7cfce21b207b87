"""Policy quality on a heterogeneous fleet: latency at 85% load and throughput at saturation, and
the default against round robin at several loads and on the demo fleet.

Fleet: relative speeds 1 : 2.5 : 6 (T4-, V100- and A100-like), ``--per-class`` devices of each.
Open run: Poisson arrivals at ``--load`` of total capacity, lognormal sizes → p50/p99 latency.
Saturated run: a closed batch (every item queued at t=0) → work throughput / total capacity.
Both are run with work stealing off, so each policy is measured alone (round robin is then the
speed-blind baseline other tools give you); the open run is repeated with stealing on, which
is the dispatcher's default and rescues even round robin.

Default against round robin: the default scheduler (``SchedulerConfig()``: its strategy and
queue order, stealing on) beside round robin under the same dispatcher settings, round robin
with FIFO queues (the order the dispatcher used before size order), the former default
(shortest_expected_delay, size-ordered queues) and the best before that, shortest_expected_delay
with FIFO queues. Scenarios: Poisson arrivals at 50%, 85% and 95% load
and bursty arrivals on the fleet above (SLO ``--slo`` seconds), and the demo
(``examples/mixed_fleet.yaml`` with ``examples/workloads/poisson_85.yaml``, its own SLO and
scheduler settings). Each run reports mean, p50, p99, SLO attainment, and what the largest 1% of
items (by cost) pay: their mean and worst latency. Then the default's p99 against round robin's
at ``--load`` for ``--seeds`` other draws of the same workload (how much of the margin is the
draw), and the default beside round robin and shortest_expected_delay on other fleets and size
spreads at 80-85% load (what the default's trade-off looks like away from the benchmark fleet).
Last, the default strategy at ``--load`` with ``overtake_weight`` 0 to 4 and with FIFO
queues.
Prints JSON; ``--out`` saves it.

    python bench/bench_quality.py --out bench/results/quality.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit

from hetero.config import SchedulerConfig, load_config
from hetero.devices.catalog import get_catalog
from hetero.devices.fleet import build_fleet
from hetero.devices.spec import Device
from hetero.sched.registry import make_policy, policy_names
from hetero.sim.result import SimResult
from hetero.sim.run import simulate
from hetero.sim.workload import WorkloadSpec, load_workload, parse_workload
from hetero.testing import emulated_fleet

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CLASSES = [("T4", 1.0), ("V100-32GB", 2.5), ("A100-80GB", 6.0)]
# Policies that need options of their own are left out of the sweep.
NEEDS_OPTIONS = {"tiered", "affinity"}


def fleet(per_class: int) -> list[Device]:
    catalog = get_catalog()
    return [
        Device(
            id=f"{model.lower()}:{k}", spec=catalog.get(model), emulated=True, speed_override=speed
        )
        for model, speed in CLASSES
        for k in range(per_class)
    ]


def speed_fleet(classes: list[tuple[float, int]]) -> list[Device]:
    """``count`` emulated devices of each relative ``speed``."""
    return emulated_fleet([speed for speed, count in classes for _ in range(count)])


BENCHMARK_FLEET = [(speed, 4) for _, speed in CLASSES]
# (name, fleet as (speed, count) pairs, lognormal sigma of sizes, load)
OTHER_CASES: list[tuple[str, list[tuple[float, int]], float, float]] = [
    ("2 devices per class", [(speed, 2) for _, speed in CLASSES], 1.0, 0.85),
    ("8 devices per class", [(speed, 8) for _, speed in CLASSES], 1.0, 0.85),
    ("sizes sigma 0.5", BENCHMARK_FLEET, 0.5, 0.85),
    ("sizes sigma 1.5", BENCHMARK_FLEET, 1.5, 0.85),
    ("6 at speed 1, 2 at speed 4", [(1.0, 6), (4.0, 2)], 1.0, 0.85),
    ("8 at speed 1, 1 at speed 8", [(1.0, 8), (8.0, 1)], 1.0, 0.8),
    ("8 alike devices", [(1.0, 8)], 1.0, 0.85),
]


def latency_row(result: SimResult) -> dict[str, Any]:
    """Mean, p50, p99 and SLO attainment of one run, and what its largest 1% of items paid."""
    m = result.metrics
    costs, latencies = result.costs, result.latencies
    largest = latencies[costs >= np.quantile(costs, 0.99)] if costs.size else latencies
    return {
        "mean": round(m.mean, 4),
        "p50": round(m.p50, 4),
        "p99": round(m.p99, 4),
        "slo_attainment": round(result.slo_attainment or 0.0, 4),
        "failed": result.failed,
        "largest_1pct_mean": round(float(largest.mean()), 4) if largest.size else None,
        "largest_1pct_worst": round(float(largest.max()), 4) if largest.size else None,
    }


def versus_round_robin(
    name: str, devices: list[Device], workload: WorkloadSpec, scheduler: SchedulerConfig
) -> dict[str, Any]:
    """The default beside round robin (same settings, and FIFO) and the former best."""
    fifo = {"queue_order": "fifo"}
    runs = {
        "default": simulate(devices, workload, [scheduler.strategy], scheduler=scheduler)[0],
        "round_robin": simulate(devices, workload, ["round_robin"], scheduler=scheduler)[0],
        "round_robin_fifo": simulate(
            devices, workload, ["round_robin"], scheduler=scheduler, dispatcher_options=fifo
        )[0],
        "shortest_expected_delay": simulate(
            devices, workload, ["shortest_expected_delay"], scheduler=scheduler
        )[0],
        "shortest_expected_delay_fifo": simulate(
            devices,
            workload,
            ["shortest_expected_delay"],
            scheduler=scheduler,
            dispatcher_options=fifo,
        )[0],
    }
    rows = {label: latency_row(r) for label, r in runs.items()}
    default = rows["default"]
    beats = {
        baseline: {
            "mean": default["mean"] < rows[baseline]["mean"],
            "p50": default["p50"] < rows[baseline]["p50"],
            "p99": default["p99"] < rows[baseline]["p99"],
            "slo_attainment": default["slo_attainment"] > rows[baseline]["slo_attainment"],
        }
        for baseline in ("round_robin", "round_robin_fifo")
    }
    doc = {
        "scenario": name,
        "requests": workload.requests,
        "slo": workload.slo.latency if workload.slo else None,
        "runs": rows,
        "default_beats": beats,
        "p99_vs_round_robin": round(default["p99"] / rows["round_robin"]["p99"], 4),
        "p99_vs_round_robin_fifo": round(default["p99"] / rows["round_robin_fifo"]["p99"], 4),
    }
    print(json.dumps(doc), file=sys.stderr)
    return doc


def scenarios(args: argparse.Namespace) -> list[dict[str, Any]]:
    devices = fleet(args.per_class)
    size = {"dist": "lognormal", "mean": 1.0, "sigma": args.sigma}
    common = {"requests": args.requests, "seed": args.seed, "size": size}
    slo = {"latency": args.slo}
    arrivals = {
        "50% load": {"process": "poisson", "load": 0.5},
        "85% load": {"process": "poisson", "load": 0.85},
        "95% load": {"process": "poisson", "load": 0.95},
        "bursty, 70% mean load": {
            "process": "bursty",
            "load": 0.7,
            "burst_factor": 3,
            "burst_seconds": 5,
            "calm_seconds": 20,
        },
    }
    docs = [
        versus_round_robin(
            name,
            devices,
            parse_workload({**common, "arrivals": process, "slo": slo}),
            SchedulerConfig(max_queue_size=1_000_000_000),
        )
        for name, process in arrivals.items()
    ]
    demo = load_config(EXAMPLES / "mixed_fleet.yaml")
    demo_workload = load_workload(EXAMPLES / "workloads" / "poisson_85.yaml")
    if args.quick:
        demo_workload = demo_workload.model_copy(update={"requests": args.requests})
    docs.append(
        versus_round_robin(
            "demo: mixed_fleet.yaml, poisson_85.yaml",
            build_fleet(demo),
            demo_workload,
            demo.scheduler,
        )
    )
    return docs


def open_workload(requests: int, seed: int, sigma: float, load: float, slo: float) -> WorkloadSpec:
    """Poisson arrivals at ``load``, lognormal sizes of mean 1, a latency SLO of ``slo`` s."""
    return parse_workload(
        {
            "requests": requests,
            "seed": seed,
            "size": {"dist": "lognormal", "mean": 1.0, "sigma": sigma},
            "arrivals": {"process": "poisson", "load": load},
            "slo": {"latency": slo},
        }
    )


def other_cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The default beside round robin and shortest_expected_delay (stealing on, size-ordered
    queues) on ``OTHER_CASES``, with half of ``--requests`` each."""
    scheduler = SchedulerConfig(max_queue_size=1_000_000_000)
    labels = {
        scheduler.strategy: "default",
        "round_robin": "round_robin",
        "shortest_expected_delay": "shortest_expected_delay",
    }
    docs = []
    for name, classes, sigma, load in OTHER_CASES:
        workload = open_workload(args.requests // 2, args.seed, sigma, load, args.slo)
        results = simulate(speed_fleet(classes), workload, list(labels), scheduler=scheduler)
        doc = {
            "case": name,
            "load": load,
            "runs": {labels[r.policy]: latency_row(r) for r in results},
        }
        docs.append(doc)
        print(json.dumps(doc), file=sys.stderr)
    return docs


def seed_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The default's p99 against round robin's at ``--load`` for seeds ``--seed`` onwards."""
    devices = fleet(args.per_class)
    scheduler = SchedulerConfig(max_queue_size=1_000_000_000)
    rows = []
    for seed in range(args.seed, args.seed + args.seeds):
        default, rr = simulate(
            devices,
            open_workload(args.requests, seed, args.sigma, args.load, args.slo),
            [scheduler.strategy, "round_robin"],
            scheduler=scheduler,
        )
        rows.append(
            {
                "seed": seed,
                "default_p99": round(default.metrics.p99, 4),
                "round_robin_p99": round(rr.metrics.p99, 4),
                "p99_vs_round_robin": round(default.metrics.p99 / rr.metrics.p99, 4),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def overtake_sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The default strategy at ``--load`` with overtake_weight 0 to 4, and with FIFO queues: the
    line between the median and the tail that the weight moves along."""
    devices = fleet(args.per_class)
    workload = open_workload(args.requests, args.seed, args.sigma, args.load, args.slo)
    rows = []
    for order, weight in [("fifo", None), *(("size", float(w)) for w in range(5))]:
        scheduler = SchedulerConfig(
            max_queue_size=1_000_000_000,
            queue_order=order,
            options={} if weight is None else {"overtake_weight": weight},
        )
        (result,) = simulate(devices, workload, [scheduler.strategy], scheduler=scheduler)
        rows.append({"queue_order": order, "overtake_weight": weight, **latency_row(result)})
        print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--per-class", type=int, default=4, help="devices per speed class")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds", type=int, default=4, help="draws of the --load workload in the seed sweep"
    )
    parser.add_argument(
        "--policies", default=",".join(p for p in policy_names() if p not in NEEDS_OPTIONS)
    )
    parser.add_argument(
        "--slo", type=float, default=3.0, help="latency SLO in seconds of the fleet scenarios"
    )
    parser.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests = 5_000
        args.seeds = 2
    policies = args.policies.split(",")
    devices = fleet(args.per_class)
    capacity = sum(d.speed for d in devices)
    size = {"dist": "lognormal", "mean": 1.0, "sigma": args.sigma}
    open_load = parse_workload(
        {
            "requests": args.requests,
            "seed": args.seed,
            "size": size,
            "arrivals": {"process": "poisson", "load": args.load},
        }
    )
    batch = parse_workload(
        {
            "requests": args.requests,
            "seed": args.seed,
            "size": size,
            "arrivals": {"process": "closed"},
        }
    )
    alone = {"stealing": False}
    opened = {r.policy: r for r in simulate(devices, open_load, policies, dispatcher_options=alone)}
    stolen = {r.policy: r for r in simulate(devices, open_load, policies)}
    saturated = {r.policy: r for r in simulate(devices, batch, policies, dispatcher_options=alone)}
    rr_p99 = opened["round_robin"].metrics.p99
    rr_stolen_p99 = stolen["round_robin"].metrics.p99
    rows: list[dict[str, Any]] = []
    for name in policies:
        o, s = opened[name].metrics, saturated[name].metrics
        rows.append(
            {
                "policy": name,
                "p50": round(o.p50, 4),
                "p99": round(o.p99, 4),
                "p99_vs_round_robin": round(o.p99 / rr_p99, 4),
                "load_balance_factor": round(o.load_balance_factor, 4),
                "p99_with_stealing": round(stolen[name].metrics.p99, 4),
                "p99_with_stealing_vs_round_robin_with_stealing": round(
                    stolen[name].metrics.p99 / rr_stolen_p99, 4
                ),
                "saturated_work_throughput": round(s.work_throughput, 4),
                "saturated_vs_capacity": round(s.work_throughput / capacity, 4),
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    best = min(rows, key=lambda r: r["p99"])
    doc = {
        "benchmark": "policy quality",
        "fleet": {
            "speeds": [s for _, s in CLASSES],
            "per_class": args.per_class,
            "capacity": capacity,
        },
        "workload": {
            "requests": args.requests,
            "load": args.load,
            "size": f"lognormal mean 1 sigma {args.sigma}",
            "seed": args.seed,
        },
        "best_policy": best["policy"],
        "best_p99_vs_round_robin": best["p99_vs_round_robin"],
        "best_saturated_vs_capacity": best["saturated_vs_capacity"],
        "policies": rows,
        "default": {
            **SchedulerConfig().model_dump(include={"strategy", "queue_order", "aging"}),
            "overtake_weight": make_policy(SchedulerConfig().strategy).overtake_weight,
        },
        "default_vs_round_robin": scenarios(args),
        "seeds": seed_sweep(args),
        "other_cases": other_cases(args),
        "overtake_weight": overtake_sweep(args),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
