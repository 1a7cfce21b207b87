"""Heterogeneous training on Ray Train: hetero's ``Trainer`` inside ``TorchTrainer`` workers
(``hetero.train.ray_train``) on a local Ray cluster of two emulated nodes, one worker each: a V100
and a T4 set to relative speeds 1 : 0.5, each node declaring its device in its own fleet config.

Each worker takes its node's device and paces itself as that device would run: a micro-batch of
n samples takes ``n × sample_time / speed`` seconds (its real compute counted toward it), its
backward paced as it goes (``hetero.train.pacing``). The ideal step time is the total work over
the sum of the speeds, ``B × sample_time / Σ speeds``.

The MLP of ``examples/train_mlp.py`` (32-64-64-10 on 4,096 synthetic samples, SGD with
momentum, global batch 30), two configurations in turns for ``--repeats`` repeats, each a fresh
Ray Train run:

- ``hetero``: ``ray_trainer``: shares from timing the workers at start, rebalanced every 10
  steps.
- ``equal_shares``: the same ``Trainer`` with ``split="equal"``: each worker half of every global
  batch, what a ``TorchTrainer`` gives its workers by default (``prepare_data_loader``'s
  ``DistributedSampler``), paced alike, with the same exact update.

``step_ms``: wall milliseconds per step on rank 0 over ``--steps`` steps after ``--warmup``
untimed ones (each step's report gathering included). ``exactness``: each hetero run's
parameters after all its steps against one process training on the same global batches, the
largest difference relative to the largest parameter (fp32).

Prints JSON; ``--out`` saves it.

    python bench/bench_train_ray.py --out bench/results/train_ray.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import torch
import yaml
from _engine_util import summary
from torch import nn
from torch.utils.data import TensorDataset

import hetero
from hetero import comm
from hetero.runtime.ray_cluster import import_ray, local_cluster
from hetero.train import HeteroSampler, TrainerOptions
from hetero.train.ray_train import ray_trainer, worker_devices

# Each node's one emulated device, at the relative speeds 1 : 0.5.
NODES = {
    "v100": {"type": "gpu", "model": "V100-32GB", "emulate": True, "speed": 1.0},
    "t4": {"type": "gpu", "model": "T4", "emulate": True, "speed": 0.5},
}
SPEEDS = tuple(float(n["speed"]) for n in NODES.values())
GOAL_VS_IDEAL = 1.15
LOSS = nn.CrossEntropyLoss(reduction="sum")


@dataclass(frozen=True)
class Setup:
    global_batch: int = 30
    sample_time: float = 0.02
    steps: int = 20
    warmup: int = 3
    repeats: int = 2
    rebalance_every: int = 10
    samples: int = 4096
    seed: int = 0


# The model and data of examples/train_mlp.py, here: Ray's workers get ``__main__``'s functions
# by value, and could not import the examples.
FEATURES, CLASSES = 32, 10


def dataset(samples: int, seed: int) -> TensorDataset:
    """Inputs from a normal distribution, labelled by a fixed random linear teacher."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    return TensorDataset(x, (x @ teacher).argmax(dim=1))


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES)
    )


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


# -------------------------------------------------------------------- on each Ray Train worker


def train_loop(config: dict[str, Any]) -> None:
    """One worker of one run: ``warmup`` steps, then ``steps`` timed ones; rank 0 writes what
    it measured to ``config["out"]`` (this machine's file system: the cluster is local)."""
    setup: Setup = config["setup"]
    workers = worker_devices()
    options = TrainerOptions(
        global_batch=setup.global_batch,
        rebalance_every=setup.rebalance_every,
        seed=setup.seed,
        split=config["split"],
        emulate_sample_time=setup.sample_time,
    )
    data = dataset(setup.samples, setup.seed)
    trainer = ray_trainer(mlp(setup.seed), sgd, LOSS, data, options, workers=workers)
    profiled = list(trainer.shares)
    trainer.train(setup.warmup, progress=False)
    comm.barrier()
    started = time.perf_counter()
    reports = trainer.train(setup.steps, progress=False)
    seconds = (time.perf_counter() - started) / setup.steps
    state = trainer.model_state_dict()
    trainer.close()
    if trainer.rank != 0:
        return

    def ms(rank: int, field: str) -> float:
        return round(statistics.mean(getattr(r.ranks[rank], field) for r in reports) * 1e3, 1)

    ranks = [
        {
            "rank": w.rank,
            "device": w.device.model,
            "speed": w.speed,
            "share": trainer.shares[w.rank],
            "compute_ms": ms(w.rank, "compute_seconds"),
            "comm_ms": ms(w.rank, "comm_seconds"),
            "idle_ms": ms(w.rank, "idle_seconds"),
            "samples_per_second": round(trainer.throughputs[w.rank], 1),
        }
        for w in workers
    ]
    result = {
        "step_seconds": seconds,
        "profiled_shares": profiled,
        "shares": list(trainer.shares),
        "rebalances": sum(r.rebalanced for r in reports),
        "efficiency_reported": round(statistics.median(r.efficiency for r in reports), 3),
        "ranks": ranks,
        "state": state,
    }
    torch.save(result, config["out"])


# ------------------------------------------------------------------------------------ driver


def one_process(setup: Setup, steps: int) -> nn.Module:
    """The MLP after ``steps`` steps of one process on the same global batches (global batch k
    of an epoch is ``order[k*B:(k+1)*B]``), each the mean loss over the global batch."""
    model = mlp(setup.seed)
    data = dataset(setup.samples, setup.seed)
    optimizer = sgd(model.parameters())
    done, epoch, size, batch = 0, 0, len(data), setup.global_batch
    while done < steps:
        order = HeteroSampler.global_order(size, setup.seed, epoch, True)
        for k in range(0, size, batch):
            if done == steps:
                break
            x, y = data[order[k : k + batch]]
            loss = LOSS(model(x), y) / len(x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
        epoch += 1
    return model


def relative_difference(state: dict[str, torch.Tensor], reference: nn.Module) -> float:
    return max(
        ((state[name] - p).abs().max() / p.abs().max()).item()
        for name, p in reference.named_parameters()
    )


def run(setup: Setup, split: str, storage: str, out: Path) -> dict[str, Any]:
    """One Ray Train run of ``split``, two workers spread over the two nodes."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"setup": setup, "split": split, "out": str(out)},
        scaling_config=ScalingConfig(num_workers=len(NODES), placement_strategy="SPREAD"),
        run_config=RunConfig(storage_path=storage),
    )
    trainer.fit()
    result: dict[str, Any] = torch.load(out, weights_only=False)  # what rank 0 just wrote
    return result


def figure(setup: Setup, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    ideal_ms = setup.global_batch * setup.sample_time / sum(SPEEDS) * 1e3
    reference = one_process(setup, setup.warmup + setup.steps)
    differences = [relative_difference(r["state"], reference) for r in runs["hetero"]]

    def configuration(name: str) -> dict[str, Any]:
        step_ms = [r["step_seconds"] * 1e3 for r in runs[name]]
        median_run = sorted(runs[name], key=lambda r: r["step_seconds"])[(len(step_ms) - 1) // 2]
        vs_ideal = statistics.median(step_ms) / ideal_ms
        return {
            "step_ms": summary(step_ms),
            "vs_ideal": round(vs_ideal, 3),
            "profiled_shares": median_run["profiled_shares"],
            "shares": median_run["shares"],
            "rebalances": median_run["rebalances"],
            "efficiency_reported": median_run["efficiency_reported"],
            "ranks_of_median_run": median_run["ranks"],
        }

    hetero_figure = configuration("hetero")
    hetero_figure.update(
        goal_vs_ideal=GOAL_VS_IDEAL, meets_goal=hetero_figure["vs_ideal"] <= GOAL_VS_IDEAL
    )
    equal = configuration("equal_shares")
    # Half the batch on the speed-0.5 device sets every step.
    equal["expected_vs_ideal"] = round(
        setup.global_batch / len(SPEEDS) * setup.sample_time / min(SPEEDS) * 1e3 / ideal_ms, 3
    )
    return {
        "ideal_ms": round(ideal_ms, 2),
        "hetero": hetero_figure,
        "equal_shares": equal,
        "hetero_speedup_vs_equal": round(
            equal["step_ms"]["median"] / hetero_figure["step_ms"]["median"], 3
        ),
        "exactness": {
            "steps": setup.warmup + setup.steps,
            "max_relative_difference_per_run": [float(f"{d:.3g}") for d in differences],
            "tolerance": 1e-5,
            "exact": max(differences) <= 1e-5,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, help="timed steps per run (default 20)")
    parser.add_argument("--repeats", type=int, help="runs of each configuration (default 2)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup()
    setup = dataclasses.replace(
        setup, steps=args.steps or setup.steps, repeats=args.repeats or setup.repeats
    )
    ray = import_ray()
    record = _common.Run("bench/bench_train_ray.py", argv)
    runs: dict[str, list[dict[str, Any]]] = {"hetero": [], "equal_shares": []}
    with tempfile.TemporaryDirectory() as tmp:
        configs = []
        for name, device in NODES.items():
            path = Path(tmp, f"{name}.yaml")
            path.write_text(yaml.safe_dump({"devices": [device]}))
            configs.append(path)
        with local_cluster(configs) as cluster:
            ray.init(address=cluster.address, logging_level="WARNING")
            for repeat in range(setup.repeats):  # in turns: the machine's drift hits both alike
                for name, split in (("hetero", "speed"), ("equal_shares", "equal")):
                    out = Path(tmp, f"{name}{repeat}.pt")
                    runs[name].append(run(setup, split, str(Path(tmp, "runs")), out))
    doc: dict[str, Any] = {
        **record.header(
            "heterogeneous training on Ray Train",
            hetero=hetero.__version__,
            ray=ray.__version__,
            torch=torch.__version__,
        ),
        "setup": {
            "nodes": {
                name: f"{d['model']} (emulated, speed {d['speed']})" for name, d in NODES.items()
            },
            "workers": len(NODES),
            "backend": "gloo (made by Ray Train)",
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
        "step_time": figure(setup, runs),
        **record.footer(),
    }
    return _common.emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
