"""The step's loss, gradient clipping, the LR-scheduler hook and the equal split on 3 gloo ranks
over 127.0.0.1, against one process training on the same global batches: the loss each step
reports is the global batch's mean, the clipped update and the norm before clipping are one
process's, the learning rate follows the scheduler as in one process (and resumes with a
checkpoint), and ``split="equal"`` keeps plain DDP's equal shares with the same exact update.
A run's report is drawn as HTML.

The three processes start once per module and run every scenario in order; the tests then
check what each rank recorded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau, StepLR

from hetero.train import HeteroSampler, Trainer, TrainerOptions
from tests.train._models import LOSS, adam, data, mlp, relative_difference, sgd
from tests.train._ranks import Outcome, each, errors, recorded, run_ranks

WORLD = 3
STEPS = 5
MAX_NORM = 0.3  # below the MLP's gradient norms (about 0.5 to 1.5): every step clips

Optimizer = Callable[[Any], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], LRScheduler]


class _Blocks(nn.Module):
    """A ModuleList of residual blocks (each its own FSDP unit) between two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def _blocks() -> nn.Module:
    torch.manual_seed(0)
    return _Blocks()


def _step_lr(optimizer: torch.optim.Optimizer) -> LRScheduler:
    return StepLR(optimizer, step_size=2, gamma=0.5)


def _plateau(optimizer: torch.optim.Optimizer) -> LRScheduler:
    # mode="max" with no patience: the rate halves at every step whose loss is no new high,
    # so it changes within a few steps, and only by the loss the trainer reports.
    return ReduceLROnPlateau(optimizer, mode="max", factor=0.5, patience=0)


def one_process(
    model: nn.Module,
    make_optimizer: Optimizer,
    options: TrainerOptions,
    steps: int,
    scheduler: SchedulerFactory | None = None,
) -> tuple[nn.Module, list[dict[str, Any]]]:
    """One process on the whole of each global batch, in the sampler's order: the model after
    ``steps`` steps, and each step's mean loss, gradient norm before clipping (with
    ``max_grad_norm``) and learning rate."""
    optimizer = make_optimizer(model.parameters())
    lr_scheduler = None if scheduler is None else scheduler(optimizer)
    dataset, batch = data(), options.global_batch
    records: list[dict[str, Any]] = []
    epoch = 0
    while len(records) < steps:
        order = HeteroSampler.global_order(len(dataset), options.seed, epoch, options.shuffle)
        for k in range(0, len(dataset), batch):
            if len(records) == steps or (options.drop_last and k + batch > len(dataset)):
                break
            x, y = dataset[order[k : k + batch]]
            loss = LOSS(model(x), y) / len(x)
            optimizer.zero_grad()
            loss.backward()
            norm = None
            if options.max_grad_norm is not None:
                norm = float(nn.utils.clip_grad_norm_(model.parameters(), options.max_grad_norm))
            lr = float(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if isinstance(lr_scheduler, ReduceLROnPlateau):
                lr_scheduler.step(loss.item())
            elif lr_scheduler is not None:
                lr_scheduler.step()
            records.append({"loss": loss.item(), "grad_norm": norm, "lr": lr})
        epoch += 1
    return model, records


def _exact(
    make_model: Callable[[], nn.Module],
    make_optimizer: Optimizer,
    scheduler: SchedulerFactory | None = None,
    *,
    html: bool = False,
    **kw: Any,
) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, seed=3, **kw)
        trainer = Trainer(make_model(), make_optimizer, LOSS, data(), options, scheduler=scheduler)
        reports = trainer.train(STEPS, progress=False)
        if html and rank == 0:
            trainer.write_report(Path(_OUT, "run.html"))
        model, records = one_process(make_model(), make_optimizer, options, STEPS, scheduler)
        return {
            "diff": relative_difference(trainer.model_state_dict(), model),
            "reports": [r.to_dict() for r in reports],
            "one_process": records,
        }

    return scenario


def _instance_scheduler(rank: int) -> Any:
    """An optimizer object and a scheduler object over it; rank 2's share is 0."""
    model = mlp()
    optimizer = sgd(model.parameters())
    warmup = LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 3))
    options = TrainerOptions(global_batch=24, seed=3, shares=(16, 8, 0), micro_batch=6)
    trainer = Trainer(model, optimizer, LOSS, data(), options, scheduler=warmup)
    reports = trainer.train(STEPS, progress=False)
    warmed = lambda o: LambdaLR(o, lambda step: min(1.0, (step + 1) / 3))  # noqa: E731
    reference, records = one_process(mlp(), sgd, options, STEPS, warmed)
    return {
        "diff": relative_difference(model.state_dict(), reference),
        "reports": [r.to_dict() for r in reports],
        "one_process": records,
    }


def _resumed_scheduler(rank: int) -> Any:
    """3 steps with a checkpoint at step 2, then a new trainer resumes there for 3 more: its
    learning rate goes on from step 2's, as one uninterrupted run's does."""
    folder = str(Path(_OUT, "checkpoints"))
    options = TrainerOptions(
        global_batch=24, seed=3, shares=(12, 8, 4), checkpoint_dir=folder, checkpoint_every=2
    )
    first = Trainer(mlp(), sgd, LOSS, data(), options, scheduler=_step_lr)
    first.train(3, progress=False)
    again = Trainer(mlp(), sgd, LOSS, data(), options, scheduler=_step_lr)
    reports = again.train(3, progress=False)
    _, records = one_process(mlp(), sgd, options, 5, _step_lr)
    return {
        "resumed_from": again.resumed_from,
        "lrs": [r.lr for r in reports],
        "expected": [r["lr"] for r in records[2:5]],
    }


def _equal(rank: int) -> Any:
    """split="equal" on ranks of speeds 1 : 0.5 : 0.25, rebalancing every 2 steps: the shares
    stay equal (26 = 9 + 9 + 8), while the throughputs are still measured."""
    options = TrainerOptions(
        global_batch=26,
        seed=3,
        split="equal",
        drop_last=True,
        rebalance_every=2,
        profile_steps=1,
        speed=(1.0, 0.5, 0.25)[rank],
        emulate_sample_time=0.002,
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    reports = trainer.train(4, progress=False)
    model, records = one_process(mlp(), sgd, options, 4)
    return {
        "diff": relative_difference(trainer.model.state_dict(), model),
        "reports": [r.to_dict() for r in reports],
        "one_process": records,
        "throughputs": trainer.throughputs,
    }


def _bad_scheduler(rank: int) -> Any:
    Trainer(mlp(), sgd, LOSS, data(), TrainerOptions(global_batch=24), scheduler=42)  # type: ignore[arg-type]


def _scheduler_of_another_optimizer(rank: int) -> Any:
    other = sgd(mlp().parameters())
    Trainer(mlp(), sgd, LOSS, data(), TrainerOptions(global_batch=24), scheduler=StepLR(other, 2))


SCENARIOS: dict[str, Callable[[int], Any]] = {
    # Unequal shares with accumulation (14 = 4+4+3+3, 7 = 4+3); 60 samples: the third step is
    # an epoch's partial last batch of 12, the fourth a new epoch.
    "clip_step_lr": _exact(
        mlp,
        sgd,
        _step_lr,
        html=True,
        shares=(14, 7, 3),
        micro_batch=4,
        max_grad_norm=MAX_NORM,
    ),
    "fsdp_clip_plateau": _exact(
        _blocks,
        adam,
        _plateau,
        shares=(5, 16, 3),
        micro_batch=5,
        max_grad_norm=MAX_NORM,
        sharding="fsdp",
    ),
    "profiled_clip": _exact(mlp, adam, max_grad_norm=MAX_NORM, profile_steps=1),
    "instance_scheduler": _instance_scheduler,
    "resumed_scheduler": _resumed_scheduler,
    "equal": _equal,
    "bad_scheduler": _bad_scheduler,
    "scheduler_of_another_optimizer": _scheduler_of_another_optimizer,
}
_OUT = ""  # set in each rank by run_ranks: where scenarios write files


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trainer_loss")
    run_ranks(__name__, WORLD, path)
    return path


@pytest.fixture(scope="module")
def ranks(out: Path) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return recorded(out, WORLD)


def _same_as_one_process(result: dict[str, Any]) -> None:
    """Each step's loss, gradient norm and learning rate are one process's."""
    reports, expected = result["reports"], result["one_process"]
    assert len(reports) == len(expected)
    for report, alone in zip(reports, expected, strict=True):
        assert report["loss"] == pytest.approx(alone["loss"], rel=1e-6), report["step"]
        assert report["lr"] == pytest.approx(alone["lr"], rel=1e-12), report["step"]
        if alone["grad_norm"] is None:
            assert report["grad_norm"] is None
        else:
            assert report["grad_norm"] == pytest.approx(alone["grad_norm"], rel=1e-5)


@pytest.mark.parametrize(
    "name", ["clip_step_lr", "fsdp_clip_plateau", "profiled_clip", "instance_scheduler", "equal"]
)
def test_loss_clipping_and_learning_rate_match_one_process(
    ranks: list[dict[str, Outcome]], name: str
) -> None:
    results = each(ranks, name)
    diffs = [r["diff"] for r in results]
    print(f"{name}: relative parameter difference per rank {diffs}")
    assert max(diffs) <= 1e-5
    for result in results:  # every rank reports the same figures, one process's
        assert result["reports"] == results[0]["reports"]
        _same_as_one_process(result)


def test_clipping_engaged_on_every_step_and_the_partial_batch_is_its_own_mean(
    ranks: list[dict[str, Outcome]],
) -> None:
    reports = each(ranks, "clip_step_lr")[0]["reports"]
    assert [r["global_batch"] for r in reports] == [24, 24, 12, 24, 24]
    assert all(r["grad_norm"] > MAX_NORM for r in reports)
    assert [r["lr"] for r in reports] == [0.1, 0.1, 0.05, 0.05, 0.025]  # StepLR(2, 0.5)


def test_a_plateau_scheduler_follows_the_reported_loss(ranks: list[dict[str, Outcome]]) -> None:
    rates = [r["lr"] for r in each(ranks, "fsdp_clip_plateau")[0]["reports"]]
    assert len(set(rates)) > 1, rates


def test_a_resumed_run_goes_on_with_the_scheduler_where_the_checkpoint_left_it(
    ranks: list[dict[str, Outcome]],
) -> None:
    for result in each(ranks, "resumed_scheduler"):
        assert result["resumed_from"] == 2
        assert result["lrs"] == result["expected"] == [0.05, 0.05, 0.025]


def test_the_equal_split_keeps_equal_shares_whatever_the_speeds(
    ranks: list[dict[str, Outcome]],
) -> None:
    result = each(ranks, "equal")[0]
    assert [r["shares"] for r in result["reports"]] == [[9, 9, 8]] * 4
    assert not any(r["rebalanced"] for r in result["reports"])
    rates = result["throughputs"]
    assert rates[0] > 1.6 * rates[2], rates  # measured all the same: a speed split would differ


def test_a_scheduler_that_is_not_one_is_refused_on_every_rank(
    ranks: list[dict[str, Outcome]],
) -> None:
    assert errors(ranks, "bad_scheduler") == (
        "ConfigError: scheduler: must be a torch LR scheduler (torch.optim.lr_scheduler) over "
        "the trainer's optimizer, or a function that makes one from it (lambda optimizer: "
        "StepLR(optimizer, 10)), got 42"
    )
    assert errors(ranks, "scheduler_of_another_optimizer") == (
        "ConfigError: scheduler: StepLR steps another optimizer than the trainer's (one made by "
        "an optimizer function is the trainer's own): give a function that makes the scheduler "
        "from the trainer's optimizer, e.g. lambda optimizer: StepLR(optimizer, ...)"
    )


def test_the_run_is_drawn_with_each_rank_and_the_loss_of_every_step(
    ranks: list[dict[str, Outcome]], out: Path
) -> None:
    page = (out / "run.html").read_text()
    reports = each(ranks, "clip_step_lr")[0]["reports"]
    assert page.startswith("<!DOCTYPE html>") and page.count("data:image/png;base64,") == 2
    for rank in range(WORLD):
        assert f"<td>rank {rank}</td>" in page
    listed = re.search(r"<pre>(.*?)</pre>", page, re.S)
    assert listed is not None
    assert listed.group(1).splitlines() == [f"{r['step']} {r['loss']:.6g}" for r in reports]
    assert all(math.isfinite(r["loss"]) for r in reports)
