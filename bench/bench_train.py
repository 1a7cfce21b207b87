"""Heterogeneous training: hetero's ``Trainer`` against equal-split DDP on 3 gloo ranks of emulated
relative speeds 1 : 0.5 : 0.25, in one run on this machine.

The model and data are ``examples/train_mlp.py``'s (an MLP 32-64-64-10 on 4,096 synthetic
samples), SGD with momentum, global batch 63. Every rank emulates its device the same way in both
configurations: a micro-batch of n samples takes ``n × sample_time / speed`` seconds (its real
compute counted toward it), so the ideal step time is ``B × sample_time / Σ speeds``.

- ``step_time``: seconds per step, wall time on rank 0 over ``--steps`` steps after
  ``--warmup`` untimed ones, hetero and the baseline in turns for ``--repeats`` repeats.
  hetero: ``Trainer`` (shares from profiling at start, rebalanced every 10 steps; the barrier,
  the synchronised pass and the report gathering each step included). Baseline: plain
  ``DistributedDataParallel``, each rank B/3 of every global batch, paced between forward and
  backward (compute, then the all-reduce inside the backward).
- ``exactness``: 5 steps of ``Trainer`` with the emulated speeds' shares and ``micro_batch`` 8
  (the fast rank accumulates over 5 micro-batches) against one process training on the same
  global batches; the largest absolute difference of any parameter (fp32).

Prints JSON; ``--out`` saves it.

    python bench/bench_train.py --out bench/results/train.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import torch
import torch.multiprocessing as mp
from _common import calibration_seconds, emit
from _engine_util import summary
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import hetero
from hetero import comm
from hetero.commands.launch import free_port
from hetero.train import HeteroSampler, Trainer, TrainerOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_mlp  # the example's model and data

SPEEDS = (1.0, 0.5, 0.25)
GOAL_VS_IDEAL = 1.15
EXACT_STEPS = 5
EXACT_MICRO_BATCH = 8
EXACT_SAMPLE_TIME = 0.0005


@dataclass(frozen=True)
class Setup:
    global_batch: int = 63
    sample_time: float = 0.004
    steps: int = 30
    warmup: int = 3
    repeats: int = 3
    rebalance_every: int = 10
    samples: int = 4096
    seed: int = 0


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


LOSS = nn.CrossEntropyLoss(reduction="sum")


# -------------------------------------------------------------------------------- on each rank


def hetero_run(rank: int, setup: Setup, data: Any) -> dict[str, Any]:
    options = TrainerOptions(
        global_batch=setup.global_batch,
        rebalance_every=setup.rebalance_every,
        seed=setup.seed,
        speed=SPEEDS[rank],
        emulate_sample_time=setup.sample_time,
    )
    trainer = Trainer(train_mlp.mlp(setup.seed), sgd, LOSS, data, options)
    profiled = list(trainer.shares)
    trainer.train(setup.warmup, progress=False)
    comm.barrier()
    started = time.perf_counter()
    reports = trainer.train(setup.steps, progress=False)
    seconds = (time.perf_counter() - started) / setup.steps
    ranks = [
        {
            "rank": r,
            "speed": SPEEDS[r],
            "compute_ms": round(
                statistics.mean(x.ranks[r].compute_seconds for x in reports) * 1e3, 2
            ),
            "comm_ms": round(statistics.mean(x.ranks[r].comm_seconds for x in reports) * 1e3, 2),
            "idle_ms": round(statistics.mean(x.ranks[r].idle_seconds for x in reports) * 1e3, 2),
            "samples_per_second": round(trainer.throughputs[r], 1),
        }
        for r in range(len(SPEEDS))
    ]
    return {
        "step_seconds": seconds,
        "profiled_shares": profiled,
        "shares": list(trainer.shares),
        "rebalances": sum(r.rebalanced for r in reports),
        "efficiency_reported": round(statistics.median(r.efficiency for r in reports), 3),
        "ranks": ranks,
    }


def equal_run(rank: int, setup: Setup, data: Any) -> dict[str, Any]:
    """Plain DDP: each rank B/3 of every global batch, paced as hetero's emulated ranks are."""
    ddp = DistributedDataParallel(train_mlp.mlp(setup.seed))
    optimizer = sgd(ddp.parameters())
    world, batch = len(SPEEDS), setup.global_batch
    share = batch // world
    order = HeteroSampler.global_order(len(data), setup.seed, 0, True)

    def step(k: int) -> None:
        start = k * batch + rank * share  # global batch k of epoch 0, this rank's third
        x, y = data[order[start : start + share]]
        started = time.perf_counter()
        loss = nn.functional.cross_entropy(ddp(x), y)
        due = started + share * setup.sample_time / SPEEDS[rank]
        time.sleep(max(0.0, due - time.perf_counter()))
        loss.backward()  # DDP all-reduces here: the mean over ranks of equal shares
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for k in range(setup.warmup):
        step(k)
    comm.barrier()
    started = time.perf_counter()
    for k in range(setup.steps):
        step(setup.warmup + k)
    return {"step_seconds": (time.perf_counter() - started) / setup.steps}


def exactness(rank: int, setup: Setup, data: Any) -> dict[str, Any]:
    options = TrainerOptions(
        global_batch=setup.global_batch,
        micro_batch=EXACT_MICRO_BATCH,
        seed=setup.seed,
        speed=SPEEDS[rank],
        emulate_sample_time=EXACT_SAMPLE_TIME,
    )
    trainer = Trainer(train_mlp.mlp(setup.seed), sgd, LOSS, data, options)
    reports = trainer.train(EXACT_STEPS, progress=False)
    # One process, no DDP, the same global batches: order[k*B:(k+1)*B] of epoch 0.
    model = train_mlp.mlp(setup.seed)
    optimizer = sgd(model.parameters())
    order = HeteroSampler.global_order(len(data), setup.seed, 0, True)
    for k in range(EXACT_STEPS):
        x, y = data[order[k * setup.global_batch : (k + 1) * setup.global_batch]]
        loss = nn.functional.cross_entropy(model(x), y)  # the mean over the global batch
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    diff = max(
        (a - b).abs().max().item()
        for a, b in zip(trainer.model.parameters(), model.parameters(), strict=True)
    )
    return {
        "steps": EXACT_STEPS,
        "shares": list(reports[0].shares),
        "micro_batches": [r.micro_batches for r in reports[0].ranks],
        "micro_batch": EXACT_MICRO_BATCH,
        "max_abs_difference": diff,
    }


def worker(rank: int, port: int, setup: Setup, out: str) -> None:
    torch.set_num_threads(1)  # three ranks share this machine's cores (torchrun does the same)
    comm.init(rank, len(SPEEDS), backend="gloo", master_port=port, timeout=120)
    data = train_mlp.dataset(setup.samples, setup.seed)
    result: dict[str, Any] = {"exactness": exactness(rank, setup, data), "hetero": [], "equal": []}
    for _ in range(setup.repeats):  # in turns, so the machine's drift hits both alike
        for name, run in (("hetero", hetero_run), ("equal", equal_run)):
            result[name].append(run(rank, setup, data))
            gc.collect()  # DDP holds reference cycles: free them while the process group is up
    comm.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------ driver


def step_time_figure(setup: Setup, result: dict[str, Any]) -> dict[str, Any]:
    ideal = setup.global_batch * setup.sample_time / sum(SPEEDS)
    share = setup.global_batch // len(SPEEDS)
    expected_equal = max(share * setup.sample_time / s for s in SPEEDS) / ideal
    hetero_runs = result["hetero"]
    hetero_s = [r["step_seconds"] for r in hetero_runs]
    equal_s = [r["step_seconds"] for r in result["equal"]]
    median_run = sorted(hetero_runs, key=lambda r: r["step_seconds"])[(len(hetero_runs) - 1) // 2]
    hetero_ms = statistics.median(hetero_s) * 1e3
    equal_ms = statistics.median(equal_s) * 1e3
    return {
        "ideal_ms": round(ideal * 1e3, 2),
        "hetero": {
            "step_ms": summary([s * 1e3 for s in hetero_s]),
            "vs_ideal": round(hetero_ms / (ideal * 1e3), 3),
            "goal_vs_ideal": GOAL_VS_IDEAL,
            "meets_goal": hetero_ms / (ideal * 1e3) <= GOAL_VS_IDEAL,
            "profiled_shares": median_run["profiled_shares"],
            "shares": median_run["shares"],
            "rebalances": median_run["rebalances"],
            "efficiency_reported": median_run["efficiency_reported"],
            "ranks_of_median_run": median_run["ranks"],
        },
        "equal_split_ddp": {
            "step_ms": summary([s * 1e3 for s in equal_s]),
            "vs_ideal": round(equal_ms / (ideal * 1e3), 3),
            "expected_vs_ideal": round(expected_equal, 3),
            "shares": [share] * len(SPEEDS),
        },
        "hetero_speedup_vs_equal": round(equal_ms / hetero_ms, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="8 steps, one repeat")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 30)")
    parser.add_argument("--repeats", type=int, help="runs of each configuration (default 3)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup(steps=8, repeats=1) if args.quick else Setup()
    setup = dataclasses.replace(
        setup, steps=args.steps or setup.steps, repeats=args.repeats or setup.repeats
    )
    if (setup.warmup + setup.steps) * setup.global_batch > setup.samples:
        parser.error(f"--steps {setup.steps}: the baseline runs out of its epoch of samples")
    revision = _common.revision()
    calibration = calibration_seconds()
    load = os.getloadavg()[0]  # other work on this shared machine, for the record
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp, "rank0.json"))
        mp.spawn(worker, args=(free_port(), setup, out), nprocs=len(SPEEDS), join=True)
        result = json.loads(Path(out).read_text())
    doc: dict[str, Any] = {
        "benchmark": "heterogeneous training",
        "command": _common.command("bench/bench_train.py", argv),
        "quick": args.quick,
        "hetero": hetero.__version__,
        "torch": torch.__version__,
        "revision": revision,
        "revision_after": _common.revision(),
        "setup": {
            "ranks": len(SPEEDS),
            "backend": "gloo",
            "speeds": list(SPEEDS),
            "sample_time_s": setup.sample_time,
            "global_batch": setup.global_batch,
            "steps": setup.steps,
            "warmup_steps": setup.warmup,
            "repeats": setup.repeats,
            "rebalance_every": setup.rebalance_every,
            "model": "MLP 32-64-64-10 (examples/train_mlp.py)",
            "samples": setup.samples,
        },
        "calibration_seconds": calibration,
        "load_average_before": round(load, 2),
        "step_time": step_time_figure(setup, result),
        "exactness": result["exactness"],
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
