"""Micro-batches bounded by memory: how many samples one forward and backward on this rank may
hold under its ``memory_limit``, found by measuring the model's peak memory.

A micro-batch of n samples needs ``resident + transient(n)`` bytes:

- ``resident``: what the device holds before the micro-batch starts. On a GPU, everything the
  allocator has handed out (``torch.cuda.memory_allocated``: the parameters, buffers and any
  other tensor of the process on it); on the CPU, the model's parameters and buffers. To that
  the trainer's way of holding the model adds, estimated from the model: under DDP its gradient
  buckets (one more copy of the trainable parameters, allocated when DDP wraps the model; the
  gradients are views of them, so the gradients the probe measures in ``transient`` are counted
  twice, erring on the safe side) and the optimizer's state; under FSDP (``parallel.py``) the
  rank's shard of the parameters and of the optimizer's state (1/world size of each), beside
  the full parameters it gathers for the step's passes.
- ``transient(n)``: the peak of what forward and backward of n samples allocate above that
  (the collated batch, activations, the gradients, autograd's temporaries), measured: on CUDA
  ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``; on the CPU every
  allocation and free of torch's CPU allocator, which torch reports only to its profiler
  (``torch.profiler.profile(profile_memory=True)``), summed in order. ``tracemalloc`` does not
  see tensor storage (torch allocates it in C), and the process's resident set size moves in
  pages and keeps what the C allocator caches, so neither measures a micro-batch.

The peak is not linear in n: at a few samples it comes when the gradients are allocated, at
many when the activations are. A line fitted at small sizes underestimates large ones, so the
probe does not extrapolate: it fits ``fixed + per_sample × n`` through two small sizes, measures
the size that line predicts to fit, and searches (the line's guess, then bisection after a
miss) for the largest size whose *measured* need fits, in at most 18 measurements.
A probe that misses runs that one micro-batch above the limit (measured, not trained on; on a
GPU running out of memory there counts as a miss). Peak memory grows with n, so every
micro-batch up to the cap fits.

The optimizer's state is made at its first step, after the probe, so it is measured on a
stand-in: an optimizer of the same kind over one small parameter, stepped once, whose state per
element of the parameter (Adam's two moments: 8 bytes per fp32 element; SGD with momentum: 4)
is scaled to the model's trainable parameters. An optimizer that cannot be rebuilt that way
counts as holding none.

Measurements are cached in a JSON file keyed by the model (its structure, parameters and
buffers), a sample's shapes, the device, the precision and torch's version, so a restart with
the same model and limit measures nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.utils.data import Dataset, default_collate

from hetero.errors import ConfigError
from hetero.train.tensors import named_tensors, to_device
from hetero.units import format_size

__all__ = [
    "MemoryEstimate",
    "MemoryProbe",
    "largest_fitting",
    "optimizer_state_bytes",
    "plan_memory",
]

# Most passes the search measures beyond the first two sizes (18 in all).
_MAX_PROBES = 16
# The cache file's format: a different one is ignored (and rewritten).
_CACHE_VERSION = 1

LossFn = Callable[[Any, Any], torch.Tensor]
OptimizerFactory = Callable[[Any], torch.optim.Optimizer]
# Elements of the stand-in parameter the optimizer's state is measured on.
_STAND_IN = 64


@dataclass(frozen=True)
class MemoryEstimate:
    """What this rank's micro-batches may hold, and what they were measured to need.

    ``points`` maps each measured micro-batch size to its transient peak in bytes (the part
    above ``resident_bytes``); ``cap`` is the largest size whose measured need fits ``limit``
    (0 when not even one sample does). ``probed`` of the points were measured by this run, the
    others read from the cache. ``resident_parts`` splits ``resident_bytes`` by what holds it
    (the model's tensors, DDP's gradient buckets or FSDP's shards, the optimizer's state)."""

    limit: int
    resident_bytes: int
    points: Mapping[int, int]
    cap: int
    method: str
    probed: int
    resident_parts: Mapping[str, int] = field(default_factory=dict)

    @property
    def per_sample_bytes(self) -> float:
        """The slope of the fitted line: bytes per sample, from the two largest measured
        sizes that fit (one sample alone when only it was measured)."""
        sizes = self._fitted_sizes()
        if len(sizes) < 2:
            return float(self.points[sizes[0]]) / sizes[0]
        a, b = sizes[-2:]
        return max(0.0, (self.points[b] - self.points[a]) / (b - a))

    @property
    def fixed_bytes(self) -> float:
        """The line's intercept, raised so that it bounds every fitted measurement from above;
        with ``resident_bytes`` it is the need of a micro-batch of no samples."""
        slope = self.per_sample_bytes
        return max(0.0, *(self.points[n] - slope * n for n in self._fitted_sizes()))

    def need(self, samples: int) -> float:
        """The estimated peak of a micro-batch of ``samples`` on this rank (bytes): measured
        where it was, else ``resident + fixed + per_sample × samples``."""
        if samples in self.points:
            return float(self.resident_bytes + self.points[samples])
        return self.resident_bytes + self.fixed_bytes + self.per_sample_bytes * samples

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "resident_bytes": self.resident_bytes,
            "resident_parts": dict(self.resident_parts),
            "fixed_bytes": self.fixed_bytes,
            "per_sample_bytes": self.per_sample_bytes,
            "cap": self.cap,
            "points": {str(n): b for n, b in sorted(self.points.items())},
            "method": self.method,
            "probed": self.probed,
        }

    def _fitted_sizes(self) -> list[int]:
        fitting = sorted(n for n in self.points if n <= max(self.cap, 1))
        return fitting or sorted(self.points)[:1]


class MemoryProbe:
    """Measures what forward and backward of a micro-batch of the first n samples of
    ``dataset`` need on the model's device (see the module's docstring for how). Build it on
    the bare model, before DDP or FSDP wraps it; ``session()`` leaves the model's buffers,
    gradients and random streams as it found them. ``optimizer`` (an optimizer or a function
    making one from parameters), ``sharding`` and ``world_size`` say what the trainer keeps
    beside the model (see ``resident_parts``)."""

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        dataset: Dataset[Any],
        collate_fn: Callable[[list[Any]], Any] = default_collate,
        *,
        autocast: torch.autocast | None = None,
        optimizer: torch.optim.Optimizer | OptimizerFactory | None = None,
        sharding: str = "ddp",
        world_size: int = 1,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._loss_fn = loss_fn
        self._dataset = dataset
        self._collate = collate_fn
        self._autocast = autocast
        self._optimizer_bytes = 0 if optimizer is None else optimizer_state_bytes(optimizer, model)
        self._sharding = sharding
        self._world_size = world_size

    @property
    def method(self) -> str:
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        return "torch's CPU allocator, through the profiler's memory events"

    def resident(self) -> int:
        """Bytes the device holds before a micro-batch: ``resident_parts`` summed."""
        return sum(self.resident_parts().values())

    def resident_parts(self) -> dict[str, int]:
        """What the device holds before a micro-batch, by what holds it: the model's tensors
        (on a GPU, all the allocator has handed out), then under DDP its gradient buckets and
        the optimizer's state, under FSDP this rank's shard of the parameters and of the
        optimizer's state (the model's tensors standing for the parameters it gathers)."""
        if self.device.type == "cuda":
            held = int(torch.cuda.memory_allocated(self.device))
        else:
            tensors = [*self.model.parameters(), *self.model.buffers()]
            tensors += [p.grad for p in self.model.parameters() if p.grad is not None]
            storages = {
                t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
            }
            held = sum(storages.values())
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        copy = sum(p.numel() * p.element_size() for p in parameters)
        if self._sharding == "fsdp":
            shards = self._world_size
            return {
                "the model's tensors": held,
                "its parameters' shard": -(
                    -sum(p.nbytes for p in self.model.parameters()) // shards
                ),
                "the optimizer's state shard": -(-self._optimizer_bytes // shards),
            }
        return {
            "the model's tensors": held,
            "DDP's gradient buckets": copy,
            "the optimizer's state": self._optimizer_bytes,
        }

    def transient(self, samples: int) -> int | None:
        """The peak bytes forward and backward of ``samples`` samples allocate above what was
        there before; ``None`` when the device ran out of memory."""
        self.model.zero_grad(set_to_none=True)
        try:
            if self.device.type == "cuda":
                return _cuda_peak(lambda: self._pass(samples), self.device)
            if self.device.type == "cpu":
                return _cpu_peak(lambda: self._pass(samples))
        except torch.OutOfMemoryError:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return None
        finally:
            self.model.zero_grad(set_to_none=True)
        raise ConfigError(
            [
                (
                    "memory_limit",
                    f"hetero measures micro-batches' memory on cuda and cpu devices, not "
                    f"{self.device.type}: give micro_batch instead",
                )
            ]
        )

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Probe inside this: one unmeasured pass first (lazy set-up), and the model's buffers
        (BatchNorm's statistics), gradients and random streams restored after."""
        buffers = [b.detach().clone() for b in self.model.buffers()]
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=self.device.type):
            try:
                self.model.zero_grad(set_to_none=True)
                self._pass(1)
                self.model.zero_grad(set_to_none=True)
                yield
            finally:
                self.model.zero_grad(set_to_none=True)
                with torch.no_grad():
                    for buffer, saved in zip(self.model.buffers(), buffers, strict=True):
                        buffer.copy_(saved)

    def _pass(self, samples: int) -> None:
        inputs, target = to_device(
            self._collate([self._dataset[i] for i in range(samples)]), self.device
        )
        with self._autocast or contextlib.nullcontext():
            loss = self._loss_fn(self.model(inputs), target)
        torch.autograd.backward(loss.float())


def _cuda_peak(run: Callable[[], None], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    run()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - start)


def _cpu_peak(run: Callable[[], None]) -> int:
    """The highest level torch's CPU allocator reached while ``run`` ran, above where it
    started: its allocation and free events, in order, as the profiler records them."""
    # Kineto prints a line at every profiler start and stop unless its log level is above its
    # "USDT" messages (read when the profiler first starts; a level the user set is kept).
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is None:  # pragma: no cover - a torch without the profiler's raw events
        raise ConfigError(
            [
                (
                    "memory_limit",
                    "this torch's profiler does not report CPU allocations, so a micro-batch's "
                    "memory cannot be measured: give micro_batch instead",
                )
            ]
        )
    events = [
        e for e in results.events() if e.name() == "[memory]" and e.device_type() == DeviceType.CPU
    ]
    level = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        level += event.nbytes()
        peak = max(peak, level)
    return peak


def largest_fitting(
    limit: int,
    resident: int,
    measure: Callable[[int], int | None],
    most: int,
    points: dict[int, int | None],
) -> int:
    """The largest micro-batch size up to ``most`` whose measured need (``resident`` plus
    ``measure(n)``, ``None`` meaning it did not fit the device) is within ``limit``; 0 when
    not even 1 is. ``points`` holds sizes already measured (a cache) and gets every new one."""
    probes = 0

    def fits(n: int) -> bool:
        nonlocal probes
        if n not in points:
            points[n] = measure(n)
            probes += 1
        value = points[n]
        return value is not None and resident + value <= limit

    if not fits(1):
        return 0
    lo, hi = 1, most + 1  # lo fits; hi does not (most + 1: nothing above `most` is tried)
    if most >= 2 and fits(2):
        lo = 2
    elif most >= 2:
        hi = 2
    missed = False
    while hi - lo > 1 and probes < _MAX_PROBES + 2:
        known = {n: v for n, v in points.items() if v is not None and n <= lo}
        guess = (lo + hi) // 2
        if not missed and len(known) >= 2:
            a, b = sorted(known)[-2:]
            slope = (known[b] - known[a]) / (b - a)
            if slope > 0:
                guess = int(b + (limit - resident - known[b]) / slope)
        guess = min(max(guess, lo + 1), hi - 1)
        if fits(guess):
            lo, missed = guess, False
        else:
            hi, missed = guess, True
    return lo


def plan_memory(
    probe: MemoryProbe,
    limit: int,
    *,
    most: int,
    micro_batch: int | None,
    cache: Path | None,
    key: str,
) -> tuple[MemoryEstimate, str | None]:
    """This rank's micro-batch cap under ``limit`` bytes: the largest size up to ``most`` (or
    ``micro_batch`` when it is given, checked instead of searched) whose need fits. Returns the
    estimate and, when the limit cannot be met, what to tell the user (for every rank to
    raise together)."""
    stored = _read_cache(cache, key)
    points: dict[int, int | None] = dict(stored)
    with probe.session():
        parts = probe.resident_parts()
        resident = sum(parts.values())
        if micro_batch is not None:
            # No micro-batch holds more than `most` samples (a share is at most a global batch).
            largest = min(micro_batch, most)
            cap = largest_fitting(limit, resident, probe.transient, 1, points)
            if cap and not _fits(points, largest, probe, resident, limit):
                cap = largest_fitting(limit, resident, probe.transient, largest - 1, points)
            elif cap:
                cap = micro_batch
        else:
            cap = largest_fitting(limit, resident, probe.transient, most, points)
    measured = {n: v for n, v in points.items() if v is not None}
    if measured != stored:
        _write_cache(cache, key, measured)
    estimate = MemoryEstimate(
        limit,
        resident,
        measured,
        cap,
        probe.method,
        probed=sum(1 for n in points if n not in stored),
        resident_parts=parts,
    )
    checked = None if micro_batch is None else min(micro_batch, most)
    return estimate, _problem(estimate, micro_batch, checked)


def optimizer_state_bytes(
    optimizer: torch.optim.Optimizer | OptimizerFactory, model: nn.Module
) -> int:
    """The bytes of state ``optimizer`` (an optimizer, or a function making one from
    parameters) keeps for ``model``'s trainable parameters once it has stepped, measured on a
    stand-in: the same kind of optimizer over one small parameter of the model's dtype and
    device, stepped once on a zero gradient. A state tensor the stand-in's size costs its bytes
    per element of every parameter; any other (a step count) its bytes per parameter. 0 when
    the optimizer cannot be rebuilt so."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    if not parameters:
        return 0
    first = parameters[0]
    stand_in = nn.Parameter(torch.zeros(_STAND_IN, dtype=first.dtype, device=first.device))
    try:
        made = (
            _same_kind(optimizer, stand_in)
            if isinstance(optimizer, torch.optim.Optimizer)
            else optimizer([stand_in])
        )
        stand_in.grad = torch.zeros_like(stand_in)
        made.step()
        state = made.state[stand_in]
    except Exception:  # any optimizer's failure means: not measurable so
        return 0
    per_element = per_parameter = 0
    for _, tensor in named_tensors(dict(state)):
        if tensor.numel() == _STAND_IN:
            per_element += tensor.element_size()
        else:
            per_parameter += tensor.numel() * tensor.element_size()
    return sum(p.numel() * per_element + per_parameter for p in parameters)


def _same_kind(optimizer: torch.optim.Optimizer, parameter: nn.Parameter) -> torch.optim.Optimizer:
    """An optimizer of ``optimizer``'s class and settings over ``parameter`` alone."""
    cls = type(optimizer)
    accepted = inspect.signature(cls).parameters
    settings = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return cls([parameter], **settings)


def _fits(
    points: dict[int, int | None], n: int, probe: MemoryProbe, resident: int, limit: int
) -> bool:
    if n not in points:
        points[n] = probe.transient(n)
    value = points[n]
    return value is not None and resident + value <= limit


def _problem(estimate: MemoryEstimate, micro_batch: int | None, checked: int | None) -> str | None:
    """What to tell the user when the limit cannot be met: not even one sample fits, or
    ``micro_batch`` does not (``checked``: the size measured for it)."""
    limit = f"memory_limit={estimate.limit} bytes ({format_size(estimate.limit)})"
    if estimate.cap == 0:
        one = estimate.points.get(1)
        parts = ", ".join(f"{name} {_bytes(n)}" for name, n in estimate.resident_parts.items())
        need = (
            f"it needs an estimated {_bytes(estimate.need(1))}: {_bytes(estimate.resident_bytes)}"
            f" resident ({parts}) + {_bytes(one)} for one sample's forward and backward "
            f"({estimate.method})"
            if one is not None
            else "it ran out of device memory"
        )
        return (
            f"{limit} cannot hold a micro-batch of 1 sample: {need}; raise memory_limit or "
            "train a smaller model"
        )
    if micro_batch is not None and checked is not None and estimate.cap < micro_batch:
        need = (
            f"needs an estimated {_bytes(estimate.need(checked))}, above {limit}"
            if checked in estimate.points
            else f"ran out of device memory (under {limit})"
        )
        if checked != micro_batch:
            need = f"cannot be met: a micro-batch of {checked}, the most a step gives, {need}"
        return (
            f"micro_batch={micro_batch} {need}; at most {estimate.cap} samples fit: lower "
            "micro_batch, or leave it None for the limit to set it"
        )
    return None


def _bytes(value: float | None) -> str:
    return "?" if value is None else f"{round(value)} bytes ({format_size(value)})"


# ---------------------------------------------------------------------------------- the cache


def cache_key(model: nn.Module, sample: Any, device: torch.device, precision: str) -> str:
    """What the measurements depend on, hashed: the model's structure (its ``repr``) and
    tensors, a one-sample batch's tensors, the device, the precision and torch's version."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    described = {
        "model": repr(model),
        "tensors": [
            (n, list(t.shape), str(t.dtype), t.requires_grad)
            for n, t in [*model.named_parameters(), *model.named_buffers()]
        ],
        "sample": [(n, list(t.shape), str(t.dtype)) for n, t in named_tensors(sample)],
        "device": name,
        "precision": precision,
        "torch": torch.__version__,
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _read_cache(path: Path | None, key: str) -> dict[int, int]:
    """The sizes measured before under ``key``; nothing when there is no readable cache (a
    cache is an optimisation: a bad one is measured again and rewritten)."""
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
        entry = doc["entries"][key] if doc.get("version") == _CACHE_VERSION else {}
        return {int(n): int(b) for n, b in entry.get("points", {}).items() if int(b) >= 0}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _write_cache(path: Path | None, key: str, points: Mapping[int, int]) -> None:
    """Add ``points`` under ``key``, written to a temporary file and renamed (every rank may
    write: another rank's entry written at the same moment can be lost, and is measured
    again next time)."""
    if path is None:
        return
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or doc.get("version") != _CACHE_VERSION:
            raise ValueError
        entries = dict(doc["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        entries = {}
    entries[key] = {"points": {str(n): b for n, b in sorted(points.items())}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps({"version": _CACHE_VERSION, "entries": entries}, indent=1))
        partial.replace(path)
    except OSError:
        pass  # an unwritable cache only costs a probe next time
