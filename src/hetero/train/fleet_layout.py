"""Data × pipeline parallelism for a fleet: how many pipeline replicas, how deep, which ranks in
each, and each replica's share of the global batch.

For every depth d that divides the number of ranks N, the ranks (fastest first) are grouped
into N / d replicas of d two ways: *dealt* round-robin (every replica gets a mix, so they are
alike) and in *blocks* (the fastest together: a slow replica may then need fewer stages' worth
of memory elsewhere). Each replica's stages are planned with ``plan_stages`` (memory for the
micro-batches it might hold: all of them), and the global batch's micro-batches are dealt one
at a time to the replica whose step would end soonest with it: a replica of step
``Σ t_i + (M_r − 1) × max t_i`` (``stages.py``) takes them in proportion to its pipeline's
throughput, ``1 / max t_i`` once filled. A replica that fits no split of the layers, or a
grouping where 1F1B would leave a replica fewer micro-batches than stages, is left out.

Then the replicas' gradients are all-reduced, weighted by their shares. The replicas' stage
boundaries may differ, so each run of layers that the same ranks hold (one rank in each
replica) is a ``GradientRange`` of its own, all-reduced among those ranks; every rank reduces
its ranges in layer order. Given a ``bandwidth`` (bytes a second each rank sends, and
receives), a range of B bytes among R ranks takes a ring all-reduce's ``2 (R − 1) / R × B /
bandwidth``, starting when all R ranks have finished their pipelines and earlier ranges; the
layout's step ends with its last range. The layout of the least predicted step wins (without a
bandwidth, the slowest replica's pipeline). The activations sent between stages are left out.
Pure code: no torch.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetero._checks import is_integer, is_positive
from hetero.errors import ConfigError
from hetero.train.stages import (
    LayerCost,
    PipelineRank,
    StagePlan,
    check_fleet,
    check_schedule,
    pipeline_seconds,
    plan_stages,
)
from hetero.units import format_size

__all__ = [
    "FleetLayout",
    "GradientRange",
    "LayoutOption",
    "PipelineReplica",
    "choose_layout",
    "given_layout",
    "gradient_ranges",
]

# Predicted steps within this relative margin are equal (float sums differ).
_SAME = 1e-9


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
class GradientRange:
    """Layers ``[first, end)`` that the same ``ranks`` hold, one in each replica (in the
    replicas' order): their gradients, ``bytes`` in all, are all-reduced among those ranks."""

    first: int
    end: int
    ranks: tuple[int, ...]
    bytes: int

    def seconds(self, bandwidth: float) -> float:
        """A ring all-reduce's time: each rank sends and receives ``2 (R − 1) / R`` of it."""
        count = len(self.ranks)
        return 2 * (count - 1) / count * self.bytes / bandwidth


@dataclass(frozen=True, slots=True)
class LayoutOption:
    """One layout tried: ``count`` replicas of ``depth`` stages, the ranks grouped by
    ``grouping``; its replicas and predicted seconds when it fits, else why not (``unfit``, and
    the ranks of the replica that fits no split, if that was why)."""

    count: int
    depth: int
    grouping: str
    replicas: tuple[PipelineReplica, ...] = ()
    pipeline_seconds: float = math.inf
    allreduce_seconds: float = 0.0
    unfit: str | None = None
    unfit_ranks: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.count} × {self.depth} ({self.grouping})"

    @property
    def step_seconds(self) -> float:
        """The slowest replica's pipeline, then the gradients' all-reduce."""
        return self.pipeline_seconds + self.allreduce_seconds

    def predicted(self) -> str:
        """Its predicted step, and the all-reduce's part when there is one."""
        said = f"{self.step_seconds * 1e3:,.1f} ms"
        if self.allreduce_seconds:
            said += (
                f" (pipelines {self.pipeline_seconds * 1e3:,.1f} ms + gradient all-reduce "
                f"{self.allreduce_seconds * 1e3:,.1f} ms)"
            )
        return said


@dataclass(frozen=True, slots=True)
class FleetLayout:
    """The chosen layout, every layout tried (``considered``, the chosen among them) and the
    bandwidth the all-reduce was predicted at (None: left out)."""

    chosen: LayoutOption
    considered: tuple[LayoutOption, ...]
    bandwidth: float | None = None

    @property
    def replicas(self) -> tuple[PipelineReplica, ...]:
        return self.chosen.replicas

    @property
    def depth(self) -> int:
        return self.chosen.depth

    @property
    def global_batch(self) -> int:
        return sum(r.samples for r in self.replicas)

    @property
    def step_seconds(self) -> float:
        """The slowest replica's step, then the gradients' all-reduce (when a bandwidth was
        given): every replica's gradients are reduced together."""
        return self.chosen.step_seconds

    @property
    def tried(self) -> tuple[tuple[int, str, float | str], ...]:
        """Every layout tried: (depth, grouping, predicted step seconds, or why it was left
        out)."""
        return tuple(
            (o.depth, o.grouping, o.step_seconds if o.unfit is None else f"left out: {o.unfit}")
            for o in self.considered
        )

    @property
    def gradient_ranges(self) -> tuple[GradientRange, ...]:
        """The runs of layers whose gradients the same ranks all-reduce, in layer order (none
        for one replica)."""
        return gradient_ranges(self.replicas)

    def table(self) -> str:
        """Each replica's ranks, share and predicted step, and each replica's stages."""
        lines = [
            f"{len(self.replicas)} replica(s) × {self.depth} stage(s), predicted step "
            f"{self.chosen.predicted()}"
        ]
        for i, r in enumerate(self.replicas):
            lines.append(
                f"replica {i}: ranks {_listed(r.ranks)}, {r.samples} samples a step "
                f"({r.samples / self.global_batch:.1%}), predicted {r.step_seconds * 1e3:,.1f} ms"
            )
            lines += ["  " + line for line in r.plan.table().splitlines()]
        return "\n".join(lines)

    def explain(self) -> str:
        """Why this layout: its table, then every layout tried (replicas × stages) and why it
        lost: it does not fit (which replica, and what), or its predicted step is slower."""
        link = "left out"
        if self.bandwidth is not None:
            link = f"at {format_size(self.bandwidth, binary=False)}/s a rank"
        lines = [
            f"chose {self.chosen.name}: the least predicted step of "
            f"{len(self.considered)} layout(s) tried (gradient all-reduce {link})",
            self.table(),
            "layouts tried (replicas × stages, grouping):",
        ]
        best = self.chosen.step_seconds
        for o in self.considered:
            if o is self.chosen:
                why = f"chosen, predicted {o.predicted()}"
            elif o.unfit is not None:
                where = f"the replica of ranks {_listed(o.unfit_ranks)}: " if o.unfit_ranks else ""
                why = f"does not fit: {where}{o.unfit}"
            elif o.step_seconds <= best * (1 + _SAME):
                why = f"as fast, predicted {o.predicted()}: the first tried of equals is chosen"
            else:
                why = f"slower: predicted {o.predicted()}, {o.step_seconds / best:.2f}× the chosen"
            lines.append(f"  {o.name}: {why}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.name,
            "bandwidth": self.bandwidth,
            "step_seconds": self.step_seconds,
            "allreduce_seconds": self.chosen.allreduce_seconds,
            "replicas": [
                {"ranks": list(r.ranks), "samples": r.samples, "plan": r.plan.to_dict()}
                for r in self.replicas
            ],
            "gradient_ranges": [
                {"layers": [g.first, g.end], "ranks": list(g.ranks), "bytes": g.bytes}
                for g in self.gradient_ranges
            ],
            "considered": [
                {
                    "layout": o.name,
                    "step_seconds": None if o.unfit else o.step_seconds,
                    "allreduce_seconds": None if o.unfit else o.allreduce_seconds,
                    "unfit": o.unfit,
                }
                for o in self.considered
            ],
        }


def choose_layout(
    layers: Sequence[LayerCost],
    ranks: Sequence[PipelineRank],
    *,
    global_batch: int,
    micro_batch_size: int,
    schedule: str = "1f1b",
    bandwidth: float | None = None,
) -> FleetLayout:
    """The data × pipeline layout of ``ranks`` of least predicted step for ``global_batch``
    samples a step in micro-batches of ``micro_batch_size``, the replicas' gradient all-reduce
    predicted at ``bandwidth`` bytes a second a rank (None: left out)."""
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
    if bandwidth is not None and not is_positive(bandwidth):
        raise ConfigError([_bad_bandwidth(bandwidth)])
    check_fleet(layers, ranks, micro_batch_size=micro_batch_size)
    micro_batches = global_batch // micro_batch_size
    fastest = sorted(ranks, key=lambda r: (-r.speed, -r.memory, r.rank))
    considered: list[LayoutOption] = []
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
            considered.append(
                _option(layers, groups, grouping, micro_batches, micro_batch_size, known, bandwidth)
            )
    fits = [o for o in considered if o.unfit is None]
    if not fits:
        why = "; ".join(f"{o.depth} deep, {o.grouping}: left out: {o.unfit}" for o in considered)
        raise ConfigError(
            [("ranks", f"no data × pipeline layout of the {len(ranks)} ranks works: {why}")]
        )
    chosen = fits[0]
    for option in fits[1:]:  # the first of equals: the shallowest
        if option.step_seconds < chosen.step_seconds * (1 - _SAME):
            chosen = option
    return FleetLayout(chosen, tuple(considered), bandwidth)


def given_layout(
    replicas: Sequence[PipelineReplica], *, bandwidth: float | None = None
) -> FleetLayout:
    """The layout of ``replicas`` as given, predicted as ``choose_layout`` predicts its own (a
    layout to compare with it, as ``split_layers``' plan is with ``plan_stages``'): refused
    unless they are plans of the same layers, as deep, on distinct ranks, each replica's samples
    its plan's micro-batches."""
    problems: list[tuple[str, str]] = []
    if not replicas:
        problems.append(("replicas", "needs at least one replica, got none"))
    ranks = [rank for r in replicas for rank in r.ranks]
    if len(set(ranks)) != len(ranks):
        problems.append(("replicas", f"must run on distinct ranks, got ranks {ranks}"))
    for i, r in enumerate(replicas):
        if r.plan.layers != replicas[0].plan.layers:
            problems.append((f"replicas[{i}].plan", "plans other layers than replica 0's"))
        if len(r.plan.stages) != len(replicas[0].plan.stages):
            problems.append(
                (
                    f"replicas[{i}].plan",
                    f"has {len(r.plan.stages)} stages, replica 0 {len(replicas[0].plan.stages)}: "
                    "every replica must be as deep",
                )
            )
        if r.samples != r.plan.micro_batches * r.plan.micro_batch_size:
            problems.append(
                (
                    f"replicas[{i}].samples",
                    f"must be its plan's {r.plan.micro_batches} micro-batches of "
                    f"{r.plan.micro_batch_size}, got {r.samples}",
                )
            )
    if bandwidth is not None and not is_positive(bandwidth):
        problems.append(_bad_bandwidth(bandwidth))
    if problems:
        raise ConfigError(problems)
    chosen = _fitted(tuple(replicas), "given", bandwidth)
    return FleetLayout(chosen, (chosen,), bandwidth)


def gradient_ranges(replicas: Sequence[PipelineReplica]) -> tuple[GradientRange, ...]:
    """The runs of layers that the same ranks hold, one in each of ``replicas``, in layer
    order; none for one replica (nothing to all-reduce)."""
    if len(replicas) < 2:
        return ()
    layers = replicas[0].plan.layers
    holders = [
        tuple(s.rank for r in replicas for s in r.plan.stages if s.first <= i < s.end)
        for i in range(len(layers))
    ]
    ranges: list[GradientRange] = []
    first = 0
    for i in range(1, len(layers) + 1):
        if i == len(layers) or holders[i] != holders[first]:
            size = sum(layer.gradient_bytes for layer in layers[first:i])
            ranges.append(GradientRange(first, i, holders[first], size))
            first = i
    return tuple(ranges)


def _allreduce_end(replicas: Sequence[PipelineReplica], bandwidth: float) -> float:
    """When the last gradient range's all-reduce ends: each starts once all its ranks have
    finished their pipelines and their earlier ranges (every rank reduces in layer order)."""
    ready = {rank: r.step_seconds for r in replicas for rank in r.ranks}
    for g in gradient_ranges(replicas):
        ends = max(ready[rank] for rank in g.ranks) + g.seconds(bandwidth)
        ready.update(dict.fromkeys(g.ranks, ends))
    return max(ready.values())


def _bad_bandwidth(bandwidth: object) -> tuple[str, str]:
    return ("bandwidth", f"must be bytes a second > 0, or None to leave it out, got {bandwidth!r}")


def _listed(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks))


def _option(
    layers: Sequence[LayerCost],
    groups: list[list[PipelineRank]],
    grouping: str,
    micro_batches: int,
    micro_batch_size: int,
    schedule: str,
    bandwidth: float | None,
) -> LayoutOption:
    """The layout of a pipeline for each of ``groups``: each planned for as many
    micro-batches as it might take, the micro-batches dealt by throughput, each planned again
    for its own count, then the gradients' all-reduce; or why it does not fit."""
    count, depth = len(groups), len(groups[0])
    floor = depth if schedule == "1f1b" else 1  # 1F1B runs at least one micro-batch a stage
    if micro_batches < floor * count:
        why = (
            f"global_batch: {micro_batches} micro-batches cannot give each of {count} "
            f"{grouping} replicas of {depth} stages the {floor} 1f1b needs"
        )
        return LayoutOption(count, depth, grouping, unfit=why)
    most = micro_batches - floor * (count - 1)
    plans: list[StagePlan] = []
    for group in groups:
        try:
            plans.append(
                plan_stages(
                    layers,
                    group,
                    micro_batches=most,
                    micro_batch_size=micro_batch_size,
                    schedule=schedule,
                )
            )
        except ConfigError as exc:
            ranks = tuple(r.rank for r in group)
            return LayoutOption(count, depth, grouping, unfit=str(exc), unfit_ranks=ranks)
    # Fewer micro-batches in flight than planned for: each replica's own plan fits too.
    replicas = tuple(
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
        for group, m in zip(groups, _deal(plans, micro_batches, floor), strict=True)
    )
    return _fitted(replicas, grouping, bandwidth)


def _fitted(
    replicas: tuple[PipelineReplica, ...], grouping: str, bandwidth: float | None
) -> LayoutOption:
    """The layout of these replicas, with its predicted pipelines and all-reduce."""
    pipelines = max(r.step_seconds for r in replicas)
    ends = pipelines if bandwidth is None else _allreduce_end(replicas, bandwidth)
    depth = len(replicas[0].plan.stages)
    return LayoutOption(len(replicas), depth, grouping, replicas, pipelines, ends - pipelines)


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
