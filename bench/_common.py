"""What every benchmark script shares: machine facts and writing its JSON."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
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
