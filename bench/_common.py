"""What every benchmark script shares: machine facts and writing its JSON."""

from __future__ import annotations

import json
import os
import platform
from typing import Any

import numpy as np


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
    }


def emit(doc: dict[str, Any], out: str | None) -> int:
    """Print ``doc`` as JSON and, with ``out``, save it there too."""
    text = json.dumps({**doc, "machine": machine()}, indent=2)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text + "\n")
    return 0
