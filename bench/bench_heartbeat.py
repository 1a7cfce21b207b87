"""Hang detection under ``hetero launch``: how long after a rank hangs the launcher names it, by
its heartbeat (``--heartbeat-timeout``), against the same launch without one, where the hang
surfaces only when a peer's collective times out (``hetero.comm.init``'s ``timeout``), blamed
on that peer.

Two gloo ranks all-reduce a small tensor in a loop; local rank 1 hangs before its fourth call
(``busy``: a Python loop; ``pause``: ``signal.pause()``; ``stop``: SIGSTOP) and writes the
``time.monotonic()`` at which it does (one clock for every process of the machine). The bench
reads the launcher's stderr as it comes and takes the time of its first line that names a
failed rank. Reported per case: the seconds from the hang to that line (median of
``--repeats``), the rank the line blames and the line itself. ``--max-restarts 0``: the launch
ends there.

Prints JSON; ``--out`` saves it.

    python bench/bench_heartbeat.py --out bench/results/heartbeat.json
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common
from _common import emit

JOB = """
import os, signal, sys, time
import torch
from hetero import comm

out, how, collective_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
slot = int(os.environ["LOCAL_RANK"])
comm.init(backend="gloo", timeout=collective_timeout)
x = torch.ones(4)
for step in range(6):
    if slot == 1 and step == 3:
        with open(f"{out}/hung_at", "w") as f:
            f.write(repr(time.monotonic()))
        if how == "busy":
            while True:
                pass
        elif how == "pause":
            signal.pause()
        else:
            os.kill(os.getpid(), signal.SIGSTOP)
    comm.all_reduce(x)
comm.destroy()
"""

_BLAMED = re.compile(r"hetero launch: local rank (\d+) ")


def run(how: str, heartbeat: float, collective_timeout: float) -> dict[str, Any]:
    """One launch: the seconds from the hang to the launcher's line naming a rank."""
    with tempfile.TemporaryDirectory() as folder:
        job = Path(folder) / "job.py"
        job.write_text(JOB)
        launcher = subprocess.Popen(
            [
                *(sys.executable, "-m", "hetero", "launch", "--nproc", "2"),
                *("--max-restarts", "0", "--heartbeat-timeout", str(heartbeat)),
                *(str(job), folder, how, str(collective_timeout)),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        assert launcher.stderr is not None
        line, seen = "", None
        for text in launcher.stderr:
            if _BLAMED.match(text):
                line, seen = text.strip(), time.monotonic()
                break
        launcher.communicate(timeout=collective_timeout + 120)
        hung_at = float((Path(folder) / "hung_at").read_text())
    match = _BLAMED.match(line)
    return {
        "seconds": None if seen is None else round(seen - hung_at, 2),
        "blamed": int(match.group(1)) if match else None,
        "line": line,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0)
    parser.add_argument("--collective-timeout", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    cases: dict[str, Any] = {}
    plans = [(how, args.heartbeat_timeout) for how in ("busy", "pause", "stop")]
    plans.append(("busy", 0.0))  # no heartbeat: the peer's collective times out
    for how, heartbeat in plans:
        runs = [run(how, heartbeat, args.collective_timeout) for _ in range(args.repeats)]
        found = [r["seconds"] for r in runs if r["seconds"] is not None]
        cases[f"{how}, heartbeat {'off' if not heartbeat else f'{heartbeat:g} s'}"] = {
            "median_seconds_to_blame": round(statistics.median(found), 2) if found else None,
            "seconds": [r["seconds"] for r in runs],
            "blamed": [r["blamed"] for r in runs],
            "line": runs[-1]["line"],
        }
    doc = {
        "bench": "heartbeat",
        "hung_rank": 1,
        "heartbeat_timeout": args.heartbeat_timeout,
        "collective_timeout": args.collective_timeout,
        "repeats": args.repeats,
        "load_average": os.getloadavg(),
        "cases": cases,
        **_common.revision(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
