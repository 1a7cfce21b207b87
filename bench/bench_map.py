"""``ctx.map`` makespan on a closed batch: 600 equal tasks over the docs' emulated fleet
(examples/emulated_fleet.yaml: H100, 2×A100, V100, T4), costed (``cost=1``, paced by cost at a
small ``time_scale``) and uncosted (a CPU spin, paced by the CPU time it used, relative to this
host: the default ``time_scale``), at ``batch_size`` "auto" and 1, under the default strategy
and round robin (the anchor).

Efficiency = ideal / makespan, ideal = total work over the fleet's total speed (costed: items ×
time_scale / Σ speed; uncosted: items × the spin's CPU seconds × ``ctx.cpu_time_scale`` /
Σ speed, as the worker paces it). ``share_ratio`` per device: its share of the items over its
share of the speed (1.0 is exact). Before the timed map, each worker runs one task of another
kind (so the performance model learns nothing from it) that imports this module, as a user's
first task would: the 0.2-0.5 s the workers take to import it is start-up, not placement.
Prints JSON; ``--out`` saves it.

    python bench/bench_map.py --out bench/results/map.json
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from typing import Any

import _common
from _common import emit

import hetero
from hetero.config import load_config
from hetero.devices.fleet import build_fleet

FLEET = "examples/emulated_fleet.yaml"
SPIN = 0.005  # CPU seconds of one uncosted task on this host


def spin(_: int) -> str:
    started = time.process_time()
    while time.process_time() - started < SPIN:
        pass
    return hetero.get_current_device().id


def costed(_: int) -> str:
    return hetero.get_current_device().id


warm = hetero.task(kind="warm-up")(costed)


def run(
    strategy: str | None, fn: Any, items: int, batch_size: int | str, time_scale: float | None
) -> dict[str, Any]:
    kwargs = {} if strategy is None else {"strategy": strategy}
    with hetero.Context(FLEET, time_scale=time_scale, **kwargs).start() as ctx:
        for f in [ctx.submit(warm.with_options(devices=(d.id,)), 0) for d in ctx.devices]:
            f.result()
        speeds = {d.id: d.speed for d in ctx.devices}
        started = time.perf_counter()
        ran = collections.Counter(ctx.map(fn, range(items), batch_size=batch_size))
        makespan = time.perf_counter() - started
        name = ctx.strategy
        per_item = SPIN * ctx.cpu_time_scale if time_scale is None else time_scale
    total = sum(speeds.values())
    ideal = items * per_item / total
    return {
        "strategy": name,
        "task": "uncosted" if fn is spin else "costed",
        "batch_size": batch_size,
        "items": items,
        "makespan_s": round(makespan, 3),
        "ideal_s": round(ideal, 3),
        "efficiency": round(ideal / makespan, 3),
        "items_per_device": dict(ran),
        "share_ratio": {d: round((ran[d] / items) / (s / total), 2) for d, s in speeds.items()},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=600)
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--quick", action="store_true", help="200 items, batch_size auto only")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    items = 200 if args.quick else args.items
    sizes: list[int | str] = ["auto"] if args.quick else ["auto", 1]
    build_fleet(load_config(FLEET))  # fail early on a bad fleet
    rows = [
        run(strategy, fn, items, size, None if fn is spin else args.time_scale)
        for fn in (hetero.task(cost=1.0)(costed), spin)
        for size in sizes
        for strategy in (None, "round_robin")
    ]
    for row in rows:
        row.update(_common.revision())
    return emit(
        {
            "benchmark": "map",
            "command": _common.command("bench/bench_map.py", argv),
            "rows": rows,
        },
        args.out,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
