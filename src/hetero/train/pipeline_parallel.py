"""Pipeline-parallel training on the ranks of the process group, each rank running the stage a
``StagePlan`` gives it (``stages.py``), with ``torch.distributed.pipelining``'s GPipe or 1F1B
schedule.

Every rank builds the whole model's layers the same way (same seed) and keeps its stage's,
with its own optimizer over them; activations go forward and their gradients back by
point-to-point sends, in the plan's rank order (the pipeline's order need not be the ranks').
Each step's batch is split into the plan's micro-batches; ``loss_fn`` returns the *sum* of a
micro-batch's per-sample losses, and the runner divides it by the whole batch's size, so the
gradients each stage accumulates over the micro-batches are those of the batch's mean loss:
the update is the one a single process would make on the whole batch.

``DataPipelineRunner`` runs replicas of a pipeline side by side, as ``choose_layout``
(``fleet_layout.py``) lays them out: each replica's ``PipelineRunner`` on a ``hetero.comm``
group of its ranks, on its share of every global batch (in its own count of micro-batches);
then every run of layers that the same ranks hold, one in each replica, has its gradients
all-reduced among those ranks on a group of their own (the replicas' stage boundaries may
differ), each rank's weighted by its replica's share of the batch. A replica's gradients are
its share's mean loss's, so the weighted sum is the global batch's mean loss's: every replica
makes the update one process makes on the whole batch.

With ``emulate=True`` each rank emulates a device of its plan speed: a micro-batch of n samples
takes ``n × Σ seconds / speed`` over the stage's layers (the plan's costs), its forward the
first third, its backward the rest, the real compute counted toward it and the remainder slept
after it, as the trainer's ``emulate_sample_time`` does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hetero import comm
from hetero.errors import BackendError, ConfigError
from hetero.train.fleet_layout import FleetLayout
from hetero.train.memory import OptimizerFactory
from hetero.train.pacing import BACKWARD_SHARE, PassPacer
from hetero.train.stages import StagePlan

__all__ = ["DataPipelineRunner", "PipelineRunner", "PipelineStepReport"]

LossFn = Callable[[Any, Any], torch.Tensor]
_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass(frozen=True, slots=True)
class PipelineStepReport:
    """One step on this rank: the whole batch's mean ``loss`` (the same on every rank), the
    step's wall ``seconds`` here, the part this rank's stage computed (paced when emulated), and
    the part it spent in the gradients' all-reduce with the other replicas
    (``DataPipelineRunner``; waiting there for a slower replica included); the rest it waited
    for its neighbours or sent to them."""

    step: int
    loss: float
    seconds: float
    compute_seconds: float
    reduce_seconds: float = 0.0

    @property
    def idle_seconds(self) -> float:
        return max(0.0, self.seconds - self.compute_seconds)


class _PacedStage(PipelineStage):
    """A ``PipelineStage`` whose forward and backward of each micro-batch are paced."""

    def __init__(self, pace: PassPacer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pace = pace
        self._rows: dict[int, int] = {}

    def forward_one_chunk(
        self,
        fwd_chunk_id: int,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        save_forward_output: bool = True,
    ) -> Any:
        started = time.perf_counter()
        output = super().forward_one_chunk(fwd_chunk_id, args, kwargs, save_forward_output)
        rows = _rows(output)
        self._rows[fwd_chunk_id] = rows
        self.pace.run(started, rows, 1 - BACKWARD_SHARE)
        return output

    def backward_one_chunk(
        self,
        bwd_chunk_id: int,
        loss: Any = None,
        full_backward: bool = True,
        last_backward: bool = False,
    ) -> None:
        started = time.perf_counter()
        super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
        self.pace.run(started, self._rows.pop(bwd_chunk_id, 0), BACKWARD_SHARE)


def _rows(output: Any) -> int:
    tensor = output[0] if isinstance(output, (tuple, list)) else output
    return int(tensor.shape[0]) if isinstance(tensor, torch.Tensor) and tensor.dim() else 1


class PipelineRunner:
    """This rank's stage of ``plan`` over ``layers`` (the whole model's, built alike on every
    rank), trained with ``optimizer`` (a function of the stage's parameters) on ``loss_fn``
    (the sum of a batch's per-sample losses). Every rank of ``group`` (a ``hetero.comm``
    group; None: the whole process group) runs one stage: the plan's ranks must be its."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        plan: StagePlan,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        *,
        emulate: bool = False,
        device: torch.device | None = None,
        group: comm.Group | None = None,
    ) -> None:
        world = dist.get_world_size() if dist.is_initialized() else 0
        members = list(range(world)) if group is None else list(group.ranks)
        ranks = sorted(s.rank for s in plan.stages)
        if ranks != members or (group is not None and not group.member):
            where = (
                f"the process group has {world} ranks: plan a stage for each rank 0 .. world "
                "size - 1 (call comm.init first)"
                if group is None
                else f"its group holds ranks {members}: plan a stage for each rank of the group, "
                "and make the runner on those ranks alone"
            )
            raise ConfigError([("plan", f"runs on ranks {ranks}, but {where}")])
        if len(layers) != len(plan.layers):
            raise ConfigError(
                [("layers", f"has {len(layers)} layers, the plan {len(plan.layers)}")]
            )
        self.plan = plan
        self.group = group
        self.stage = plan.stage_of(dist.get_rank())
        self.device = device or torch.device("cpu")
        self.module = nn.Sequential(*layers[self.stage.first : self.stage.end]).to(self.device)
        parameters = list(self.module.parameters())
        # A stage of layers without parameters (an activation alone) has nothing to update.
        self.optimizer = optimizer(parameters) if parameters else None
        self._loss_fn = loss_fn
        per_sample = sum(plan.layers[i].seconds for i in self.stage.layers) / self.stage.speed
        self._pace = PassPacer(per_sample if emulate else None)
        pipe = _PacedStage(
            self._pace,
            self.module,
            self.stage.index,
            len(plan.stages),
            self.device,
            group=None if group is None else group.torch_group,
        )
        # Stage index → the rank's index in the group (the pipeline's order need not be it).
        pipe.stage_index_to_group_rank = {s.index: members.index(s.rank) for s in plan.stages}
        self._first, self._last = self.stage.index == 0, self.stage.index == len(plan.stages) - 1
        self._last_rank = plan.stages[-1].rank
        self._schedule = _SCHEDULES[plan.schedule](
            pipe, n_microbatches=plan.micro_batches, loss_fn=self._scaled_loss, scale_grads=False
        )
        self._batch = 0  # the first step's batch size: every step's
        self.steps = 0

    @property
    def compute_seconds(self) -> float:
        """The seconds this rank's stage has computed so far (paced when emulated)."""
        return self._pace.total

    def step(self, inputs: torch.Tensor, target: Any) -> PipelineStepReport:
        """One step on a batch (every rank passes the same: the first stage reads ``inputs``,
        the last ``target``): forward and backward of its micro-batches by the schedule, then
        each stage's optimizer step."""
        started, computed = time.perf_counter(), self._pace.total
        loss = self.accumulate(inputs, target)
        self.update()
        return PipelineStepReport(
            step=self.steps,
            loss=float(loss),
            seconds=time.perf_counter() - started,
            compute_seconds=self._pace.total - computed,
        )

    def accumulate(self, inputs: torch.Tensor, target: Any) -> torch.Tensor:
        """The forward and backward of a batch's micro-batches by the schedule, leaving each
        stage's gradients of the batch's mean loss unapplied; that loss (the last stage's, the
        same on every rank of the pipeline)."""
        size = len(inputs)
        if size % self.plan.micro_batches or (self._batch and size != self._batch):
            first = f" and the first step's {self._batch}" if self._batch else ""
            raise ConfigError(
                [
                    (
                        "inputs",
                        f"a batch of {size} samples: every step needs a multiple of the plan's "
                        f"{self.plan.micro_batches} micro-batches{first} (the stages learn their "
                        "tensors' shapes at the first step)",
                    )
                ]
            )
        self._batch = size
        losses: list[torch.Tensor] = []
        inputs, target = inputs.to(self.device), target.to(self.device)
        args = (inputs,) if self._first else ()
        try:
            self._schedule.step(
                *args, target=target if self._last else None, losses=losses, return_outputs=False
            )
        except dist.DistBackendError as exc:
            raise BackendError(f"pipeline step on rank {self.stage.rank} failed: {exc}") from exc
        loss = torch.stack([x.detach().float() for x in losses]).sum() if losses else None
        total = (loss if loss is not None else torch.zeros(())).to(self.device)
        comm.broadcast(total, src=self._last_rank, group=self.group)
        return total

    def update(self) -> None:
        """The stage's optimizer step on its accumulated gradients, which it then clears."""
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1

    def _scaled_loss(self, output: Any, target: Any) -> torch.Tensor:
        """The micro-batch's summed loss over the whole batch's size: summed over the
        micro-batches, the batch's mean loss."""
        return self._loss_fn(output, target) / self._batch


class DataPipelineRunner:
    """This rank's stage of its replica in ``layout`` (``choose_layout``'s) over ``layers``
    (the whole model's, built alike on every rank), trained with ``optimizer`` on ``loss_fn``
    (the sum of a batch's per-sample losses). Every rank of the process group runs one stage
    of one replica: the layout's ranks must be the group's. Every rank makes the runner at once
    (it makes the replicas' groups and the gradient ranges' groups)."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        layout: FleetLayout,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        *,
        emulate: bool = False,
        device: torch.device | None = None,
    ) -> None:
        world = dist.get_world_size() if dist.is_initialized() else 0
        ranks = sorted(r for replica in layout.replicas for r in replica.ranks)
        if ranks != list(range(world)):
            raise ConfigError(
                [
                    (
                        "layout",
                        f"runs on ranks {ranks}, but the process group has {world} ranks: lay "
                        "out every rank 0 .. world size - 1 (call comm.init first)",
                    )
                ]
            )
        me = dist.get_rank()
        # new_group wants every rank to make every group, in the same order.
        replica_groups = [comm.new_group(r.ranks) for r in layout.replicas]
        range_groups = [(g, comm.new_group(g.ranks)) for g in layout.gradient_ranges]
        index = next(i for i, r in enumerate(layout.replicas) if me in r.ranks)
        self.layout = layout
        self.replica = layout.replicas[index]
        self.share = self.replica.samples / layout.global_batch
        first = sum(r.samples for r in layout.replicas[:index])
        self._samples = slice(first, first + self.replica.samples)
        self.pipeline = PipelineRunner(
            layers,
            self.replica.plan,
            optimizer,
            loss_fn,
            emulate=emulate,
            device=device,
            group=replica_groups[index],
        )
        stage = self.pipeline.stage
        # Each gradient range this rank holds a part of, in layer order (every rank's order).
        self._buckets = [
            bucket
            for g, group in range_groups
            if me in g.ranks
            for bucket in _GradientBucket.of(
                group,
                [
                    p
                    for i in range(max(g.first, stage.first), min(g.end, stage.end))
                    for p in self.pipeline.module[i - stage.first].parameters()
                    if p.requires_grad
                ],
            )
        ]

    @property
    def steps(self) -> int:
        return self.pipeline.steps

    def step(self, inputs: torch.Tensor, target: Any) -> PipelineStepReport:
        """One step on a global batch (every rank passes the same): this replica's pipeline on
        its share, the gradients all-reduced across the replicas weighted by their shares,
        then each stage's optimizer step. The report's loss is the global batch's mean."""
        size, expected = len(inputs), self.layout.global_batch
        if size != expected:
            shares = " + ".join(str(r.samples) for r in self.layout.replicas)
            raise ConfigError(
                [
                    (
                        "inputs",
                        f"a batch of {size} samples: the layout splits a global batch of "
                        f"{expected} ({shares} samples across its replicas)",
                    )
                ]
            )
        started, computed = time.perf_counter(), self.pipeline.compute_seconds
        for bucket in self._buckets:
            bucket.attach()
        loss = self.pipeline.accumulate(inputs[self._samples], target[self._samples])
        reducing = time.perf_counter()
        self._reduce_gradients()
        reduced = time.perf_counter() - reducing
        self.pipeline.update()
        # Each replica's mean loss weighted by its share, spread over its ranks.
        total = loss * (self.share / len(self.replica.ranks))
        comm.all_reduce(total)
        return PipelineStepReport(
            step=self.steps,
            loss=float(total),
            seconds=time.perf_counter() - started,
            compute_seconds=self.pipeline.compute_seconds - computed,
            reduce_seconds=reduced,
        )

    def _reduce_gradients(self) -> None:
        """Σ over the replicas of share × gradient, for every parameter this rank holds: the
        global batch's mean loss's gradient. All issued at once, then waited for."""
        handles = [
            comm.all_reduce(b.flat, "sum", self.share, group=b.group, async_op=True)
            for b in self._buckets
        ]
        for handle in handles:
            handle.wait()


class _GradientBucket:
    """The gradients of some of a gradient range's parameters on this rank (all of one dtype),
    as views of one flat tensor: the backward accumulates into them in place, and one
    all-reduce of the flat tensor reduces them all (a collective costs per call as well as per
    byte) with no copy."""

    def __init__(self, group: comm.Group, parameters: list[torch.Tensor]) -> None:
        self.group = group
        self._parameters = parameters
        first = parameters[0]
        self.flat = torch.zeros(
            sum(p.numel() for p in parameters), dtype=first.dtype, device=first.device
        )
        sizes = [p.numel() for p in parameters]
        self._views = [
            view.view_as(p)
            for view, p in zip(torch.split(self.flat, sizes), parameters, strict=True)
        ]

    @classmethod
    def of(cls, group: comm.Group, parameters: list[torch.Tensor]) -> list[_GradientBucket]:
        """A bucket for each dtype among ``parameters`` (none for none), in the order of their
        first parameters: the same on every rank of the group, which holds the same layers."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in parameters:
            by_dtype.setdefault(p.dtype, []).append(p)
        return [cls(group, same) for same in by_dtype.values()]

    def attach(self) -> None:
        """Zero the gradients and hand them to the parameters to accumulate into (the
        optimizer's ``zero_grad`` set them to None after the last step). A parameter the loss
        does not reach keeps a zero gradient."""
        self.flat.zero_()
        for p, view in zip(self._parameters, self._views, strict=True):
            p.grad = view
