"""Data × pipeline parallelism for a fleet: how many pipeline replicas, how deep, which ranks in
each, and each replica's share of the global batch.

For every depth d that divides the number of ranks N, the ranks (fastest first) are grouped
into N / d replicas of d two ways: *dealt* round-robin (every replica gets a mix, so they are
alike) and in *blocks* (the fastest together: a slow replica may then need fewer stages' worth
of memory elsewhere). Each replica's stages are planned with ``plan_stages`` (memory for the
micro-batches it might hold: all of them), and the global batch's micro-batches are dealt one
at a time to the replica whose step would end soonest with it: a replica of step
``Σ t_i + (M_r − 1) × max t_i`` (``stages.py``) takes them in proportion to its pipeline's
throughput, ``1 / max t_i`` once filled. The layout of the least predicted step wins (the
slowest replica's); a replica that fits no split of the layers, or a grouping where 1F1B would
leave a replica fewer micro-batches than stages, is left out. Communication — the
activations between stages, the replicas' gradient all-reduce — is left out of the
prediction. Pure code: no torch.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from hetero._checks import is_integer
from hetero.errors import ConfigError
from hetero.train.stages import (
    LayerCost,
    PipelineRank,
    StagePlan,
    check_schedule,
    pipeline_seconds,
    plan_stages,
)

__all__ = ["FleetLayout", "PipelineReplica", "choose_layout"]


@dataclass(frozen=True, slots=True)
class PipelineReplica:
    """One pipeline: its stages' plan and its share of every global batch (``samples``, in the
    plan's micro-batches)."""

    plan: StagePlan
    samples: int

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(s.rank for s in self.plan.stages)

    @property
    def step_seconds(self) -> float:
        return self.plan.step_seconds


@dataclass(frozen=True, slots=True)
class FleetLayout:
    """The chosen replicas, and every layout tried: (depth, grouping, predicted step seconds,
    or why it was left out)."""

    replicas: tuple[PipelineReplica, ...]
    tried: tuple[tuple[int, str, float | str], ...]

    @property
    def depth(self) -> int:
        return len(self.replicas[0].plan.stages)

    @property
    def step_seconds(self) -> float:
        """The slowest replica's step: every replica's gradients are reduced together."""
        return max(r.step_seconds for r in self.replicas)

    def table(self) -> str:
        """Each replica's ranks, share and predicted step, each replica's stages, then every
        layout tried."""
        lines = [
            f"{len(self.replicas)} replica(s) × {self.depth} stage(s), predicted step "
            f"{self.step_seconds * 1e3:.1f} ms"
        ]
        for i, r in enumerate(self.replicas):
            ranks = ", ".join(map(str, r.ranks))
            lines.append(
                f"replica {i}: ranks {ranks}, {r.samples} samples a step, predicted "
                f"{r.step_seconds * 1e3:.1f} ms"
            )
            lines += ["  " + line for line in r.plan.table().splitlines()]
        lines.append("layouts tried (depth, grouping: predicted step):")
        for depth, grouping, outcome in self.tried:
            said = f"{outcome * 1e3:.1f} ms" if isinstance(outcome, float) else outcome
            lines.append(f"  {depth}, {grouping}: {said}")
        return "\n".join(lines)


def choose_layout(
    layers: Sequence[LayerCost],
    ranks: Sequence[PipelineRank],
    *,
    global_batch: int,
    micro_batch_size: int,
    schedule: str = "1f1b",
) -> FleetLayout:
    """The data × pipeline layout of ``ranks`` of least predicted step for ``global_batch``
    samples a step in micro-batches of ``micro_batch_size``."""
    known = check_schedule(schedule)
    for name, value in (("global_batch", global_batch), ("micro_batch_size", micro_batch_size)):
        if not is_integer(value) or value < 1:
            raise ConfigError([(name, f"must be a whole number >= 1, got {value!r}")])
    if global_batch % micro_batch_size:
        raise ConfigError(
            [
                (
                    "global_batch",
                    f"{global_batch} is not a whole number of micro-batches of {micro_batch_size}",
                )
            ]
        )
    if not ranks:
        raise ConfigError([("ranks", "needs at least one rank, got none")])
    micro_batches = global_batch // micro_batch_size
    fastest = sorted(ranks, key=lambda r: (-r.speed, -r.memory, r.rank))
    best: tuple[PipelineReplica, ...] | None = None
    tried: list[tuple[int, str, float | str]] = []
    for depth in range(1, min(len(ranks), len(layers)) + 1):
        if len(ranks) % depth:
            continue
        count = len(ranks) // depth
        groupings = {
            "dealt": [fastest[i::count] for i in range(count)],
            "blocks": [fastest[i * depth : (i + 1) * depth] for i in range(count)],
        }
        for grouping, groups in groupings.items():
            if (depth == 1 and grouping == "blocks") or (count == 1 and grouping == "dealt"):
                continue  # the same groups as the other grouping
            try:
                replicas = _replicas(
                    layers, groups, micro_batches, micro_batch_size, known, grouping
                )
            except ConfigError as exc:
                tried.append((depth, grouping, f"left out: {exc}"))
                continue
            seconds = max(r.step_seconds for r in replicas)
            tried.append((depth, grouping, seconds))
            if best is None or seconds < max(r.step_seconds for r in best):
                best = replicas
    if best is None:
        why = "; ".join(f"{d} deep, {g}: {outcome}" for d, g, outcome in tried)
        raise ConfigError(
            [("ranks", f"no data × pipeline layout of the {len(ranks)} ranks works: {why}")]
        )
    return FleetLayout(best, tuple(tried))


def _replicas(
    layers: Sequence[LayerCost],
    groups: list[list[PipelineRank]],
    micro_batches: int,
    micro_batch_size: int,
    schedule: str,
    grouping: str,
) -> tuple[PipelineReplica, ...]:
    """Each group's pipeline, planned for as many micro-batches as it might take, with the
    micro-batches dealt by throughput, then planned again for its own count."""
    depth = len(groups[0])
    floor = depth if schedule == "1f1b" else 1  # 1F1B runs at least one micro-batch a stage
    if micro_batches < floor * len(groups):
        raise ConfigError(
            [
                (
                    "global_batch",
                    f"{micro_batches} micro-batches cannot give each of {len(groups)} "
                    f"{grouping} replicas of {depth} stages the {floor} 1f1b needs",
                )
            ]
        )
    most = micro_batches - floor * (len(groups) - 1)
    plans = [
        plan_stages(
            layers,
            group,
            micro_batches=most,
            micro_batch_size=micro_batch_size,
            schedule=schedule,
        )
        for group in groups
    ]
    counts = _deal(plans, micro_batches, floor)
    return tuple(
        PipelineReplica(
            plan_stages(
                layers,
                group,
                micro_batches=m,
                micro_batch_size=micro_batch_size,
                schedule=schedule,
            ),
            m * micro_batch_size,
        )
        for group, m in zip(groups, counts, strict=True)
    )


def _deal(plans: list[StagePlan], micro_batches: int, floor: int) -> list[int]:
    """Micro-batches for each replica, ``floor`` each first, then one at a time to the replica
    whose step would end soonest with it (least-finish-time first: optimal for the slowest
    replica's step, each replica's step growing by its slowest stage a micro-batch)."""
    counts = [floor] * len(plans)
    times = [[s.seconds for s in p.stages] for p in plans]
    heap = [(pipeline_seconds(t, floor + 1), i) for i, t in enumerate(times)]
    heapq.heapify(heap)
    for _ in range(micro_batches - floor * len(plans)):
        _, i = heapq.heappop(heap)
        counts[i] += 1
        heapq.heappush(heap, (pipeline_seconds(times[i], counts[i] + 1), i))
    return counts
