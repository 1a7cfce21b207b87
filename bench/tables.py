"""Render docs/benchmarks.md from the JSON results in bench/results/.

python bench/tables.py            # rewrites docs/benchmarks.md
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _sim_row(r: dict[str, Any], calibration: Any) -> list[Any]:
    return [
        r["devices"],
        f"{r['requests']:,}",
        r["wall_seconds"],
        f"{r['events_per_second']:,}",
        r["us_per_request"],
        r["p99_latency"],
        r.get("peak_rss_mib", "-"),  # results from before it was measured lack it
        calibration,
    ]


def simulator(doc: dict[str, Any]) -> str:
    rows = [
        _sim_row(r, doc.get("machine", {}).get("calibration_seconds", "-")) for r in doc["runs"]
    ]
    # Repeats of the headline run (bench/results/sim_headline_*.json), for the spread.
    for path in sorted(RESULTS.glob("sim_headline_*.json"), reverse=True):
        repeat = json.loads(path.read_text())
        calibration = repeat.get("machine", {}).get("calibration_seconds", "-")
        rows.insert(1, _sim_row(repeat["runs"][0], calibration))
    long = doc.get("long_run")
    long_note = (
        f"\n\nMemory stays bounded however long the simulated run: {long['requests']:,} requests "
        f"on one device without `expected_duration` ({long['simulated_seconds']:,} simulated "
        f"seconds: {long['simulated_seconds'] * 200 / 1e6:.0f} million samples at the first "
        f"1/200 s interval, before the series was bounded) peaked at {long['peak_rss_mib']} MiB "
        f"({long['rss_before_run_mib']} MiB before the run), with {long['series_points']} "
        f"series points, in {long['wall_seconds']} s."
        if long
        else ""
    )
    return (
        "## Simulator speed\n\n`python bench/bench_sim.py --out bench/results/sim.json` — "
        "`shortest_expected_delay`, Poisson arrivals at 85% of capacity, lognormal sizes; "
        "the first rows are the 1,000,000-request headline run and its repeats "
        "(`--devices '' --long 0`). Each run is in a fresh process; peak RSS is that process's "
        "high-water mark, the interpreter, numpy and hetero included (`rss_before_run_mib` in "
        "the JSON). The calibration column is the seconds a fixed pure-Python loop took "
        "during that run: this shared 2-core machine's speed drifts by tens of percent, so "
        "compare rows by it.\n\n"
        + _table(
            [
                "devices",
                "requests",
                "wall s",
                "events/s",
                "µs/request",
                "p99 latency s",
                "peak RSS MiB",
                "calibration s",
            ],
            rows,
        )
        + long_note
    )


def decisions(doc: dict[str, Any]) -> str:
    counts = sorted({r["devices"] for r in doc["results"]})
    by_policy: dict[str, dict[int, float]] = {}
    for r in doc["results"]:
        by_policy.setdefault(r["policy"], {})[r["devices"]] = r["us_per_decision"]
    rows = [[name, *(cost.get(n, "-") for n in counts)] for name, cost in by_policy.items()]
    return (
        "## Decision cost\n\n`python bench/bench_decisions.py --out bench/results/decisions.json`"
        " — µs per `pick`, median of repeats, random load in the view.\n\n"
        + _table(["policy", *(f"{n} devices" for n in counts)], rows)
    )


def quality(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["policy"],
            r["p50"],
            r["p99"],
            r["p99_vs_round_robin"],
            r["load_balance_factor"],
            r["saturated_vs_capacity"],
            r["p99_with_stealing"],
            r["p99_with_stealing_vs_round_robin_with_stealing"],
        ]
        for r in doc["policies"]
    ]
    fleet, work = doc["fleet"], doc["workload"]
    return (
        "## Policy quality\n\n`python bench/bench_quality.py --out bench/results/quality.json` — "
        f"speeds {' : '.join(str(s) for s in fleet['speeds'])}, {fleet['per_class']} devices "
        f"each; {work['requests']:,} requests, {work['size']}; open run at "
        f"{work['load']:.0%} load, saturated run a closed batch.\n\n"
        f"Best p99: **{doc['best_policy']}**, {doc['best_p99_vs_round_robin']} × round robin's;"
        f" its saturated throughput is {doc['best_saturated_vs_capacity']} × the sum of device "
        "capacities.\n\n"
        + "Each policy alone (work stealing off), then the open run again with stealing on (the "
        "dispatcher's default), which rescues even round robin.\n\n"
        + _table(
            [
                "policy",
                "p50 s",
                "p99 s",
                "p99 / round robin",
                "load balance factor",
                "saturated throughput / capacity",
                "p99 s, stealing",
                "p99 / round robin, both stealing",
            ],
            rows,
        )
        + ("\n\n" + versus_round_robin(doc) if "default_vs_round_robin" in doc else "")
    )


_CONFIGS = {
    "default": "**default**",
    "round_robin": "round robin",
    "round_robin_fifo": "round robin, FIFO",
    "shortest_expected_delay_fifo": "shortest_expected_delay, FIFO",
}


_LATENCY = ["mean", "p50", "p99", "SLO", "largest 1% mean", "largest 1% worst"]


def _latency_cells(r: dict[str, Any]) -> list[Any]:
    """The cells under ``_LATENCY`` for one run of bench_quality's ``latency_row``."""
    return [
        r["mean"],
        r["p50"],
        r["p99"],
        f"{r['slo_attainment']:.2%}",
        r["largest_1pct_mean"],
        r["largest_1pct_worst"],
    ]


def _wins(beats: dict[str, bool]) -> str:
    return ", ".join(name for name, won in beats.items() if won) or "none"


def versus_round_robin(doc: dict[str, Any]) -> str:
    default = doc["default"]
    rows = []
    for scenario in doc["default_vs_round_robin"]:
        for label, r in scenario["runs"].items():
            rows.append(
                [
                    scenario["scenario"] if label == "default" else "",
                    _CONFIGS[label],
                    *_latency_cells(r),
                    r["failed"],
                ]
            )
    verdicts = "\n".join(
        f"- {s['scenario']}: the default beats round robin on "
        f"{_wins(s['default_beats']['round_robin'])} (p99 {s['p99_vs_round_robin']} ×), and "
        f"round robin with FIFO queues on {_wins(s['default_beats']['round_robin_fifo'])} "
        f"(p99 {s['p99_vs_round_robin_fifo']} ×)."
        for s in doc["default_vs_round_robin"]
    )
    return (
        "### The default against round robin\n\n"
        f"The default scheduler (`{default['strategy']}`, `queue_order: "
        f"{default['queue_order']}`, aging {default['aging']}, work stealing on) beside round "
        "robin under the same settings, round robin with FIFO queues and the former best "
        "(`shortest_expected_delay` with FIFO queues). Latencies in seconds; SLO attainment is "
        "the share of items done within the scenario's SLO (3 s on the benchmark fleet, the "
        "workload's 5 s on the demo, whose config also sets a 30 s timeout); *largest 1%* is "
        "the mean and worst latency of the 1% of items with the highest cost.\n\n"
        + _table(["scenario", "scheduler", *_LATENCY, "failed"], rows)
        + "\n\n"
        + verdicts
        + ("\n\n" + overtake(doc) if "overtake_weight" in doc else "")
    )


def overtake(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["queue_order"],
            "-" if r["overtake_weight"] is None else r["overtake_weight"],
            *_latency_cells(r),
        ]
        for r in doc["overtake_weight"]
    ]
    return (
        f"### `overtake_weight`\n\n`{doc['default']['strategy']}` on the benchmark fleet at "
        f"{doc['workload']['load']:.0%} load with FIFO queues and with size order at weights 0 "
        "to 3 (the default is 2):\n\n" + _table(["queue order", "overtake_weight", *_LATENCY], rows)
    )


def plan(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["case"],
            r["device_types"],
            r["buckets"],
            r["rate"],
            r["median_seconds"],
            r["max_seconds"],
            ", ".join(f"{m} × {n}" for m, n in r["mix"].items()),
            r["price_per_hour"],
        ]
        for r in doc["cases"]
    ]
    check = doc["verify"]
    return (
        "## Fleet sizing\n\n`python bench/bench_plan.py --out bench/results/plan.json` — "
        "wall time of `plan_fleet` (the cheapest mix and every single-type fleet: one MILP per "
        "type plus one for the mix, each solved twice for the fewest-devices tie-break), median "
        "of repeats. `example` is `examples/plan.yaml`; `large` is 8 catalog types × 40 "
        "buckets at 20× its rate.\n\n"
        + _table(
            [
                "case",
                "device types",
                "buckets",
                "requests/s",
                "median s",
                "max s",
                "mix",
                "$/hour",
            ],
            rows,
        )
        + f"\n\nThe example plan in the simulator (`shortest_expected_delay`, "
        f"{check['requests']:,} requests): {check['attainment']:.2%} within the "
        f"{check['slo_latency']} s SLO (target {check['target']:.0%}); latency at the target "
        f"percentile {check['latency_at_percentile']} s; "
        f"{'meets' if check['meets_slo'] else 'misses'} the SLO."
    )


def main() -> int:
    parts = [
        "# Benchmarks\n\nGenerated by `python bench/tables.py` from `bench/results/*.json`."
        " Machine: 2 cores, no GPU (the `machine` field of each JSON file has the details)."
        " Benchmarks are never timed tests; rerun them with the commands shown."
    ]
    for name, render in (
        ("sim.json", simulator),
        ("decisions.json", decisions),
        ("quality.json", quality),
        ("plan.json", plan),
    ):
        doc = _load(name)
        if doc is not None:
            parts.append(render(doc))
    (ROOT / "docs" / "benchmarks.md").write_text("\n\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
