"""Train a small MLP on synthetic data with hetero's Trainer, on ranks of different speeds.

    python examples/train_mlp.py --nproc 3 --speeds 1,0.5,0.25 --steps 30
    torchrun --nproc-per-node 3 examples/train_mlp.py --speeds 1,0.5,0.25 --steps 30
    hetero launch --nproc 3 examples/train_mlp.py --checkpoint-dir ckpt --fail-at 15
    hetero launch --nproc 2:3 --rank-restarts 0 --rejoin-after 0 examples/train_mlp.py \
        --checkpoint-dir ckpt --fail-at 15

Without torchrun the script starts ``--nproc`` gloo ranks on this machine itself. Rank i emulates
a device of relative speed ``speeds[i]`` (under a launcher, local rank i: ``hetero launch`` keeps
a rank's local rank when the ranks shrink): each of its micro-batches takes samples ×
``--sample-time`` / speed seconds (``--sample-time 0``: its real compute time over the speed).
The trainer profiles the ranks, splits every global batch in proportion to their measured
throughput, and prints, on rank 0, how each rank spent its time and how close the step time came
to the ideal (global batch / the sum of the ranks' samples/s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import TensorDataset

from hetero import comm
from hetero.commands.launch import free_port
from hetero.train import StepReport, Trainer, TrainerOptions

FEATURES, CLASSES = 32, 10


def dataset(samples: int, seed: int) -> TensorDataset:
    """Inputs from a normal distribution, labelled by a fixed random linear teacher."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # the same start on every rank (DDP also broadcasts rank 0's)
    return nn.Sequential(
        nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES)
    )


def mean_loss(model: nn.Module, data: TensorDataset) -> float:
    with torch.no_grad():
        x, y = data.tensors
        return float(nn.functional.cross_entropy(model(x), y))


def summary(speeds: list[float], reports: list[StepReport]) -> str:
    last = reports[-1]
    lines = ["rank  speed  share  samples/s  compute ms  comm ms  idle ms"]
    for r, speed in enumerate(speeds):
        ranks = [rep.ranks[r] for rep in reports]
        lines.append(
            f"{r:<5} {speed:<6g} {last.shares[r]:<6} {last.throughputs[r]:<10.0f} "
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
    return "\n".join(lines)


def train(
    trainer: Trainer, steps: int, args: argparse.Namespace, data: TensorDataset, progress: bool
) -> list[StepReport]:
    """``steps`` steps; with --loss-log, rank 0 adds each step's loss over ``data`` to it."""
    if args.loss_log is None:
        return trainer.train(steps, progress=progress)
    reports = []
    for _ in range(steps):
        reports.append(trainer.step())
        if trainer.rank == 0:
            line = {"step": trainer.steps, "ranks": trainer.world_size}
            with open(args.loss_log, "a") as f:
                f.write(json.dumps(line | {"loss": mean_loss(trainer.model, data)}) + "\n")
    return reports


def run(rank: int, world: int, args: argparse.Namespace, port: int | None) -> None:
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun sets it to 1 for the same reason:
        torch.set_num_threads(1)  # the ranks share this machine's cores
    comm.init(rank, world, backend="gloo", master_port=port)
    # Under a launcher, the local rank names the rank's device (hetero launch keeps it when the
    # ranks shrink, while RANK is renumbered).
    slot = int(os.environ.get("LOCAL_RANK", rank))
    speeds = [float(s) for s in args.speeds.split(",")]
    data = dataset(args.samples, args.seed)
    model = mlp(args.seed)
    options = TrainerOptions(
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        rebalance_every=args.rebalance_every,
        seed=args.seed,
        speed=speeds[slot],
        emulate_sample_time=args.sample_time or None,
        report_path=args.report,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
    )
    before = mean_loss(model, data)
    trainer = Trainer(
        model,
        lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        nn.CrossEntropyLoss(reduction="sum"),
        data,
        options,
    )
    speeds = comm.all_gather_object(speeds[slot])  # each rank's, in rank order
    if rank == 0:
        resumed = (
            f"; resumed from the checkpoint of step {trainer.resumed_from}"
            if trainer.resumed_from is not None
            else ""
        )
        print(
            f"{world} ranks (gloo), global batch {args.global_batch}, speeds "
            f"{' : '.join(f'{s:g}' for s in speeds)}; shares after profiling: "
            f"{'/'.join(map(str, trainer.shares))}{resumed}",
            flush=True,
        )
    start = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    failing = slot == args.fail_rank and start < args.fail_starts
    if failing and args.fail_at is not None and trainer.steps < args.fail_at:
        # Failure injection: this rank dies after --fail-at steps on the first --fail-starts
        # starts; a launcher with restarts (hetero launch, torchrun) starts the ranks again.
        train(trainer, args.fail_at - trainer.steps, args, data, progress=False)
        os._exit(1)
    reports = train(trainer, max(0, args.steps - trainer.steps), args, data, not args.quiet)
    if rank == 0:
        if reports:
            print(summary(speeds, reports))
        print(f"loss over the dataset: {before:.3f} -> {mean_loss(model, data):.3f}")
        if args.save_params:
            torch.save(model.state_dict(), args.save_params)
    del trainer
    gc.collect()  # DDP holds reference cycles: free them while the process group is up
    comm.destroy()


@record  # an uncaught error goes to the launcher's error file: it learns which rank failed first
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=3, help="ranks to start (without torchrun)")
    parser.add_argument("--speeds", default="1,0.5,0.25", help="relative speed of each rank")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=63)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument(
        "--sample-time", type=float, default=0.004, help="seconds per sample at speed 1"
    )
    parser.add_argument("--rebalance-every", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4096, help="size of the synthetic dataset")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, help="JSON lines of step reports (rank 0)")
    parser.add_argument("--quiet", action="store_true", help="no live progress")
    parser.add_argument("--checkpoint-dir", default=None, help="save and resume training here")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between saves")
    parser.add_argument(
        "--fail-at", type=int, default=None, help="--fail-rank dies after this step"
    )
    parser.add_argument("--fail-rank", type=int, default=1, help="(local) rank that dies")
    parser.add_argument(
        "--fail-starts", type=int, default=1, help="it dies on this many first starts"
    )
    parser.add_argument("--save-params", default=None, help="rank 0 saves the final parameters")
    parser.add_argument("--loss-log", default=None, help="rank 0 adds each step's loss (JSON)")
    args = parser.parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.nproc
    # An elastic launch may run fewer ranks than there are speeds: one per local rank.
    slots = max(world, int(os.environ.get("LOCAL_RANK", "0")) + 1)
    if len(args.speeds.split(",")) < slots:
        parser.error(f"--speeds gives {len(args.speeds.split(','))} speeds for {slots} ranks")
    if under_torchrun:
        run(int(os.environ["RANK"]), world, args, None)
    else:
        mp.spawn(run, args=(world, args, free_port()), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
