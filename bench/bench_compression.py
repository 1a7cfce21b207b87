"""Local SGD and gradient compression against exact DDP (issue #38): how far each one's loss
ends from exact DDP's on the same global batches, against the bound ``docs/training.md``
documents, and the bytes each step hands to the collectives against the dense all-reduce's.

Three gloo ranks over 127.0.0.1, one torch thread each, ``hetero.train.Trainer`` with fixed
uneven shares 14/7/3 of a global batch of 24 (seed 3, as ``tests/train/test_compression.py``):
60 samples of 8 normal features in 4 random classes, an MLP 8 → ``hidden`` → 4 (tanh), summed
cross-entropy, SGD (learning rate 0.1, momentum 0.9); the tests' MLP (hidden 16: 212
parameters) and one 4 × wider (hidden 64: 836 parameters). Configurations, each from the same
start on the same global batches:

- *exact*: DDP's all-reduce (``compression="none"``), the reference;
- *int8*, *topk 1 %*, *topk 10 %*: ``compression="int8"`` and ``compression="topk"`` at
  ``topk_ratio`` 0.01 and 0.1, with error feedback;
- *local SGD, K = 4*: ``local_sgd_every=4``, the replicas averaged every 4 steps.

Figures for each, after each of ``--steps`` (20 and 200; both multiples of 4, so local SGD ends
on an average):

- *Loss*: the mean cross-entropy over the whole dataset of rank 0's model (every rank's is
  checked to be the same), and its difference from exact DDP's relative to exact DDP's. The
  bound (docs/training.md#gradient-compression and #local-sgd, documented for 20 steps of the
  tests' MLP): 0.1 % for int8, 10 % for topk, 2 % for local SGD at K = 4, checked at 20 steps
  on both MLPs. At 200 steps the difference is reported beside them, not checked: no bound is
  documented there (exact DDP has nearly fitted the data by then, and Top-K at 1 %, which sends
  each value about once in a hundred steps, lags far behind it).
- *Bytes*: the step reports' ``comm_bytes`` (what each rank handed to the collectives of the
  step's gradient reduction, or of local SGD's parameter average) and ``dense_bytes`` (an
  uncompressed all-reduce's), the mean over the steps, and their ratio. Target: topk at 1 %
  ≤ 5 % of dense.
- *Step time*: the step reports' ``step_seconds`` (the slowest rank's), median over the steps
  after the first, in ms; for the record only (tiny models on a shared 2-core machine).

Prints JSON; ``--out`` saves it.

    python bench/bench_compression.py --out bench/results/compression.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import _common
import torch
from _common import emit
from torch import nn
from torch.utils.data import TensorDataset

import hetero
from hetero import comm
from hetero.train import Trainer, TrainerOptions

WORLD = 3
GLOBAL_BATCH = 24
SHARES = (14, 7, 3)
SEED = 3
SAMPLES = 60
FEATURES, CLASSES = 8, 4
HIDDEN = (16, 64)  # the tests' MLP and one 4 × wider
STEPS = (20, 200)
QUICK_STEPS = (20,)
LOSS = nn.CrossEntropyLoss(reduction="sum")
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "exact": {},
    "int8": {"compression": "int8"},
    "topk_1pct": {"compression": "topk", "topk_ratio": 0.01},
    "topk_10pct": {"compression": "topk", "topk_ratio": 0.1},
    "local_sgd_4": {"local_sgd_every": 4},
}
# The loss after 20 steps, relative to exact DDP's: docs/training.md#gradient-compression (int8,
# topk) and #local-sgd (K = 4).
BOUNDS = {"int8": 1e-3, "topk_1pct": 0.10, "topk_10pct": 0.10, "local_sgd_4": 0.02}
DOCUMENTED_AT = 20
TOPK_BYTES_GOAL = 0.05  # topk at 1 %: comm bytes ≤ 5 % of dense


def data() -> TensorDataset:
    """The tests' data: ``SAMPLES`` samples of normal features, each in a random class."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return TensorDataset(x, y)


def mlp(hidden: int) -> nn.Module:
    """FEATURES → ``hidden`` → CLASSES, the same start on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, CLASSES))


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def dataset_loss(model: nn.Module) -> float:
    x, y = data()[:]
    with torch.no_grad():
        return float(LOSS(model(x), y) / len(x))


# ---------------------------------------------------------------------------------- on each rank


def trained(hidden: int, options: dict[str, Any], steps: tuple[int, ...]) -> dict[str, Any]:
    """One configuration: the dataset loss on every rank after each of ``steps``, and every
    step's report."""
    trainer = Trainer(
        mlp(hidden),
        sgd,
        LOSS,
        data(),
        TrainerOptions(
            global_batch=GLOBAL_BATCH, shares=SHARES, seed=SEED, profile_steps=1, **options
        ),
    )
    losses, reports = {}, []
    for n in steps:
        reports += [r.to_dict() for r in trainer.train(n - trainer.steps, progress=False)]
        losses[n] = comm.all_gather_object(dataset_loss(trainer.model))
    del trainer
    gc.collect()  # DDP keeps reference cycles: free it before the next one is built
    return {"losses": losses, "reports": reports}


def worker(rank: int, port: int, steps: tuple[int, ...], out: str) -> None:
    torch.set_num_threads(1)  # three ranks share this machine's cores (torchrun does the same)
    comm.init(rank, WORLD, backend="gloo", master_port=port, timeout=300)
    result = {
        str(hidden): {name: trained(hidden, kw, steps) for name, kw in CONFIGURATIONS.items()}
        for hidden in HIDDEN
    }
    comm.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------ driver


def figures(run: dict[str, Any], exact: dict[str, Any], name: str) -> dict[str, Any]:
    """A configuration's losses against exact DDP's, its bytes a step and its step time."""
    reports = run["reports"]
    comm_bytes = [r["comm_bytes"] for r in reports]
    dense = {r["dense_bytes"] for r in reports}
    (dense_bytes,) = dense  # the gradients' bytes: the same every step
    mean_bytes = statistics.mean(comm_bytes)
    loss = {}
    for n, per_rank in run["losses"].items():
        bound = BOUNDS.get(name) if int(n) == DOCUMENTED_AT else None
        reference = exact["losses"][n][0]
        gap = abs(per_rank[0] - reference) / reference
        loss[n] = {
            "loss": round(per_rank[0], 5),
            "exact_loss": round(reference, 5),
            "relative_difference": float(f"{gap:.3g}"),
            "over_exact": round(per_rank[0] / reference, 3),
            "ranks_agree": len(set(per_rank)) == 1,
            "bound": bound,
            "meets": None if bound is None else gap <= bound,
        }
    out = {
        "loss": loss,
        "comm_bytes_per_step": round(mean_bytes, 1),
        "comm_bytes_values": sorted(set(comm_bytes)),
        "dense_bytes_per_step": dense_bytes,
        "bytes_ratio": round(mean_bytes / dense_bytes, 4),
        "step_ms_median": round(statistics.median(r["step_seconds"] for r in reports[1:]) * 1e3, 2),
    }
    if name == "topk_1pct":
        out["bytes_goal"] = TOPK_BYTES_GOAL
        out["bytes_meets"] = mean_bytes <= TOPK_BYTES_GOAL * dense_bytes
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="20 steps only")
    parser.add_argument(
        "--steps",
        type=int,
        nargs="+",
        help="step counts to measure the loss after, ascending (default 20 200)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    steps = tuple(args.steps or (QUICK_STEPS if args.quick else STEPS))
    if list(steps) != sorted(set(steps)) or steps[0] < 2:
        parser.error(f"--steps: must be ascending step counts of at least 2, got {list(steps)}")
    record = _common.Run("bench/bench_compression.py", argv)
    result = _common.spawned_ranks(worker, WORLD, steps)
    models: dict[str, dict[str, Any]] = {}
    for hidden, runs in result.items():
        exact = runs["exact"]
        configurations = {name: figures(run, exact, name) for name, run in runs.items()}
        models[f"hidden_{hidden}"] = {
            "hidden": int(hidden),
            "parameters": sum(p.numel() for p in mlp(int(hidden)).parameters()),
            "configurations": configurations,
        }
    every = [c for m in models.values() for c in m["configurations"].values()]
    at = {
        n: [c["loss"][n]["meets"] for c in every if c["loss"][n]["meets"] is not None]
        for n in map(str, steps)
    }
    at = {n: flags for n, flags in at.items() if flags}  # where a bound is documented
    doc: dict[str, Any] = {
        **record.header(
            "local SGD and gradient compression against exact DDP",
            quick=args.quick,
            hetero=hetero.__version__,
            torch=torch.__version__,
        ),
        "setup": {
            "ranks": WORLD,
            "backend": "gloo",
            "global_batch": GLOBAL_BATCH,
            "shares": list(SHARES),
            "seed": SEED,
            "steps": list(steps),
            "data": f"{SAMPLES} samples of {FEATURES} normal features in {CLASSES} random classes",
            "model": f"MLP {FEATURES} → hidden → {CLASSES} (tanh), hidden {list(HIDDEN)}",
            "optimizer": "SGD, lr 0.1, momentum 0.9; summed cross-entropy",
            "configurations": CONFIGURATIONS,
        },
        "bounds": {
            **BOUNDS,
            "documented_at_steps": DOCUMENTED_AT,
            "source": "docs/training.md#gradient-compression, #local-sgd",
        },
        "models": models,
        "met": {
            **{f"loss_at_{n}_steps": all(flags) for n, flags in at.items()},
            "topk_1pct_bytes": all(c["bytes_meets"] for c in every if "bytes_meets" in c),
        },
        **record.footer(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
