"""Activation checkpointing (``activation_checkpointing=True``): the model's blocks keep only
their inputs in the forward and run their forward again in the backward to get the
activations back (``torch.utils.checkpoint``, non-reentrant), trading that recomputation for
the memory the activations took.

The blocks are the FSDP units (``parallel.fsdp_units``: the classes in ``_no_split_modules``,
else the members of every ``nn.ModuleList``), else the model's top-level children. Each block's
``forward`` is replaced on the instance, so parameter names, state dicts and hooks stay as they
were. The random state is saved and restored around the recomputation (dropout draws the same
masks), so the gradients are the same as without it: exact.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.utils.checkpoint import checkpoint

from hetero.train.parallel import fsdp_units

__all__ = ["checkpoint_activations", "recomputed_blocks"]


def recomputed_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules whose activations ``checkpoint_activations`` recomputes."""
    return fsdp_units(model) or list(model.children())


def checkpoint_activations(model: nn.Module) -> list[nn.Module]:
    """Make each of ``model``'s blocks recompute its activations in the backward; returns them.
    Without gradients (evaluation) a block runs as before."""
    blocks = recomputed_blocks(model)
    for block in blocks:
        block.forward = _recomputed(block.forward)
    return blocks


def _recomputed(forward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
