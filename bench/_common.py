"""What every benchmark script shares: machine facts and writing its JSON."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def calibration_seconds() -> float:
    """Seconds for a fixed pure-Python loop. This shared machine's speed drifts by tens of
    percent within an hour, so every result carries it and rows are compared by it."""
    started = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    return round(time.perf_counter() - started, 3)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "calibration_seconds": calibration_seconds(),
    }


def emit(doc: dict[str, Any], out: str | None) -> int:
    """Print ``doc`` as JSON and, with ``out``, save it there too."""
    text = json.dumps({**doc, "machine": machine()}, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return 0


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def header(benchmark: str, out: str | None) -> dict[str, Any]:
    """A result's first fields: the benchmark (``bench/bench_<benchmark>.py``), the commit
    measured and the command that made it."""
    command = f"python bench/bench_{benchmark}.py" + (f" --out {out}" if out else "")
    return {"benchmark": benchmark, "revision": revision(), "command": command}


def revision() -> dict[str, Any]:
    """The commit measured, and whether ``src/`` differed from it (others edit it meanwhile)."""
    root = Path(__file__).resolve().parents[1]
    return {
        "commit": _git(root, "rev-parse", "HEAD") or None,
        "src_modified": bool(_git(root, "status", "--porcelain", "--", "src")),
    }


def short_commit(tree: Path) -> str:
    """The short commit checked out in ``tree`` (another checkout measured beside this one)."""
    return _git(tree, "rev-parse", "--short", "HEAD") or "unknown"


def command(script: str, argv: Sequence[str]) -> str:
    """The command line that reruns ``script`` (``bench/NAME.py``) with ``argv``."""
    python = os.path.relpath(sys.executable) if sys.prefix != sys.base_prefix else "python"
    if python.startswith(".."):
        python = "python"
    return " ".join([python, script, *map(shlex.quote, argv)])


@dataclass
class Run:
    """One run of a benchmark script, for its JSON: what reruns it, the revision measured and
    how loaded and how fast this shared machine was when it began. Make it before measuring."""

    script: str  # bench/NAME.py
    argv: Sequence[str]
    revision_before: dict[str, Any] = field(default_factory=revision)
    calibration: float = field(default_factory=calibration_seconds)
    load: float = field(default_factory=lambda: os.getloadavg()[0])
    started: float = field(default_factory=time.perf_counter)

    def header(self, benchmark: str, **versions: Any) -> dict[str, Any]:
        """The fields a result begins with; ``versions``: the packages measured (and flags)."""
        return {
            "benchmark": benchmark,
            "command": command(self.script, self.argv),
            **versions,
            "revision": self.revision_before,
            "revision_after": revision(),
        }

    def footer(self) -> dict[str, Any]:
        """The fields a result ends with: the machine's state at the start, the run's length."""
        return {
            "calibration_seconds": self.calibration,
            "load_average_before": round(self.load, 2),
            "wall_seconds": round(time.perf_counter() - self.started, 1),
        }


def spawned_ranks(worker: Callable[..., None], ranks: int, *args: Any) -> Any:
    """Run ``worker(rank, port, *args, out)`` on ``ranks`` processes (a free port for their
    process group) and return what rank 0 wrote to ``out`` as JSON."""
    import torch.multiprocessing as mp

    from hetero.commands.launch import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "rank0.json"))
        mp.spawn(worker, args=(free_port(), *args, out), nprocs=ranks, join=True)
        return json.loads(Path(out).read_text())
