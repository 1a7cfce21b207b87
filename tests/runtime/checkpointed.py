"""A task that checkpoints each step and can be killed halfway: the fault tests of the local
engine and of Ray run it on their workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import hetero


def steps_with_checkpoints(n: int, marker: str) -> tuple[int, list[int], int]:
    """Counts to ``n``, checkpointing each step; reports its pid in ``marker`` and waits there
    at step n/2 on its first attempt so that the test can kill it."""
    state = hetero.restore({"step": 0, "ran": []})
    start = state["step"]
    first = start == 0
    while state["step"] < n:
        if first and state["step"] == n // 2:
            Path(f"{marker}.tmp").write_text(str(os.getpid()))
            os.replace(f"{marker}.tmp", marker)  # the test never reads it half written
            time.sleep(60)  # killed here
        state["ran"].append(state["step"])
        state["step"] += 1
        hetero.checkpoint(state)
    return start, state["ran"], os.getpid()
