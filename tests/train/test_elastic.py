"""Checkpoints and elastic recovery under ``hetero launch``: a killed rank and all ranks start
again; a rank lost for good and the others go on from the checkpoint at the smaller size, as a
fresh run at that size would; a lost rank that rejoins at a checkpoint. Each run re-profiles,
resumes from the checkpoint and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def train(
    folder: Path, *extra: str, nproc: str = "3", launch: tuple[str, ...] = (), restarts: int = 0
) -> subprocess.CompletedProcess[str]:
    """The example on ``nproc`` ranks under ``hetero launch`` (with ``launch``'s options),
    checkpointing every 4 steps in ``folder``, where it also saves the final parameters and
    each step's loss."""
    folder.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [
            *(sys.executable, "-m", "hetero", "launch", "--nproc", nproc, *launch),
            *("--max-restarts", str(restarts), str(ROOT / "examples" / "train_mlp.py")),
            *("--steps", "12", "--checkpoint-dir", str(folder / "checkpoints")),
            *("--checkpoint-every", "4", "--save-params", str(folder / "params.pt")),
            *("--loss-log", str(folder / "loss.jsonl")),
            *("--quiet", "--sample-time", "0.001", "--speeds", "1,0.5,0.25", *extra),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )


def losses(folder: Path) -> dict[int, tuple[int, float]]:
    """Each step's (ranks, loss over the dataset) after it, as the run that last reached it
    logged them."""
    lines = [json.loads(line) for line in (folder / "loss.jsonl").read_text().splitlines()]
    return {line["step"]: (line["ranks"], line["loss"]) for line in lines}


def largest_difference(a: Path, b: Path) -> float:
    x, y = torch.load(a / "params.pt"), torch.load(b / "params.pt")
    return max(float((x[k] - y[k]).abs().max()) for k in x)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run of 12 steps on 3 ranks."""
    folder = tmp_path_factory.mktemp("whole")
    done = train(folder)
    assert done.returncode == 0, done.stderr
    assert "resumed" not in done.stdout
    return folder


def test_a_killed_rank_resumes_from_the_checkpoint_and_matches_an_uninterrupted_run(
    tmp_path: Path, whole: Path
) -> None:
    killed = train(tmp_path, "--fail-at", "6", restarts=1)
    assert killed.returncode == 0, killed.stderr
    assert "local rank 1 exited with status 1; starting all 3 ranks again" in killed.stderr
    assert "resumed from the checkpoint of step 4" in killed.stdout
    assert largest_difference(whole, tmp_path) <= 1e-5


def test_after_a_rank_is_lost_the_others_train_as_a_fresh_run_at_that_size_would(
    tmp_path: Path,
) -> None:
    # Three ranks take the run to the checkpoint of step 4.
    start = train(tmp_path / "start", "--steps", "4", restarts=0)
    assert start.returncode == 0, start.stderr
    for name in ("shrunk", "fresh"):
        shutil.copytree(tmp_path / "start" / "checkpoints", tmp_path / name / "checkpoints")
    # From it, local rank 1 dies after step 6 on its first start and on its retry: it is lost,
    # and the two others go on from the checkpoint of step 4 to step 10.
    shrunk = train(
        tmp_path / "shrunk",
        *("--steps", "10", "--fail-at", "6", "--fail-starts", "2"),
        nproc="2:3",
        launch=("--rank-restarts", "1", "--rejoin-after", "3600"),
        restarts=1,
    )
    assert shrunk.returncode == 0, shrunk.stderr
    assert "local rank 1 exited with status 1; starting all 3 ranks again" in shrunk.stderr
    assert (
        "local rank 1 exited with status 1; it is lost: it failed 2 times, more than "
        "--rank-restarts 1; going on with 2 ranks (local ranks 0, 2) from the last checkpoint"
    ) in shrunk.stderr
    assert "2 ranks (gloo)" in shrunk.stdout
    assert "speeds 1 : 0.25; shares after profiling:" in shrunk.stdout  # recomputed for 2
    assert "resumed from the checkpoint of step 4" in shrunk.stdout
    # Two ranks (of the same speeds) started afresh from that same checkpoint.
    fresh = train(
        tmp_path / "fresh", *("--steps", "10", "--speeds", "1,0.25"), nproc="2", restarts=0
    )
    assert fresh.returncode == 0, fresh.stderr
    after, alone = losses(tmp_path / "shrunk"), losses(tmp_path / "fresh")
    assert sorted(alone) == [5, 6, 7, 8, 9, 10]
    assert {after[step][0] for step in alone} == {2}
    for step in alone:
        assert after[step][1] == pytest.approx(alone[step][1], rel=1e-6, abs=1e-7), step
    assert largest_difference(tmp_path / "shrunk", tmp_path / "fresh") <= 1e-5


def test_a_lost_rank_rejoins_at_the_next_checkpoint_and_the_run_ends_as_an_uninterrupted_one(
    tmp_path: Path, whole: Path
) -> None:
    # Local rank 1 dies after step 6 on the first start and is lost at once; the two others go
    # on from step 4, and since it may rejoin at once, all three leave at the checkpoint of
    # step 8 and go on from it together.
    grown = train(
        tmp_path,
        "--fail-at",
        "6",
        nproc="2:3",
        launch=("--rank-restarts", "0", "--rejoin-after", "0"),
    )
    assert grown.returncode == 0, grown.stderr
    assert "going on with 2 ranks (local ranks 0, 2)" in grown.stderr
    assert "local rank 1 may rejoin: the ranks regroup at their next checkpoint" in grown.stderr
    assert (
        "the ranks left at their checkpoint; starting 3 ranks (local ranks 0, 1, 2), local "
        "rank 1 rejoining" in grown.stderr
    )
    assert "3 ranks (gloo)" in grown.stdout
    assert "resumed from the checkpoint of step 8" in grown.stdout
    after, uninterrupted = losses(tmp_path), losses(whole)
    assert {step: ranks for step, (ranks, _) in after.items()} == {
        **dict.fromkeys(range(1, 5), 3),
        **dict.fromkeys(range(5, 9), 2),
        **dict.fromkeys(range(9, 13), 3),
    }
    for step, (_, loss) in uninterrupted.items():
        assert after[step][1] == pytest.approx(loss, rel=1e-6, abs=1e-7), step
    assert largest_difference(whole, tmp_path) <= 1e-5


def test_a_checkpoint_that_cannot_be_read_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "bad" / "checkpoints").mkdir(parents=True)
    (tmp_path / "bad" / "checkpoints" / "checkpoint.pt").write_text("not a checkpoint")
    done = train(tmp_path / "bad")
    assert done.returncode != 0
    assert "checkpoint_dir: cannot resume from" in done.stderr


def test_a_set_up_the_trainer_refuses_is_said_once_and_never_retried(tmp_path: Path) -> None:
    done = train(tmp_path, "--global-batch", "2", restarts=3)  # 2 samples a step for 3 ranks
    assert done.returncode == 1
    error = (
        "ConfigError: global_batch: a global batch smaller than the number of ranks: "
        "global_batch=2 with 3 ranks; use at least 3 (or fewer ranks)"
    )
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr  # every rank raised it; it is said once, by one
    assert re.fullmatch(
        rf"hetero launch: local rank \d refused its set-up before the first step: "
        rf"{re.escape(error)}",
        lines[0],
    )
    assert lines[1] == "error: not restarted: a configuration error is raised alike at every start"
