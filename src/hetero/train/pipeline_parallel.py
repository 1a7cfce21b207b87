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
from hetero.train.memory import OptimizerFactory
from hetero.train.pacing import BACKWARD_SHARE, paced_from
from hetero.train.stages import StagePlan

__all__ = ["PipelineRunner", "PipelineStepReport"]

LossFn = Callable[[Any, Any], torch.Tensor]
_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


@dataclass(frozen=True, slots=True)
class PipelineStepReport:
    """One step on this rank: the whole batch's mean ``loss`` (the last stage's, the same on
    every rank), the step's wall ``seconds`` here, and the part this rank's stage computed
    (paced when emulated); the rest it waited for its neighbours or sent to them."""

    step: int
    loss: float
    seconds: float
    compute_seconds: float

    @property
    def idle_seconds(self) -> float:
        return max(0.0, self.seconds - self.compute_seconds)


class _Pace:
    """Holds a pass (a forward or a backward: its ``share`` of a micro-batch's time) of ``n``
    samples until ``n × seconds × share`` after it started, as a device of ``seconds`` a sample
    would take, and counts the time passes took (real when not emulating)."""

    def __init__(self, seconds_per_sample: float | None) -> None:
        self._seconds = seconds_per_sample
        self._due = -1.0
        self.total = 0.0

    def run(self, started: float, samples: int, share: float) -> None:
        now = time.perf_counter()
        if self._seconds is None:
            self.total += now - started
            return
        base = paced_from(started, self._due)
        self._due = base + samples * self._seconds * share
        if self._due > now:
            time.sleep(self._due - now)
        self.total += max(self._due, now) - base


class _PacedStage(PipelineStage):
    """A ``PipelineStage`` whose forward and backward of each micro-batch are paced."""

    def __init__(self, pace: _Pace, *args: Any, **kwargs: Any) -> None:
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
    (the sum of a batch's per-sample losses). Every rank of the process group runs one stage:
    the plan's ranks must be the group's."""

    def __init__(
        self,
        layers: Sequence[nn.Module],
        plan: StagePlan,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        *,
        emulate: bool = False,
        device: torch.device | None = None,
    ) -> None:
        world = dist.get_world_size() if dist.is_initialized() else 0
        ranks = sorted(s.rank for s in plan.stages)
        if ranks != list(range(world)):
            raise ConfigError(
                [
                    (
                        "plan",
                        f"runs on ranks {ranks}, but the process group has {world} ranks: "
                        "plan a stage for each rank 0 .. world size - 1 (call comm.init first)",
                    )
                ]
            )
        if len(layers) != len(plan.layers):
            raise ConfigError(
                [("layers", f"has {len(layers)} layers, the plan {len(plan.layers)}")]
            )
        self.plan = plan
        self.stage = plan.stage_of(dist.get_rank())
        self.device = device or torch.device("cpu")
        self.module = nn.Sequential(*layers[self.stage.first : self.stage.end]).to(self.device)
        parameters = list(self.module.parameters())
        # A stage of layers without parameters (an activation alone) has nothing to update.
        self.optimizer = optimizer(parameters) if parameters else None
        self._loss_fn = loss_fn
        per_sample = sum(plan.layers[i].seconds for i in self.stage.layers) / self.stage.speed
        self._pace = _Pace(per_sample if emulate else None)
        pipe = _PacedStage(self._pace, self.module, self.stage.index, len(plan.stages), self.device)
        pipe.stage_index_to_group_rank = {s.index: s.rank for s in plan.stages}
        self._first, self._last = self.stage.index == 0, self.stage.index == len(plan.stages) - 1
        self._last_rank = plan.stages[-1].rank
        self._schedule = _SCHEDULES[plan.schedule](
            pipe, n_microbatches=plan.micro_batches, loss_fn=self._scaled_loss, scale_grads=False
        )
        self._batch = 0  # the first step's batch size: every step's
        self.steps = 0

    def step(self, inputs: torch.Tensor, target: Any) -> PipelineStepReport:
        """One step on a batch (every rank passes the same: the first stage reads ``inputs``,
        the last ``target``): forward and backward of its micro-batches by the schedule, then
        each stage's optimizer step."""
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
        started, computed = time.perf_counter(), self._pace.total
        losses: list[torch.Tensor] = []
        inputs, target = inputs.to(self.device), target.to(self.device)
        args = (inputs,) if self._first else ()
        try:
            self._schedule.step(
                *args, target=target if self._last else None, losses=losses, return_outputs=False
            )
        except dist.DistBackendError as exc:
            raise BackendError(f"pipeline step on rank {self.stage.rank} failed: {exc}") from exc
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack([x.detach().float() for x in losses]).sum() if losses else None
        total = (loss if loss is not None else torch.zeros(())).to(self.device)
        comm.broadcast(total, src=self._last_rank)
        self.steps += 1
        return PipelineStepReport(
            step=self.steps,
            loss=float(total),
            seconds=time.perf_counter() - started,
            compute_seconds=self._pace.total - computed,
        )

    def _scaled_loss(self, output: Any, target: Any) -> torch.Tensor:
        """The micro-batch's summed loss over the whole batch's size: summed over the
        micro-batches, the batch's mean loss."""
        return self._loss_fn(output, target) / self._batch
