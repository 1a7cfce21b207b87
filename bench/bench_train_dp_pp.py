"""Data × pipeline parallelism: the layout ``choose_layout`` picks for 4 gloo ranks of emulated
relative speeds 1 : 1 : 0.5 : 0.25, run with ``DataPipelineRunner``, against the same replicas
with the global batch split evenly between them, and against one pipeline over all four ranks
(``plan_stages``' plan alone), in turns in one run, under 1F1B.

The model, its profile and the pacing are ``bench_pipeline.py``'s: a small causal transformer
(a token and position embedding, 12 pre-norm blocks of width 64 with 4 heads, a final norm and
the vocabulary projection: 14 layers), AdamW, random sequences of 32 tokens; the profiled
costs scaled so the whole model takes ``--sample-time`` seconds a sample at speed 1, which each
rank paces its stage to. Each step a global batch of 16 sequences in micro-batches of 1.

- *Memory*: rank r's limit is ``MEMORY_SHARES[r]`` of what the whole model needs under GPipe
  with the whole batch in flight (parameters, gradients, AdamW's state and 16 micro-batches'
  activations): the quarter-speed rank does not hold the model's state, so plain data
  parallelism (4 × 1) does not fit.
- *Bandwidth*: the planner predicts the gradient all-reduce at ``--bandwidth`` bytes a second
  a rank; the all-reduce itself is gloo's over 127.0.0.1, not paced, and its measured time is
  reported beside the prediction.
- *Ideal*: the total work over the sum of the speeds, ``B × W / Σ speeds`` (B: the global
  batch, W: the whole model's seconds a sample at speed 1): no pipeline bubble, no
  communication; a bound no layout reaches.
- *Step time*: rank 0's wall time per step (every rank ends a step together, at the loss's
  all-reduce), the median over ``--steps`` steps after ``--warmup``, for each layout in turns
  for ``--repeats`` repeats; the figure is the median over repeats.
- *Exactness*: 5 steps of the chosen layout, unpaced, in float64, SGD (momentum 0.9; see
  ``bench_pipeline.py`` for why not AdamW), against one process training the whole model on
  the same global batches: the largest difference of any parameter, relative to that
  parameter's largest magnitude. In float64 because in float32 this model's rounding noise
  grows over 5 steps to ~3e-4 of its small biases' magnitude with one pipeline alone (16
  micro-batches against the batch at once), which would hide a wrong weight as large.

Prints JSON; ``--out`` saves it.

    python bench/bench_train_dp_pp.py --out bench/results/train_dp_pp.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import _common
import torch
from _common import emit
from _engine_util import summary
from bench_pipeline import (
    EXACT_STEPS,
    EXACT_TOLERANCE,
    Setup,
    adamw,
    batches,
    emulated_costs,
    layers,
    sgd,
    token_loss,
)
from torch import nn

import hetero
from hetero import comm
from hetero.train.fleet_layout import FleetLayout, PipelineReplica, choose_layout, given_layout
from hetero.train.pipeline_parallel import DataPipelineRunner
from hetero.train.stages import LayerCost, PipelineRank, split_layers

SPEEDS = (1.0, 1.0, 0.5, 0.25)
MEMORY_SHARES = (0.6, 0.6, 0.45, 0.3)
SCHEDULE = "1f1b"
BANDWIDTH = 1e9


def default_setup() -> Setup:
    return Setup(micro_batches=16, micro_batch_size=1, sample_time=0.25, steps=5, warmup=1)


# ------------------------------------------------------------------------------ in this process


def fleet(costs: list[LayerCost], setup: Setup) -> list[PipelineRank]:
    whole = sum(c.state_bytes for c in costs) + setup.batch * sum(c.activation_bytes for c in costs)
    return [
        PipelineRank(r, speed, int(share * whole))
        for r, (speed, share) in enumerate(zip(SPEEDS, MEMORY_SHARES, strict=True))
    ]


def even_shares(layout: FleetLayout, bandwidth: float) -> FleetLayout:
    """The chosen replicas and stages, the global batch split evenly between the replicas."""
    count = len(layout.replicas)
    micro_batches = layout.global_batch // count  # of 1 sample each
    replicas = []
    for r in layout.replicas:
        plan = split_layers(
            r.plan.layers,
            [PipelineRank(s.rank, s.speed, s.limit) for s in r.plan.stages],
            [s.end - s.first for s in r.plan.stages],
            micro_batches=micro_batches,
            micro_batch_size=1,
            schedule=SCHEDULE,
        )
        replicas.append(PipelineReplica(plan, micro_batches))
    return given_layout(replicas, bandwidth=bandwidth)


def one_pipeline(layout: FleetLayout) -> FleetLayout:
    """The planner's layout of one pipeline over every rank (``plan_stages``' plan)."""
    (option,) = [o for o in layout.considered if o.count == 1]
    return given_layout(option.replicas, bandwidth=layout.bandwidth)


def reference_state(setup: Setup) -> dict[str, torch.Tensor]:
    """One process, the whole model in float64, the same global batches: each step the batch's
    mean loss."""
    model = nn.Sequential(*layers(setup)).double()
    optimizer = sgd(model.parameters())
    for x, y in batches(setup, EXACT_STEPS):
        loss = token_loss(model(x), y) / len(x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------- on each rank


def exactness(setup: Setup, layout: FleetLayout, reference: dict[str, torch.Tensor]) -> float:
    """The largest relative parameter difference on this rank's stage after 5 steps."""
    runner = DataPipelineRunner([x.double() for x in layers(setup)], layout, sgd, token_loss)
    for x, y in batches(setup, EXACT_STEPS):
        runner.step(x, y)
    worst = 0.0
    stage = runner.pipeline.stage
    for offset, layer in zip(stage.layers, runner.pipeline.module, strict=True):
        for name, p in layer.named_parameters():
            expected = reference[f"{offset}.{name}"]
            worst = max(worst, ((p - expected).abs().max() / expected.abs().max()).item())
    return worst


def timed(setup: Setup, layout: FleetLayout) -> dict[str, Any]:
    """``steps`` paced steps after ``warmup``: this rank's seconds a step and its split."""
    runner = DataPipelineRunner(layers(setup), layout, adamw, token_loss, emulate=True)
    data = batches(setup, setup.warmup + setup.steps)
    for x, y in data[: setup.warmup]:
        runner.step(x, y)
    reports = [runner.step(x, y) for x, y in data[setup.warmup :]]
    return {
        "step_seconds": statistics.median(r.seconds for r in reports),
        "compute_seconds": statistics.mean(r.compute_seconds for r in reports),
        "reduce_seconds": statistics.mean(r.reduce_seconds for r in reports),
        "loss": reports[-1].loss,
    }


def worker(
    rank: int,
    port: int,
    setup: Setup,
    layouts: dict[str, FleetLayout],
    reference: dict[str, torch.Tensor],
    out: str,
) -> None:
    torch.set_num_threads(1)  # four ranks share this machine's cores (torchrun does the same)
    comm.init(rank, len(SPEEDS), backend="gloo", master_port=port, timeout=300)
    result: dict[str, Any] = {"runs": {}}
    result["exactness"] = comm.all_gather_object(exactness(setup, layouts["hetero"], reference))
    for _ in range(setup.repeats):  # in turns, so the machine's drift hits all alike
        for name, layout in layouts.items():
            ranks = comm.all_gather_object(timed(setup, layout))
            result["runs"].setdefault(name, []).append(ranks)
            gc.collect()
    comm.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------ driver


def ideal_seconds(costs: list[LayerCost], setup: Setup) -> float:
    """The total work over the sum of the speeds: ``B × W / Σ speeds``."""
    return setup.batch * sum(c.seconds for c in costs) / sum(SPEEDS)


def layout_figure(layout: FleetLayout, runs: list[list[dict[str, Any]]], ideal: float) -> Any:
    """A layout's step time over the repeats, against the ideal and its prediction, and each
    rank's measured split (the median repeat's)."""
    steps = [run[0]["step_seconds"] for run in runs]
    median = statistics.median(steps)
    middle = sorted(runs, key=lambda run: run[0]["step_seconds"])[(len(runs) - 1) // 2]
    return {
        "layout": [
            {"ranks": list(r.ranks), "samples": r.samples, "layers": _layers(r)}
            for r in layout.replicas
        ],
        "step_ms": summary([s * 1e3 for s in steps]),
        "vs_ideal": round(median / ideal, 3),
        "predicted_ms": round(layout.step_seconds * 1e3, 1),
        "predicted_allreduce_ms": round(layout.chosen.allreduce_seconds * 1e3, 2),
        "vs_predicted": round(median / layout.step_seconds, 3),
        "per_rank": [
            {
                "rank": rank,
                "compute_ms_per_step": round(m["compute_seconds"] * 1e3, 1),
                "allreduce_ms_per_step": round(m["reduce_seconds"] * 1e3, 2),
            }
            for rank, m in enumerate(middle)
        ],
        "table": layout.table(),
    }


def _layers(replica: PipelineReplica) -> list[str]:
    return [f"rank {s.rank}: {s.first}-{s.end - 1}" for s in replica.plan.stages]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 5)")
    parser.add_argument("--repeats", type=int, help="runs of each layout (default 2)")
    parser.add_argument(
        "--sample-time", type=float, help="emulated seconds a sample at speed 1 (default 0.25)"
    )
    parser.add_argument(
        "--bandwidth", type=float, default=BANDWIDTH, help="the planner's bytes a second a rank"
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = default_setup()
    if args.quick:
        setup = dataclasses.replace(setup, steps=2, warmup=1, repeats=1)
    setup = dataclasses.replace(
        setup,
        steps=args.steps or setup.steps,
        repeats=args.repeats or setup.repeats,
        sample_time=args.sample_time or setup.sample_time,
    )
    record = _common.Run("bench/bench_train_dp_pp.py", argv)
    costs, _ = emulated_costs(setup)
    ranks = fleet(costs, setup)
    chosen = choose_layout(
        costs,
        ranks,
        global_batch=setup.batch,
        micro_batch_size=setup.micro_batch_size,
        schedule=SCHEDULE,
        bandwidth=args.bandwidth,
    )
    print(chosen.explain(), file=sys.stderr)
    layouts = {
        "hetero": chosen,
        "even_shares": even_shares(chosen, args.bandwidth),
        "one_pipeline": one_pipeline(chosen),
    }
    reference = reference_state(setup)
    result = _common.spawned_ranks(worker, len(SPEEDS), setup, layouts, reference)
    ideal = ideal_seconds(costs, setup)
    figures = {
        name: layout_figure(lay, result["runs"][name], ideal) for name, lay in layouts.items()
    }
    hetero_ms = figures["hetero"]["step_ms"]["median"]
    speedup_even = figures["even_shares"]["step_ms"]["median"] / hetero_ms
    speedup_pipeline = figures["one_pipeline"]["step_ms"]["median"] / hetero_ms
    diff = max(result["exactness"])
    doc: dict[str, Any] = {
        **record.header(
            "data × pipeline parallelism",
            quick=args.quick,
            hetero=hetero.__version__,
            torch=torch.__version__,
        ),
        "setup": {
            **dataclasses.asdict(setup),
            "global_batch": setup.batch,
            "schedule": SCHEDULE,
            "ranks": len(SPEEDS),
            "backend": "gloo",
            "speeds": list(SPEEDS),
            "memory_shares": list(MEMORY_SHARES),
            "memory_limits": [r.memory for r in ranks],
            "model_state_bytes": sum(c.state_bytes for c in costs),
            "gradient_bytes": sum(c.gradient_bytes for c in costs),
            "bandwidth": args.bandwidth,
            "model": f"causal transformer, {setup.blocks} blocks × {setup.width}, "
            f"{setup.heads} heads, vocabulary {setup.vocab}: {len(costs)} layers (torch.nn only)",
            "optimizer": "AdamW, lr 1e-3 (exactness: SGD, lr 0.02, momentum 0.9, float64)",
        },
        "plan": chosen.to_dict(),
        "explain": chosen.explain(),
        "ideal": {
            "ms": round(ideal * 1e3, 1),
            "formula": "B * W / sum(speeds): the total work over the sum of the speeds, no "
            "pipeline bubble, no communication",
        },
        "layouts": figures,
        "hetero_vs_ideal": figures["hetero"]["vs_ideal"],
        "hetero_speedup_vs_even_shares": round(speedup_even, 3),
        "hetero_speedup_vs_one_pipeline": round(speedup_pipeline, 3),
        "exactness": {
            "steps": EXACT_STEPS,
            "relative_difference_per_rank": result["exactness"],
            "relative_difference": diff,
            "within_tolerance": diff <= EXACT_TOLERANCE,
        },
        **record.footer(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
