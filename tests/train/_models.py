"""The data, models and optimizers the multi-rank trainer tests share: 60 samples of 8 features
in 4 classes, a small MLP, summed cross-entropy, SGD and Adam; and one process training a model
on the same global batches, to hold a distributed run's parameters against."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from hetero.train import TrainerOptions
from tests.train._ranks import one_process

LOSS = nn.CrossEntropyLoss(reduction="sum")


def data(n: int = 60) -> TensorDataset:
    """``n`` samples of 8 normal features, each in one of 4 classes at random."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=generator)
    y = torch.randint(0, 4, (n,), generator=generator)
    return TensorDataset(x, y)


def mlp(hidden: int = 16) -> nn.Module:
    """8 → ``hidden`` → 4, the same start on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 4))


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=0.01)


def trained_in_one_process(
    model: nn.Module,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    options: TrainerOptions,
    steps: int,
) -> nn.Module:
    """``model`` after ``steps`` steps of one process on ``data()``'s global batches."""
    return one_process(model, data(), make_optimizer(model.parameters()), LOSS, options, steps)


def relative_difference(state: Mapping[str, torch.Tensor], reference: nn.Module) -> float:
    """The largest parameter difference, relative to the largest value of that parameter."""
    return max(
        ((state[name] - p).abs().max() / p.abs().max()).item()
        for name, p in reference.named_parameters()
    )
