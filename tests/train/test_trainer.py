"""The Trainer on 3 gloo ranks over 127.0.0.1: exact gradients against one process training on the
same global batches, shares that follow emulated speeds, rebalancing, a rank with share 0, the
collective errors and the step reports.

The three processes start once per module (starting torch costs most of the time) and run every
scenario in order; the tests then check what each rank recorded.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero.errors import ConfigError
from hetero.train import StepReport, Trainer, TrainerOptions
from tests.train._models import LOSS, adam, data, mlp, sgd, trained_in_one_process
from tests.train._ranks import (
    Outcome,
    each,
    errors,
    matching_one_process,
    recorded,
    run_ranks,
)

WORLD = 3
STEPS = 5


def _exact(
    make_optimizer: Callable[[Any], torch.optim.Optimizer], **kw: Any
) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, seed=3, **kw)
        trainer = Trainer(mlp(), make_optimizer, LOSS, data(), options)
        reports = trainer.train(STEPS, progress=False)
        reference = trained_in_one_process(mlp(), make_optimizer, options, STEPS)
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(trainer.model.parameters(), reference.parameters(), strict=True)
        )
        return {"diff": diff, "reports": [r.to_dict() for r in reports]}

    return scenario


def _speeds(rank: int) -> Any:
    speed = (1.0, 0.5, 0.25)[rank]
    options = TrainerOptions(
        global_batch=28,
        drop_last=True,
        profile_steps=2,
        rebalance_every=0,
        speed=speed,
        emulate_sample_time=0.002,
        report_path=str(Path(_OUT, "speeds.jsonl")),
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    reports = trainer.train(4, progress=False)
    return {
        "shares": trainer.shares,
        "throughputs": trainer.throughputs,
        "reports": [r.to_dict() for r in reports],
    }


def _rebalance(rank: int) -> Any:
    """Equal speeds, then rank 0 slows to a quarter (as a throttled device would) after step 3:
    the rebalance at step 6 moves work away from it."""
    options = TrainerOptions(
        global_batch=24, rebalance_every=3, profile_steps=2, speed=1.0, emulate_sample_time=0.002
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    before = list(trainer.shares)
    reports = trainer.train(3, progress=False)
    if rank == 0:
        trainer.options = dataclasses.replace(options, speed=0.25)
    reports += trainer.train(4, progress=False)
    return {"before": before, "after": trainer.shares, "reports": [r.to_dict() for r in reports]}


def _options_run(**kw: Any) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, profile_steps=1, **kw)
        trainer = Trainer(mlp(), sgd, LOSS, data(), options)
        return [r.to_dict() for r in trainer.train(2, progress=False)]

    return scenario


def _batchnorm(rank: int) -> Any:
    """A model with buffers, which DDP broadcasts at the first forward of each step, and a rank
    with share 0: every rank must reach that broadcast before the barrier."""
    torch.manual_seed(0)
    norm = nn.BatchNorm1d(16)
    model = nn.Sequential(nn.Linear(8, 16), norm, nn.Tanh(), nn.Linear(16, 4))
    options = TrainerOptions(
        global_batch=24, shares=(16, 8, 0), micro_batch=6, profile_steps=1, drop_last=True
    )
    trainer = Trainer(model, sgd, LOSS, data(), options)
    trainer.train(3, progress=False)
    return int(norm.num_batches_tracked)


def _small_batch(rank: int) -> Any:
    Trainer(mlp(), sgd, LOSS, data(), TrainerOptions(global_batch=2))


def _other_model(rank: int) -> Any:
    Trainer(mlp(17 if rank == 2 else 16), sgd, LOSS, data(), TrainerOptions(global_batch=24))


def _other_seed(rank: int) -> Any:
    Trainer(mlp(), sgd, LOSS, data(), TrainerOptions(global_batch=24, seed=int(rank == 1)))


SCENARIOS: dict[str, Callable[[int], Any]] = {
    # Unequal shares; micro_batch 4 makes ranks 0 and 1 accumulate (14 = 4+4+3+3, 7 = 4+3).
    # 60 samples: the third step is an epoch's partial last batch of 12, the fourth a new epoch.
    "sgd": _exact(sgd, shares=(14, 7, 3), micro_batch=4),
    "adam": _exact(adam, shares=(5, 16, 3), micro_batch=5),
    "share0": _exact(sgd, shares=(16, 8, 0), micro_batch=6),
    "speeds": _speeds,
    "rebalance": _rebalance,
    "batchnorm": _batchnorm,
    "bf16": _options_run(mixed_precision="bf16"),
    "fp16": _options_run(mixed_precision="fp16"),
    "fp16_compression": _options_run(compression="fp16", bucket_cap_mb=0.001),
    "powersgd": _options_run(compression="powersgd"),
    "small_batch": _small_batch,
    "other_model": _other_model,
    "other_seed": _other_seed,
}
_OUT = ""  # set in each rank by run_ranks: where scenarios write files


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trainer")
    run_ranks(__name__, WORLD, path)
    return path


@pytest.fixture(scope="module")
def ranks(out: Path) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return recorded(out, WORLD)


@pytest.mark.parametrize("name", ["sgd", "adam", "share0"])
def test_parameters_match_one_process_training_on_the_global_batches(
    ranks: list[dict[str, Outcome]], name: str
) -> None:
    reports = matching_one_process(ranks, name, 1e-5)[0]["reports"]
    assert [r["global_batch"] for r in reports] == [24, 24, 12, 24, 24]
    assert [r["epoch"] for r in reports] == [0, 0, 0, 1, 1]


def test_a_share_above_micro_batch_accumulates_over_micro_batches(
    ranks: list[dict[str, Outcome]],
) -> None:
    first = each(ranks, "sgd")[0]["reports"][0]
    assert first["shares"] == [14, 7, 3]
    assert [(r["samples"], r["micro_batches"]) for r in first["ranks"]] == [(14, 4), (7, 2), (3, 1)]
    zero = each(ranks, "share0")[0]["reports"][0]
    assert [(r["samples"], r["micro_batches"]) for r in zero["ranks"]] == [(16, 3), (8, 2), (0, 0)]


def test_shares_follow_emulated_speeds(ranks: list[dict[str, Outcome]]) -> None:
    results = each(ranks, "speeds")
    assert all(r["shares"] == results[0]["shares"] for r in results)
    shares = results[0]["shares"]
    assert sum(shares) == 28
    # 28 × 1 : 0.5 : 0.25 over 1.75 = 16 : 8 : 4; profiling on a busy machine may shift one.
    for share, ideal in zip(shares, (16, 8, 4), strict=True):
        assert abs(share - ideal) <= 1, shares
    rates = results[0]["throughputs"]
    assert rates[0] > 1.6 * rates[1] > 1.6 * 1.6 * rates[2], rates


def test_step_reports_split_each_rank_time_and_measure_efficiency(
    ranks: list[dict[str, Outcome]], out: Path
) -> None:
    reports = each(ranks, "speeds")[0]["reports"]
    assert [r["step"] for r in reports] == [1, 2, 3, 4]
    lines = [json.loads(line) for line in (out / "speeds.jsonl").read_text().splitlines()]
    assert lines == reports
    for report in reports:
        assert report["global_batch"] == 28
        for r in report["ranks"]:
            assert min(r["compute_seconds"], r["comm_seconds"], r["idle_seconds"]) >= 0
            assert r["compute_seconds"] + r["idle_seconds"] + r["comm_seconds"] <= (
                r["step_seconds"] + 1e-6
            )
            assert r["samples_per_second"] == pytest.approx(r["samples"] / r["compute_seconds"])
        # Emulated compute: samples × 2 ms / speed, real compute included.
        speeds = (1, 0.5, 0.25)
        emulated = [0.002 * r["samples"] / s for r, s in zip(report["ranks"], speeds, strict=True)]
        for r, expected in zip(report["ranks"], emulated, strict=True):
            assert expected <= r["compute_seconds"] < expected + 0.03
        assert report["ideal_seconds"] == pytest.approx(28 / sum(report["throughputs"]))
        assert 0.5 < report["efficiency"] <= 1.05
        assert report["efficiency"] == pytest.approx(
            report["ideal_seconds"] / report["step_seconds"]
        )


def test_rebalancing_moves_work_from_a_rank_that_slowed_down(
    ranks: list[dict[str, Outcome]],
) -> None:
    results = each(ranks, "rebalance")
    before, after = results[0]["before"], results[0]["after"]
    assert max(before) - min(before) <= 1, before
    assert after[0] <= 4 and sum(after) == 24, after
    reports = results[0]["reports"]
    # Only at the end of a window; the one at step 3 may shift a sample on measurement noise.
    assert [i for i, r in enumerate(reports, 1) if r["rebalanced"]] in ([6], [3, 6])
    assert reports[5]["next_shares"] == after
    assert reports[6]["shares"] == after
    assert all(r["after"] == after for r in results)


def test_a_model_with_buffers_trains_with_a_rank_of_share_0(
    ranks: list[dict[str, Outcome]],
) -> None:
    # Rank 0's buffers reach the others at the first forward of each step; in the last step
    # rank 0 then ran 3 micro-batches, rank 1 two and rank 2 one empty pass.
    tracked = each(ranks, "batchnorm")
    assert [tracked[0] - t for t in tracked] == [0, 1, 2]


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp16_compression", "powersgd"])
def test_precision_and_compression_options_train(
    ranks: list[dict[str, Outcome]], name: str
) -> None:
    reports = each(ranks, name)[0]
    assert [r["global_batch"] for r in reports] == [24, 24]


def test_a_global_batch_smaller_than_the_ranks_is_refused_on_every_rank(
    ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(ranks, "small_batch")
    assert message == (
        "ConfigError: global_batch: a global batch smaller than the number of ranks: "
        "global_batch=2 with 3 ranks; use at least 3 (or fewer ranks)"
    )


def test_ranks_with_different_models_or_options_are_refused_on_every_rank(
    ranks: list[dict[str, Outcome]],
) -> None:
    assert errors(ranks, "other_model") == (
        "ConfigError: rank 2: rank 2's model differs from rank 0's: '0.weight' is [17, 8] "
        "torch.float32 on rank 2, [16, 8] torch.float32 on rank 0"
    )
    assert errors(ranks, "other_seed") == (
        "ConfigError: rank 1: option seed=1 differs from rank 0's 0: it must be the same on "
        "every rank"
    )


# ------------------------------------------------------------------------- one process


def test_options_name_every_bad_value() -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=0, micro_batch=0, compression="zip", speed=-1.0, shares=(1, 2))  # type: ignore[arg-type]
    assert str(info.value) == (
        "5 problems:\n"
        "  - global_batch: must be an integer >= 1, got 0\n"
        "  - micro_batch: must be an integer >= 1 (the most samples one forward/backward on this"
        " rank holds; None for no cap): a rank that cannot hold one sample cannot train, got 0\n"
        "  - speed: must be a number from 1e-06 to 1e+06 or None, got -1.0\n"
        "  - compression: must be one of none, fp16, powersgd, int8, topk, got 'zip'\n"
        "  - shares: must sum to global_batch=0, got [1, 2] (sum 3)"
    )


def test_a_trainer_needs_a_process_group() -> None:
    with pytest.raises(ConfigError, match=r"call hetero.comm.init\(\)"):
        Trainer(mlp(), sgd, LOSS, data(), TrainerOptions(global_batch=8))


def test_step_report_derives_ideal_time_and_efficiency() -> None:
    from hetero.train.report import RankReport

    ranks = (RankReport(0, 6, 1, 0.3, 0.0, 0.01, 0.4), RankReport(1, 2, 1, 0.2, 0.1, 0.01, 0.5))
    report = StepReport(1, 0, (6, 2), (20.0, 10.0), ranks)
    assert report.global_batch == 8
    assert report.step_seconds == 0.5
    assert report.ideal_seconds == pytest.approx(8 / 30)
    assert report.efficiency == pytest.approx(8 / 30 / 0.5)
    assert report.to_dict()["ranks"][0]["samples_per_second"] == 20.0
    assert report.summary().startswith("step 1: 500.0 ms, ideal 266.7 ms (53%), shares 6/2")


def test_the_example_spawns_its_ranks_and_prints_the_report(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    report = tmp_path / "steps.jsonl"
    command = [sys.executable, str(root / "examples" / "train_mlp.py"), "--steps", "4"]
    command += ["--sample-time", "0.001", "--report", str(report)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # Speeds from examples/train_fleet.yaml: an A100, a V100 and a T4, relative to the A100.
    assert (
        "3 ranks (gloo), global batch 63, speeds 1 : 0.401 : 0.208; shares after profiling: "
        in (out)
    )
    assert re.search(r"^median step [\d.]+ ms, ideal [\d.]+ ms .*: efficiency \d+%$", out, re.M)
    assert re.search(r"^loss over the dataset: [\d.]+ -> [\d.]+$", out, re.M)
    assert len(report.read_text().splitlines()) == 4
