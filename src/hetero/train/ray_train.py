"""``Trainer`` inside Ray Train: ``TorchTrainer`` workers on nodes of different accelerators,
each taking a share of every global batch by the speed of its node's device.

Ray Train starts the workers and joins them in a torch.distributed process group (gloo on CPU,
NCCL on GPUs) before the training function runs; ``Trainer`` trains over that group as over one
``hetero.comm.init`` made. A node's devices are those hetero's Ray backend finds there
(``ray_actor._probe_node``): the fleet config its ``HETERO_NODE_CONFIG`` names, emulated
devices included, else those detected. The k-th worker on a node takes the node's k-th device,
the workers counted by Ray node id: Ray Train's local rank counts them by IP address, and the
emulated nodes of one machine all have 127.0.0.1.

An emulated device paces its worker (``TrainerOptions.speed``) at its speed over the fastest
emulated device's among the workers, as the training examples pace their ranks: with
``emulate_sample_time``, that is the fastest one's seconds per sample. The shares then come as
they always do: the ranks are timed at start and the global batch is split by their measured
speeds, which for an emulated device are its own; a real device is simply measured.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.utils.data import Dataset, default_collate

from hetero import comm
from hetero._checks import is_integer
from hetero.devices.spec import Device
from hetero.errors import BackendError, ConfigError, HeteroError
from hetero.runtime.ray_cluster import NODE_CONFIG_ENV, import_ray
from hetero.runtime.ray_nodes import short_id
from hetero.train.options import TrainerOptions
from hetero.train.report import StepReport
from hetero.train.trainer import LossFn, OptimizerFactory, Scheduler, Trainer

ray = import_ray()
try:
    from ray import train
    from ray.train import (
        Checkpoint,
        RunConfig,
        ScalingConfig,
        TrainingFailedError,
        WorkerGroupError,
    )
    from ray.train.torch import TorchTrainer
except ImportError as exc:  # ray without its train extra
    raise HeteroError(
        "hetero.train.ray_train needs Ray Train: pip install -e '.[ray,torch]' (in the hetero "
        "checkout)"
    ) from exc

__all__ = [
    "RayTrainRun",
    "TrainerParts",
    "WorkerDevice",
    "assign_devices",
    "ray_trainer",
    "run_on_ray",
    "worker_devices",
]

# What rank 0 leaves in the run's last checkpoint for ``run_on_ray`` to read.
_RUN_FILE = "hetero_run.pt"


@dataclass(frozen=True, slots=True)
class WorkerDevice:
    """A Ray Train worker's device: its rank, its Ray node (the short id), the device of that
    node it trains on, and the speed it emulates relative to the fastest emulated device of
    the workers (``None``: a real device, measured as it runs)."""

    rank: int
    node: str
    device: Device
    speed: float | None


class TrainerParts(NamedTuple):
    """What ``run_on_ray``'s ``build`` makes on each worker: ``Trainer``'s first arguments."""

    model: nn.Module
    optimizer: torch.optim.Optimizer | OptimizerFactory
    loss_fn: LossFn
    dataset: Dataset[Any]


@dataclass(frozen=True)
class RayTrainRun:
    """What ``run_on_ray`` brings back: the trained model's state dict, every step's report
    and every worker's device, in rank order."""

    model_state: dict[str, torch.Tensor]
    reports: list[StepReport]
    workers: list[WorkerDevice]


def assign_devices(
    nodes: Sequence[str], found: Sequence[Sequence[Device] | str]
) -> list[WorkerDevice]:
    """Each worker's device, in rank order: ``nodes[i]`` is rank i's Ray node id and
    ``found[i]`` the devices it found there, or why it found none. The k-th worker on a node
    takes its k-th device. ``ConfigError`` naming every node whose devices are unknown or fewer
    than its workers."""
    problems: list[tuple[str, str]] = []
    chosen: list[Device | None] = []
    for rank, node in enumerate(nodes):
        devices = found[rank]
        index = nodes[:rank].count(node)
        name = f"node {short_id(node)}"
        if isinstance(devices, str):
            problems.append((name, f"rank {rank} found no devices there: {devices}"))
            chosen.append(None)
        elif index >= len(devices):
            if index == len(devices):  # once per node
                ranks = [r for r, n in enumerate(nodes) if n == node]
                models = ", ".join(d.model for d in devices) or "none"
                problems.append(
                    (
                        name,
                        f"Ray Train placed {len(ranks)} workers there (ranks {ranks}) and it has "
                        f"{len(devices)} device(s) ({models}); a worker takes one device: start "
                        f"fewer workers, or give the node's fleet config ({NODE_CONFIG_ENV}) "
                        "more devices",
                    )
                )
            chosen.append(None)
        else:
            chosen.append(devices[index])
    if problems:
        raise ConfigError(problems)
    devices = [d for d in chosen if d is not None]
    fastest = max((d.speed for d in devices if d.emulated), default=1.0)
    return [
        WorkerDevice(rank, short_id(node), d, d.speed / fastest if d.emulated else None)
        for rank, (node, d) in enumerate(zip(nodes, devices, strict=True))
    ]


def worker_devices() -> list[WorkerDevice]:
    """Every worker's device, in rank order, the same on every worker (``assign_devices``).
    Call it on every worker, inside the training function of a ``TorchTrainer``: it gathers
    over the process group Ray Train made."""
    from hetero.runtime.ray_actor import _probe_node

    _require_group()
    probe = _probe_node()
    mine = (
        ray.get_runtime_context().get_node_id(),
        probe.devices if probe.devices is not None else probe.problem,
    )
    gathered = comm.all_gather_object(mine)
    return assign_devices([node for node, _ in gathered], [devices for _, devices in gathered])


def ray_trainer(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | OptimizerFactory,
    loss_fn: LossFn,
    dataset: Dataset[Any],
    options: TrainerOptions,
    *,
    collate_fn: Callable[[list[Any]], Any] = default_collate,
    scheduler: Scheduler | None = None,
    workers: Sequence[WorkerDevice] | None = None,
) -> Trainer:
    """A ``Trainer`` on this Ray Train worker, over Ray Train's process group, pacing its
    worker at its node's device's speed when that device is emulated. ``workers``: the
    workers' devices, if already gathered (``worker_devices``; else gathered here, so call it
    on every worker). ``options.speed`` must be ``None``: the node's device sets it."""
    _check_speed(options)
    _require_group()
    mine = (workers if workers is not None else worker_devices())[comm.rank()]
    paced = dataclasses.replace(options, speed=mine.speed)
    return Trainer(
        model, optimizer, loss_fn, dataset, paced, collate_fn=collate_fn, scheduler=scheduler
    )


def run_on_ray(
    build: Callable[[], TrainerParts],
    options: TrainerOptions,
    steps: int,
    *,
    num_workers: int,
    storage_path: str | None = None,
    name: str | None = None,
    scaling: ScalingConfig | None = None,
) -> RayTrainRun:
    """Train for ``steps`` steps on ``num_workers`` Ray Train workers of the Ray cluster this
    process is connected to (``ray.init``), one ``Trainer`` each (``ray_trainer``) on the
    ``TrainerParts`` that ``build()`` makes there; rank 0 brings back the model, the step
    reports and the workers' devices through the run's checkpoint in ``storage_path`` (Ray
    Train's; on several machines, storage every node reaches). The workers are spread over the
    nodes, one CPU each, unless ``scaling`` (a ``ray.train.ScalingConfig``) says otherwise.

    A worker's ``HeteroError`` (a ``ConfigError`` of the set-up) is raised here as it was
    raised there; any other failure of the run is a ``BackendError``."""
    _check_speed(options)
    if not is_integer(steps) or steps < 1:
        raise ConfigError([("steps", f"must be an integer >= 1, got {steps!r}")])
    if not is_integer(num_workers) or num_workers < 1:
        raise ConfigError([("num_workers", f"must be an integer >= 1, got {num_workers!r}")])
    if scaling is not None and scaling.num_workers != num_workers:
        raise ConfigError(
            [
                (
                    "scaling",
                    f"asks for {scaling.num_workers!r} workers and num_workers={num_workers}: "
                    "make them agree",
                )
            ]
        )
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config={"build": build, "options": options, "steps": steps},
        scaling_config=scaling
        or ScalingConfig(num_workers=num_workers, placement_strategy="SPREAD"),
        run_config=RunConfig(name=name, storage_path=storage_path),
    )
    try:
        result = trainer.fit()
    except TrainingFailedError as exc:
        raise _worker_error(exc) from exc
    if result.checkpoint is None:
        raise BackendError(f"the Ray Train run ended without rank 0's results ({result})")
    with result.checkpoint.as_directory() as folder:
        # The file rank 0 of this very run wrote: its step reports and devices are pickled.
        saved = torch.load(Path(folder, _RUN_FILE), weights_only=False)
    return RayTrainRun(
        saved["model_state"],
        [StepReport.from_dict(r) for r in saved["reports"]],
        saved["workers"],
    )


def _train_loop(config: dict[str, Any]) -> None:
    """What each ``run_on_ray`` worker runs: train, then rank 0 reports the run to the driver
    in a checkpoint (every worker reports: Ray Train waits for all of them)."""
    parts = config["build"]()
    if not isinstance(parts, TrainerParts):
        raise ConfigError(
            [
                (
                    "build",
                    "must return a TrainerParts(model, optimizer, loss_fn, dataset), returned "
                    f"{type(parts).__name__}",
                )
            ]
        )
    workers = worker_devices()
    trainer = ray_trainer(
        parts.model,
        parts.optimizer,
        parts.loss_fn,
        parts.dataset,
        config["options"],
        workers=workers,
    )
    try:
        reports = trainer.train(config["steps"], progress=False)
        state = trainer.model_state_dict()  # on every rank: FSDP gathers it
    finally:
        trainer.close()
    metrics = {"steps": trainer.steps}
    if trainer.rank != 0:
        train.report(metrics)
        return
    with tempfile.TemporaryDirectory() as folder:
        run = {
            "model_state": state,
            "reports": [r.to_dict() for r in reports],
            "workers": workers,
        }
        torch.save(run, Path(folder, _RUN_FILE))
        train.report(metrics, checkpoint=Checkpoint.from_directory(folder))


def _check_speed(options: TrainerOptions) -> None:
    if options.speed is not None:
        raise ConfigError(
            [
                (
                    "options.speed",
                    f"is {options.speed!r}; on Ray Train each worker's speed is its node's "
                    f"device's (an emulated one's from the node's fleet config, "
                    f"{NODE_CONFIG_ENV}): leave it None",
                )
            ]
        )


def _require_group() -> None:
    if not comm.is_initialized():
        raise HeteroError(
            "no process group: call this inside the training function of a Ray Train "
            "TorchTrainer (train_loop_per_worker), where Ray Train has made one"
        )


def _worker_error(exc: TrainingFailedError) -> HeteroError:
    """The ``HeteroError`` a worker of a failed run raised (Ray Train hands back the workers'
    own exceptions), one of the set-up or the run before a ``BackendError`` (a peer's failure,
    seen by the others as a broken collective); else the failure as a ``BackendError``."""
    failures = exc.worker_failures if isinstance(exc, WorkerGroupError) else {}
    raised: list[tuple[bool, int, HeteroError]] = [
        (isinstance(e, BackendError), rank, e)
        for rank, e in failures.items()
        if isinstance(e, HeteroError)
    ]
    if raised:
        return min(raised, key=lambda t: t[:2])[2]
    return BackendError(f"the Ray Train run failed: {exc}")
