"""What every benchmark script shares: machine facts and writing its JSON."""

from __future__ import annotations

import json
import os
import platform
import time
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
