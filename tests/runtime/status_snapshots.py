"""A status snapshot as a running context writes one (``hetero.runtime.status``), for the tests
of the status files and of ``hetero top``."""

from __future__ import annotations

import time

from hetero.runtime.status import StatusSnapshot


def snapshot(pid: int, started: float | None = None, config: str | None = None) -> StatusSnapshot:
    now = time.time()
    return {
        "pid": pid,
        "started": now if started is None else started,
        "updated": now,
        "config": config,
        "tasks": {"submitted": 3, "done": 1, "failed": 0, "running": 1, "waiting": 1},
        "devices": [
            {
                "id": "a100-80gb:0",
                "model": "A100-80GB",
                "kind": "gpu",
                "emulated": True,
                "healthy": True,
                "speed": 240.5,
                "prior_speed": 250.0,
                "running": 1,
                "queued": 1,
                "done": 1,
                "failed": 0,
                "utilization": 55.0,
                "memory_used": 1024,
                "memory_total": 80 * 1024**3,
                "temperature": None,
            }
        ],
    }
