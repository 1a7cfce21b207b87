"""Checkpoints written in the background (``checkpoint_async``) and the latest ones kept
(``checkpoint_keep``), on one gloo rank: a checkpoint holds the state of its step though
training went on while it was written; a rank killed mid-write (a real process, a state large
enough that its write takes a while) resumes from the last complete checkpoint; a failed write
is raised in the training thread; the older checkpoints kept.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero.errors import ConfigError
from hetero.train import Trainer, TrainerOptions
from tests.train._models import LOSS, data, mlp, sgd, trained_in_one_process

# A buffer of 64M floats: a 256 MB checkpoint, whose write takes seconds where a step of the
# model takes milliseconds.
_TABLE = 64_000_000


class _Heavy(nn.Module):
    """The tests' MLP and a large buffer, which checkpoints hold and training never reads."""

    def __init__(self) -> None:
        super().__init__()
        self.net = mlp()
        self.register_buffer("table", torch.zeros(_TABLE))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _options(folder: Path, **kw: Any) -> TrainerOptions:
    return TrainerOptions(global_batch=8, profile_steps=1, checkpoint_dir=str(folder), **kw)


def _saved(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, weights_only=True)
    return state


def test_a_checkpoint_holds_its_step_while_training_goes_on(group: None, tmp_path: Path) -> None:
    trainer = Trainer(
        mlp(), sgd, LOSS, data(), _options(tmp_path, checkpoint_every=2, checkpoint_async=True)
    )
    trainer.step()
    trainer.step()  # a checkpoint of step 2, written in the background
    at_step_2 = {n: t.clone() for n, t in trainer.model.state_dict().items()}
    trainer.step()  # changes the parameters in place
    trainer.wait_for_checkpoint()
    state = _saved(tmp_path / "checkpoint.pt")
    assert state["steps"] == 2
    for name, tensor in state["model"].items():
        assert torch.equal(tensor, at_step_2[name]), name
    assert not torch.equal(trainer.model.state_dict()["0.weight"], at_step_2["0.weight"])
    assert not (tmp_path / "checkpoint.partial").exists()


def test_the_latest_checkpoints_are_kept(group: None, tmp_path: Path) -> None:
    options = _options(tmp_path, checkpoint_every=1, checkpoint_keep=2, checkpoint_async=True)
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    trainer.train(4, progress=False)
    assert sorted(p.name for p in tmp_path.glob("checkpoint*")) == [
        "checkpoint-000000003.pt",
        "checkpoint-000000004.pt",
        "checkpoint.pt",
    ]
    assert _saved(tmp_path / "checkpoint.pt")["steps"] == 4
    assert _saved(tmp_path / "checkpoint-000000003.pt")["steps"] == 3


def test_a_failed_background_write_is_raised_in_the_training_thread(
    group: None, tmp_path: Path
) -> None:
    blocked = tmp_path / "file"  # a file where the checkpoint's directory should be
    blocked.write_text("")
    options = _options(blocked, checkpoint_every=1, checkpoint_async=True)
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    with pytest.raises(FileExistsError):
        trainer.train(1, progress=False)


def test_checkpoint_keep_must_be_at_least_1() -> None:
    with pytest.raises(ConfigError, match=r"^checkpoint_keep: must be an integer >= 1 \(the"):
        TrainerOptions(global_batch=8, checkpoint_keep=0)


# ------------------------------------------------------------------ a rank killed mid-write


def _train_until_killed(folder: str, port: int) -> None:
    """One rank training ``_Heavy`` with a background checkpoint every 3 steps, until killed;
    each step's report is a line of ``steps.jsonl``."""
    from hetero import comm

    torch.set_num_threads(1)
    comm.init(0, 1, backend="gloo", master_port=port, timeout=60)
    options = _options(
        Path(folder),
        checkpoint_every=3,
        checkpoint_async=True,
        report_path=str(Path(folder, "steps.jsonl")),
    )
    Trainer(_Heavy(), sgd, LOSS, data(), options).train(10_000, progress=False)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_rank_killed_mid_write_resumes_from_the_last_complete_checkpoint(
    group: None, tmp_path: Path
) -> None:
    from hetero.commands.launch import free_port

    complete, partial = tmp_path / "checkpoint.pt", tmp_path / "checkpoint.partial"
    steps = tmp_path / "steps.jsonl"
    rank = multiprocessing.get_context("spawn").Process(
        target=_train_until_killed, args=(str(tmp_path), free_port())
    )
    rank.start()
    try:
        while not complete.exists():  # the first checkpoint is on disk
            assert rank.is_alive(), rank.exitcode
            time.sleep(0.005)
        # A later one being written, and training two more steps meanwhile: the write takes
        # seconds, so this happens at the first tries. Then kill the rank.
        while True:
            while not partial.exists():
                assert rank.is_alive(), rank.exitcode
                time.sleep(0.001)
            seen = _lines(steps)
            while partial.exists() and _lines(steps) < seen + 2:
                time.sleep(0.001)
            if partial.exists():
                assert rank.pid is not None
                os.kill(rank.pid, signal.SIGKILL)
                break
    finally:
        rank.kill()
        rank.join()
    assert partial.exists()  # killed mid-write
    last = _saved(complete)["steps"]
    assert last % 3 == 0 and _lines(steps) >= last + 2
    print(f"killed at step {_lines(steps)}, while writing a checkpoint; the last complete: {last}")

    options = _options(tmp_path, checkpoint_every=3, checkpoint_async=True)
    resumed = Trainer(_Heavy(), sgd, LOSS, data(), options)
    assert resumed.resumed_from == last
    reference = trained_in_one_process(mlp(), sgd, options, last)
    for p, q in zip(resumed.model.net.parameters(), reference.parameters(), strict=True):
        assert (p - q).abs().max() <= 1e-6
    resumed.train(3, progress=False)  # and it goes on, to its next checkpoint
    assert _saved(complete)["steps"] == last + 3
    assert not partial.exists()
