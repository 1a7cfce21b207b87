"""Pipeline parallelism: hetero's stages sized by speed and memory (``plan_stages``) against an
even split of the layers, on 4 gloo ranks of emulated relative speeds 1 : 1 : 0.5 : 0.25, in
turns in one run, under 1F1B and GPipe.

The model: a small causal transformer built with ``torch.nn`` alone (a token and position
embedding, 12 pre-norm blocks of width 64 with 4 heads, a final norm and the vocabulary
projection: 14 layers), AdamW, on random sequences of 32 tokens; each step a batch of 8
sequences in 8 micro-batches of 1.

- *Costs*: a short profile (``profile_layers``: each layer's forward and backward on a
  micro-batch, the least of 9 rounds, in this process on one thread) gives each layer's
  seconds a sample. Scaled so the whole model takes ``--sample-time`` seconds a sample at
  speed 1, they are the costs the planner splits and each rank paces its stage to
  (``emulate=True``: a rank of speed s sleeps after its real compute until its layers' cost / s
  has passed), so the emulated devices' time, not this shared machine's noise, sets the step.
- *Memory*: rank r's limit is ``MEMORY_SHARES[r]`` of what the whole model needs under GPipe
  (parameters, gradients and AdamW's state, and the activations of every micro-batch): no rank
  holds the model, and the smallest limit is below its parameters and optimizer state alone.
  Both layouts must fit them (``plan_stages`` plans within them; ``split_layers`` checks).
- *Ideal*: a perfectly balanced pipeline of the same 4 stages and 8 micro-batches. Each stage
  takes ``t* = m × W / Σ speeds`` per micro-batch (W: the whole model's seconds a sample at
  speed 1, m: the micro-batch), and a step ``(M + S − 1) × t*``: the total work over the sum of
  the speeds (``M × t*``) plus the schedule's fill-and-drain bubble (``(S − 1) × t*``), with no
  communication.
- *Step time*: rank 0's wall time per step (every rank ends a step together, at the loss's
  broadcast), the median over ``--steps`` steps after ``--warmup``, for each layout in turns for
  ``--repeats`` repeats; the figure is the median over repeats.
- *Exactness*: 5 steps of hetero's plan under each schedule, unpaced, against one process
  training the whole model on the same batches: the largest difference of any parameter,
  relative to that parameter's largest magnitude. With SGD (momentum 0.9), not AdamW: the key
  part of attention's input bias has a gradient of exactly zero in exact arithmetic (softmax
  does not change when every key moves alike), so its float gradient is rounding noise, which
  Adam scales up to whole steps of the learning rate; one process summing 8 micro-batches
  against one running the batch at once differs by 8.5e-3 under AdamW after 5 steps, by 9e-7
  under SGD. (``tests/train/test_pipeline_parallel.py`` checks Adam on an MLP.)

Prints JSON; ``--out`` saves it.

    python bench/bench_pipeline.py --out bench/results/pipeline.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common
import torch
from _common import emit
from _engine_util import summary
from torch import nn

import hetero
from hetero import comm
from hetero.train import (
    LayerCost,
    PipelineRank,
    PipelineRunner,
    StagePlan,
    plan_stages,
    profile_layers,
    split_layers,
)
from hetero.train.stages import SCHEDULES, even_counts, pipeline_seconds

SPEEDS = (1.0, 1.0, 0.5, 0.25)
# Each rank's memory limit, as a share of what the whole model needs under GPipe.
MEMORY_SHARES = (0.6, 0.6, 0.45, 0.3)
GOAL_VS_IDEAL = 1.15
GOAL_VS_EVEN = 1.5
EXACT_STEPS = 5
EXACT_TOLERANCE = 1e-5
PROFILE_REPEATS = 9


@dataclass(frozen=True)
class Setup:
    blocks: int = 12
    width: int = 64
    heads: int = 4
    vocab: int = 512
    seq_len: int = 32
    micro_batches: int = 8
    micro_batch_size: int = 1
    sample_time: float = 0.5
    steps: int = 6
    warmup: int = 2
    repeats: int = 2
    seed: int = 0

    @property
    def batch(self) -> int:
        return self.micro_batches * self.micro_batch_size


class Embed(nn.Module):
    """Token and position embeddings."""

    def __init__(self, vocab: int, width: int, seq_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(seq_len, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))


class Block(nn.Module):
    """A pre-norm transformer block, causal."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            width, heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.layer(x, src_mask=mask, is_causal=True)


def layers(setup: Setup) -> list[nn.Module]:
    """The model as its pipeline's layers, the same start on every rank."""
    torch.manual_seed(setup.seed)
    return [
        Embed(setup.vocab, setup.width, setup.seq_len),
        *(Block(setup.width, setup.heads) for _ in range(setup.blocks)),
        nn.Sequential(nn.LayerNorm(setup.width), nn.Linear(setup.width, setup.vocab)),
    ]


def token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The sum over the batch's sequences of each one's mean next-token cross-entropy."""
    flat = nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum")
    return flat / target.shape[1]


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-3)


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.02, momentum=0.9)


def batches(setup: Setup, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of random token sequences, inputs and next-token targets."""
    generator = torch.Generator().manual_seed(setup.seed + 1)
    tokens = torch.randint(
        0, setup.vocab, (count, setup.batch, setup.seq_len + 1), generator=generator
    )
    return [(t[:, :-1], t[:, 1:]) for t in tokens]


# ------------------------------------------------------------------------------ in this process


def emulated_costs(setup: Setup) -> tuple[list[LayerCost], list[float]]:
    """The layers' profiled costs scaled to ``sample_time`` a sample for the whole model, and
    the measured seconds a sample they were scaled from."""
    torch.set_num_threads(1)
    x, _ = batches(setup, 1)[0]
    measured = profile_layers(
        layers(setup), x[: setup.micro_batch_size], optimizer=adamw, repeats=PROFILE_REPEATS
    )
    scale = setup.sample_time / sum(c.seconds for c in measured)
    costs = [dataclasses.replace(c, seconds=c.seconds * scale) for c in measured]
    return costs, [c.seconds for c in measured]


def memory_limits(costs: list[LayerCost], setup: Setup) -> list[int]:
    whole = sum(c.state_bytes for c in costs) + setup.batch * sum(c.activation_bytes for c in costs)
    return [int(share * whole) for share in MEMORY_SHARES]


def layouts(
    costs: list[LayerCost], limits: list[int], setup: Setup
) -> dict[str, dict[str, StagePlan]]:
    """For each schedule, hetero's plan and the even split of the layers over ranks 0..3."""
    ranks = [PipelineRank(r, s, m) for r, (s, m) in enumerate(zip(SPEEDS, limits, strict=True))]
    kw: dict[str, Any] = {
        "micro_batches": setup.micro_batches,
        "micro_batch_size": setup.micro_batch_size,
    }
    return {
        schedule: {
            "hetero": plan_stages(costs, ranks, schedule=schedule, **kw),
            "even": split_layers(
                costs, ranks, even_counts(len(costs), len(ranks)), schedule=schedule, **kw
            ),
        }
        for schedule in SCHEDULES
    }


def reference_state(setup: Setup) -> dict[str, torch.Tensor]:
    """One process, the whole model, the same batches: each step the batch's mean loss."""
    model = nn.Sequential(*layers(setup))
    optimizer = sgd(model.parameters())
    for x, y in batches(setup, EXACT_STEPS):
        loss = token_loss(model(x), y) / len(x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------------------- on each rank


def exactness(setup: Setup, plan: StagePlan, reference: dict[str, torch.Tensor]) -> float:
    """The largest relative parameter difference on this rank's stage after 5 steps."""
    runner = PipelineRunner(layers(setup), plan, sgd, token_loss)
    for x, y in batches(setup, EXACT_STEPS):
        runner.step(x, y)
    worst = 0.0
    for offset, layer in zip(runner.stage.layers, runner.module, strict=True):
        for name, p in layer.named_parameters():
            expected = reference[f"{offset}.{name}"]
            worst = max(worst, ((p - expected).abs().max() / expected.abs().max()).item())
    return worst


def timed(setup: Setup, plan: StagePlan) -> dict[str, Any]:
    """``steps`` paced steps after ``warmup``: this rank's seconds a step and its split."""
    runner = PipelineRunner(layers(setup), plan, adamw, token_loss, emulate=True)
    data = batches(setup, setup.warmup + setup.steps)
    for x, y in data[: setup.warmup]:
        runner.step(x, y)
    reports = [runner.step(x, y) for x, y in data[setup.warmup :]]
    return {
        "step_seconds": statistics.median(r.seconds for r in reports),
        "compute_seconds": statistics.mean(r.compute_seconds for r in reports),
        "idle_seconds": statistics.mean(r.idle_seconds for r in reports),
        "loss": reports[-1].loss,
    }


def worker(
    rank: int,
    port: int,
    setup: Setup,
    plans: dict[str, dict[str, StagePlan]],
    reference: dict[str, torch.Tensor],
    out: str,
) -> None:
    torch.set_num_threads(1)  # four ranks share this machine's cores (torchrun does the same)
    comm.init(rank, len(SPEEDS), backend="gloo", master_port=port, timeout=300)
    result: dict[str, Any] = {"exactness": {}, "runs": {}}
    for schedule, pair in plans.items():
        diff = exactness(setup, pair["hetero"], reference)
        result["exactness"][schedule] = comm.all_gather_object(diff)
    for _ in range(setup.repeats):  # in turns, so the machine's drift hits both alike
        for schedule, pair in plans.items():
            for name, plan in pair.items():
                ranks = comm.all_gather_object(timed(setup, plan))
                result["runs"].setdefault(f"{schedule}/{name}", []).append(ranks)
                gc.collect()
    comm.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(result))


# ------------------------------------------------------------------------------------ driver


def ideal_seconds(costs: list[LayerCost], setup: Setup) -> float:
    """A perfectly balanced pipeline's step: ``(M + S − 1) × m × W / Σ speeds``."""
    per_stage = setup.micro_batch_size * sum(c.seconds for c in costs) / sum(SPEEDS)
    return pipeline_seconds([per_stage] * len(SPEEDS), setup.micro_batches)


def layout_figure(
    plan: StagePlan, runs: list[list[dict[str, Any]]], ideal: float
) -> dict[str, Any]:
    """A layout's step time over the repeats, against the ideal and its plan's prediction, and
    each stage's plan and measured split (the median repeat's)."""
    steps = [run[0]["step_seconds"] for run in runs]
    median = statistics.median(steps)
    middle = sorted(runs, key=lambda run: run[0]["step_seconds"])[(len(runs) - 1) // 2]
    stages = [
        {
            "stage": s.index,
            "rank": s.rank,
            "speed": s.speed,
            "layers": f"{s.first}-{s.end - 1}",
            "planned_ms_per_micro_batch": round(s.seconds * 1e3, 1),
            "memory_bytes": s.memory,
            "limit_bytes": s.limit,
            "compute_ms_per_step": round(middle[s.rank]["compute_seconds"] * 1e3, 1),
            "idle_ms_per_step": round(middle[s.rank]["idle_seconds"] * 1e3, 1),
        }
        for s in plan.stages
    ]
    return {
        "step_ms": summary([s * 1e3 for s in steps]),
        "vs_ideal": round(median / ideal, 3),
        "predicted_ms": round(plan.step_seconds * 1e3, 1),
        "vs_predicted": round(median / plan.step_seconds, 3),
        "table": plan.table(),
        "stages": stages,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 6)")
    parser.add_argument("--repeats", type=int, help="runs of each layout (default 2)")
    parser.add_argument(
        "--sample-time", type=float, help="emulated seconds a sample at speed 1 (default 0.5)"
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup(steps=3, warmup=1, repeats=1) if args.quick else Setup()
    setup = dataclasses.replace(
        setup,
        steps=args.steps or setup.steps,
        repeats=args.repeats or setup.repeats,
        sample_time=args.sample_time or setup.sample_time,
    )
    record = _common.Run("bench/bench_pipeline.py", argv)
    costs, measured = emulated_costs(setup)
    limits = memory_limits(costs, setup)
    state = sum(c.state_bytes for c in costs)
    if state <= min(limits):
        raise SystemExit(f"the smallest limit {min(limits)} holds the model's state {state}")
    plans = layouts(costs, limits, setup)
    for schedule, pair in plans.items():
        for name, plan in pair.items():
            print(f"{schedule}, {name}:\n{plan.table()}\n", file=sys.stderr)
    reference = reference_state(setup)
    result = _common.spawned_ranks(worker, len(SPEEDS), setup, plans, reference)
    ideal = ideal_seconds(costs, setup)
    schedules: dict[str, Any] = {}
    for schedule, pair in plans.items():
        figures = {
            name: layout_figure(plan, result["runs"][f"{schedule}/{name}"], ideal)
            for name, plan in pair.items()
        }
        hetero_ms = figures["hetero"]["step_ms"]["median"]
        speedup = figures["even"]["step_ms"]["median"] / hetero_ms
        diff = max(result["exactness"][schedule])
        schedules[schedule] = {
            **figures,
            "hetero_vs_ideal": figures["hetero"]["vs_ideal"],
            "meets_goal_vs_ideal": figures["hetero"]["vs_ideal"] <= GOAL_VS_IDEAL,
            "hetero_speedup_vs_even": round(speedup, 3),
            "meets_goal_vs_even": speedup >= GOAL_VS_EVEN,
            "exactness": {
                "steps": EXACT_STEPS,
                "relative_difference_per_rank": result["exactness"][schedule],
                "relative_difference": diff,
                "within_tolerance": diff <= EXACT_TOLERANCE,
            },
        }
    doc: dict[str, Any] = {
        **record.header(
            "pipeline parallelism",
            quick=args.quick,
            hetero=hetero.__version__,
            torch=torch.__version__,
        ),
        "setup": {
            **dataclasses.asdict(setup),
            "ranks": len(SPEEDS),
            "backend": "gloo",
            "speeds": list(SPEEDS),
            "model": f"causal transformer, {setup.blocks} blocks × {setup.width}, "
            f"{setup.heads} heads, vocabulary {setup.vocab}: {len(costs)} layers "
            "(torch.nn only)",
            "parameters": sum(p.numel() for layer in layers(setup) for p in layer.parameters()),
            "optimizer": "AdamW, lr 1e-3 (exactness: SGD, lr 0.02, momentum 0.9)",
            "model_state_bytes": state,
            "memory_limits": limits,
            "memory_shares": list(MEMORY_SHARES),
            "layer_costs": [
                {
                    "name": c.name,
                    "measured_ms_per_sample": round(m * 1e3, 3),
                    "emulated_ms_per_sample": round(c.seconds * 1e3, 2),
                    "state_bytes": c.state_bytes,
                    "activation_bytes_per_sample": c.activation_bytes,
                }
                for c, m in zip(costs, measured, strict=True)
            ],
        },
        "ideal": {
            "ms": round(ideal * 1e3, 1),
            "formula": "(M + S - 1) * m * W / sum(speeds): the total work over the sum of "
            "speeds plus the fill-and-drain bubble of S - 1 balanced stages, no communication",
            "work_ms_per_sample": round(sum(c.seconds for c in costs) * 1e3, 1),
        },
        "goals": {"vs_ideal": GOAL_VS_IDEAL, "speedup_vs_even": GOAL_VS_EVEN},
        **record.footer(),
        "schedules": schedules,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
