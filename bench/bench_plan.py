"""Fleet sizing: seconds for ``plan_fleet`` (the cheapest mix plus every single-type fleet, i.e.
one MILP per type plus one for the mix, each solved twice for the tie-break) and the simulator
check of the example plan.

Cases: the example spec (3 device types × 10 length buckets) and a larger one (8 types × 40
buckets at 20× the rate). The figure is the median wall time over repeats. Prints JSON;
``--out`` saves it.

    python bench/bench_plan.py --out bench/results/plan.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from _common import emit

from hetero.plan.sizing import plan_fleet
from hetero.plan.sizing_spec import PlanSpec, load_plan
from hetero.plan.verification import verify

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plan.yaml"
LARGE_MENU = ["T4", "L4", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100-SXM-80GB", "H200-141GB"]


def large_spec(example: PlanSpec) -> PlanSpec:
    data = example.model_dump()
    data["workload"].update(rate=example.workload.rate * 20, buckets=40)
    data["devices"] = [{"model": m} for m in LARGE_MENU]
    return PlanSpec.model_validate(data)


def timed(spec: PlanSpec, repeats: int) -> dict[str, Any]:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        plan = plan_fleet(spec)
        seconds.append(time.perf_counter() - started)
    return {
        "device_types": len(spec.devices),
        "buckets": len(plan.buckets),
        "rate": spec.workload.rate,
        "median_seconds": round(statistics.median(seconds), 4),
        "max_seconds": round(max(seconds), 4),
        "repeats": repeats,
        "devices": plan.devices,
        "mix": plan.mix,
        "price_per_hour": round(plan.price_per_hour, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--requests", type=int, default=50_000, help="for the simulator check")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    example = load_plan(EXAMPLE)
    cases = [
        {"case": "example", **timed(example, args.repeats)},
        {"case": "large", **timed(large_spec(example), args.repeats)},
    ]
    plan = plan_fleet(example)
    started = time.perf_counter()
    check = verify(plan, example, requests=args.requests)
    doc = {
        "benchmark": "plan",
        "command": "python bench/bench_plan.py --out bench/results/plan.json",
        "cases": cases,
        "verify": {
            "requests": check.requests,
            "attainment": round(check.attainment, 5),
            "target": check.target,
            "meets_slo": check.meets_slo,
            "latency_at_percentile": round(check.latency_at_percentile, 4),
            "slo_latency": example.slo.latency,
            "wall_seconds": round(time.perf_counter() - started, 3),
        },
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
