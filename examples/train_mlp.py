"""Train a small MLP on synthetic data with hetero's Trainer, on ranks of different speeds.

    python examples/train_mlp.py --nproc 3 --steps 30 --html train.html
    python examples/train_mlp.py --split equal          # plain DDP's equal split, the baseline
    torchrun --nproc-per-node 3 examples/train_mlp.py --fleet examples/train_fleet.yaml
    hetero launch --nproc 3 examples/train_mlp.py --checkpoint-dir ckpt --fail-at 15
    hetero launch --nproc 2:3 --rank-restarts 0 --rejoin-after 0 examples/train_mlp.py \
        --checkpoint-dir ckpt --fail-at 15

Without torchrun the script starts ``--nproc`` gloo ranks on this machine itself. Rank i emulates
device i of the fleet config ``--fleet`` (under a launcher, local rank i: ``hetero launch`` keeps
a rank's local rank when the ranks shrink), at its catalog speed relative to the fleet's fastest
device (``--speeds`` gives the speeds instead): each of its micro-batches takes samples ×
``--sample-time`` / speed seconds (``--sample-time 0``: its real compute time over the speed).
The trainer profiles the ranks, splits every global batch in proportion to their measured
throughput (``--split equal``: in equal shares, as plain DDP), and prints, on rank 0, how each
rank spent its time, how close the step time came to the ideal (global batch / the sum of the
ranks' samples/s) and the loss; ``--html`` writes that as a picture.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import _training  # what the training examples share
import torch
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.data import TensorDataset

from hetero import comm
from hetero.train import StepReport, Trainer

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


def train_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    """One rank's run: train, dying on the way when --fail-at says so; rank 0 reports."""
    # Under a launcher, the local rank names the rank's device (hetero launch keeps it when the
    # ranks shrink, while RANK is renumbered).
    slot = int(os.environ.get("LOCAL_RANK", rank))
    device = args.devices[slot]
    data = dataset(args.samples, args.seed)
    model = mlp(args.seed)
    before = mean_loss(model, data)
    trainer = Trainer(
        model,
        lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
        nn.CrossEntropyLoss(reduction="sum"),
        data,
        _training.trainer_options(args, device.speed),
    )
    devices = comm.all_gather_object(device)  # each rank's, in rank order
    ranks_speeds = [d.speed for d in devices]
    if rank == 0:
        print(f"{world} ranks (gloo), {_training.shares_line(trainer, ranks_speeds)}", flush=True)
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
            print(_training.summary(ranks_speeds, reports))
        print(f"loss over the dataset: {before:.3f} -> {mean_loss(model, data):.3f}")
        _training.write_html(args, trainer, devices)
        if args.save_params:
            torch.save(model.state_dict(), args.save_params)


@record  # an uncaught error goes to the launcher's error file: it learns which rank failed first
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    _training.add_training_options(
        parser, steps=30, global_batch=63, sample_time=0.004, samples=4096, checkpoint_every=10
    )
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
    _training.start_ranks(parser, args, train_rank, elastic=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
