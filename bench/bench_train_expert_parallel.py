"""Expert parallelism: experts placed by speed (``place_experts``) against an even placement
(``place_experts_evenly``), on 3 gloo ranks of emulated relative speeds 4 : 2 : 1, in turns in
one run.

The model: a one-layer mixture-of-experts language model built with ``torch.nn`` alone (a
token embedding of width 64, the MoE layer as a residual feed-forward of 8 experts of 256
hidden units under top-2 gating, a layer norm and the vocabulary projection), SGD, on random
sequences of 32 tokens; each step every rank takes 2 sequences (64 tokens, 128 rows to
experts), so the ranks send each other the same tokens under both placements and only where
the experts are differs.

- *Emulation*: each rank paces its experts as a device of its speed
  (``emulate_token_seconds``: one expert's forward and backward of one token row takes
  ``--token-time`` seconds at speed 1; a rank of speed s holds its experts' forward and backward
  of n rows to ``n × token-time / s``, its real compute counted toward it). The embedding, the
  gate and the projection run unpaced on every rank alike: they are the same under both
  placements.
- *Placements*: speed-proportional gives the ranks 5, 2 and 1 experts (each ``experts / speed``
  at most 1.25); even gives 3, 3 and 2 (rank 2, speed 1, at 2). With rows spread evenly over the
  experts, the slowest rank's expert time predicts the step's expert part:
  ``rows × top_k × load / E × token-time`` (``load``: the slowest rank's experts over its speed).
- *Ideal*: every rank's expert work done at the sum of the speeds, ``R × rows × token-time / Σ
  speeds`` (R ranks' rows over the fleet's speed): no placement of whole experts beats it.
- *Step time*: rank 0's wall time per step (every step ends with the all-reduce of the gate's
  and the dense layers' gradients, which waits for the slowest rank), the median over
  ``--steps`` steps after ``--warmup``, for each placement in turns for ``--repeats`` repeats; the
  figure is the median over repeats.
- *Bytes*: what ``hetero.comm.all_to_all`` passed per step on each rank (``comm.stats()``: the
  expert ids and the token rows out and back, forward and backward, rows a rank keeps for its
  own experts included), and of that the token rows that crossed to another rank.

Prints JSON; ``--out`` saves it.

    python bench/bench_train_expert_parallel.py --out bench/results/train_expert_parallel.json
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
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
from hetero.train.expert_parallel import ExpertParallelMoE, MixtureOfExperts, reduce_dense_gradients
from hetero.train.expert_placement import (
    ExpertPlacement,
    ExpertRank,
    place_experts,
    place_experts_evenly,
)

SPEEDS = (4.0, 2.0, 1.0)
MEMORY = 1 << 30  # ample: this benchmark is about speed


@dataclass(frozen=True)
class Setup:
    width: int = 64
    hidden: int = 256
    experts: int = 8
    top_k: int = 2
    vocab: int = 256
    seq_len: int = 32
    sequences: int = 2  # per rank and step
    token_time: float = 5e-3
    steps: int = 8
    warmup: int = 2
    repeats: int = 3
    seed: int = 0

    @property
    def rows(self) -> int:
        """Token rows each rank sends to experts a step."""
        return self.sequences * self.seq_len * self.top_k


class Model(nn.Module):
    """Embedding, the MoE layer as a residual feed-forward, layer norm, projection."""

    def __init__(self, setup: Setup) -> None:
        super().__init__()
        torch.manual_seed(setup.seed)  # the same start on every rank
        self.embed = nn.Embedding(setup.vocab, setup.width)
        self.moe: nn.Module = MixtureOfExperts(
            setup.width, setup.hidden, setup.experts, top_k=setup.top_k
        )
        self.norm = nn.LayerNorm(setup.width)
        self.head = nn.Linear(setup.width, setup.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        return self.head(self.norm(h + self.moe(h)))


def placements(setup: Setup) -> dict[str, ExpertPlacement]:
    moe = MixtureOfExperts(setup.width, setup.hidden, setup.experts, top_k=setup.top_k)
    sizes = moe.expert_state_bytes()
    ranks = [ExpertRank(r, s, MEMORY) for r, s in enumerate(SPEEDS)]
    return {"hetero": place_experts(sizes, ranks), "even": place_experts_evenly(sizes, ranks)}


def batches(setup: Setup, rank: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``rank``'s sequences of each step: random tokens, and the same shifted by one."""
    generator = torch.Generator().manual_seed(setup.seed + 1 + rank)
    out = []
    for _ in range(count):
        seq = torch.randint(
            0, setup.vocab, (setup.sequences, setup.seq_len + 1), generator=generator
        )
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


# ---------------------------------------------------------------------------------- on each rank


def timed(setup: Setup, placement: ExpertPlacement, rank: int) -> dict[str, Any]:
    """``steps`` paced steps after ``warmup``: this rank's seconds a step, its experts' time
    and what its all-to-alls passed."""
    model = Model(setup)
    assert isinstance(model.moe, MixtureOfExperts)
    layer = ExpertParallelMoE(model.moe, placement, emulate_token_seconds=setup.token_time)
    model.moe = layer
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    total = setup.sequences * setup.seq_len * len(SPEEDS)
    steps, expert, crossed = [], [], []
    for i, (x, y) in enumerate(batches(setup, rank, setup.warmup + setup.steps)):
        if i == setup.warmup:
            comm.barrier()
            comm.reset_stats()
        started, before = time.perf_counter(), layer.compute_seconds
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
        optimizer.zero_grad()
        (loss / total).backward()
        reduce_dense_gradients(model)
        optimizer.step()
        if i >= setup.warmup:
            steps.append(time.perf_counter() - started)
            expert.append(layer.compute_seconds - before)
            rows = sum(n for r, n in enumerate(layer.sent) if r != rank)
            # Out and back, forward and backward: four crossings of each row.
            crossed.append(4 * rows * setup.width * 4)
    a2a = comm.stats().ops["all_to_all"]
    return {
        "step_seconds": statistics.median(steps),
        "expert_seconds": statistics.mean(expert),
        "received_rows": sum(layer.received),
        "all_to_all_bytes_per_step": a2a.bytes / setup.steps,
        "all_to_all_calls_per_step": a2a.count / setup.steps,
        "all_to_all_seconds_per_step": a2a.seconds / setup.steps,
        "crossing_bytes_per_step": statistics.mean(crossed),
    }


def worker(
    rank: int, port: int, setup: Setup, layouts: dict[str, ExpertPlacement], out: str
) -> None:
    torch.set_num_threads(1)  # the ranks share this machine's cores (torchrun does the same)
    comm.init(rank, len(SPEEDS), backend="gloo", master_port=port, timeout=300)
    runs: dict[str, list[list[dict[str, Any]]]] = {}
    for _ in range(setup.repeats):  # in turns, so the machine's drift hits both alike
        for name, placement in layouts.items():
            runs.setdefault(name, []).append(comm.all_gather_object(timed(setup, placement, rank)))
            gc.collect()
    comm.destroy()
    if rank == 0:
        Path(out).write_text(json.dumps(runs))


# ------------------------------------------------------------------------------------ driver


def predicted_expert_seconds(setup: Setup, placement: ExpertPlacement) -> float:
    """The slowest rank's expert time with every expert receiving an equal share of rows."""
    per_expert = len(SPEEDS) * setup.rows / setup.experts
    slowest = placement.slowest
    return per_expert * placement.load(slowest.rank) * setup.token_time


def layout_figure(
    setup: Setup, placement: ExpertPlacement, runs: list[list[dict[str, Any]]]
) -> dict[str, Any]:
    """A placement's step time over the repeats and each rank's figures (the median repeat's)."""
    steps = [run[0]["step_seconds"] for run in runs]
    middle = sorted(runs, key=lambda run: run[0]["step_seconds"])[(len(runs) - 1) // 2]
    ranks = [
        {
            "rank": r.rank,
            "speed": r.speed,
            "experts": list(placement.experts_of(r.rank)),
            "received_rows_per_step": middle[r.rank]["received_rows"],
            "expert_ms_per_step": round(middle[r.rank]["expert_seconds"] * 1e3, 1),
            "step_ms": round(middle[r.rank]["step_seconds"] * 1e3, 1),
            "all_to_all_bytes_per_step": round(middle[r.rank]["all_to_all_bytes_per_step"]),
            "all_to_all_calls_per_step": middle[r.rank]["all_to_all_calls_per_step"],
            "all_to_all_ms_per_step": round(middle[r.rank]["all_to_all_seconds_per_step"] * 1e3, 1),
            "crossing_bytes_per_step": round(middle[r.rank]["crossing_bytes_per_step"]),
        }
        for r in placement.ranks
    ]
    return {
        "counts": list(placement.counts),
        "step_ms": summary([s * 1e3 for s in steps]),
        "predicted_expert_ms": round(predicted_expert_seconds(setup, placement) * 1e3, 1),
        "all_to_all_bytes_per_step": sum(r["all_to_all_bytes_per_step"] for r in ranks),
        "crossing_bytes_per_step": sum(r["crossing_bytes_per_step"] for r in ranks),
        "ranks": ranks,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few steps, one repeat")
    parser.add_argument("--steps", type=int, help="timed steps per run (default 8)")
    parser.add_argument("--repeats", type=int, help="runs of each placement (default 3)")
    parser.add_argument(
        "--token-time",
        type=float,
        help="emulated seconds of one expert's forward and backward of a token row at speed 1 "
        "(default 0.005)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup(steps=3, warmup=1, repeats=1) if args.quick else Setup()
    setup = dataclasses.replace(
        setup,
        steps=args.steps or setup.steps,
        repeats=args.repeats or setup.repeats,
        token_time=args.token_time or setup.token_time,
    )
    record = _common.Run("bench/bench_train_expert_parallel.py", argv)
    layouts = placements(setup)
    runs = _common.spawned_ranks(worker, len(SPEEDS), setup, layouts)
    figures = {name: layout_figure(setup, p, runs[name]) for name, p in layouts.items()}
    ideal = len(SPEEDS) * setup.rows * setup.token_time / sum(SPEEDS)
    hetero_ms = figures["hetero"]["step_ms"]["median"]
    doc: dict[str, Any] = {
        **record.header(
            "expert parallelism",
            quick=args.quick,
            hetero=hetero.__version__,
            torch=torch.__version__,
        ),
        "setup": {
            **dataclasses.asdict(setup),
            "ranks": len(SPEEDS),
            "backend": "gloo",
            "speeds": list(SPEEDS),
            "rows_per_rank_per_step": setup.rows,
            "expert_state_bytes": placements(setup)["hetero"].expert_bytes[0],
            "parameters": sum(p.numel() for p in Model(setup).parameters()),
            "optimizer": "SGD, lr 0.05",
        },
        "ideal_expert_ms": round(ideal * 1e3, 1),
        "ideal_formula": "R * rows * token_time / sum(speeds): every rank's expert rows at the "
        "fleet's total speed",
        "placements": figures,
        "hetero_speedup_vs_even": round(figures["even"]["step_ms"]["median"] / hetero_ms, 3),
        "predicted_expert_speedup_vs_even": round(
            figures["even"]["predicted_expert_ms"] / figures["hetero"]["predicted_expert_ms"], 3
        ),
        **record.footer(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
