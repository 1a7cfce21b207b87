"""``Trainer``: data-parallel training where each rank takes a share of the global batch in
proportion to its measured speed, and the update is still exactly the global batch's.

Each step, rank i runs its ``b_i`` samples of the global batch ``B`` (``HeteroSampler``) in
micro-batches of at most ``micro_batch`` under ``no_sync``, so its gradients accumulate locally.
Its summed loss is scaled by ``world_size / B``: DDP divides the all-reduced sum by
``world_size``, so the result is ``(1/B) Σ ∇loss_sample`` over all B samples — the gradient of
the mean loss of the whole global batch on one device, ``Σ_i (b_i/B)·ḡ_i``.

Every micro-batch but the last runs under ``no_sync``; the last one's backward triggers DDP's
bucketed all-reduce, so the communication of the first buckets hides under the rest of that
backward, as in plain DDP. A rank with share 0 runs one empty micro-batch, which takes part in
the same collectives without touching the gradients. An emulated rank waits out its last
micro-batch's emulated time before that backward, so its all-reduce starts when the device it
emulates would reach it. The step report splits each rank's time into compute (to the end of
its last backward's own work), idle (waiting for the slowest rank's compute to end) and
exposed communication (the rest of the all-reduce, the part the backward did not hide).

Shares come from ``PerfModel.batch_sizes`` over each rank's throughput (samples/s): measured at
start on ``profile_steps`` equal micro-batches, then every ``rebalance_every`` steps from the
compute time of the steps since the last rebalance.
"""

from __future__ import annotations

import contextlib
import json
import math
import pickle
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset, default_collate

from hetero import comm
from hetero.config import MAX_SPEED, MIN_SPEED
from hetero.devices.spec import Device, DeviceKind, DeviceSpec
from hetero.errors import ConfigError
from hetero.sched.perf import PerfModel
from hetero.train.sampler import HeteroSampler

__all__ = ["RankReport", "StepReport", "Trainer", "TrainerOptions"]

Compression = Literal["none", "fp16", "powersgd"]
MixedPrecision = Literal["no", "bf16", "fp16"]
OptimizerFactory = Callable[[Iterator[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[Any, Any], torch.Tensor]

_COMPRESSIONS = ("none", "fp16", "powersgd")
_PRECISIONS = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
# Back-to-back micro-batches are paced from where the previous one was due to end, so the
# overshoot of each sleep is made up (as hetero's emulated workers do).
_PACE_SLACK = 0.002
# The longest emulated time per sample: longer ones are no device's, and overflow a sleep.
_MAX_SAMPLE_SECONDS = 3600
# What a checkpoint holds beside the optional "scaler".
_CHECKPOINT_KEYS = ("steps", "model", "optimizer", "sampler")
# Step reports kept in ``Trainer.reports``; the whole run is in ``report_path``.
_KEEP_REPORTS = 10_000
# Ranks become devices of this spec for PerfModel, their speed the measured throughput.
_RANK_SPEC = DeviceSpec(
    model="rank", kind=DeviceKind.CPU, vendor="", tflops={}, memory_bytes=0, memory_bandwidth_gbs=0
)
# Options every rank must share (the others, like speed or micro_batch, are per rank).
_SHARED_OPTIONS = (
    "global_batch",
    "rebalance_every",
    "profile_steps",
    "seed",
    "shuffle",
    "drop_last",
    "shares",
    "bucket_cap_mb",
    "compression",
    "mixed_precision",
)


@dataclass(frozen=True)
class TrainerOptions:
    """How a ``Trainer`` splits, runs and reports the work. Built on every rank: ``micro_batch``,
    ``speed``, ``emulate_sample_time``, ``report_path`` and ``report_every`` may differ per rank,
    the others must be equal on all of them.

    - ``global_batch``: samples per optimizer step over all ranks (``B``).
    - ``micro_batch``: most samples one forward/backward on this rank holds (its memory); a
      larger share is accumulated over several. ``None``: no cap.
    - ``rebalance_every``: steps between rebalancing from measured speeds (0: never).
    - ``profile_steps``: timed micro-batches per rank at start that set the first shares.
    - ``shares``: fixed shares per rank (summing to ``global_batch``): no rebalancing.
    - ``speed``, ``emulate_sample_time``: emulate a device of relative ``speed`` on this rank
      (see ``docs/training.md``): each micro-batch takes ``samples × emulate_sample_time /
      speed`` seconds, or without a sample time its real compute time over ``speed``.
    - ``bucket_cap_mb``, ``compression``, ``mixed_precision``: DDP's bucket size, a DDP
      communication hook (``fp16_compress_hook``, PowerSGD with torch's defaults) and
      ``torch.autocast`` (with a ``GradScaler`` for fp16). Compression makes the gradients
      inexact.
    - ``report_path``: JSON lines, one step report each, written by rank 0.
    - ``checkpoint_dir``, ``checkpoint_every``: rank 0 saves the model, the optimizer, the
      sampler's position and the step count there every ``checkpoint_every`` steps (a directory
      every rank can read); a ``Trainer`` built where a checkpoint exists resumes from it,
      profiling the ranks afresh (``hetero launch`` restarts them after a failure).
    """

    global_batch: int
    micro_batch: int | None = None
    rebalance_every: int = 50
    profile_steps: int = 3
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    shares: tuple[int, ...] | None = None
    speed: float | None = None
    emulate_sample_time: float | None = None
    bucket_cap_mb: float = 25.0
    compression: Compression = "none"
    mixed_precision: MixedPrecision = "no"
    report_path: str | None = None
    report_every: int = 10
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50

    def __post_init__(self) -> None:
        if self.shares is not None and not isinstance(self.shares, (str, bytes)):
            with contextlib.suppress(TypeError):
                object.__setattr__(self, "shares", tuple(self.shares))
        problems = _check_options(self)
        if problems:
            raise ConfigError(problems)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check_options(o: TrainerOptions) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []

    def at_least(name: str, minimum: int, why: str = "") -> None:
        value = getattr(o, name)
        if not _is_int(value) or value < minimum:
            problems.append((name, f"must be an integer >= {minimum}{why}, got {value!r}"))

    at_least("global_batch", 1)
    if o.micro_batch is not None:
        at_least(
            "micro_batch",
            1,
            " (the most samples one forward/backward on this rank holds; None for no cap): a"
            " rank that cannot hold one sample cannot train",
        )
    at_least("rebalance_every", 0, " (0: never)")
    at_least("profile_steps", 1)
    at_least("seed", 0)
    at_least("report_every", 1)
    at_least("checkpoint_every", 1)
    if o.speed is not None and not (_is_positive(o.speed) and MIN_SPEED <= o.speed <= MAX_SPEED):
        problems.append(
            (
                "speed",
                f"must be a number from {MIN_SPEED:g} to {MAX_SPEED:g} or None, got {o.speed!r}",
            )
        )
    sample_time = o.emulate_sample_time
    if sample_time is not None and not (
        _is_positive(sample_time) and sample_time <= _MAX_SAMPLE_SECONDS
    ):
        problems.append(
            (
                "emulate_sample_time",
                f"must be a number of seconds > 0 and at most {_MAX_SAMPLE_SECONDS} or None, "
                f"got {sample_time!r}",
            )
        )
    if not _is_positive(o.bucket_cap_mb):
        problems.append(("bucket_cap_mb", f"must be a finite number > 0, got {o.bucket_cap_mb!r}"))
    if o.compression not in _COMPRESSIONS:
        allowed = ", ".join(_COMPRESSIONS)
        problems.append(("compression", f"must be one of {allowed}, got {o.compression!r}"))
    if o.mixed_precision not in _PRECISIONS:
        allowed = ", ".join(_PRECISIONS)
        problems.append(("mixed_precision", f"must be one of {allowed}, got {o.mixed_precision!r}"))
    if o.shares is not None:
        shares = o.shares
        if not isinstance(shares, tuple) or not all(_is_int(s) and s >= 0 for s in shares):
            problems.append(("shares", f"must be a list of integers >= 0, got {shares!r}"))
        elif _is_int(o.global_batch) and sum(shares) != o.global_batch:
            problems.append(
                (
                    "shares",
                    f"must sum to global_batch={o.global_batch}, got {list(shares)} "
                    f"(sum {sum(shares)})",
                )
            )
    return problems


@dataclass(frozen=True, slots=True)
class RankReport:
    """One rank's part of one step (seconds of wall time)."""

    rank: int
    samples: int
    micro_batches: int
    compute_seconds: float  # its micro-batches: data, forward, backward (and emulated pacing)
    idle_seconds: float  # waiting for the slowest rank's compute to end
    comm_seconds: float  # the all-reduce left after that: what the last backward did not hide
    step_seconds: float  # the whole step, optimizer included

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.compute_seconds if self.compute_seconds > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StepReport:
    """One synchronised step on every rank, the same on all of them.

    ``throughputs`` are the per-rank samples/s the trainer works from (profiled, then measured
    over each rebalance window); the ideal step time is ``global_batch / Σ throughputs``, what a
    perfect split with no communication would take, and ``efficiency`` is ideal / actual.
    """

    step: int  # steps done, this one included
    epoch: int
    shares: tuple[int, ...]  # of this step's global batch
    throughputs: tuple[float, ...]
    ranks: tuple[RankReport, ...]
    rebalanced: bool = False  # the shares change from the next step
    next_shares: tuple[int, ...] = field(default=())

    @property
    def global_batch(self) -> int:
        return sum(r.samples for r in self.ranks)

    @property
    def step_seconds(self) -> float:
        return max(r.step_seconds for r in self.ranks)

    @property
    def ideal_seconds(self) -> float:
        return self.global_batch / sum(self.throughputs)

    @property
    def efficiency(self) -> float:
        return self.ideal_seconds / self.step_seconds

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["ranks"] = [
            {**asdict(r), "samples_per_second": r.samples_per_second} for r in self.ranks
        ]
        doc.update(
            shares=list(self.shares),
            throughputs=list(self.throughputs),
            next_shares=list(self.next_shares),
            global_batch=self.global_batch,
            step_seconds=self.step_seconds,
            ideal_seconds=self.ideal_seconds,
            efficiency=self.efficiency,
        )
        return doc

    def summary(self) -> str:
        """One line: step time against the ideal, shares, and each rank's time split."""
        ms = 1e3
        ranks = "; ".join(
            f"r{r.rank} {r.compute_seconds * ms:.0f}/{r.comm_seconds * ms:.0f}/"
            f"{r.idle_seconds * ms:.0f}"
            for r in self.ranks
        )
        return (
            f"step {self.step}: {self.step_seconds * ms:.1f} ms, ideal "
            f"{self.ideal_seconds * ms:.1f} ms ({self.efficiency:.0%}), shares "
            f"{'/'.join(map(str, self.shares))}, compute/comm/idle ms {ranks}"
            + (f"; rebalanced to {'/'.join(map(str, self.next_shares))}" if self.rebalanced else "")
        )


class Trainer:
    """Heterogeneous data-parallel training of ``model`` over the ranks of the process group.

    Call ``hetero.comm.init()`` (or ``torch.distributed.init_process_group``) on every rank
    first, then build a ``Trainer`` with the same model structure and shared options on each.
    ``loss_fn(output, target)`` returns the *sum* of the per-sample losses of a batch (e.g.
    ``nn.CrossEntropyLoss(reduction="sum")``); training minimises their mean over the global
    batch. ``dataset`` yields ``(input, target)`` samples, batched by ``collate_fn``.
    ``optimizer`` is an optimizer over ``model``'s parameters or a function that makes one
    from them.
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
        self.options = options
        self.rank = comm.rank()
        self.world_size = comm.world_size()
        self.model = model
        self._loss_fn = loss_fn
        self._dataset = dataset
        self._collate = collate_fn
        self._dataset_size = len(dataset)
        self._device = next(model.parameters()).device
        self._profile_size = self._agree(model, len(dataset))
        self._ddp = self._wrap(model)
        self.optimizer = (
            optimizer
            if isinstance(optimizer, torch.optim.Optimizer)
            else optimizer(model.parameters())
        )
        dtype = _PRECISIONS[options.mixed_precision]
        self._autocast = torch.autocast(self._device.type, dtype=dtype, enabled=dtype is not None)
        self._scaler = (
            torch.amp.GradScaler(self._device.type) if options.mixed_precision == "fp16" else None
        )
        self._empty = _to(_take_none(collate_fn([dataset[0]])), self._device)
        self._paced_until = -1.0
        self.steps = 0
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
        """Rank 0 writes the training state (atomically: a crash mid-write keeps the last)."""
        path = self.checkpoint_path
        if path is None or self.rank != 0:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "steps": self.steps,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "sampler": self.sampler.state_dict(),
            "scaler": None if self._scaler is None else self._scaler.state_dict(),
        }
        partial = path.with_suffix(".partial")
        torch.save(state, partial)
        partial.replace(path)

    def _resume(self) -> int | None:
        """Load the checkpoint, if there is one: the step it was taken at, else None. The
        shares stay those just profiled: the ranks may be other machines now."""
        path = self.checkpoint_path
        if path is None or not path.exists():
            return None
        parameters = {name for name, _ in self.model.named_parameters()}
        try:
            state = _read_checkpoint(path, self._device, parameters)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.sampler.load_state_dict(state["sampler"])
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise ConfigError([("checkpoint_dir", f"cannot resume from {path}: {exc}")]) from exc
        if self._scaler is not None and state.get("scaler") is not None:
            self._scaler.load_state_dict(state["scaler"])
        self.sampler.set_shares(self.shares)
        self.steps = state["steps"]
        return self.steps

    # ------------------------------------------------------------------------------ set-up

    def _agree(self, model: nn.Module, dataset_size: int) -> int:
        """Check that every rank runs the same model and shared options on a dataset of the same
        size, raising the same ``ConfigError`` on all of them otherwise; returns the
        micro-batch size every rank profiles with."""
        o = self.options
        mine = {
            "model": [(n, tuple(t.shape), str(t.dtype)) for n, t in _tensors(model)],
            "options": {name: getattr(o, name) for name in _SHARED_OPTIONS},
            "dataset_size": dataset_size,
            "micro_batch": o.micro_batch,
        }
        ranks = comm.all_gather_object(mine)
        problems: list[tuple[str, str]] = []
        if o.global_batch < self.world_size:
            problems.append(
                (
                    "global_batch",
                    f"a global batch smaller than the number of ranks: global_batch="
                    f"{o.global_batch} with {self.world_size} ranks; use at least "
                    f"{self.world_size} (or fewer ranks)",
                )
            )
        if o.shares is not None and len(o.shares) != self.world_size:
            problems.append(
                (
                    "shares",
                    f"has {len(o.shares)} entries for {self.world_size} ranks: give one each",
                )
            )
        if dataset_size < o.global_batch and o.drop_last:
            problems.append(
                (
                    "dataset",
                    f"has {dataset_size} samples, fewer than one global batch of "
                    f"{o.global_batch}, and drop_last is set: no step would run",
                )
            )
        first = ranks[0]
        for rank, theirs in enumerate(ranks[1:], start=1):
            if theirs["model"] != first["model"]:
                diff = _model_difference(first["model"], theirs["model"], rank)
                problems.append(
                    (f"rank {rank}", f"rank {rank}'s model differs from rank 0's: {diff}")
                )
            for name, value in theirs["options"].items():
                if value != first["options"][name]:
                    problems.append(
                        (
                            f"rank {rank}",
                            f"option {name}={value!r} differs from rank 0's "
                            f"{first['options'][name]!r}: it must be the same on every rank",
                        )
                    )
            if theirs["dataset_size"] != dataset_size:
                problems.append(
                    (
                        f"rank {rank}",
                        f"its dataset has {theirs['dataset_size']} samples, rank 0's "
                        f"{dataset_size}: every rank indexes the same dataset",
                    )
                )
        if problems:
            raise ConfigError(problems)
        caps = [r["micro_batch"] for r in ranks if r["micro_batch"] is not None]
        return int(min([math.ceil(o.global_batch / self.world_size), *caps]))

    def _wrap(self, model: nn.Module) -> DistributedDataParallel:
        o = self.options
        device_ids = [self._device] if self._device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=o.bucket_cap_mb)
        if o.compression == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif o.compression == "powersgd":
            state = powerSGD_hook.PowerSGDState(process_group=None)
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return ddp

    def _profile(self) -> list[float]:
        """Every rank's samples/s on ``profile_steps`` micro-batches of one size (after one
        untimed warm-up); the gradients are thrown away."""
        indices = list(range(min(self._profile_size, self._dataset_size)))
        with self._ddp.no_sync():
            self._micro_batch(indices, 0.0)  # first-pass allocations and lazy set-up
            self._paced_until = -1.0  # the timed passes get no credit for the warm-up's pacing
            started = finished = time.perf_counter()
            for _ in range(self.options.profile_steps):
                finished = self._micro_batch(indices, 0.0)
            seconds = finished - started
        self.model.zero_grad(set_to_none=True)
        rate = len(indices) * self.options.profile_steps / seconds
        return [row[0] for row in self._gather([rate])]

    def _split(self, throughputs: Sequence[float]) -> list[int]:
        devices = [
            Device(id=f"rank{i}", spec=_RANK_SPEC, speed_override=x)
            for i, x in enumerate(throughputs)
        ]
        return PerfModel(devices).batch_sizes(self.options.global_batch)

    # -------------------------------------------------------------------------------- steps

    def step(self) -> StepReport:
        """One synchronised optimizer step on this rank's share of the next global batch."""
        o = self.options
        sampler = self.sampler
        if sampler.position == sampler.num_batches:
            sampler.set_epoch(sampler.epoch + 1)
        epoch, position, shares = sampler.epoch, sampler.position, sampler.shares
        indices = next(sampler.batches())
        # The loss scale world_size / B_k (B_k: this global batch, smaller if it is an epoch's
        # partial last one) turns DDP's mean over ranks into the mean over the global batch.
        batch = min(o.global_batch, sampler.dataset_size - position * o.global_batch)
        scale = self.world_size / batch
        chunks = _chunks(indices, o.micro_batch)

        self._paced_until = -1.0  # the device idled through the last step's communication
        started = time.perf_counter()
        # Wall-clock instants, to compare with other ranks' (perf_counter's origin is per
        # process); taken once, so the step's own timings stay monotonic.
        wall = time.time() - started
        *accumulated, last = chunks or [[]]  # share 0: one empty micro-batch, in the collectives
        with self._ddp.no_sync():
            for chunk in accumulated:
                self._micro_batch(chunk, scale)
        computed = self._last_micro_batch(last, scale)  # all-reduces under its backward
        self._sync_device()
        synced = time.perf_counter()
        if self._scaler is not None:
            self._scaler.step(self.optimizer)
            self._scaler.update()
        else:
            self.optimizer.step()
        self.model.zero_grad(set_to_none=True)
        self._sync_device()
        ended = time.perf_counter()
        sampler.advance()
        self.steps += 1
        if (
            self.options.checkpoint_dir is not None
            and self.steps % self.options.checkpoint_every == 0
        ):
            self.save_checkpoint()

        mine = [len(indices), len(chunks), computed - started, synced - computed]
        mine += [ended - started, computed + wall]
        rows = self._gather(mine)
        slowest = max(row[5] for row in rows)  # when the last rank's compute ended
        reports = []
        for i, (samples, micro, compute, tail, whole, end) in enumerate(rows):
            # What came after its compute: waiting for the slowest rank, then the all-reduce.
            idle = min(max(slowest - end, 0.0), tail)
            reports.append(
                RankReport(i, int(samples), int(micro), compute, idle, tail - idle, whole)
            )
        ranks = tuple(reports)
        report = StepReport(self.steps, epoch, shares, tuple(self.throughputs), ranks)
        report = self._rebalance(report)
        self.reports.append(report)
        if self.rank == 0 and o.report_path:
            with open(o.report_path, "a") as f:
                f.write(json.dumps(report.to_dict()) + "\n")
        return report

    def train(self, steps: int, progress: bool = True) -> list[StepReport]:
        """Run ``steps`` steps; with ``progress``, rank 0 shows them live on stderr (a progress
        bar on a terminal, else a line every ``report_every`` steps)."""
        if not _is_int(steps) or steps < 0:
            raise ConfigError([("steps", f"must be an integer >= 0, got {steps!r}")])
        view = _Progress(steps, self.options.report_every) if progress and self.rank == 0 else None
        done: list[StepReport] = []
        try:
            for _ in range(steps):
                done.append(self.step())
                if view is not None:
                    view.update(done[-1])
        finally:
            if view is not None:
                view.close()
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
        return StepReport(
            report.step,
            report.epoch,
            report.shares,
            report.throughputs,
            report.ranks,
            rebalanced=True,
            next_shares=tuple(shares),
        )

    # ------------------------------------------------------------------------------ passes

    def _micro_batch(self, indices: list[int], scale: float) -> float:
        """Forward and backward of one micro-batch, paced when this rank emulates a speed;
        returns when it finished."""
        started = time.perf_counter()
        torch.autograd.backward(self._forward(self._batch(indices), scale))
        self._sync_device()
        return self._pace(started, len(indices))

    def _last_micro_batch(self, indices: list[int], scale: float) -> float:
        """The step's last micro-batch, outside ``no_sync``: its backward all-reduces DDP's
        buckets as they fill. Returns when its compute ended. An emulated rank waits out the
        micro-batch's emulated time before the backward (less the backward's own estimated
        time), so the all-reduce starts when the emulated device would reach it, and its
        compute ends at the paced end. Otherwise the end is estimated as the backward's start
        plus twice the forward's time (a backward costs about two forwards); what the backward
        takes beyond that is the all-reduce it could not hide."""
        started = time.perf_counter()
        loss = self._forward(self._batch(indices), scale)
        self._sync_device()
        forwarded = time.perf_counter()
        backward = 2 * (forwarded - started)
        paced = self._pace(started, len(indices), backward)
        torch.autograd.backward(loss)
        if not self._emulated:
            return forwarded + backward
        self._sync_device()
        # The backward (and its all-reduce) took less than estimated: the emulated device is
        # still computing.
        time.sleep(max(0.0, paced - time.perf_counter()))
        return paced

    def _batch(self, indices: list[int]) -> Any:
        if not indices:
            return self._empty
        return _to(self._collate([self._dataset[i] for i in indices]), self._device)

    def _forward(self, batch: Any, scale: float) -> torch.Tensor:
        inputs, target = batch
        with self._autocast:
            loss = self._loss_fn(self._ddp(inputs), target)
        loss = loss.float() * scale
        return self._scaler.scale(loss) if self._scaler is not None else loss

    @property
    def _emulated(self) -> bool:
        return self.options.speed is not None or self.options.emulate_sample_time is not None

    def _pace(self, started: float, samples: int, remaining: float = 0.0) -> float:
        """Hold this rank until the emulated device would have finished the micro-batch, less
        ``remaining`` seconds of real work still to run, and return when the emulated device
        finishes it: the sleep's overshoot is the host's delay, not the device's."""
        o = self.options
        now = time.perf_counter()
        if not self._emulated:
            return now
        speed = o.speed or 1.0
        if o.emulate_sample_time is not None:
            target = samples * o.emulate_sample_time / speed  # the real compute counts toward it
        else:
            target = (now - started + remaining) / speed
        base = self._paced_until if 0 <= started - self._paced_until < _PACE_SLACK else started
        self._paced_until = base + target
        if self._paced_until - remaining > now:
            time.sleep(self._paced_until - remaining - now)
        return max(self._paced_until, now)

    def _sync_device(self) -> None:
        # CUDA runs asynchronously: wait for it, or the clocks would time the launches only.
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    def _gather(self, values: list[float]) -> list[list[float]]:
        """``values`` from every rank, identical on all of them (so they split identically)."""
        tensor = torch.tensor(values, dtype=torch.float64, device=self._device)
        return [row.tolist() for row in comm.all_gather(tensor)]


# ---------------------------------------------------------------------------------- helpers


def _chunks(indices: list[int], cap: int | None) -> list[list[int]]:
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


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _model_difference(
    first: list[tuple[str, tuple[int, ...], str]],
    theirs: list[tuple[str, tuple[int, ...], str]],
    rank: int,
) -> str:
    """The first parameter or buffer where rank ``rank``'s model and rank 0's part ways."""
    for a, b in zip(first, theirs, strict=False):
        if a[0] != b[0]:
            return f"it has {b[0]!r} where rank 0 has {a[0]!r}"
        if a[1:] != b[1:]:
            return f"{a[0]!r} is {list(b[1])} {b[2]} on rank {rank}, {list(a[1])} {a[2]} on rank 0"
    return f"it has {len(theirs)} parameters and buffers, rank 0 has {len(first)}"


def _read_checkpoint(path: Path, device: torch.device, parameters: set[str]) -> dict[str, Any]:
    """The training state saved at ``path``, loaded as tensors and plain values only (to
    unpickle anything else could run any code: the file may come from a shared filesystem).
    ``ValueError`` saying what is wrong when it is no training state, lacks a key, or a
    parameter or the optimizer's state holds NaN or infinity. Buffers are not checked: they may
    hold infinities on purpose (attention masks)."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        if found is None:
            raise ValueError("it is not a file of tensors and plain values torch can read") from exc
        raise ValueError(
            "it holds an object other than tensors and plain values, which hetero does not load "
            f"(loading it could run any code): {found.group(1)}"
        ) from exc
    except EOFError as exc:
        raise ValueError("the file is empty or cut short") from exc
    if not isinstance(state, dict):
        raise ValueError(
            f"it holds a {type(state).__name__}, not a training state (a mapping of "
            f"{', '.join(_CHECKPOINT_KEYS)})"
        )
    for key in _CHECKPOINT_KEYS:
        if key not in state:
            raise ValueError(f"it has no {key!r}; it holds: {', '.join(map(str, state))}")
    if not _is_int(state["steps"]) or state["steps"] < 0:
        raise ValueError(f"its 'steps' is {state['steps']!r}, not a step count (an integer >= 0)")
    weights = [(f"model {n}", t) for n, t in _named_tensors(state["model"]) if n in parameters]
    weights += [(f"optimizer {n}", t) for n, t in _named_tensors(state["optimizer"])]
    for where, tensor in weights:
        if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.isfinite().all():
            continue
        counts = ((int(tensor.isnan().sum()), "NaN"), (int(tensor.isinf().sum()), "infinite"))
        bad = " and ".join(f"{n} {what}" for n, what in counts if n)
        raise ValueError(
            f"{where} holds {bad} of {tensor.numel()} values; a run resumed from it would "
            "train on nothing but NaN"
        )
    return state


def _named_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` (nested mappings and sequences), named by its dotted path."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from _named_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _named_tensors(value, f"{prefix}.{i}" if prefix else str(i))


def _map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` (a collated batch) with ``fn`` applied to every tensor in it."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    return obj


def _to(obj: Any, device: torch.device) -> Any:
    return _map_tensors(obj, lambda t: t.to(device, non_blocking=True))


def _take_none(obj: Any) -> Any:
    """A batch of no samples shaped like ``obj`` (a collated batch)."""
    return _map_tensors(obj, lambda t: t[:0])


class _Progress:
    """Rank 0's live view: a rich progress bar when stderr is a terminal, else a line every
    ``every`` steps."""

    def __init__(self, total: int, every: int) -> None:
        self._every = every
        self._bar: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=total)

    def update(self, report: StepReport) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=report.summary())
        elif report.step % self._every == 0 or report.rebalanced:
            print(report.summary(), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
