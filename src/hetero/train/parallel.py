"""How a ``Trainer`` holds the model on its ranks: replicated by ``DistributedDataParallel``
(``sharding="ddp"``) or sharded by FSDP2's ``fully_shard`` (``sharding="fsdp"``), behind the
one interface a step uses.

Both reduce the gradients to their mean over the ranks, so the trainer's loss scale
(``world_size / B``) gives either one the global batch's gradient. Under FSDP:

- *Units*: every module of a class the model lists in ``_no_split_modules`` (transformers'
  convention: its blocks), else every module of every ``nn.ModuleList``, gets its own
  ``fully_shard`` (one all-gather and one reduce-scatter each), then the root takes the rest.
  The last micro-batch's backward reduce-scatters each unit's gradient as soon as the unit's
  backward is done, while the backward goes on through the units before it.
- *One all-gather and one reduce-scatter per unit and step*, whatever a rank's number of
  micro-batches: the parameters stay gathered from the step's first forward
  (``reshard_after_forward=False``) through the accumulated micro-batches
  (``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``: gradients
  accumulate unsharded, nothing is communicated), and the last backward reduce-scatters and
  reshards. Ranks with different numbers of micro-batches (the point of uneven shares) thus run
  the same collectives in the same order; resharding after each micro-batch would not.
- So what FSDP shards is the state between the passes: each rank keeps and steps 1/world_size
  of the parameters, gradients and optimizer state; during a step's passes it holds the full
  parameters and gradients, as under DDP.
- Mixed precision is FSDP's ``MixedPrecisionPolicy``: ``mixed_precision="bf16"`` gathers the
  parameters in bf16 and computes in it, and reduces the gradients in fp32.
- Checkpoints hold full (unsharded) state dicts, gathered to rank 0
  (``torch.distributed.checkpoint.state_dict``), so a run resumes at any world size.

With ``local_sgd_every`` above 1 (``LocalReplicas``) no gradient is reduced at all: each rank
steps its own replica on its own share and ``local_sgd.ParameterAverager`` averages the
replicas every so many steps.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any, cast

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from hetero.train.compression import CommMeter, ErrorFeedback, Int8, TopK, dense_bytes
from hetero.train.layer_buckets import layer_route
from hetero.train.local_sgd import ParameterAverager
from hetero.train.options import PRECISIONS, TrainerOptions, local_sgd

__all__ = ["DataParallel", "LocalReplicas", "Replicated", "Sharded", "fsdp_units", "wrap"]

# Gathered to rank 0 alone, on the CPU: the other ranks get empty dicts (and use no memory).
_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
_FULL = StateDictOptions(full_state_dict=True)


class DataParallel(abc.ABC):
    """The model as the step runs it: ``module`` is what the forward calls.

    ``reduces_gradients``: the step's last backward reduces the gradients to their mean over
    the ranks (every rank must run one, an idle one at share 0); else each rank steps on its
    own gradients. ``dense_bytes``: what one uncompressed all-reduce of the gradients hands to
    the collectives on each rank (``None``: not measured)."""

    name: str
    module: nn.Module
    reduces_gradients = True
    dense_bytes: int | None = None

    def end_step(self, samples: int, steps: int, checkpoint: bool) -> int | None:
        """After the optimizer's step on this rank's ``samples``, ``steps`` steps done (and a
        checkpoint to save after it, if ``checkpoint``): the bytes this rank handed to the
        step's gradient (or parameter) reduction, ``None`` where not measured."""
        return None

    @abc.abstractmethod
    def accumulating(self) -> contextlib.AbstractContextManager[None]:
        """Micro-batches run inside this keep their gradients on this rank (no communication);
        the next backward outside it reduces everything accumulated."""

    @abc.abstractmethod
    def discard(self) -> None:
        """After passes inside ``accumulating`` whose loss was weighted 0 (profiling): leave
        the model as a step expects to find it."""

    @abc.abstractmethod
    def model_state(self, rank0_only: bool = False) -> dict[str, Any]:
        """The model's full state dict (every rank must call it under FSDP, which gathers it;
        with ``rank0_only`` the other ranks get an empty dict)."""

    @abc.abstractmethod
    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The model's and the optimizer's state to save, complete on rank 0 (every rank must
        call it)."""

    @abc.abstractmethod
    def load_checkpoint_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        """Load what ``checkpoint_state`` saved (every rank, each from its own copy);
        ``ValueError`` when another sharding wrote it."""

    def clip_grad_norm(self, max_norm: float) -> float:
        """Scale the reduced gradients down to L2 norm ``max_norm`` when above it; returns their
        norm before. Every rank holds the global batch's averaged gradient (DDP: all of it,
        so each computes the same norm; FSDP: its shards, whose squared norms one all-reduce
        sums), so the norm is the one one process would compute. Every rank must call it."""
        parameters = [p for p in self.module.parameters() if p.grad is not None]
        grads = [p.grad for p in parameters if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads)
        if isinstance(total, DTensor):  # FSDP: the shards' partial norms, summed across ranks
            total = total.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
        return float(total)

    def _check_sharding(self, state: dict[str, Any]) -> None:
        written = state.get("sharding", "ddp")  # only FSDP's say: DDP's are as they always were
        if written != self.name:
            raise ValueError(
                f"it was written with sharding={written!r} and this run uses "
                f"sharding={self.name!r}: resume with sharding={written!r}"
            )


class _Replica(DataParallel):
    """The whole model on every rank: its state is the bare model's."""

    name = "ddp"
    _model: nn.Module

    def discard(self) -> None:
        self._model.zero_grad(set_to_none=True)

    def model_state(self, rank0_only: bool = False) -> dict[str, Any]:
        return self._model.state_dict()

    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return {"model": self._model.state_dict(), "optimizer": optimizer.state_dict()}

    def load_checkpoint_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        self._check_sharding(state)
        self._model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


class Replicated(_Replica):
    """``DistributedDataParallel``: the whole model on every rank, gradients all-reduced in
    buckets during the last backward, through the communication hook ``compression`` (or
    ``compression_by_layer``) names.
    The gradients are views of the buckets (``gradient_as_bucket_view``): DDP then does not copy
    every reduced bucket back into them after the last one, a copy no backward hides (on the
    benchmark's transformer, the exposed communication went from 57 to 26 ms a step)."""

    def __init__(self, model: nn.Module, options: TrainerOptions, device: torch.device) -> None:
        device_ids = [device] if device.type == "cuda" else None
        ddp = DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=options.bucket_cap_mb,
            gradient_as_bucket_view=True,
        )
        self.dense_bytes = dense_bytes(model)
        # The bytes of every step's reduction: fixed, but for the error-feedback hooks, which
        # count their payloads, and PowerSGD, which is not measured.
        self._step_bytes: int | None = self.dense_bytes
        self._meter: CommMeter | None = None
        if options.compression == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            self._step_bytes = 2 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        elif options.compression == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
            self._step_bytes = None
        elif options.compression in ("int8", "topk"):
            codec = Int8() if options.compression == "int8" else TopK(options.topk_ratio)
            self._meter = CommMeter()
            ErrorFeedback(codec, self._meter).register(ddp)
        elif options.compression_by_layer is not None:
            route = layer_route(model, options.compression_by_layer, options.topk_ratio)
            if route is not None:  # else every gradient is exact: DDP's own all-reduce
                self._meter = CommMeter()
                ErrorFeedback(route, self._meter).register(ddp)
        self._model = model
        self.module = ddp

    def accumulating(self) -> contextlib.AbstractContextManager[None]:
        return cast(DistributedDataParallel, self.module).no_sync()

    def end_step(self, samples: int, steps: int, checkpoint: bool) -> int | None:
        return self._meter.take() if self._meter is not None else self._step_bytes


class LocalReplicas(_Replica):
    """Local SGD (``local_sgd_every`` > 1): the bare model on every rank, stepped on the rank's
    own gradients; ``ParameterAverager`` averages the replicas every ``local_sgd_every`` steps
    and at every checkpoint (so a checkpoint holds the average). Starts from rank 0's
    parameters, as DDP does."""

    reduces_gradients = False

    def __init__(self, model: nn.Module, options: TrainerOptions) -> None:
        self._model = self.module = model
        self.dense_bytes = dense_bytes(model)
        self._averager = ParameterAverager(model, options.local_sgd_every or 1)
        self._averager.broadcast()

    def accumulating(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def end_step(self, samples: int, steps: int, checkpoint: bool) -> int | None:
        return self._averager.end_step(samples, steps, checkpoint)


class Sharded(DataParallel):
    """FSDP2 (``fully_shard``) over ``fsdp_units(model)`` and the root (see the module's
    docstring): parameters, gradients and optimizer state sharded between the passes."""

    name = "fsdp"

    def __init__(self, model: nn.Module, options: TrainerOptions) -> None:
        dtype = PRECISIONS[options.mixed_precision]
        policy = (
            MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
            if dtype is not None
            else MixedPrecisionPolicy()
        )
        for unit in fsdp_units(model):
            fully_shard(unit, reshard_after_forward=False, mp_policy=policy)
        fully_shard(model, reshard_after_forward=False, mp_policy=policy)
        self.module = model
        self._root = cast(FSDPModule, model)

    @contextlib.contextmanager
    def accumulating(self) -> Iterator[None]:
        self._root.set_requires_gradient_sync(False)
        self._root.set_reshard_after_backward(False)
        try:
            yield
        finally:
            self._root.set_requires_gradient_sync(True)
            self._root.set_reshard_after_backward(True)

    def discard(self) -> None:
        # Resharded, the next forward gathers the parameters again (a resumed checkpoint may
        # have changed them). The zero gradients FSDP keeps unsharded join the next step's.
        for module in self.module.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def model_state(self, rank0_only: bool = False) -> dict[str, Any]:
        return get_model_state_dict(self.module, options=_TO_RANK0 if rank0_only else _FULL)

    def checkpoint_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return {
            "model": get_model_state_dict(self.module, options=_TO_RANK0),
            "optimizer": get_optimizer_state_dict(self.module, optimizer, options=_TO_RANK0),
            "sharding": self.name,
        }

    def load_checkpoint_state(
        self, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        self._check_sharding(state)
        set_model_state_dict(self.module, state["model"], options=_FULL)
        set_optimizer_state_dict(self.module, optimizer, state["optimizer"], options=_FULL)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The submodules that get their own ``fully_shard``, innermost first: those of a class
    named in the model's ``_no_split_modules`` (a transformers model's blocks), else the
    members of every ``nn.ModuleList``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    if names:
        units = [m for m in model.modules() if m is not model and type(m).__name__ in names]
    else:
        units = [m for lst in model.modules() if isinstance(lst, nn.ModuleList) for m in lst]
    # modules() lists a module before those inside it: reversed, inner units shard first.
    return [m for m in reversed(units) if any(p.requires_grad for p in m.parameters())]


def wrap(model: nn.Module, options: TrainerOptions, device: torch.device) -> DataParallel:
    """``model`` (the same structure on every rank) as ``options.sharding`` holds it, or as
    local SGD does (``local_sgd_every`` > 1)."""
    if options.sharding == "fsdp":
        return Sharded(model, options)
    if local_sgd(options):
        return LocalReplicas(model, options)
    return Replicated(model, options, device)
