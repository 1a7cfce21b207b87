"""What the training examples share: their command line (ranks emulating the devices of a fleet
config, steps, batches, checkpoints), the start of their ranks (under torchrun or ``hetero
launch``, else spawned here on gloo), and rank 0's lines on the shares and on how each rank spent
its time, and its HTML report."""

from __future__ import annotations

import argparse
import gc
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from hetero import comm
from hetero.commands.launch import free_port
from hetero.config import load_config
from hetero.devices.fleet import build_fleet
from hetero.errors import HeteroError
from hetero.train import StepReport, Trainer, TrainerOptions

#: The fleet the examples emulate unless told otherwise: an A100, a V100 and a T4.
FLEET = Path(__file__).with_name("train_fleet.yaml")

#: An example's work on one rank, ``(rank, world, args)``, run inside its process group.
RankMain = Callable[[int, int, argparse.Namespace], None]


def add_training_options(
    parser: argparse.ArgumentParser,
    *,
    steps: int,
    global_batch: int,
    sample_time: float,
    samples: int,
    checkpoint_every: int,
) -> None:
    """The options every training example takes, with that example's defaults for the ones
    that depend on its model."""
    parser.add_argument("--nproc", type=int, default=3, help="ranks to start (without torchrun)")
    parser.add_argument(
        "--fleet",
        default=str(FLEET),
        help="fleet config (hetero.config): rank i emulates its device i, at the catalog speed "
        "relative to the fastest device listed (default: an A100, a V100 and a T4)",
    )
    parser.add_argument(
        "--speeds",
        default=None,
        help="relative speed of each rank, comma-separated, instead of --fleet's (e.g. 1,0.5,0.25)",
    )
    parser.add_argument(
        "--split",
        choices=("speed", "equal"),
        default="speed",
        help="shares by measured speed, or equal ones as plain DDP (the baseline)",
    )
    parser.add_argument(
        "--max-grad-norm", type=float, default=None, help="clip the global gradient to this norm"
    )
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--global-batch", type=int, default=global_batch)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument(
        "--sample-time", type=float, default=sample_time, help="seconds per sample at speed 1"
    )
    parser.add_argument("--rebalance-every", type=int, default=10)
    parser.add_argument(
        "--samples", type=int, default=samples, help="size of the synthetic dataset"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, help="JSON lines of step reports (rank 0)")
    parser.add_argument(
        "--html", default=None, help="rank 0 writes the run's report here (self-contained HTML)"
    )
    parser.add_argument("--quiet", action="store_true", help="no live progress")
    parser.add_argument("--checkpoint-dir", default=None, help="save and resume training here")
    parser.add_argument(
        "--checkpoint-every", type=int, default=checkpoint_every, help="steps between saves"
    )


@dataclass(frozen=True)
class RankDevice:
    """What a rank (under a launcher, a local rank) emulates: a device and its relative speed."""

    name: str
    speed: float


def rank_devices(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[RankDevice]:
    """What each rank (or local rank) emulates, in order: the devices of ``--fleet`` (emulated
    or found here, ``hetero.devices.fleet.build_fleet``), each at its speed over the fastest
    one's, so that the fastest takes ``--sample-time`` a sample; or ``--speeds`` as given."""
    if args.speeds is not None:
        try:
            given = [float(s) for s in args.speeds.split(",")]
        except ValueError:
            parser.error(f"--speeds must be numbers separated by commas, got {args.speeds!r}")
        return [RankDevice(f"speed {s:g}", s) for s in given]
    try:
        fleet = build_fleet(load_config(args.fleet))
    except HeteroError as exc:
        parser.error(f"--fleet {args.fleet}: {exc}")
    fastest = max(d.speed for d in fleet)
    return [RankDevice(d.model, d.speed / fastest) for d in fleet]


def trainer_options(args: argparse.Namespace, speed: float, **more: Any) -> TrainerOptions:
    """The trainer's options from the shared command line, for a rank of relative ``speed``
    (``--sample-time 0``: its real compute time over the speed); ``more`` adds the others."""
    return TrainerOptions(
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        rebalance_every=args.rebalance_every,
        seed=args.seed,
        split=args.split,
        max_grad_norm=args.max_grad_norm,
        speed=speed,
        emulate_sample_time=args.sample_time or None,
        report_path=args.report,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
        **more,
    )


def start_ranks(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    main: RankMain,
    *,
    elastic: bool = False,
) -> None:
    """Run ``main`` on every rank: under torchrun or ``hetero launch`` (``RANK`` and
    ``WORLD_SIZE`` set) this process is one rank; without them ``--nproc`` ranks start here.
    ``args.devices`` is then what each rank (or local rank) emulates (``rank_devices``).
    ``--speeds`` must give one speed a rank or, ``elastic``, one a local rank: an elastic launch
    may run fewer ranks than there are speeds (a parser error otherwise). ``--fleet`` must list
    a device for each, and may list more (the first ones are taken)."""
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_launcher else args.nproc
    args.devices = rank_devices(parser, args)  # read once, here: a rank takes args.devices[i]
    given = len(args.devices)
    needed = max(world, int(os.environ.get("LOCAL_RANK", "0")) + 1) if elastic else world
    if args.speeds is None and given < needed:
        devices = f"{given} device" + ("s" if given != 1 else "")
        parser.error(
            f"--fleet {args.fleet} lists {devices} for {needed} ranks: list one a rank, or "
            "start fewer (--nproc)"
        )
    if args.speeds is not None and (given < needed or (given > needed and not elastic)):
        parser.error(f"--speeds gives {given} speeds for {needed} ranks")
    if under_launcher:
        _rank(int(os.environ["RANK"]), world, args, None, main)
    else:
        mp.spawn(_rank, args=(world, args, free_port(), main), nprocs=world, join=True)


def _rank(
    rank: int, world: int, args: argparse.Namespace, port: int | None, main: RankMain
) -> None:
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun sets it to 1 for the same reason:
        torch.set_num_threads(1)  # the ranks share this machine's cores
    comm.init(rank, world, backend="gloo", master_port=port)
    main(rank, world, args)
    # DDP holds reference cycles: free them (the trainer went with main's frame) while the
    # process group is up.
    gc.collect()
    comm.destroy()


def shares_line(trainer: Trainer, speeds: Sequence[float]) -> str:
    """``global batch 63, speeds 1 : 0.5 : 0.25; shares after profiling: 36/18/9``, and the
    checkpoint the trainer resumed from, if it did."""
    resumed = (
        f"; resumed from the checkpoint of step {trainer.resumed_from}"
        if trainer.resumed_from is not None
        else ""
    )
    split = "equal split" if trainer.options.split == "equal" else "shares after profiling"
    return (
        f"global batch {trainer.options.global_batch}, speeds "
        f"{' : '.join(f'{s:.3g}' for s in speeds)}; {split}: "
        f"{'/'.join(map(str, trainer.shares))}{resumed}"
    )


def summary(speeds: Sequence[float], reports: Sequence[StepReport]) -> str:
    """How each rank spent its time over ``reports``, and how close the median step came to the
    ideal (global batch / the sum of the ranks' samples/s)."""
    last = reports[-1]
    lines = ["rank  speed  share  samples/s  compute ms  comm ms  idle ms"]
    for r, speed in enumerate(speeds):
        ranks = [rep.ranks[r] for rep in reports]
        lines.append(
            f"{r:<5} {speed:<6.3g} {last.shares[r]:<6} {last.throughputs[r]:<10.0f} "
            f"{statistics.mean(x.compute_seconds for x in ranks) * 1e3:<11.1f} "
            f"{statistics.mean(x.comm_seconds for x in ranks) * 1e3:<8.1f} "
            f"{statistics.mean(x.idle_seconds for x in ranks) * 1e3:.1f}"
        )
    step = statistics.median(rep.step_seconds for rep in reports)
    ideal = statistics.median(rep.ideal_seconds for rep in reports)
    lines.append(
        f"median step {step * 1e3:.1f} ms, ideal {ideal * 1e3:.1f} ms (global batch / Σ "
        f"samples/s): efficiency {ideal / step:.0%}"
    )
    first = reports[0]
    lines.append(
        f"loss over each global batch: {first.loss:.3f} at step {first.step} -> "
        f"{last.loss:.3f} at step {last.step}"
    )
    return "\n".join(lines)


def write_html(args: argparse.Namespace, trainer: Trainer, devices: Sequence[RankDevice]) -> None:
    """With ``--html``, rank 0's report of the run's steps, each rank named by its device."""
    if args.html is None or not trainer.reports:
        return
    labels = [f"rank {r}: {d.name} (speed {d.speed:.3g})" for r, d in enumerate(devices)]
    print(f"report: {trainer.write_report(args.html, labels=labels)}")
