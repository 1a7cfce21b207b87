"""Heterogeneous training: hetero's ``Trainer`` against equal-split DDP on 3 gloo ranks of emulated
relative speeds 1 : 0.5 : 0.25, in one run on this machine, on two models.

Every rank emulates its device the same way in every configuration: a micro-batch of n samples
takes ``n × sample_time / speed`` seconds (its real compute counted toward it), the first third
its forward, the rest its backward, paced as it goes (``hetero.train.pacing``) so gradients are
ready when the emulated device would make them. The ideal step time is
``B × sample_time / Σ speeds``.

The MLP (``examples/train_mlp.py``: 32-64-64-10 on 4,096 synthetic samples, SGD with momentum,
global batch 63):

- ``step_time``: seconds per step, wall time on rank 0 over ``--steps`` steps after
  ``--warmup`` untimed ones, hetero and the baseline in turns for ``--repeats`` repeats.
  hetero: ``Trainer`` (shares from profiling at start, rebalanced every 10 steps; the report
  gathering each step included). Baseline: plain ``DistributedDataParallel``, each rank B/3 of
  every global batch, paced alike.
- ``exactness``: 5 steps of ``Trainer`` with the emulated speeds' shares and ``micro_batch`` 8
  (the fast rank accumulates over 5 micro-batches) against one process training on the same
  global batches; the largest absolute difference of any parameter (fp32).

The transformer (``examples/train_gpt.py``: GPT-2 of 8 layers × 512 over a vocabulary of 2,048,
26.3M parameters, random weights; sequences of 64 tokens of a synthetic Markov chain; AdamW,
fused; global batch 14), the configurations in turns for ``--gpt-repeats`` repeats:

- ``hetero_ddp``: ``Trainer`` under DDP (its default 25 MB buckets).
- ``equal_split_ddp``: plain DDP, 5/5/4 of every global batch, paced alike.
- ``hetero_fsdp``: ``Trainer`` with ``sharding="fsdp"``.
- ``memory_bounded``: ``Trainer`` under DDP where the fast rank's ``memory_limit`` holds a
  micro-batch of 2 sequences and the others' is four times it: it keeps its share, in more
  micro-batches.
- ``allreduce_ms``: one all-reduce of every gradient (a flat fp32 tensor of all parameters, the
  ranks started together), median of 5: the communication each configuration's exposed
  ``comm`` is a fraction of.
- ``exactness``: 5 steps under DDP and under FSDP, shares 8/4/2, ``micro_batch`` 3, SGD with
  momentum, against one process on the same global batches: the largest parameter difference,
  absolute and relative to the largest parameter (fp32).

Prints JSON; ``--out`` saves it.

    python bench/bench_train.py --out bench/results/train.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import torch
import torch.multiprocessing as mp
from _common import emit
from _engine_util import summary
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

import hetero
from hetero import comm
from hetero.commands.launch import free_port
from hetero.train import HeteroSampler, Trainer, TrainerOptions
from hetero.train.memory import MemoryProbe
from hetero.train.pacing import BACKWARD_SHARE, BackwardPacer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import train_gpt  # the examples' models and data
import train_mlp

SPEEDS = (1.0, 0.5, 0.25)
GOAL_VS_IDEAL = 1.15
EXACT_STEPS = 5
EXACT_MICRO_BATCH = 8
EXACT_SAMPLE_TIME = 0.0005
# The transformer's goals: hetero's step against the ideal, with the memory-bounded fast rank,
# and the exposed communication as a fraction of one all-reduce of the gradients.
GPT_GOAL_VS_IDEAL = 1.05
GPT_MEMORY_GOAL_VS_IDEAL = 1.1
GPT_GOAL_EXPOSED = 0.3
GPT_EXACT_MICRO_BATCH = 3
GPT_EXACT_SHARES = (8, 4, 2)
# The fast rank's memory holds a micro-batch of this many sequences; the others' four times it.
GPT_MEMORY_SEQUENCES = 2


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


@dataclass(frozen=True)
class GPTSetup:
    layers: int = 8
    width: int = 512
    vocab: int = 2048
    seq_len: int = 64
    global_batch: int = 14
    sample_time: float = 0.3
    steps: int = 6
    warmup: int = 2
    repeats: int = 2
    bucket_cap_mb: float = 25.0
    samples: int = 256
    seed: int = 0

    def model(self) -> nn.Module:
        return train_gpt.gpt(self.layers, self.width, self.vocab, self.seq_len, self.seed)

    def data(self) -> TensorDataset:
        return train_gpt.tokens(self.samples, self.seq_len, self.vocab, self.seed)


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def gpt_sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.02, momentum=0.9)


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=5e-4, fused=True)


LOSS = nn.CrossEntropyLoss(reduction="sum")


# -------------------------------------------------------------------------------- on each rank


def timed(trainer: Trainer, warmup: int, steps: int) -> dict[str, Any]:
    """``steps`` steps after ``warmup`` untimed ones: wall seconds per step on this rank, the
    shares, and where each rank's time went (ms per step, means)."""
    profiled = list(trainer.shares)
    trainer.train(warmup, progress=False)
    comm.barrier()
    started = time.perf_counter()
    reports = trainer.train(steps, progress=False)
    seconds = (time.perf_counter() - started) / steps

    def ms(r: int, field: str) -> float:
        return round(statistics.mean(getattr(x.ranks[r], field) for x in reports) * 1e3, 2)

    ranks = [
        {
            "rank": r,
            "speed": SPEEDS[r],
            "micro_batches": reports[-1].ranks[r].micro_batches,
            "compute_ms": ms(r, "compute_seconds"),
            "comm_ms": ms(r, "comm_seconds"),
            "idle_ms": ms(r, "idle_seconds"),
            "data_ms": ms(r, "data_seconds"),
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


def equal_run(
    rank: int,
    model: nn.Module,
    data: TensorDataset,
    loss_fn: Callable[[Any, Any], torch.Tensor],
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    *,
    global_batch: int,
    sample_time: float,
    warmup: int,
    steps: int,
    seed: int,
    bucket_cap_mb: float = 25.0,
) -> dict[str, Any]:
    """Plain DDP: each rank a near-equal part of every global batch (its mean loss, as DDP
    users write it), each micro-batch paced as hetero's emulated ranks are."""
    pacer = BackwardPacer(model)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    optimizer = make_optimizer(ddp.parameters())
    sizes = equal_shares(global_batch)
    share, offset = sizes[rank], sum(sizes[:rank])
    order = HeteroSampler.global_order(len(data), seed, 0, True)

    def step(k: int) -> None:
        start = k * global_batch + offset  # global batch k of epoch 0, this rank's part
        x, y = data[order[start : start + share]]
        started = time.perf_counter()
        with pacer.watching():
            loss = loss_fn(ddp(x), y) / share
        due = started + share * sample_time / SPEEDS[rank]
        backward = due - (due - started) * BACKWARD_SHARE
        time.sleep(max(0.0, backward - time.perf_counter()))
        with pacer.spread(time.perf_counter(), due):
            loss.backward()  # DDP all-reduces here: the mean over ranks
        time.sleep(max(0.0, due - time.perf_counter()))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for k in range(warmup):
        step(k)
    comm.barrier()
    started = time.perf_counter()
    for k in range(steps):
        step(warmup + k)
    return {"step_seconds": (time.perf_counter() - started) / steps, "shares": sizes}


def equal_shares(batch: int) -> list[int]:
    world = len(SPEEDS)
    return [batch // world + (r < batch % world) for r in range(world)]


def hetero_run(rank: int, setup: Setup, data: Any) -> dict[str, Any]:
    options = TrainerOptions(
        global_batch=setup.global_batch,
        rebalance_every=setup.rebalance_every,
        seed=setup.seed,
        speed=SPEEDS[rank],
        emulate_sample_time=setup.sample_time,
    )
    trainer = Trainer(train_mlp.mlp(setup.seed), sgd, LOSS, data, options)
    return timed(trainer, setup.warmup, setup.steps)


def mlp_equal_run(rank: int, setup: Setup, data: Any) -> dict[str, Any]:
    return equal_run(
        rank,
        train_mlp.mlp(setup.seed),
        data,
        LOSS,
        sgd,
        global_batch=setup.global_batch,
        sample_time=setup.sample_time,
        warmup=setup.warmup,
        steps=setup.steps,
        seed=setup.seed,
    )


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
    model = reference(train_mlp.mlp(setup.seed), sgd, LOSS, data, setup.global_batch, setup.seed)
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


def reference(
    model: nn.Module,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    data: TensorDataset,
    global_batch: int,
    seed: int,
) -> nn.Module:
    """One process, no DDP, the same global batches: order[k*B:(k+1)*B] of epoch 0, each
    step the mean loss over the global batch."""
    optimizer = make_optimizer(model.parameters())
    order = HeteroSampler.global_order(len(data), seed, 0, True)
    for k in range(EXACT_STEPS):
        x, y = data[order[k * global_batch : (k + 1) * global_batch]]
        loss = loss_fn(model(x), y) / len(x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def worker(rank: int, port: int, setup: Setup, out: str) -> None:
    torch.set_num_threads(1)  # three ranks share this machine's cores (torchrun does the same)
    comm.init(rank, len(SPEEDS), backend="gloo", master_port=port, timeout=120)
    data = train_mlp.dataset(setup.samples, setup.seed)
    result: dict[str, Any] = {"exactness": exactness(rank, setup, data), "hetero": [], "equal": []}
    for _ in range(setup.repeats):  # in turns, so the machine's drift hits both alike
        for name, run in (("hetero", hetero_run), ("equal", mlp_equal_run)):
            result[name].append(run(rank, setup, data))
            gc.collect()  # DDP holds reference cycles: free them while the process group is up
    comm.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(result))


# ----------------------------------------------------------------- the transformer, on each rank


def gpt_options(rank: int, setup: GPTSetup, **kw: Any) -> TrainerOptions:
    return TrainerOptions(
        global_batch=setup.global_batch,
        seed=setup.seed,
        speed=SPEEDS[rank],
        emulate_sample_time=setup.sample_time,
        bucket_cap_mb=setup.bucket_cap_mb,
        profile_steps=2,
        **kw,
    )


def gpt_hetero(rank: int, setup: GPTSetup, **kw: Any) -> dict[str, Any]:
    options = gpt_options(rank, setup, **kw)
    trainer = Trainer(setup.model(), adamw, train_gpt.token_loss, setup.data(), options)
    result = timed(trainer, setup.warmup, setup.steps)
    if trainer.memory is not None:
        result["memory"] = {
            "limit": trainer.memory.limit,
            "cap": trainer.memory.cap,
            "resident_bytes": trainer.memory.resident_bytes,
            "need_of_cap": round(trainer.memory.need(trainer.memory.cap)),
            "probed": trainer.memory.probed,
        }
    return result


def gpt_equal(rank: int, setup: GPTSetup) -> dict[str, Any]:
    return equal_run(
        rank,
        setup.model(),
        setup.data(),
        train_gpt.token_loss,
        adamw,
        global_batch=setup.global_batch,
        sample_time=setup.sample_time,
        warmup=setup.warmup,
        steps=setup.steps,
        seed=setup.seed,
        bucket_cap_mb=setup.bucket_cap_mb,
    )


def gpt_memory_limits(rank: int, setup: GPTSetup) -> list[int]:
    """Each rank's memory limit: the fast rank 0's holds a micro-batch of
    ``GPT_MEMORY_SEQUENCES`` sequences but not one more (as the trainer measures it, under
    DDP with AdamW), the others' four times that."""
    fast = 0
    if rank == 0:
        probe = MemoryProbe(setup.model(), train_gpt.token_loss, setup.data(), optimizer=adamw)
        with probe.session():
            resident = probe.resident()
            need = [resident + (probe.transient(GPT_MEMORY_SEQUENCES + i) or 0) for i in (0, 1)]
        fast = sum(need) // 2
    fast = max(comm.all_gather_object(fast))
    return [fast if r == 0 else 4 * fast for r in range(len(SPEEDS))]


def gpt_exactness(rank: int, setup: GPTSetup) -> dict[str, Any]:
    data = setup.data()
    states, micro = {}, {}
    for sharding in ("ddp", "fsdp"):
        options = TrainerOptions(
            global_batch=setup.global_batch,
            shares=GPT_EXACT_SHARES,
            micro_batch=GPT_EXACT_MICRO_BATCH,
            seed=setup.seed,
            profile_steps=1,
            sharding=sharding,
            bucket_cap_mb=setup.bucket_cap_mb,
        )
        trainer = Trainer(setup.model(), gpt_sgd, train_gpt.token_loss, data, options)
        reports = trainer.train(EXACT_STEPS, progress=False)
        states[sharding] = trainer.model_state_dict()
        micro[sharding] = [r.micro_batches for r in reports[0].ranks]
        del trainer
        gc.collect()
    if rank != 0:
        return {}
    model = reference(
        setup.model(), gpt_sgd, train_gpt.token_loss, data, setup.global_batch, setup.seed
    )
    largest = max(p.abs().max().item() for p in model.parameters())
    result: dict[str, Any] = {
        "steps": EXACT_STEPS,
        "shares": list(GPT_EXACT_SHARES),
        "micro_batch": GPT_EXACT_MICRO_BATCH,
        "optimizer": "SGD, momentum 0.9",
    }
    for sharding, state in states.items():
        diff = max((state[n] - p).abs().max().item() for n, p in model.named_parameters())
        result[sharding] = {
            "micro_batches": micro[sharding],
            "max_abs_difference": diff,
            "relative_difference": diff / largest,
        }
    return result


def allreduce_seconds(setup: GPTSetup) -> list[float]:
    """One all-reduce of a flat fp32 tensor as large as all the model's parameters, the ranks
    started together, 5 times."""
    flat = torch.zeros(sum(p.numel() for p in setup.model().parameters()))
    seconds = []
    for _ in range(5):
        comm.barrier()
        started = time.perf_counter()
        comm.all_reduce(flat)
        seconds.append(time.perf_counter() - started)
    return seconds


def gpt_worker(rank: int, port: int, setup: GPTSetup, folder: str) -> None:
    torch.set_num_threads(1)
    comm.init(rank, len(SPEEDS), backend="gloo", master_port=port, timeout=300)
    limits = gpt_memory_limits(rank, setup)
    cache = str(Path(folder, "memory_probe.json"))  # the probe measures once, in repeat 1
    result: dict[str, Any] = {"exactness": gpt_exactness(rank, setup), "limits": limits}
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "hetero_ddp": lambda: gpt_hetero(rank, setup),
        "equal_split_ddp": lambda: gpt_equal(rank, setup),
        "hetero_fsdp": lambda: gpt_hetero(rank, setup, sharding="fsdp"),
        "memory_bounded": lambda: gpt_hetero(
            rank, setup, memory_limit=limits[rank], memory_cache=cache
        ),
    }
    for name in runs:
        result[name] = []
    for _ in range(setup.repeats):  # in turns, so the machine's drift hits all alike
        for name, run in runs.items():
            result[name].append(run())
            gc.collect()
    result["allreduce_seconds"] = allreduce_seconds(setup)
    model = setup.model()
    result["resident"] = {
        sharding: MemoryProbe(
            model,
            train_gpt.token_loss,
            setup.data(),
            optimizer=adamw,
            sharding=sharding,
            world_size=len(SPEEDS),
        ).resident_parts()
        for sharding in ("ddp", "fsdp")
    }
    comm.destroy()
    if rank == 0:
        Path(folder, "gpt.json").write_text(json.dumps(result))


# ------------------------------------------------------------------------------------ driver


def step_time_figure(setup: Setup, result: dict[str, Any]) -> dict[str, Any]:
    ideal = setup.global_batch * setup.sample_time / sum(SPEEDS)
    shares = equal_shares(setup.global_batch)
    expected_equal = slowest(shares, setup.sample_time) / ideal
    hetero_runs = result["hetero"]
    hetero_s = [r["step_seconds"] for r in hetero_runs]
    equal_s = [r["step_seconds"] for r in result["equal"]]
    median_run = median_of(hetero_runs)
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
            "shares": shares,
        },
        "hetero_speedup_vs_equal": round(equal_ms / hetero_ms, 3),
    }


def slowest(shares: list[int], sample_time: float) -> float:
    """The emulated compute of the slowest rank with these shares (seconds)."""
    return max(n * sample_time / s for n, s in zip(shares, SPEEDS, strict=True))


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["step_seconds"])[(len(runs) - 1) // 2]


def transformer_figure(setup: GPTSetup, result: dict[str, Any]) -> dict[str, Any]:
    ideal_ms = setup.global_batch * setup.sample_time / sum(SPEEDS) * 1e3
    allreduce_ms = statistics.median(result["allreduce_seconds"]) * 1e3
    goals = {
        "hetero_ddp": GPT_GOAL_VS_IDEAL,
        "hetero_fsdp": GPT_GOAL_VS_IDEAL,
        "memory_bounded": GPT_MEMORY_GOAL_VS_IDEAL,
    }
    configurations: dict[str, Any] = {}
    for name in ("hetero_ddp", "equal_split_ddp", "hetero_fsdp", "memory_bounded"):
        runs = result[name]
        step_ms = [r["step_seconds"] * 1e3 for r in runs]
        vs_ideal = statistics.median(step_ms) / ideal_ms
        figure: dict[str, Any] = {
            "step_ms": summary(step_ms),
            "vs_ideal": round(vs_ideal, 3),
            "shares": median_of(runs)["shares"],
        }
        if name in goals:
            median_run = median_of(runs)
            exposed = max(r["comm_ms"] for r in median_run["ranks"])
            figure.update(
                goal_vs_ideal=goals[name],
                meets_goal=vs_ideal <= goals[name],
                exposed_comm_ms=exposed,
                exposed_fraction_of_allreduce=round(exposed / allreduce_ms, 3),
                efficiency_reported=median_run["efficiency_reported"],
                ranks_of_median_run=median_run["ranks"],
            )
            if "memory" in median_run:
                figure["memory_of_median_run"] = median_run["memory"]
        else:
            worst = slowest(figure["shares"], setup.sample_time)
            figure["expected_vs_ideal"] = round(worst * 1e3 / ideal_ms, 3)
        configurations[name] = figure
    hetero = configurations["hetero_ddp"]
    hetero["exposed_goal"] = GPT_GOAL_EXPOSED
    hetero["meets_exposed_goal"] = hetero["exposed_fraction_of_allreduce"] <= GPT_GOAL_EXPOSED
    equal_ms = configurations["equal_split_ddp"]["step_ms"]["median"]
    parameters = sum(p.numel() for p in setup.model().parameters())
    return {
        "setup": {
            **dataclasses.asdict(setup),
            "model": f"GPT-2, {setup.layers} layers × {setup.width}, vocabulary {setup.vocab} "
            f"(examples/train_gpt.py)",
            "parameters": parameters,
            "optimizer": "AdamW (fused), lr 5e-4",
            "memory_limits": result["limits"],
        },
        "ideal_ms": round(ideal_ms, 2),
        "allreduce_ms": summary([s * 1e3 for s in result["allreduce_seconds"]]),
        "configurations": configurations,
        "hetero_speedup_vs_equal": round(equal_ms / hetero["step_ms"]["median"], 3),
        "resident_estimate": result["resident"],
        "exactness": result["exactness"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat")
    parser.add_argument("--steps", type=int, help="timed MLP steps per run (default 30)")
    parser.add_argument("--repeats", type=int, help="runs of each MLP configuration (default 3)")
    parser.add_argument("--gpt-steps", type=int, help="timed transformer steps per run (6)")
    parser.add_argument("--gpt-repeats", type=int, help="runs of each transformer one (2)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup(steps=8, repeats=1) if args.quick else Setup()
    setup = dataclasses.replace(
        setup, steps=args.steps or setup.steps, repeats=args.repeats or setup.repeats
    )
    gpt = GPTSetup(steps=3, warmup=1, repeats=1) if args.quick else GPTSetup()
    gpt = dataclasses.replace(
        gpt, steps=args.gpt_steps or gpt.steps, repeats=args.gpt_repeats or gpt.repeats
    )
    if (setup.warmup + setup.steps) * setup.global_batch > setup.samples:
        parser.error(f"--steps {setup.steps}: the baseline runs out of its epoch of samples")
    if (gpt.warmup + gpt.steps) * gpt.global_batch > gpt.samples:
        parser.error(f"--gpt-steps {gpt.steps}: the baseline runs out of its epoch of samples")
    record = _common.Run("bench/bench_train.py", argv)
    result = _common.spawned_ranks(worker, len(SPEEDS), setup)
    mlp_seconds = time.perf_counter() - record.started
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(gpt_worker, args=(free_port(), gpt, tmp), nprocs=len(SPEEDS), join=True)
        transformer = json.loads(Path(tmp, "gpt.json").read_text())
    doc: dict[str, Any] = {
        **record.header(
            "heterogeneous training",
            quick=args.quick,
            hetero=hetero.__version__,
            torch=torch.__version__,
        ),
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
        **record.footer(),
        "step_time": step_time_figure(setup, result),
        "exactness": result["exactness"],
        "mlp_wall_seconds": round(mlp_seconds, 1),
        "transformer": transformer_figure(gpt, transformer),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
