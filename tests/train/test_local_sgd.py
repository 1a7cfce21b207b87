"""Local SGD (``local_sgd_every``) on 3 gloo ranks over 127.0.0.1: K = 1 is DDP's exact update
(against one process on the same global batches); K > 1 is each rank stepping on its own share
and the replicas averaged, weighted by samples, every K steps and at checkpoints, exactly as one
process simulating the ranks does; its loss after 20 steps stays within the documented bound
of exact DDP's; the bytes it communicates; and the options it refuses.

The three processes start once per module and run every scenario in order; the tests then
check what each rank recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero.errors import ConfigError
from hetero.train import HeteroSampler, Trainer, TrainerOptions
from tests.train._models import (
    LOSS,
    adam,
    data,
    mlp,
    relative_difference,
    sgd,
    trained_in_one_process,
)
from tests.train._ranks import Outcome, each, matching_one_process, run_ranks

WORLD = 3
# The loss over the dataset after BOUND_STEPS steps of local SGD every 4 steps, relative to
# exact DDP's on the same global batches (docs/training.md#local-sgd; measured: 0.26%).
BOUND_STEPS = 20
LOSS_BOUND = 0.02


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _dataset_loss(model: nn.Module) -> float:
    x, y = data()[:]
    with torch.no_grad():
        return float(LOSS(model(x), y) / len(x))


def _exact_k1(rank: int) -> Any:
    options = TrainerOptions(
        global_batch=24, seed=3, shares=(14, 7, 3), micro_batch=4, local_sgd_every=1
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    trainer.train(5, progress=False)
    reference = trained_in_one_process(mlp(), sgd, options, 5)
    return {"diff": relative_difference(trainer.model.state_dict(), reference)}


def _local(
    make_optimizer: Callable[[Any], torch.optim.Optimizer], steps: int, **kw: Any
) -> Callable[[int], Any]:
    """``steps`` steps of local SGD; each rank's parameters after every step."""

    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, seed=3, profile_steps=1, **kw)
        trainer = Trainer(mlp(), make_optimizer, LOSS, data(), options)
        after = []
        reports = []
        for _ in range(steps):
            reports.append(trainer.step().to_dict())
            after.append(_flat(trainer.model))
        return {"after": after, "reports": reports}

    return scenario


def _bound(rank: int) -> Any:
    """The loss over the dataset after 20 steps, with local SGD every 4 steps and exact."""
    losses = {}
    for name, every in (("local", 4), ("exact", None)):
        options = TrainerOptions(
            global_batch=24, seed=3, shares=(14, 7, 3), profile_steps=1, local_sgd_every=every
        )
        trainer = Trainer(mlp(), sgd, LOSS, data(), options)
        trainer.train(BOUND_STEPS, progress=False)
        losses[name] = _dataset_loss(trainer.model)
    return losses


def _resumed(rank: int) -> Any:
    """Local SGD every 3 steps with a checkpoint every 2: the steps that average, and a run
    resumed from the checkpoint of step 4, whose replicas start equal."""
    folder = str(Path(_OUT, "local-checkpoints"))
    options = TrainerOptions(
        global_batch=24,
        seed=3,
        shares=(14, 7, 3),
        profile_steps=1,
        local_sgd_every=3,
        checkpoint_dir=folder,
        checkpoint_every=2,
    )
    trainer = Trainer(mlp(), sgd, LOSS, data(), options)
    reports = [r.to_dict() for r in trainer.train(5, progress=False)]
    resumed = Trainer(mlp(), sgd, LOSS, data(), options)
    return {
        "reports": reports,
        "resumed_from": resumed.resumed_from,
        "resumed": _flat(resumed.model),
    }


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "k1": _exact_k1,
    # Unequal shares, accumulation (14 = 4+4+3+3), an epoch's partial last batch (step 3).
    "k3_sgd": _local(sgd, 6, shares=(14, 7, 3), micro_batch=4, local_sgd_every=3),
    "k2_adam_share0": _local(adam, 4, shares=(16, 8, 0), local_sgd_every=2),
    "bound": _bound,
    "resumed": _resumed,
}
_OUT = ""  # set in each rank by run_ranks: where scenarios write files


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("local_sgd"))


def local_sgd_in_one_process(
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    shares: tuple[int, ...],
    every: int,
    steps: int,
) -> list[nn.Module]:
    """One process simulating the ranks: each replica steps on its piece of every global batch
    (its mean loss; no step without samples), and every ``every`` steps all become their mean
    weighted by the samples each had since the last average."""
    dataset = data()
    models = [mlp() for _ in shares]
    optimizers = [make_optimizer(m.parameters()) for m in models]
    samplers = [HeteroSampler(len(dataset), 24, shares, r, seed=3) for r in range(len(shares))]
    samples = [0] * len(shares)
    done, epoch = 0, 0
    while done < steps:
        for sampler in samplers:
            sampler.set_epoch(epoch)
        for pieces in zip(*(s.batches() for s in samplers), strict=True):
            for r, piece in enumerate(pieces):
                if not piece:
                    continue
                x, y = dataset[piece]
                optimizers[r].zero_grad()
                (LOSS(models[r](x), y) / len(piece)).backward()
                optimizers[r].step()
                samples[r] += len(piece)
            done += 1
            if done % every == 0:
                _average(models, samples)
                samples = [0] * len(shares)
            if done == steps:
                break
        epoch += 1
    return models


def _average(models: list[nn.Module], weights: list[int]) -> None:
    with torch.no_grad():
        for tensors in zip(*(m.parameters() for m in models), strict=True):
            mean = sum(w * t for w, t in zip(weights, tensors, strict=True)) / sum(weights)
            for t in tensors:
                t.copy_(mean)


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_every_step_is_exact_ddp(ranks: list[dict[str, Outcome]]) -> None:
    matching_one_process(ranks, "k1", 1e-5)


@pytest.mark.parametrize(
    ("name", "make_optimizer", "shares", "every", "steps"),
    [
        ("k3_sgd", sgd, (14, 7, 3), 3, 6),
        ("k2_adam_share0", adam, (16, 8, 0), 2, 4),
    ],
)
def test_replicas_step_alone_and_average_weighted_by_samples(
    ranks: list[dict[str, Outcome]],
    name: str,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    shares: tuple[int, ...],
    every: int,
    steps: int,
) -> None:
    results = each(ranks, name)
    for step in range(1, steps + 1):
        after = [r["after"][step - 1] for r in results]
        equal = all(torch.equal(a, after[0]) for a in after)
        # The replicas agree right after an average and only then (a rank of share 0 keeps
        # the last average's parameters, so two differ at least).
        assert equal == (step % every == 0), step
    reference = local_sgd_in_one_process(make_optimizer, shares, every, steps)
    for rank, result in enumerate(results):
        diff = _relative(result["after"][-1], _flat(reference[rank]))
        print(f"{name}: rank {rank} against one process simulating the ranks: {diff:.1e}")
        assert diff <= 1e-6


def test_the_loss_stays_within_the_bound_of_exact_ddp(ranks: list[dict[str, Outcome]]) -> None:
    losses = each(ranks, "bound")[0]
    gap = abs(losses["local"] - losses["exact"]) / losses["exact"]
    print(f"loss over the dataset after {BOUND_STEPS} steps: {losses}, {gap:.2%} apart")
    assert gap <= LOSS_BOUND


def test_only_averaging_steps_communicate_the_parameters(
    ranks: list[dict[str, Outcome]],
) -> None:
    reports = each(ranks, "k3_sgd")[0]["reports"]
    parameter_bytes = 4 * sum(p.numel() for p in mlp().parameters())
    assert [r["dense_bytes"] for r in reports] == [parameter_bytes] * 6
    assert [r["comm_bytes"] for r in reports] == [0, 0, parameter_bytes] * 2


def test_checkpoints_average_and_a_resumed_run_starts_from_the_average(
    ranks: list[dict[str, Outcome]],
) -> None:
    results = each(ranks, "resumed")
    averaged = [r["step"] for r in results[0]["reports"] if r["comm_bytes"]]
    assert averaged == [2, 3, 4]  # every 3 steps, and at the checkpoints of steps 2 and 4
    assert [r["resumed_from"] for r in results] == [4, 4, 4]
    assert all(torch.equal(r["resumed"], results[0]["resumed"]) for r in results)


# ------------------------------------------------------------------------- one process


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"local_sgd_every": 0},
            "local_sgd_every: must be an integer >= 1 (steps between parameter averages; None "
            "or 1: the gradients are all-reduced every step), got 0",
        ),
        (
            {"local_sgd_every": 4, "sharding": "fsdp"},
            "local_sgd_every: 4 averages whole replicas of the model, which sharding='fsdp' "
            "does not hold: use sharding='ddp'",
        ),
        (
            {"local_sgd_every": 4, "compression": "int8"},
            "compression: 'int8' compresses DDP's gradient all-reduce, which local_sgd_every=4 "
            "replaces by averaging the parameters every 4 steps: use compression='none'",
        ),
        (
            {"local_sgd_every": 4, "max_grad_norm": 1.0},
            "max_grad_norm: clips the global batch's gradient, which no rank forms with "
            "local_sgd_every=4 (each rank steps on its own share): use None",
        ),
        (
            {"local_sgd_every": 4, "exact": True},
            "local_sgd_every: 4 lets each rank step on its own share between averages, and "
            "exact=True asks for the global batch's exact update: use None (or 1) or "
            "exact=False",
        ),
    ],
)
def test_options_local_sgd_cannot_honour_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=24, **options)
    assert str(info.value) == message


def test_every_step_or_none_is_plain_ddp() -> None:
    TrainerOptions(global_batch=24, local_sgd_every=1, exact=True, max_grad_norm=1.0)
