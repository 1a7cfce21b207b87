"""A short profile of a model's layers for the stage planner (``stages.py``): each layer's
forward and backward time per sample, and the memory it holds.

The layers run in order on one batch, each on the previous one's output, so each sees the
input it will see in the pipeline; that pass is untimed (a warm-up). Then ``repeats`` rounds
time every layer's forward and a backward from a gradient of ones at its output, and a layer's
time is its least: on a shared machine others' work only ever slows a pass down, and a pass of
a millisecond or two is easily caught by a burst of it (a median of 3 passes, tried first, made
one of 12 identical transformer blocks 13 times as costly as the others). Its state is its
parameters, their gradients and the optimizer's state for them
(``memory.optimizer_state_bytes``), and its parameters' bytes (its gradients', which data
parallelism all-reduces) are given apart; its activations are the tensors autograd saves in its
forward for the backward (``saved_tensors_hooks``, each storage once, the parameters left
out), per sample of the batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn

from hetero._checks import is_integer
from hetero.errors import ConfigError
from hetero.train.compression import dense_bytes
from hetero.train.memory import OptimizerFactory, optimizer_state_bytes
from hetero.train.stages import LayerCost

__all__ = ["profile_layers"]


def profile_layers(
    layers: Sequence[nn.Module],
    batch: torch.Tensor,
    *,
    optimizer: OptimizerFactory | None = None,
    repeats: int = 5,
) -> list[LayerCost]:
    """Each of ``layers``' cost, run in order from ``batch`` (its first dimension the
    samples). The layers' gradients are left as they were found (none)."""
    if not isinstance(batch, torch.Tensor) or batch.dim() == 0 or len(batch) == 0:
        raise ConfigError([("batch", "must be a tensor of at least one sample")])
    if not is_integer(repeats) or repeats < 1:
        raise ConfigError([("repeats", f"must be a whole number >= 1, got {repeats!r}")])
    inputs, saved = _first_pass(layers, batch)
    times: list[list[float]] = [[] for _ in layers]
    for _ in range(repeats):  # round after round, so a burst of others' work hits one pass
        for i, layer in enumerate(layers):
            times[i].append(_timed_pass(layer, inputs[i]))
    samples = len(batch)
    costs = []
    for i, layer in enumerate(layers):
        parameters = dense_bytes(layer)
        state = 2 * parameters  # the parameters and their gradients, as many bytes
        if optimizer is not None:
            state += optimizer_state_bytes(optimizer, layer)
        costs.append(
            LayerCost(
                name=f"{i}:{type(layer).__name__}",
                seconds=min(times[i]) / samples,
                state_bytes=state,
                activation_bytes=-(-saved[i] // samples),
                parameter_bytes=parameters,
            )
        )
    return costs


def _first_pass(
    layers: Sequence[nn.Module], batch: torch.Tensor
) -> tuple[list[torch.Tensor], list[int]]:
    """Each layer's input, run in order from ``batch``, and the bytes its forward saves for the
    backward (a warm-up too: the timed passes then find their buffers made)."""
    inputs, saved, current = [], [], batch
    for layer in layers:
        own = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        storages: dict[int, int] = {}
        x = _leaf(current)
        with torch.autograd.graph.saved_tensors_hooks(_counting(own, storages), lambda t: t):
            output = layer(x)
        if not isinstance(output, torch.Tensor) or not output.requires_grad:
            raise ConfigError(
                [
                    (
                        "layers",
                        f"{type(layer).__name__} must return one tensor that needs a gradient "
                        "(a stage passes one tensor on)",
                    )
                ]
            )
        torch.autograd.backward(output, torch.ones_like(output))
        layer.zero_grad(set_to_none=True)
        inputs.append(current)
        saved.append(sum(storages.values()))
        current = output.detach()
    return inputs, saved


def _timed_pass(layer: nn.Module, inputs: torch.Tensor) -> float:
    """Seconds of ``layer``'s forward and a backward from a gradient of ones at its output."""
    x = _leaf(inputs)
    started = time.perf_counter()
    output = layer(x)
    torch.autograd.backward(output, torch.ones_like(output))
    if output.is_cuda:  # CUDA runs asynchronously: time the work, not its launch
        torch.cuda.synchronize(output.device)
    seconds = time.perf_counter() - started
    layer.zero_grad(set_to_none=True)
    return seconds


def _leaf(inputs: torch.Tensor) -> torch.Tensor:
    """``inputs`` as a layer's input of its own, needing a gradient when it can have one."""
    return inputs.detach().requires_grad_(inputs.is_floating_point())


def _counting(own: set[int], storages: dict[int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A pack hook that notes the bytes of each storage autograd saves, but ``own``'s."""

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    return pack
