"""Checkpoints written in the background: the ``Trainer``'s step time while checkpointing, with
``checkpoint_async`` and without, against the same training with no checkpoints.

One gloo rank in this process (rank 0, the one that writes checkpoints), one torch thread, an
MLP of ``--layers`` square layers of ``--width`` (fp32) trained with SGD and momentum, so a
checkpoint holds the weights and the momentum: 76 MB at the defaults. The configurations run in
turns, ``--repeats`` times each, each turn starting with the next one:

- ``none``: no checkpoints;
- ``sync``: a checkpoint every ``--every`` steps, written in the step (``checkpoint_async=False``,
  the default): torch.save to a temporary file, fsync, rename;
- ``async``: the same, ``checkpoint_async=True``: the step copies the state into CPU memory kept
  from the previous checkpoint, and a thread writes it while the next steps run;
- ``async_mirror`` (with ``--mirror [DIR]``): ``async`` with one mirror
  (``checkpoint_mirrors``) in ``DIR`` (default: beside the primary copy, on the same disk):
  the same background write also copies the file there.

Each run takes ``--every`` untimed steps (which end with a first checkpoint, so the async
copy's memory is mapped), then ``--steps`` timed ones; a step's time is the wall time of
``trainer.step()``, the checkpoint's part included. Reported per configuration: the median over
the repeats of each run's mean step, the median and largest step, and the mean over the
checkpoint steps; ``vs_none`` is the median over the repeats of the run's mean step over the
mean step of the same turn's run without checkpoints (goal for ``async``: at most 1.1). This
shared machine's other work shakes single runs by tens of percent (``run_vs_none``): the
repeats are many and short, and the load average is recorded.

Prints JSON; ``--out`` saves it.

    python bench/bench_checkpoint.py --out bench/results/checkpoint.json
    python bench/bench_checkpoint.py --mirror --out bench/results/checkpoint_mirror.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
import torch
from _common import calibration_seconds, emit
from torch import nn
from torch.utils.data import TensorDataset

import hetero
from hetero import comm
from hetero.commands.launch import free_port
from hetero.train import Trainer, TrainerOptions

GOAL = 1.1
CONFIGURATIONS = ("none", "sync", "async")


@dataclass(frozen=True)
class Setup:
    width: int = 1536
    layers: int = 4
    batch: int = 64
    every: int = 10
    steps: int = 20
    warmup: int = 10
    repeats: int = 15
    seed: int = 0

    def model(self) -> nn.Module:
        torch.manual_seed(self.seed)
        layers: list[nn.Module] = []
        for _ in range(self.layers):
            layers += [nn.Linear(self.width, self.width), nn.Tanh()]
        return nn.Sequential(*layers[:-1])

    def data(self) -> TensorDataset:
        generator = torch.Generator().manual_seed(self.seed)
        samples = self.batch * 16
        x = torch.randn(samples, self.width, generator=generator)
        return TensorDataset(x, torch.randint(0, self.width, (samples,), generator=generator))


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def run(setup: Setup, configuration: str, folder: Path, mirrors: Path) -> list[float]:
    """The seconds of each timed step of one run (``async_mirror``: its mirror in ``mirrors``)."""
    options = TrainerOptions(
        global_batch=setup.batch,
        profile_steps=1,
        rebalance_every=0,
        seed=setup.seed,
        checkpoint_dir=None if configuration == "none" else str(folder),
        checkpoint_every=setup.every,
        checkpoint_async=configuration.startswith("async"),
        checkpoint_mirrors=[str(mirrors / folder.name)] if configuration == "async_mirror" else [],
    )
    loss = nn.CrossEntropyLoss(reduction="sum")
    trainer = Trainer(setup.model(), sgd, loss, setup.data(), options)
    for _ in range(setup.warmup):
        trainer.step()
    seconds = []
    for _ in range(setup.steps):
        started = time.perf_counter()
        trainer.step()
        seconds.append(time.perf_counter() - started)
    trainer.close()
    return seconds


def figures(runs: list[list[float]], setup: Setup) -> dict[str, Any]:
    """A configuration's runs: each run's mean step, and over the runs the median of those."""
    means = [statistics.fmean(run) for run in runs]
    # Timed step i is step warmup + i + 1 of its run.
    checkpointing = [
        s for run in runs for i, s in enumerate(run) if (setup.warmup + i + 1) % setup.every == 0
    ]
    steps = [s for run in runs for s in run]
    return {
        "mean_step_ms": round(1e3 * statistics.median(means), 1),
        "run_mean_step_ms": [round(1e3 * m, 1) for m in means],
        "median_step_ms": round(1e3 * statistics.median(steps), 1),
        "max_step_ms": round(1e3 * max(steps), 1),
        "mean_checkpoint_step_ms": round(1e3 * statistics.fmean(checkpointing), 1),
        "steps": len(steps),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", type=int, default=Setup.width)
    parser.add_argument("--layers", type=int, default=Setup.layers)
    parser.add_argument("--every", type=int, default=Setup.every, help="steps between checkpoints")
    parser.add_argument("--steps", type=int, default=Setup.steps, help="timed steps per run")
    parser.add_argument("--repeats", type=int, default=Setup.repeats)
    parser.add_argument("--dir", help="where checkpoints are written (default: a temporary one)")
    parser.add_argument(
        "--mirror",
        nargs="?",
        const="",
        metavar="DIR",
        help="also run async_mirror: async with one mirror in DIR (default: beside the primary)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup(
        width=args.width,
        layers=args.layers,
        every=args.every,
        steps=args.steps,
        warmup=args.every,
        repeats=args.repeats,
    )
    revision = _common.revision()
    calibration = calibration_seconds()
    load = os.getloadavg()[0]  # other work on this shared machine, for the record
    torch.set_num_threads(1)
    comm.init(0, 1, backend="gloo", master_port=free_port(), timeout=600)
    configurations = CONFIGURATIONS + (() if args.mirror is None else ("async_mirror",))
    runs: dict[str, list[list[float]]] = {c: [] for c in configurations}
    with (
        tempfile.TemporaryDirectory(dir=args.dir) as tmp,
        tempfile.TemporaryDirectory(dir=args.mirror or args.dir) as mirrors,
    ):
        for repeat in range(setup.repeats):
            # Each repeat starts with the next configuration: none is not always first.
            first = repeat % len(configurations)
            turn = configurations[first:] + configurations[:first]
            for configuration in turn:
                folder = Path(tmp, f"{configuration}-{repeat}")
                runs[configuration].append(run(setup, configuration, folder, Path(mirrors)))
                print(f"{configuration} {repeat}: done", file=sys.stderr, flush=True)
        checkpoint_bytes = sum(p.stat().st_size for p in Path(tmp).glob("sync-0/checkpoint.pt"))
    comm.destroy()
    results = {c: figures(r, setup) for c, r in runs.items()}
    for c in configurations:
        # Each repeat's runs ran back to back: their ratio is the least shaken by other work.
        ratios = [
            statistics.fmean(mine) / statistics.fmean(none)
            for mine, none in zip(runs[c], runs["none"], strict=True)
        ]
        results[c]["vs_none"] = round(statistics.median(ratios), 3)
        results[c]["run_vs_none"] = [round(r, 3) for r in ratios]
    doc: dict[str, Any] = {
        "benchmark": "background checkpoints",
        "command": _common.command("bench/bench_checkpoint.py", argv),
        "hetero": hetero.__version__,
        "torch": torch.__version__,
        "revision": revision,
        "setup": asdict(setup),
        "parameters": sum(p.numel() for p in setup.model().parameters()),
        "checkpoint_bytes": checkpoint_bytes,
        "mirror_dir": args.mirror,  # None: no async_mirror; "": beside the primary
        "results": results,
        "goal_async_vs_none": GOAL,
        "met": results["async"]["vs_none"] <= GOAL,
        "calibration_seconds_before": calibration,
        "load_average_before": load,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
