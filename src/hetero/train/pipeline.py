"""The input pipeline: each rank's micro-batches, step after step, loaded by a ``DataLoader``.

The ``HeteroSampler`` says which samples of each global batch are this rank's; the trainer runs
them in micro-batches of at most its cap (``chunks``). ``InputPipeline`` hands the same
micro-batches to a ``DataLoader`` as its batch sampler, in the order the trainer will run them
(every step's from the sampler's position on, across epochs), so with ``num_workers`` worker
processes load and collate the next ones (``prefetch_factor`` each) while this rank computes,
into pinned memory when the model is on a GPU. With ``num_workers=0`` the trainer's process
loads each micro-batch when it is needed, as before.

What the loader runs ahead on depends on the shares: when they change (a rebalance, a resumed
checkpoint) the loader starts again from the sampler's position with the new ones, and what it
had loaded ahead is dropped. The time the trainer waits for a micro-batch, and moves it to the
device, is the step's *data* time, reported apart from compute.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from hetero.train.sampler import HeteroSampler
from hetero.train.tensors import take_none, to_device

__all__ = ["InputPipeline", "chunks", "idle_batch"]


def chunks(indices: list[int], cap: int | None) -> list[list[int]]:
    """``indices`` in as few near-equal micro-batches as ``cap`` allows (none when empty)."""
    if not indices:
        return []
    count = 1 if cap is None else -(-len(indices) // cap)
    size, extra = divmod(len(indices), count)
    out, start = [], 0
    for k in range(count):
        end = start + size + (k < extra)
        out.append(indices[start:end])
        start = end
    return out


def idle_batch(model: nn.Module, loss_fn: Callable[[Any, Any], Any], sample: Any) -> Any:
    """What a rank with no samples in a step runs, to take part in the step's collectives (the
    trainer weights its loss 0): a batch of no samples when the model takes one, else ``sample``
    (a collated batch of one sample, on the model's device). Tried once, without gradients,
    the model's buffers and the random streams left as they were."""
    empty = take_none(sample)
    buffers = [b.detach().clone() for b in model.buffers()]
    device = next(model.parameters()).device
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices, device_type=device.type):
            inputs, target = empty
            loss_fn(model(inputs), target)
        return empty
    except Exception:  # whatever the model raises, it does not take one
        return sample  # (transformers' attention cannot reshape a batch of no samples)
    finally:
        with torch.no_grad():
            for buffer, saved in zip(model.buffers(), buffers, strict=True):
                buffer.copy_(saved)


def _position(sampler: HeteroSampler) -> tuple[Any, ...]:
    """Where ``sampler`` stands, as the step that runs next sees it (an epoch's end is the next
    epoch's start), with what decides that step's indices."""
    epoch, position = sampler.epoch, sampler.position
    if position == sampler.num_batches:
        epoch, position = epoch + 1, 0
    return epoch, position, sampler.shares, sampler.seed


class _StepPlan(Sampler[list[int]]):
    """The batch sampler: this rank's micro-batches of every step from a sampler's position on,
    without end (the trainer decides how many steps run). Iterating again starts again from
    the position given to ``start``."""

    def __init__(self, cap: int | None) -> None:
        self._cap = cap
        self._start: HeteroSampler | None = None

    def start(self, sampler: HeteroSampler) -> None:
        self._start = copy.copy(sampler)  # the trainer's own sampler moves on by itself

    def __iter__(self) -> Iterator[list[int]]:
        if self._start is None:
            return
        sampler = copy.copy(self._start)
        while True:
            if sampler.position == sampler.num_batches:
                sampler.set_epoch(sampler.epoch + 1)
            indices = next(sampler.batches())
            sampler.advance()
            yield from chunks(indices, self._cap)


class InputPipeline:
    """This rank's micro-batches from a ``DataLoader`` over ``dataset``: ``begin(sampler)`` at
    the start of each step, then ``next()`` once per micro-batch of the step (as many as
    ``chunks`` gives the sampler's next indices)."""

    def __init__(
        self,
        dataset: Dataset[Any],
        collate_fn: Callable[[list[Any]], Any],
        device: torch.device,
        *,
        cap: int | None,
        num_workers: int = 0,
        prefetch_factor: int = 2,
    ) -> None:
        self._device = device
        self._plan = _StepPlan(cap)
        workers: dict[str, Any] = (
            {"prefetch_factor": prefetch_factor, "persistent_workers": True} if num_workers else {}
        )
        self._loader: DataLoader[Any] = DataLoader(
            dataset,
            batch_sampler=self._plan,
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=device.type == "cuda",
            **workers,
        )
        self._batches: Iterator[Any] | None = None
        self._next: tuple[Any, ...] | None = None  # the position the loader is ahead from

    def begin(self, sampler: HeteroSampler) -> None:
        """The step about to run is the sampler's next: start the loader again from there
        unless it is already on it (it is, step after step, until the shares change)."""
        here = _position(sampler)
        if self._batches is None or here != self._next:
            self._plan.start(sampler)
            self._batches = iter(self._loader)
        epoch, position, shares, seed = here
        following = position + 1
        if following == sampler.num_batches:
            epoch, following = epoch + 1, 0
        self._next = (epoch, following, shares, seed)

    def next(self) -> tuple[Any, float]:
        """The step's next micro-batch on the model's device, and the seconds spent waiting
        for it and moving it there."""
        if self._batches is None:
            raise RuntimeError("InputPipeline.next() before begin()")
        started = time.perf_counter()
        batch = to_device(next(self._batches), self._device)
        return batch, time.perf_counter() - started

    def close(self) -> None:
        """Stop the worker processes (a later ``begin`` starts them again)."""
        self._batches = None
        self._next = None
        workers = getattr(self._loader, "_iterator", None)
        if workers is not None:
            shutdown = getattr(workers, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            self._loader._iterator = None
