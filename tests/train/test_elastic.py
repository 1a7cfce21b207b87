"""Checkpoints and elastic recovery: a rank killed mid-training under ``hetero launch``; all
ranks start again, re-profile, resume from the checkpoint and end where an uninterrupted run
ends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def train(folder: Path, *extra: str, restarts: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "hetero", "launch", "--nproc", "3"),
            *("--max-restarts", str(restarts), str(ROOT / "examples" / "train_mlp.py")),
            *("--steps", "12", "--checkpoint-dir", str(folder / "checkpoints")),
            *("--checkpoint-every", "4", "--save-params", str(folder / "params.pt")),
            *("--quiet", "--sample-time", "0.001", *extra),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_a_killed_rank_resumes_from_the_checkpoint_and_matches_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    whole = train(tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr
    killed = train(tmp_path / "killed", "--fail-at", "6", restarts=1)
    assert killed.returncode == 0, killed.stderr
    assert "rank 1 exited with status 1; starting all 3 ranks again" in killed.stderr
    assert "resumed from the checkpoint of step 4" in killed.stdout
    assert "resumed" not in whole.stdout
    a = torch.load(tmp_path / "whole" / "params.pt")
    b = torch.load(tmp_path / "killed" / "params.pt")
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= 1e-5


def test_a_checkpoint_that_cannot_be_read_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad" / "checkpoints").mkdir(parents=True)
    (tmp_path / "bad" / "checkpoints" / "checkpoint.pt").write_text("not a checkpoint")
    done = train(tmp_path / "bad")
    assert done.returncode != 0
    assert "checkpoint_dir: cannot resume from" in done.stderr
