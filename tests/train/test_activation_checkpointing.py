"""Activation checkpointing (``activation_checkpointing=True``) on 3 gloo ranks over 127.0.0.1:
under DDP and FSDP the parameters after 5 steps match one process training without it on the
same global batches, and with dropout they match the same ranks' run without it (the
recomputation draws the same masks); in one process, which blocks recompute, and that they do.

The three processes start once per module and run every scenario in order; the tests then
check what each rank recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero.train import Trainer, TrainerOptions
from hetero.train.recompute import checkpoint_activations, recomputed_blocks
from tests.train._models import LOSS, data, mlp, relative_difference, sgd
from tests.train._ranks import Outcome, matching_one_process, one_process, run_ranks

WORLD = 3
STEPS = 5
TOLERANCE = 1e-6


class _Net(nn.Module):
    """An input layer, a ModuleList of three blocks (the recomputed ones) and a head."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Dropout(dropout)) for _ in range(3)
        )
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def _net(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return _Net(dropout)


def _against_one_process(make_model: Callable[[], nn.Module], **kw: Any) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, seed=3, activation_checkpointing=True, **kw)
        trainer = Trainer(make_model(), sgd, LOSS, data(), options)
        trainer.train(STEPS, progress=False)
        model = make_model()
        reference = one_process(model, data(), sgd(model.parameters()), LOSS, options, STEPS)
        return {"diff": relative_difference(trainer.model_state_dict(), reference)}

    return scenario


def _dropout(rank: int) -> Any:
    """The same ranks with and without recomputation, from the same random state."""
    trained = []
    for recompute in (False, True):
        options = TrainerOptions(
            global_batch=24, seed=3, shares=(14, 7, 3), activation_checkpointing=recompute
        )
        model = _net(dropout=0.2)
        trainer = Trainer(model, sgd, LOSS, data(), options)
        torch.manual_seed(10 + rank)  # each rank's masks, the same in both runs
        trainer.train(STEPS, progress=False)
        trained.append(trainer.model_state_dict())
    return {"diff": max((trained[1][n] - t).abs().max().item() for n, t in trained[0].items())}


SCENARIOS: dict[str, Callable[[int], Any]] = {
    # Unequal shares with accumulation (14 = 4+4+3+3), an epoch's partial last batch.
    "ddp_mlp": _against_one_process(mlp, shares=(14, 7, 3), micro_batch=4),
    "ddp_blocks": _against_one_process(_net, shares=(5, 16, 3), micro_batch=5),
    "fsdp_blocks": _against_one_process(_net, shares=(16, 8, 0), sharding="fsdp"),
    "dropout": _dropout,
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("recompute"))


@pytest.mark.parametrize("name", ["ddp_mlp", "ddp_blocks", "fsdp_blocks", "dropout"])
def test_parameters_match_training_without_it(ranks: list[dict[str, Outcome]], name: str) -> None:
    matching_one_process(ranks, name, TOLERANCE)


# ------------------------------------------------------------------------- one process


def test_the_blocks_are_the_fsdp_units_else_the_top_level_children() -> None:
    net = _net()
    assert recomputed_blocks(net) == list(reversed(net.blocks))
    model = mlp()
    assert recomputed_blocks(model) == list(model.children())


def test_a_block_runs_its_forward_again_in_the_backward_and_not_without_gradients() -> None:
    net = _net()
    calls = []
    net.blocks[0][0].register_forward_hook(lambda *_: calls.append(1))
    names = [n for n, _ in net.named_parameters()]
    checkpoint_activations(net)
    assert [n for n, _ in net.named_parameters()] == names  # state dicts stay as they were
    x, y = data()[:8]
    LOSS(net(x), y).backward()
    assert len(calls) == 2  # the forward, and again in the backward
    with torch.no_grad():
        net(x)
    assert len(calls) == 3
