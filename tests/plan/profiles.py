"""A saved engine profile of a model on a device, for the tests of what reads one (a serving
plan's menu entry, the autoscaler's replicas): what they take from it is the calibration."""

from __future__ import annotations

from pathlib import Path

from hetero.plan.engine_profile import EngineProfile, ProbePlan, ProbeResult
from hetero.serve.engine_model import Calibration


def save_profile(path: Path, shape: str, device: str, calibration: Calibration) -> Path:
    """A profile of ``shape`` on ``device`` with ``calibration`` (one probe), saved at
    ``path``."""
    EngineProfile(
        model_shape=shape,
        device=device,
        calibration=calibration,
        http_s=0.0,
        probes=(ProbeResult("itl", 1, 0.05, 0.05),),
        model="m",
        url="http://127.0.0.1:8000",
        taken_at="2026-01-02T03:04:05+00:00",
        plan=ProbePlan(ttft_prompts=(32,), itl_batches=(1,), load_clients=()),
    ).save(path)
    return path
