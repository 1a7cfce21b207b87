"""Instructions per simulated request, counted by valgrind: the hot path's cost without the
noise of a shared machine's clock.

Each point runs the simulator (``shortest_expected_delay``, Poisson arrivals at 85% of capacity,
lognormal sizes, as ``bench_sim.py``) under ``valgrind --tool=cachegrind`` twice, at two request
counts, and divides the difference in instructions by the difference in requests, so that
start-up, imports and warm-up cancel out. ``--tree`` measures another checkout of the project
(a ``git worktree`` of an older revision) in the same run; ``--queue-order`` compares the
device queues' orders. ``--cache`` also simulates the caches and the branch predictor (a
32 KiB 8-way L1 and an 8 MiB 16-way last level, fixed so that runs on other machines compare)
and reports their misses per request: where equal instructions take unequal time. A tree's
C kernel must be built in it first (``python setup.py build_ext --inplace``). Skipped, with a
message, where valgrind is not installed. Prints JSON; ``--out`` saves it.

    git worktree add /tmp/old df9dfcb
    python bench/bench_instructions.py --tree /tmp/old --devices 10,1000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import command, emit, short_commit

HERE = Path(__file__).resolve().parent
# One run, in the checkout named by PYTHONPATH: its own bench_sim fleet and workload.
RUN = """
import sys
sys.path.insert(0, sys.argv[1] + "/bench")
import bench_sim
from hetero.sched.registry import make_policy
from hetero.sim.engine import Simulator
from hetero.sim.run import expected_duration
from hetero.sim.workload import generate, parse_workload
n, requests, order = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
workload = parse_workload({"requests": requests, "arrivals": {"process": "poisson", "load": 0.85},
    "size": {"dist": "lognormal", "mean": 1.0, "sigma": 1.0}, "seed": 0})
options = {} if order == "default" else {"queue_order": order}
sim = Simulator(bench_sim.fleet(n, 0), make_policy("shortest_expected_delay"),
    dispatcher_options=options)
duration = expected_duration(workload, sim.capacity)
sim.run(generate(workload, sim.capacity), expected_duration=duration)
"""


# Cachegrind's summary lines: what each counts.
_COUNTS = {
    "instructions": r"I\s+refs:\s+([\d,]+)",
    "d1_misses": r"D1\s+misses:\s+([\d,]+)",
    "ll_misses": r"LL misses:\s+([\d,]+)",
    "mispredicts": r"Mispredicts:\s+([\d,]+)",
}
_CACHES = ["--cache-sim=yes", "--branch-sim=yes", "--D1=32768,8,64", "--LL=8388608,16,64"]


def counts(tree: Path, devices: int, requests: int, order: str, cache: bool) -> dict[str, int]:
    """What valgrind counts for one run of ``requests`` in ``tree``: instructions, and with
    ``cache`` the simulated L1 and last-level misses and mispredicted branches."""
    # A fixed hash seed: string hashes decide how dicts probe, and so the count.
    # One BLAS thread: idle ones spin, and valgrind counts their instructions for as long as the
    # run lasts under it.
    env = {
        **os.environ,
        "PYTHONPATH": str(tree / "src"),
        "PYTHONHASHSEED": "0",
        "OPENBLAS_NUM_THREADS": "1",
    }
    argv = [
        "valgrind",
        "--tool=cachegrind",
        *(_CACHES if cache else ["--cache-sim=no"]),
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        "-c",
        RUN,
        str(tree),
        str(devices),
        str(requests),
        order,
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wanted = _COUNTS if cache else {"instructions": _COUNTS["instructions"]}
    found = {name: re.search(pattern, done.stderr) for name, pattern in wanted.items()}
    if done.returncode != 0 or not all(found.values()):
        raise RuntimeError(f"valgrind run failed in {tree}:\n{done.stderr[-2000:]}")
    return {name: int(m.group(1).replace(",", "")) for name, m in found.items() if m}


def per_request(
    tree: Path, devices: int, order: str, low: int, high: int, cache: bool
) -> dict[str, Any]:
    more = counts(tree, devices, high, order, cache)
    fewer = counts(tree, devices, low, order, cache)
    row: dict[str, Any] = {
        "tree": str(tree),
        "revision": short_commit(tree),
        "devices": devices,
        "queue_order": order,
        "requests": [low, high],
        **{
            f"{name}_per_request": round((more[name] - fewer[name]) / (high - low), ndigits)
            for name, ndigits in ((k, None if k == "instructions" else 1) for k in more)
        },
        # The C placement kernel, where the tree has one and it is built (else numpy's path).
        "kernel": any((tree / "src/hetero/sched").glob("_kernel*.so")),
    }
    print(json.dumps(row), file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", default="10,1000")
    parser.add_argument(
        "--tree", action="append", default=[], help="another checkout to measure too"
    )
    parser.add_argument(
        "--queue-order",
        default="default",
        help="comma-separated: default, size, fifo (older trees know only their default)",
    )
    parser.add_argument(
        "--cache", action="store_true", help="also simulate the caches and branch predictor"
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        print("valgrind is not installed: nothing measured", file=sys.stderr)
        return 0
    trees = [HERE.parent, *(Path(t).resolve() for t in args.tree)]
    rows = []
    for n in (int(x) for x in args.devices.split(",")):
        # Enough requests past the warm-up that every device has finished a few.
        low, high = (10_000, 50_000) if n <= 100 else (20 * n, 40 * n)
        for tree in trees:
            orders = args.queue_order.split(",") if tree == HERE.parent else ["default"]
            rows.extend(per_request(tree, n, order, low, high, args.cache) for order in orders)
    # The command that reruns it, each other checkout named by its revision.
    named = {t: f"<{short_commit(Path(t).resolve())}>" for t in args.tree}
    given = sys.argv[1:] if argv is None else argv
    rerun = command("bench/bench_instructions.py", [named.get(a, a) for a in given])
    doc = {"benchmark": "instructions per simulated request", "command": rerun, "results": rows}
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
