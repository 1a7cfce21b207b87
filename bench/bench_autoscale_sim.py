"""A simulated day of diurnal traffic with bursts: ``hetero serve --autoscale``'s policy and
sizer against static plans, on engine-faithful replicas behind the router's dispatcher.

- Model and fleet: Llama 3.1 70B on two A100-80GB, two H100-SXM-80GB or four L40S per
  replica (catalog prices); each replica an ``EngineModel`` (continuous batching,
  chunked prefill, paged KV) in ``hetero.sim.engine_fleet``, routed by the ``slo`` strategy with
  the SLO below; a replica asked for is billed at once and serves after its start-up time.
- Traffic: Poisson arrivals whose rate follows a day (``--trough`` at midnight to ``--peak`` at
  noon, a raised cosine), plus three bursts of ``--burst`` more requests/s for 10 minutes (9:00,
  14:00, 20:00); prompts lognormal (mean 600 tokens), outputs lognormal (mean 200).
- SLO: TTFT 2 s and TPOT 80 ms for 99 % of requests.
- Configurations: **autoscale** (``ScalePolicy`` with the default hysteresis, its sizer the
  serving planner at the cap ``hetero plan --verify`` found for the peak); **static peak**
  (that verified plan for the peak rate, all day); **static mean** (the plan for the day's mean
  rate at the same cap); each **one GPU type alone** at the peak (its cost from the planner; not
  simulated).
- Reported: cost of the day ($, replica-seconds × price), SLO attainment, scale actions per
  hour (the most in any hour and the mean), requests failed, and a timeline per 5 minutes.

Prints JSON; ``--out`` saves it.

    python bench/bench_autoscale_sim.py --out bench/results/autoscale_sim.json
"""

from __future__ import annotations

import argparse
import bisect
import math
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
from _common import emit, revision

from hetero.plan.serving import ServingPlan, ServingPlanner
from hetero.plan.serving_spec import ServingPlanSpec, parse_serving_plan
from hetero.plan.serving_verify import replace_utilization, serving_plan_verified
from hetero.serve.autoscale.policy import PolicyOptions, ReplicaType, ScalePolicy
from hetero.serve.autoscale.simulated import SimulatedAutoscaler, replica_name
from hetero.serve.autoscale.sizing import PlanSizer, TypeOption
from hetero.serve.records import RouterOptions
from hetero.sim.engine_fleet import EngineFleetSimulator, FleetResult, replica_kind

DAY = 86_400.0
TTFT, TPOT = 2.0, 0.08
# Replicas of about one size (160-192 GB of HBM each), as an operator would offer them: the
# static plans and the autoscaler choose among the same three.
MENU = [
    {"model": "A100-80GB", "tensor_parallel": [2]},
    {"model": "H100-SXM-80GB", "tensor_parallel": [2]},
    {"model": "L40S", "tensor_parallel": [4]},
]
STARTUP = {"A100-80GB": 150.0, "H100-SXM-80GB": 120.0, "L40S": 180.0}  # loading 140 GB
BURSTS = (9 * 3600.0, 14 * 3600.0, 20 * 3600.0)
BURST_S = 600.0


def spec(rate: float) -> ServingPlanSpec:
    return parse_serving_plan(
        {
            "model": "llama-3.1-70b",
            "workload": {
                "rate": rate,
                "prompt_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.8},
                "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
            },
            "slo": {"ttft": TTFT, "tpot": TPOT, "percentile": 99},
            "devices": MENU,
        }
    )


def rate_at(t: float, args: argparse.Namespace) -> float:
    day = (t % DAY) / DAY
    rate = args.trough + (args.peak - args.trough) * (1 - math.cos(2 * math.pi * day)) / 2
    return rate + sum(args.burst for b in BURSTS if b <= t % DAY < b + BURST_S)


def arrivals(args: argparse.Namespace, base: ServingPlanSpec) -> Iterator[tuple[float, int, int]]:
    """Non-homogeneous Poisson arrivals by thinning, lengths drawn from the spec's."""
    rng = np.random.default_rng(args.seed)
    prompt, output = base.lengths
    top = args.peak + args.burst
    t, end = 0.0, args.hours * 3600.0
    while True:
        t += rng.exponential(1.0 / top)
        if t >= end:
            return
        if rng.random() * top <= rate_at(t, args):
            i = int(rng.integers(len(prompt)))
            yield t, max(1, int(prompt[i])), max(1, int(output[i]))


def mean_rate(args: argparse.Namespace) -> float:
    ts = np.linspace(0, args.hours * 3600.0, 20_000, endpoint=False)
    return float(np.mean([rate_at(t, args) for t in ts]))


def fleet_of(plan: ServingPlan) -> list[tuple[str, Any]]:
    return [
        (replica_name(o.option.name, k), o.option.engine)
        for o in plan.options
        if o.option.engine is not None
        for k in range(o.replicas)
    ]


def options() -> RouterOptions:
    return RouterOptions(strategy="slo", slo_ttft=TTFT, slo_tpot=TPOT)


def summary(result: FleetResult, prices: dict[str, float], wall: float) -> dict[str, Any]:
    cost = 0.0
    seconds: Counter[str] = Counter()
    for r in result.replicas:
        seconds[r.kind] += r.billed_seconds
        cost += r.billed_seconds / 3600 * prices[r.kind]
    return {
        "requests": result.requests,
        "attainment": result.attainment(TTFT, TPOT),
        "failed": int((~result.done).sum()),
        "failures": dict(result.failure_reasons()),
        "cost": cost,
        "replica_hours": {k: v / 3600 for k, v in seconds.items()},
        "wall_seconds": wall,
    }


def kind_prices(plan: ServingPlan) -> dict[str, float]:
    """$ per hour of each replica kind the simulator bills (``GPU`` or ``GPUx<TP>``)."""
    return {
        replica_kind(o.option.engine): o.option.price
        for o in plan.options
        if o.option.engine is not None
    }


def run_static(
    plan: ServingPlan, args: argparse.Namespace, base: ServingPlanSpec
) -> dict[str, Any]:
    started = time.perf_counter()
    sim = EngineFleetSimulator(fleet_of(plan), options=options(), priors="engine")
    result = sim.run(arrivals(args, base), until=args.hours * 3600.0)
    out = summary(result, kind_prices(plan), time.perf_counter() - started)
    out["replicas"] = plan.replicas
    out["price_per_hour"] = plan.price_per_hour
    return out


def priced_static(plan: ServingPlan, args: argparse.Namespace) -> dict[str, Any]:
    """A static plan's cost without simulating it: its replicas are billed the whole day, so the
    cost is its price by the hours; what it serves is not measured (``--static-priced``)."""
    hours = args.hours
    return {
        "simulated": False,
        "cost": plan.price_per_hour * hours,
        "replica_hours": {
            replica_kind(o.option.engine): o.replicas * hours
            for o in plan.options
            if o.option.engine is not None
        },
        "replicas": plan.replicas,
        "price_per_hour": plan.price_per_hour,
    }


def run_autoscaled(
    planner_spec: ServingPlanSpec, args: argparse.Namespace, base: ServingPlanSpec
) -> dict[str, Any]:
    started = time.perf_counter()
    planner = ServingPlanner(planner_spec)
    engines = {o.name: o for o in planner.problem.options if o.engine is not None}
    types = [
        ReplicaType(name, startup_s=STARTUP[o.gpu], max_count=64) for name, o in engines.items()
    ]
    hysteresis = PolicyOptions()
    sizer = PlanSizer(
        planner_spec,
        {n: TypeOption(o.gpu, o.tensor_parallel) for n, o in engines.items()},
        interval=args.tick,
        hold=hysteresis.down_after,
    )
    policy = ScalePolicy(types, sizer, hysteresis)
    specs = {name: o.engine for name, o in engines.items() if o.engine is not None}
    scaler = SimulatedAutoscaler(policy, specs)
    first = planner.plan(rate_at(0.0, args), explain=False)  # the night's fleet, to start
    initial = [
        (scaler.initial(o.option.name), o.option.engine)
        for o in first.options
        if o.option.engine is not None
        for _ in range(o.replicas)
    ]
    sim = EngineFleetSimulator(initial, options=options(), priors="engine")
    result = sim.run(
        arrivals(args, base),
        until=args.hours * 3600.0,
        interval=args.tick,
        on_tick=scaler,
        slo=(TTFT, TPOT),
    )
    prices = {replica_kind(o.engine): o.price for o in engines.values() if o.engine is not None}
    out = summary(result, prices, time.perf_counter() - started)
    per_hour = Counter(int(t // 3600) for t, *_ in scaler.actions)
    out["actions"] = len(scaler.actions)
    out["actions_max_per_hour"] = max(per_hour.values(), default=0)  # by the clock's hours
    times = sorted(t for t, *_ in scaler.actions)
    out["actions_max_in_any_hour"] = max(  # over every hour-long window, however placed
        (bisect.bisect_left(times, t + 3600.0) - i for i, t in enumerate(times)), default=0
    )
    out["actions_mean_per_hour"] = len(scaler.actions) / args.hours
    out["decisions"] = [
        {"t": round(t, 1), "kind": k, "type": n, "reason": r} for t, k, n, r in scaler.actions
    ]
    series = result.series((TTFT, TPOT))
    step = max(1, int(300 // result.interval))
    out["timeline"] = {
        "t": series.t[::step].tolist(),
        "arrivals_per_s": series.arrivals_per_s[::step].tolist(),
        "replicas": {k: v[::step].tolist() for k, v in series.replicas.items()},
        "attainment": [None if math.isnan(a) else a for a in series.attainment[::step]],
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peak", type=float, default=3.0, help="requests/s at noon")
    parser.add_argument("--trough", type=float, default=0.3, help="requests/s at midnight")
    parser.add_argument("--burst", type=float, default=2.0, help="requests/s more in a burst")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours from 0:00")
    parser.add_argument("--tick", type=float, default=30.0, help="seconds between decisions")
    parser.add_argument("--check-requests", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--static-priced",
        action="store_true",
        help="price the static plans (billed all day) without simulating what they serve: "
        "the autoscaled day alone is simulated (about a third of the run)",
    )
    parser.add_argument("--out", help="save the JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    peak = args.peak + args.burst
    peak_plan, checks = serving_plan_verified(spec(peak), requests=args.check_requests)
    cap = peak_plan.max_utilization
    base = replace_utilization(spec(peak), cap)
    mean = mean_rate(args)
    mean_plan = ServingPlanner(replace_utilization(spec(mean), cap)).plan()
    doc: dict[str, Any] = {
        "benchmark": "autoscale_sim",
        "revision": revision(),
        "command": "python bench/bench_autoscale_sim.py"
        + (" --static-priced" if args.static_priced else "")
        + (f" --seed {args.seed}" if args.seed else "")
        + (f" --out {args.out}" if args.out else ""),
        "model": "llama-3.1-70b",
        "slo": {"ttft": TTFT, "tpot": TPOT, "percentile": 99},
        "traffic": {
            "peak": args.peak,
            "trough": args.trough,
            "burst": args.burst,
            "burst_minutes": BURST_S / 60,
            "mean": mean,
            "hours": args.hours,
        },
        "startup_s": STARTUP,
        "tick_s": args.tick,
        "cap": cap,
        "peak_checks": [c.to_dict() for c in checks],
        "single_type_at_peak": dict(peak_plan.single_type),
        "static_peak": priced_static(peak_plan, args)
        if args.static_priced
        else run_static(peak_plan, args, base),
        "static_mean": priced_static(mean_plan, args)
        if args.static_priced
        else run_static(mean_plan, args, base),
        "autoscale": run_autoscaled(base, args, base),
    }
    a, s = doc["autoscale"], doc["static_peak"]
    doc["autoscale_cost_vs_static_peak"] = a["cost"] / s["cost"] if s["cost"] else None
    doc["seconds"] = time.perf_counter() - started
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
