"""``Trainer``: data-parallel training where each rank takes a share of the global batch in
proportion to its measured speed, and the update is still exactly the global batch's.

Each step, rank i runs its ``b_i`` samples of the global batch ``B`` (``HeteroSampler``) in
micro-batches of at most ``micro_batch`` under ``no_sync``, so its gradients accumulate locally.
Its summed loss is scaled by ``world_size / B``: DDP divides the all-reduced sum by
``world_size``, so the result is ``(1/B) Σ ∇loss_sample`` over all B samples — the gradient of
the mean loss of the whole global batch on one device, ``Σ_i (b_i/B)·ḡ_i``.

Every micro-batch but the last runs under ``no_sync``; the last one's backward triggers DDP's
bucketed all-reduce, so the communication of the first buckets hides under the rest of that
backward, as in plain DDP. With ``sharding="fsdp"`` FSDP2 shards the model instead, with the
same loss scale and the same accumulation (``parallel.py``). A rank with share 0 runs one idle
micro-batch (``pipeline.idle_batch``) whose loss weighs 0, which takes part in the same
collectives without touching the gradients. An emulated rank waits out its last micro-batch's
emulated forward, then paces the backward over the emulated backward's time (``pacing.py``), so
its gradients are reduced when the device it emulates would make them. The step report splits
each rank's time into compute (to the end of its last backward's own work), idle (waiting for
the slowest rank's compute to end) and exposed communication (the rest of the all-reduce, the
part the backward did not hide).

Shares come from ``PerfModel.batch_sizes`` over each rank's throughput (samples/s): measured at
start on ``profile_steps`` equal micro-batches, then every ``rebalance_every`` steps from the
compute time of the steps since the last rebalance; ``split="equal"`` keeps plain DDP's equal
shares instead, as a baseline with the same exact update.

The step's loss, clipping and learning rate are the global batch's too: each rank's summed loss
travels in the step report's all-gather and the report divides the total by ``B``; the gradient
is clipped after the reduction, by the norm of the averaged gradient (``max_grad_norm``); the LR
scheduler steps once per global step.

Speed decides a rank's share; memory decides how many micro-batches carry it: with a
``memory_limit`` the largest micro-batch that fits is measured at start (``memory.py``) and caps
them. Micro-batches come from a ``DataLoader`` per rank (``pipeline.py``) fed with the rank's
share of each step, and the time spent waiting for them is the step's data time, apart from
compute.

Past exact data parallelism, each off by default: gradient compression with error feedback
(``compression.py``), local SGD, where each rank steps on the mean over its own share and the
replicas are averaged every few steps (``local_sgd.py``), activation checkpointing
(``recompute.py``) and checkpoints written in the background (``async_checkpoint.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from torch.utils.data import Dataset, default_collate

from hetero import comm
from hetero._checks import is_integer
from hetero.devices.spec import Device, DeviceKind, DeviceSpec
from hetero.errors import ConfigError
from hetero.sched.perf import PerfModel
from hetero.train.async_checkpoint import CheckpointWriter
from hetero.train.checkpoint import CheckpointCopies, leave_if_regrouping, read_newest_checkpoint
from hetero.train.elastic import LAUNCHED_ENV, leave_refused
from hetero.train.memory import MemoryEstimate, MemoryProbe, cache_key, plan_memory
from hetero.train.options import PRECISIONS, TrainerOptions, rank_setup, setup_problems
from hetero.train.pacing import BACKWARD_SHARE, BackwardPacer, paced_from
from hetero.train.parallel import wrap
from hetero.train.pipeline import InputPipeline, idle_batch
from hetero.train.pipeline import chunks as _chunks
from hetero.train.recompute import checkpoint_activations
from hetero.train.report import ProgressView, RankReport, StepReport, rank_timings, step_report
from hetero.train.report_html import write_training_report
from hetero.train.sampler import HeteroSampler
from hetero.train.tensors import to_device

# RankReport, StepReport and TrainerOptions moved to their own modules; this one still exports
# them, so imports from hetero.train.trainer keep working.
__all__ = ["RankReport", "StepReport", "Trainer", "TrainerOptions"]

OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]
#: A learning-rate scheduler over the trainer's optimizer, or a function that makes one from it.
Scheduler = LRScheduler | Callable[[torch.optim.Optimizer], LRScheduler]
LossFn = Callable[[Any, Any], torch.Tensor]

# Step reports kept in ``Trainer.reports``; the whole run is in ``report_path``.
_KEEP_REPORTS = 10_000
# Ranks become devices of this spec for PerfModel, their speed the measured throughput.
_RANK_SPEC = DeviceSpec(
    model="rank", kind=DeviceKind.CPU, vendor="", tflops={}, memory_bytes=0, memory_bandwidth_gbs=0
)


class Trainer:
    """Heterogeneous data-parallel training of ``model`` over the ranks of the process group.

    Call ``hetero.comm.init()`` (or ``torch.distributed.init_process_group``) on every rank
    first, then build a ``Trainer`` with the same model structure and shared options on each.
    ``loss_fn(output, target)`` returns the *sum* of the per-sample losses of a batch (e.g.
    ``nn.CrossEntropyLoss(reduction="sum")``); training minimises their mean over the global
    batch. ``dataset`` yields ``(input, target)`` samples, batched by ``collate_fn``.
    ``optimizer`` is an optimizer over ``model``'s parameters or a function that makes one
    from them (a function with ``sharding="fsdp"``, which replaces the parameters with shards).
    ``model_state_dict()`` gives the model's full state dict under either sharding.
    ``scheduler`` is a torch LR scheduler over that optimizer, or a function that makes one
    from it (the only way with an optimizer function): it steps once per global step, after
    the optimizer (``ReduceLROnPlateau`` with the step's loss over the global batch).

    ``micro_batch`` is the cap on this rank's micro-batches in effect (the option, or what
    ``memory_limit`` lets it hold; ``None``: none) and ``memory`` what the memory probe found
    (``None`` without a limit). ``close()`` stops the data loader's worker processes.

    A ``ConfigError`` of the set-up (the constructor, before the first step) is raised on every
    start alike; under ``hetero launch`` the rank records it and leaves (``leave_refused``)
    (status 78, no traceback), and the launcher prints it once and gives up.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: LossFn,
        dataset: Dataset[Any],
        options: TrainerOptions,
        *,
        collate_fn: Callable[[list[Any]], Any] = default_collate,
        scheduler: Scheduler | None = None,
    ) -> None:
        with _refused_once():
            self._set_up(model, optimizer, loss_fn, dataset, options, collate_fn)
            self.scheduler: LRScheduler | None = self._make_scheduler(scheduler)
            self._resume_scheduler()

    def _set_up(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | OptimizerFactory,
        loss_fn: LossFn,
        dataset: Dataset[Any],
        options: TrainerOptions,
        collate_fn: Callable[[list[Any]], Any],
    ) -> None:
        if not comm.is_initialized():
            raise ConfigError(
                "Trainer needs a process group on every rank: call hetero.comm.init() (or "
                "torch.distributed.init_process_group) first"
            )
        if not isinstance(dataset, Sized) or len(dataset) < 1:
            raise ConfigError(
                [("dataset", "must be a map-style dataset with at least one sample (len())")]
            )
        if options.sharding == "fsdp" and isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(
                [
                    (
                        "optimizer",
                        "with sharding='fsdp' give a function that makes the optimizer from the "
                        "parameters (e.g. lambda params: torch.optim.AdamW(params)): FSDP "
                        "replaces the model's parameters with shards, which an optimizer made "
                        "before does not hold",
                    )
                ]
            )
        self.options = options
        self.rank = comm.rank()
        self.world_size = comm.world_size()
        self.model = model
        self._loss_fn = loss_fn
        self._dataset = dataset
        self._collate = collate_fn
        self._dataset_size = len(dataset)
        self._device = next(model.parameters()).device
        if options.activation_checkpointing:  # before the memory probe, which measures it
            checkpoint_activations(model)
        dtype = PRECISIONS[options.mixed_precision]
        # Under FSDP its MixedPrecisionPolicy sets the precision; the memory probe, on the bare
        # model, approximates that with autocast.
        self._autocast = torch.autocast(
            self._device.type, dtype=dtype, enabled=dtype is not None and options.sharding == "ddp"
        )
        sample = collate_fn([dataset[0]])
        self.memory, memory_problem = self._probe_memory(sample, optimizer)
        self.micro_batch = options.micro_batch if self.memory is None else self.memory.cap or None
        self._profile_size = self._agree(model, len(dataset), memory_problem)
        self._idle = idle_batch(model, loss_fn, to_device(sample, self._device))
        self._backward_pacer = BackwardPacer(model) if self._emulated else None
        self._parallel = wrap(model, options, self._device)
        self.optimizer = (
            optimizer
            if isinstance(optimizer, torch.optim.Optimizer)
            else optimizer(model.parameters())
        )
        self._scaler = (
            torch.amp.GradScaler(self._device.type) if options.mixed_precision == "fp16" else None
        )
        self._pipeline = InputPipeline(
            dataset,
            collate_fn,
            self._device,
            cap=self.micro_batch,
            num_workers=options.num_workers,
            prefetch_factor=options.prefetch_factor,
        )
        self._paced_until = -1.0
        self._losses: list[torch.Tensor] = []  # this step's summed losses, one per micro-batch
        self._scheduler_state: dict[str, Any] | None = None  # a resumed checkpoint's
        self.steps = 0
        self._saved_at: int | None = None  # the step of the last checkpoint step() saved
        path = self.checkpoint_path
        self._checkpoints = (
            None
            if path is None
            else CheckpointWriter(
                path, options.checkpoint_keep, options.checkpoint_async, options.checkpoint_mirrors
            )
        )
        self.reports: deque[StepReport] = deque(maxlen=_KEEP_REPORTS)
        self.throughputs = self._profile()
        self.shares = (
            list(options.shares) if options.shares is not None else self._split(self.throughputs)
        )
        self.sampler = HeteroSampler(
            len(dataset),
            options.global_batch,
            self.shares,
            self.rank,
            seed=options.seed,
            shuffle=options.shuffle,
            drop_last=options.drop_last,
        )
        self._window = [[0.0, 0.0] for _ in range(self.world_size)]  # samples, compute s
        self.resumed_from: int | None = self._resume()
        if self.rank == 0 and options.report_path and self.resumed_from is None:
            Path(options.report_path).write_text("")

    # ------------------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_path(self) -> Path | None:
        folder = self.options.checkpoint_dir
        return None if folder is None else Path(folder) / "checkpoint.pt"

    def save_checkpoint(self) -> None:
        """Rank 0 writes the training state (atomically: a crash mid-write keeps the last);
        with ``checkpoint_async`` it copies it to CPU memory and writes the copy in the
        background (``wait_for_checkpoint``). Call it on every rank: under FSDP they gather the
        state to rank 0 together."""
        if self._checkpoints is None:
            return
        gathered = self._parallel.checkpoint_state(self.optimizer)
        if self.rank != 0:
            return
        state = {
            "steps": self.steps,
            **gathered,
            "sampler": self.sampler.state_dict(),
            "scaler": None if self._scaler is None else self._scaler.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
        }
        self._checkpoints.save(state)

    def wait_for_checkpoint(self) -> CheckpointCopies | None:
        """Return once the last checkpoint is on disk (``checkpoint_async`` writes it in the
        background; ``train`` and ``close`` wait for it too), with the copies written and those
        that failed (``checkpoint_mirrors``; ``None`` before the first, and on ranks but 0).
        Raises what its write raised."""
        return None if self._checkpoints is None else self._checkpoints.wait()

    def _resume(self) -> int | None:
        """Load the checkpoint, if there is one: the step it was taken at, else None (the newest
        copy that verifies, in ``checkpoint_dir`` or a mirror). The shares stay those just
        profiled: the ranks may be other machines now."""
        path = self.checkpoint_path
        if path is None:
            return None
        parameters = {name for name, _ in self.model.named_parameters()}
        mirrors = self.options.checkpoint_mirrors
        try:
            found = read_newest_checkpoint(path, self._device, parameters, mirrors)
        except ValueError as exc:  # no copy could be read: it names each and why
            raise ConfigError([("checkpoint_dir", f"cannot resume from {exc}")]) from exc
        if found is None:
            return None
        path, state = found
        try:
            self._parallel.load_checkpoint_state(self.optimizer, state)
            self.sampler.load_state_dict(state["sampler"])
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise ConfigError([("checkpoint_dir", f"cannot resume from {path}: {exc}")]) from exc
        if self._scaler is not None and state.get("scaler") is not None:
            self._scaler.load_state_dict(state["scaler"])
        self._scheduler_state = state.get("scheduler")  # loaded once the scheduler is made
        self.sampler.set_shares(self.shares)
        self.steps = state["steps"]
        return self.steps

    def _make_scheduler(self, scheduler: Scheduler | None) -> LRScheduler | None:
        """``scheduler`` over this trainer's optimizer, made from it when it is a function."""
        if scheduler is None:
            return None
        made: object = scheduler
        if not isinstance(scheduler, LRScheduler) and callable(scheduler):
            made = scheduler(self.optimizer)
        if not isinstance(made, LRScheduler):
            returned = "" if made is scheduler else f", which returned {made!r}"
            raise ConfigError(
                [
                    (
                        "scheduler",
                        "must be a torch LR scheduler (torch.optim.lr_scheduler) over the "
                        "trainer's optimizer, or a function that makes one from it (lambda "
                        f"optimizer: StepLR(optimizer, 10)), got {scheduler!r}{returned}",
                    )
                ]
            )
        if made.optimizer is not self.optimizer:
            raise ConfigError(
                [
                    (
                        "scheduler",
                        f"{type(made).__name__} steps another optimizer than the trainer's "
                        "(one made by an optimizer function is the trainer's own): give a "
                        "function that makes the scheduler from the trainer's optimizer, "
                        f"e.g. lambda optimizer: {type(made).__name__}(optimizer, ...)",
                    )
                ]
            )
        return made

    def _resume_scheduler(self) -> None:
        """The resumed checkpoint's scheduler state, once the scheduler is made: its learning
        rate goes on from the saved step."""
        state, self._scheduler_state = self._scheduler_state, None
        if self.scheduler is not None and state is not None:
            self.scheduler.load_state_dict(state)

    def write_report(self, path: str | Path, *, labels: Sequence[str] | None = None) -> Path:
        """Write ``reports`` (the last 10,000 steps) as one self-contained HTML file: each
        rank's compute, data, communication and idle time over the steps, and the loss
        (``report_html.write_training_report``). ``labels`` names the ranks."""
        return write_training_report(list(self.reports), path, labels=labels)

    def model_state_dict(self) -> dict[str, Any]:
        """The model's full state dict, on every rank; call it on every rank (under FSDP they
        gather the shards together)."""
        return self._parallel.model_state()

    # ------------------------------------------------------------------------------ set-up

    def _probe_memory(
        self, sample: Any, optimizer: torch.optim.Optimizer | OptimizerFactory
    ) -> tuple[MemoryEstimate | None, str | None]:
        """With a ``memory_limit``: the largest micro-batch this rank may run under it, measured
        on the bare model (see ``memory.py``), and why the limit cannot be met if it cannot
        (every rank raises that together, in ``_agree``)."""
        o = self.options
        if o.memory_limit is None:
            return None, None
        cache = o.memory_cache or (
            None if o.checkpoint_dir is None else str(Path(o.checkpoint_dir) / "memory_probe.json")
        )
        dtype = PRECISIONS[o.mixed_precision]
        probe = MemoryProbe(
            self.model,
            self._loss_fn,
            self._dataset,
            self._collate,
            autocast=torch.autocast(self._device.type, dtype=dtype, enabled=dtype is not None),
            optimizer=optimizer,
            sharding=o.sharding,
            world_size=self.world_size,
        )
        try:
            return plan_memory(
                probe,
                o.memory_limit,
                most=min(o.global_batch, self._dataset_size),
                micro_batch=o.micro_batch,
                cache=None if cache is None else Path(cache),
                # Activations recomputed in the backward need less memory: measured apart.
                key=cache_key(self.model, sample, self._device, o.mixed_precision)
                + ("-recompute" if o.activation_checkpointing else ""),
            )
        except ConfigError as exc:
            return None, str(exc)

    def _agree(self, model: nn.Module, dataset_size: int, memory: str | None = None) -> int:
        """Check that every rank runs the same model and shared options on a dataset of the same
        size, and that every rank's memory limit can be met, raising the same ``ConfigError``
        on all of them otherwise; returns the micro-batch size every rank profiles with."""
        o = self.options
        setup = rank_setup(o, model, dataset_size, micro_batch=self.micro_batch, memory=memory)
        ranks = comm.all_gather_object(setup)
        problems = setup_problems(o, ranks, self.world_size, dataset_size)
        if problems:
            raise ConfigError(problems)
        caps = [r["micro_batch"] for r in ranks if r["micro_batch"] is not None]
        return int(min([math.ceil(o.global_batch / self.world_size), *caps]))

    def _profile(self) -> list[float]:
        """Every rank's samples/s on ``profile_steps`` micro-batches of one size (after one
        untimed warm-up); the gradients are thrown away."""
        indices = list(range(min(self._profile_size, self._dataset_size)))
        batch = self._batch(indices)  # loaded once: profiling times the compute
        with self._parallel.accumulating():
            self._micro_batch(batch, len(indices), 0.0)  # first-pass allocations, lazy set-up
            self._paced_until = -1.0  # the timed passes get no credit for the warm-up's pacing
            started = finished = time.perf_counter()
            for _ in range(self.options.profile_steps):
                finished = self._micro_batch(batch, len(indices), 0.0)
            seconds = finished - started
        self._parallel.discard()
        rate = len(indices) * self.options.profile_steps / seconds
        return [row[0] for row in self._gather([rate])]

    def _split(self, throughputs: Sequence[float]) -> list[int]:
        """Shares of the global batch: by ``throughputs``, or equal ones (``split="equal"``,
        plain DDP's split; the first ``B mod world_size`` ranks take one more)."""
        if self.options.split == "equal":
            size, extra = divmod(self.options.global_batch, self.world_size)
            return [size + (i < extra) for i in range(self.world_size)]
        devices = [
            Device(id=f"rank{i}", spec=_RANK_SPEC, speed_override=x)
            for i, x in enumerate(throughputs)
        ]
        return PerfModel(devices).batch_sizes(self.options.global_batch)

    # -------------------------------------------------------------------------------- steps

    def step(self) -> StepReport:
        """One synchronised optimizer step on this rank's share of the next global batch."""
        o = self.options
        if self._saved_at == self.steps:  # between steps: every rank is past the checkpoint
            # An elastic launch's lost rank rejoins, from that checkpoint once it is on disk.
            leave_if_regrouping(self._device, self.wait_for_checkpoint)
        sampler = self.sampler
        if sampler.position == sampler.num_batches:
            sampler.set_epoch(sampler.epoch + 1)
        epoch, position, shares = sampler.epoch, sampler.position, sampler.shares
        indices = next(sampler.batches())
        parallel = self._parallel
        if parallel.reduces_gradients:
            # The loss scale world_size / B_k (B_k: this global batch, smaller if it is an
            # epoch's partial last one) turns DDP's mean over ranks into the mean over the
            # global batch.
            batch = min(o.global_batch, sampler.dataset_size - position * o.global_batch)
            scale = self.world_size / batch
        else:  # local SGD: each rank steps on the mean over its own share
            scale = 1 / max(len(indices), 1)
        # Under local SGD a rank with no samples has nothing to compute, nor to step.
        updates = bool(indices) or parallel.reduces_gradients
        chunks = _chunks(indices, self.micro_batch)

        self._paced_until = -1.0  # the device idled through the last step's communication
        self._losses = []
        started = time.perf_counter()
        # Wall-clock instants, to compare with other ranks' (perf_counter's origin is per
        # process); taken once, so the step's own timings stay monotonic.
        wall = time.time() - started
        self._pipeline.begin(sampler)  # (re)starting the loader, if it must, is data time
        data = time.perf_counter() - started
        *accumulated, last = chunks or [[]]  # share 0: one idle micro-batch, in the collectives
        with parallel.accumulating():
            for chunk in accumulated:
                loaded, waited = self._next_batch()
                data += waited
                self._micro_batch(loaded, len(chunk), scale)
        computed = time.perf_counter()
        if updates:
            loaded, waited = self._next_batch() if last else (self._idle, 0.0)
            data += waited
            # Its backward reduces the gradients; an idle micro-batch's loss weighs 0.
            computed = self._last_micro_batch(loaded, len(last), scale if last else 0.0)
        self._sync_device()
        synced = time.perf_counter()
        grad_norm = self._clip()
        lr = float(self.optimizer.param_groups[0]["lr"])  # the rate this update uses
        if updates:
            if self._scaler is not None:
                self._scaler.step(self.optimizer)
                self._scaler.update()
            else:
                self.optimizer.step()
        self.model.zero_grad(set_to_none=True)
        checkpointing = o.checkpoint_dir is not None and (self.steps + 1) % o.checkpoint_every == 0
        averaging = time.perf_counter()
        comm_bytes = parallel.end_step(len(indices), self.steps + 1, checkpointing)
        # Local SGD's parameter averaging is its step's communication (DDP's end_step does
        # none): counted as such, after the compute.
        synced += time.perf_counter() - averaging
        self._sync_device()
        ended = time.perf_counter()
        sampler.advance()
        self.steps += 1

        # One number for the device to hand over: the losses stayed on it during the step.
        loss_sum = float(torch.stack(self._losses).double().sum()) if self._losses else 0.0
        mine = rank_timings(
            len(indices), len(chunks), started, computed, synced, ended, wall, data, loss_sum
        )
        report = step_report(
            self.steps,
            epoch,
            shares,
            self.throughputs,
            self._gather(mine),
            grad_norm=grad_norm,
            lr=lr,
            comm_bytes=comm_bytes,
            dense_bytes=parallel.dense_bytes,
        )
        if self.scheduler is not None:
            # After the gather: ReduceLROnPlateau goes by the global batch's loss, the same on
            # every rank, so every rank's learning rate stays the same.
            if isinstance(self.scheduler, ReduceLROnPlateau):
                self.scheduler.step(math.nan if report.loss is None else report.loss)
            else:
                self.scheduler.step()
        if checkpointing:
            self.save_checkpoint()
            self._saved_at = self.steps
        report = self._rebalance(report)
        self.reports.append(report)
        if self.rank == 0 and o.report_path:
            with open(o.report_path, "a") as f:
                f.write(json.dumps(report.to_dict()) + "\n")
        return report

    def train(self, steps: int, progress: bool = True) -> list[StepReport]:
        """Run ``steps`` steps; with ``progress``, rank 0 shows them live on stderr (a progress
        bar on a terminal, else a line every ``report_every`` steps). Returns once the last
        checkpoint is on disk."""
        if not is_integer(steps) or steps < 0:
            raise ConfigError([("steps", f"must be an integer >= 0, got {steps!r}")])
        view = (
            ProgressView(steps, self.options.report_every) if progress and self.rank == 0 else None
        )
        done: list[StepReport] = []
        try:
            for _ in range(steps):
                done.append(self.step())
                if view is not None:
                    view.update(done[-1])
        finally:
            if view is not None:
                view.close()
        self.wait_for_checkpoint()
        return done

    def _rebalance(self, report: StepReport) -> StepReport:
        """Fold the step into the measurement window; at the end of a window, re-estimate the
        throughputs and, unless the shares are fixed, split the next global batches by them."""
        for r in report.ranks:
            self._window[r.rank][0] += r.samples
            self._window[r.rank][1] += r.compute_seconds
        every = self.options.rebalance_every
        if not every or self.steps % every:
            return report
        # A rank that had no samples in the window keeps its last estimate.
        self.throughputs = [
            samples / seconds if samples > 0 and seconds > 0 else old
            for (samples, seconds), old in zip(self._window, self.throughputs, strict=True)
        ]
        self._window = [[0.0, 0.0] for _ in range(self.world_size)]
        if self.options.shares is not None:
            return report
        shares = self._split(self.throughputs)
        if shares == self.shares:
            return report
        self.shares = shares
        self.sampler.set_shares(shares)
        return dataclasses.replace(report, rebalanced=True, next_shares=tuple(shares))

    # ------------------------------------------------------------------------------ passes

    def close(self) -> None:
        """Stop the data loader's worker processes (``num_workers``; a later step starts them
        again) and wait for a checkpoint still being written."""
        self._pipeline.close()
        self.wait_for_checkpoint()

    def _next_batch(self) -> tuple[Any, float]:
        """The step's next micro-batch from the pipeline, and the seconds waited for it. An
        emulated device idles while it waits: its pacing moves on by as much."""
        batch, waited = self._pipeline.next()
        if self._paced_until >= 0:
            self._paced_until += waited
        return batch, waited

    def _micro_batch(self, batch: Any, samples: int, scale: float) -> float:
        """Forward and backward of one micro-batch of ``samples`` samples, paced when this
        rank emulates a speed; returns when it finished."""
        started = time.perf_counter()
        torch.autograd.backward(self._forward(batch, scale))
        self._sync_device()
        return self._pace(started, samples)

    def _last_micro_batch(self, batch: Any, samples: int, scale: float) -> float:
        """The step's last micro-batch, outside ``accumulating``: its backward reduces the
        gradients as they become ready (DDP's buckets, FSDP's units). Returns when its compute
        ended. An emulated rank waits out the micro-batch's emulated forward, then runs the
        backward paced over the emulated backward's time (``pacing.py``), so the gradients
        become ready when the emulated device would make them, and its compute ends at the
        paced end. Otherwise the end is estimated as the backward's start plus twice the
        forward's time (a backward costs about two forwards); what the backward takes beyond
        that is the communication it could not hide."""
        started = time.perf_counter()
        pacer = self._backward_pacer
        with pacer.watching() if pacer is not None else contextlib.nullcontext():
            loss = self._forward(batch, scale)
        self._sync_device()
        forwarded = time.perf_counter()
        backward = 2 * (forwarded - started)
        paced = self._pace(started, samples, backward)
        if pacer is None:
            torch.autograd.backward(loss)
            return forwarded + backward
        with pacer.spread(time.perf_counter(), paced):
            torch.autograd.backward(loss)
        self._sync_device()
        # The backward (and its all-reduce) took less than estimated: the emulated device is
        # still computing.
        time.sleep(max(0.0, paced - time.perf_counter()))
        return paced

    def _batch(self, indices: list[int]) -> Any:
        """``indices`` loaded here, outside the pipeline (for profiling)."""
        return to_device(self._collate([self._dataset[i] for i in indices]), self._device)

    def _clip(self) -> float | None:
        """With ``max_grad_norm``: clip the reduced gradient (the global batch's) to it, and
        return its norm before; under fp16 the gradients are unscaled first, so the norm is the
        true one (an overflow's is infinite, and the scaler then skips the step)."""
        if self.options.max_grad_norm is None:
            return None
        if self._scaler is not None:
            self._scaler.unscale_(self.optimizer)
        return self._parallel.clip_grad_norm(self.options.max_grad_norm)

    def _forward(self, batch: Any, scale: float) -> torch.Tensor:
        inputs, target = batch
        with self._autocast:
            loss = self._loss_fn(self._parallel.module(inputs), target)
        loss = loss.float()
        if scale:  # an idle or profiling pass (scale 0) has no loss to report
            self._losses.append(loss.detach())
        loss = loss * scale
        return self._scaler.scale(loss) if self._scaler is not None else loss

    @property
    def _emulated(self) -> bool:
        return self.options.speed is not None or self.options.emulate_sample_time is not None

    def _pace(self, started: float, samples: int, backward: float = 0.0) -> float:
        """Hold this rank until the emulated device would have finished the micro-batch, and
        return when the emulated device finishes it: the sleep's overshoot is the host's
        delay, not the device's. With ``backward`` (the real backward's estimated seconds,
        still to run), hold it only until the emulated device would start its backward: the
        last ``BACKWARD_SHARE`` of the micro-batch's emulated time, or the real backward's
        when that is longer."""
        o = self.options
        now = time.perf_counter()
        if not self._emulated:
            return now
        speed = o.speed or 1.0
        if o.emulate_sample_time is not None:
            target = samples * o.emulate_sample_time / speed  # the real compute counts toward it
        else:
            target = (now - started + backward) / speed
        base = paced_from(started, self._paced_until)
        self._paced_until = base + target
        held = max(backward, target * BACKWARD_SHARE) if backward else 0.0
        if self._paced_until - held > now:
            time.sleep(self._paced_until - held - now)
        return max(self._paced_until, now)

    def _sync_device(self) -> None:
        # CUDA runs asynchronously: wait for it, or the clocks would time the launches only.
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _gather(self, values: list[float]) -> list[list[float]]:
        """``values`` from every rank, identical on all of them (so they split identically)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self._device)
        return [row.tolist() for row in comm.all_gather(tensor)]


@contextlib.contextmanager
def _refused_once() -> Iterator[None]:
    """A ``ConfigError`` of the set-up, under ``hetero launch``: recorded where the launcher reads
    it, and this rank leaves quietly (``leave_refused``), since every start would raise it again
    on every rank; the launcher prints it once. Elsewhere it is raised as it is."""
    try:
        yield
    except ConfigError as exc:
        if os.environ.get(LAUNCHED_ENV) != "1":
            raise
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
        leave_refused()
