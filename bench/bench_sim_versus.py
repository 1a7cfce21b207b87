"""The simulator's cost per request beside another revision's, in one run: the hot path's
budget is "no slower than that revision", and this shared machine drifts by tens of percent
within an hour, so the two are measured in turns and compared by the median of their rounds.

Each round runs ``bench/bench_sim.py`` in this checkout and then in ``--tree`` (a ``git
worktree`` of the other revision, with its own bench_sim.py), with the same fleets, workload
and request counts; a tree's C kernel must be built in it first (``python setup.py build_ext
--inplace``). Prints JSON: every round's figures and, per run, both medians and their ratio
(this checkout over the other; below 1 is faster). ``--out`` saves it.

    git worktree add /tmp/old df9dfcb
    python bench/bench_sim_versus.py --tree /tmp/old --out bench/results/sim_versus.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from _common import emit, short_commit

HERE = Path(__file__).resolve().parent


def bench_sim(tree: Path, devices: str, requests: int, headline: int) -> list[dict[str, Any]]:
    """The runs of one ``bench_sim.py`` in ``tree`` (its own copy of the script)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sim.json"
        argv = [sys.executable, "bench/bench_sim.py", "--devices", devices]
        argv += ["--requests", str(requests), "--headline", str(headline), "--out", str(out)]
        if "--long" in (tree / "bench/bench_sim.py").read_text():
            argv += ["--long", "0"]  # older revisions have no long run
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"bench_sim.py failed in {tree}:\n{done.stderr[-2000:]}")
        runs: list[dict[str, Any]] = json.loads(out.read_text())["runs"]
    return runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tree", required=True, help="the other checkout (a git worktree)")
    parser.add_argument("--rounds", type=int, default=3, help="turns each (default: 3)")
    parser.add_argument("--devices", default="10,1000,10000")
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--headline", type=int, default=1_000_000)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    other = Path(args.tree).resolve()
    if not (other / "bench/bench_sim.py").is_file():
        parser.error(f"--tree {args.tree}: no bench/bench_sim.py there")
    trees = {"this": HERE.parent, "other": other}
    rounds: list[dict[str, Any]] = []
    for number in range(1, args.rounds + 1):
        for name, tree in trees.items():
            runs = bench_sim(tree, args.devices, args.requests, args.headline)
            rounds.append({"round": number, "tree": name, "runs": runs})
            figures = [(r["devices"], r["requests"], r["us_per_request"]) for r in runs]
            print(f"round {number}, {name}: {figures}", file=sys.stderr)
    summary = []
    keys = [(r["devices"], r["requests"]) for r in rounds[0]["runs"]]
    for devices, requests in keys:
        medians = {}
        for name in trees:
            figures = [
                r["us_per_request"]
                for row in rounds
                if row["tree"] == name
                for r in row["runs"]
                if (r["devices"], r["requests"]) == (devices, requests)
            ]
            medians[name] = statistics.median(figures)
        summary.append(
            {
                "devices": devices,
                "requests": requests,
                "us_per_request": medians["this"],
                "other_us_per_request": medians["other"],
                "ratio": round(medians["this"] / medians["other"], 3),
            }
        )
    doc = {
        "benchmark": "simulator versus another revision",
        "this": short_commit(HERE.parent),
        "other": short_commit(other),
        "summary": summary,
        "rounds": rounds,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
