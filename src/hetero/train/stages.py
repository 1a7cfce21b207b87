"""Pipeline stages sized by speed and memory: which contiguous layers each rank runs.

A pipeline of S stages runs each step's M micro-batches of m samples through its ranks in
order. Stage i's forward and backward of one micro-batch take ``t_i = m × Σ seconds / speed``
over its layers (``seconds``: a layer's forward and backward of one sample at speed 1), and a
step takes about ``Σ t_i + (M − 1) × max t_i``: the micro-batches fill and drain the pipeline
once, and in between the slowest stage sets the pace (exact for GPipe's fill-drain without
communication; 1F1B keeps the same bubble). A stage holds its layers' ``state_bytes``
(parameters, gradients, optimizer state) and the activations of the micro-batches whose
backward it has not run yet: all M under GPipe, ``min(M, S − i)`` at stage i under 1F1B.

``plan_stages`` finds, for an order of the ranks, the contiguous split with the smallest slowest
stage that fits every rank's memory (a DP over stages and layers), then among the splits that
keep that slowest stage the one of least total time (the fill and drain). It tries every order
of the ranks (ranks of the same speed and memory count once; a few orders past
``_MAX_ORDERS``): the order matters when layers differ (an expensive last layer wants a fast
rank) and under 1F1B, where the first stage holds the most activations. Pure code: no torch.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hetero._checks import is_integer, is_number, is_positive
from hetero.errors import ConfigError
from hetero.units import format_size

__all__ = [
    "SCHEDULES",
    "LayerCost",
    "PipelineRank",
    "Schedule",
    "Stage",
    "StagePlan",
    "check_fleet",
    "check_schedule",
    "even_counts",
    "pipeline_seconds",
    "plan_stages",
    "split_layers",
]

Schedule = Literal["gpipe", "1f1b"]
SCHEDULES: tuple[Schedule, ...] = ("gpipe", "1f1b")
# Orders of the ranks tried in full (6 distinct ranks); past that, a few likely ones.
_MAX_ORDERS = 720
# Stage times within this relative margin count as the same bottleneck (float sums differ).
_SAME = 1e-9


@dataclass(frozen=True, slots=True)
class LayerCost:
    """One layer as the planner sees it: ``seconds`` for its forward and backward of one sample
    at relative speed 1; ``state_bytes`` held whatever the batch (parameters, gradients,
    optimizer state); ``activation_bytes`` per sample kept from its forward for its backward;
    ``parameter_bytes``, its parameters' (as many as the gradients data parallelism
    all-reduces; None: not known, and half its state, the most it can be, is assumed)."""

    name: str
    seconds: float
    state_bytes: int
    activation_bytes: int = 0
    parameter_bytes: int | None = None

    @property
    def gradient_bytes(self) -> int:
        """The bytes of its gradients: its parameters', else at most half its state (which
        holds the parameters and their gradients at least)."""
        return self.state_bytes // 2 if self.parameter_bytes is None else self.parameter_bytes


@dataclass(frozen=True, slots=True)
class PipelineRank:
    """A rank of the process group, its relative ``speed`` and its ``memory`` limit in bytes."""

    rank: int
    speed: float
    memory: int


@dataclass(frozen=True, slots=True)
class Stage:
    """Stage ``index`` runs layers ``[first, end)`` on ``rank``; ``seconds`` is its forward and
    backward of one micro-batch, ``memory`` its predicted peak bytes, ``in_flight`` the
    micro-batches whose activations it holds at once."""

    index: int
    rank: int
    speed: float
    first: int
    end: int
    seconds: float
    memory: int
    limit: int
    in_flight: int

    @property
    def layers(self) -> range:
        return range(self.first, self.end)


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Stages in pipeline order, and the step time they predict."""

    stages: tuple[Stage, ...]
    layers: tuple[LayerCost, ...]
    schedule: Schedule
    micro_batches: int
    micro_batch_size: int

    @property
    def step_seconds(self) -> float:
        """The predicted step: ``Σ t_i + (M − 1) × max t_i``, communication left out."""
        return pipeline_seconds([s.seconds for s in self.stages], self.micro_batches)

    @property
    def slowest(self) -> Stage:
        return max(self.stages, key=lambda s: s.seconds)

    def stage_of(self, rank: int) -> Stage:
        """The stage ``rank`` runs."""
        for stage in self.stages:
            if stage.rank == rank:
                return stage
        ranks = ", ".join(str(s.rank) for s in self.stages)
        raise ConfigError([("rank", f"rank {rank} runs no stage of this plan (ranks {ranks})")])

    def table(self) -> str:
        """What each stage runs, its predicted time per micro-batch and its memory, then the
        predicted step."""
        rows = [("stage", "rank", "speed", "layers", "ms/micro-batch", "memory / limit")]
        for s in self.stages:
            names = self.layers[s.first].name
            if s.end - s.first > 1:
                names += f" .. {self.layers[s.end - 1].name}"
            rows.append(
                (
                    str(s.index),
                    str(s.rank),
                    f"{s.speed:g}",
                    f"{s.first}-{s.end - 1} ({names})",
                    f"{s.seconds * 1e3:.1f}",
                    f"{format_size(s.memory)} / {format_size(s.limit)}",
                )
            )
        widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        slowest = self.slowest
        lines.append(
            f"predicted step {self.step_seconds * 1e3:.1f} ms: {self.micro_batches} micro-batches "
            f"of {self.micro_batch_size} under {self.schedule}, stage {slowest.index} (rank "
            f"{slowest.rank}) the slowest at {slowest.seconds * 1e3:.1f} ms"
        )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schedule": self.schedule,
            "micro_batches": self.micro_batches,
            "micro_batch_size": self.micro_batch_size,
            "step_seconds": self.step_seconds,
            "stages": [
                {
                    "stage": s.index,
                    "rank": s.rank,
                    "speed": s.speed,
                    "layers": [s.first, s.end],
                    "seconds": s.seconds,
                    "memory": s.memory,
                    "limit": s.limit,
                }
                for s in self.stages
            ],
        }


def pipeline_seconds(stage_seconds: Sequence[float], micro_batches: int) -> float:
    """A step of ``micro_batches`` through stages of these times per micro-batch: one fill and
    drain (``Σ t_i``), then the slowest stage for the other micro-batches."""
    return sum(stage_seconds) + (micro_batches - 1) * max(stage_seconds)


def check_schedule(schedule: str) -> Schedule:
    """``schedule`` if it is one hetero runs, else a ConfigError listing those."""
    for known in SCHEDULES:
        if schedule == known:
            return known
    allowed = ", ".join(repr(s) for s in SCHEDULES)
    raise ConfigError([("schedule", f"must be one of {allowed}, got {schedule!r}")])


def plan_stages(
    layers: Sequence[LayerCost],
    ranks: Sequence[PipelineRank],
    *,
    micro_batches: int,
    micro_batch_size: int,
    schedule: str = "1f1b",
    reorder: bool = True,
) -> StagePlan:
    """Contiguous layers for each of ``ranks`` (a stage each), balanced by speed within every
    rank's memory; with ``reorder`` the ranks' order in the pipeline too (else as given)."""
    shape = _Shape.checked(layers, ranks, micro_batches, micro_batch_size, schedule)
    _refuse_oversized_layers(
        shape.layers, shape.ranks, shape.in_flight(len(shape.ranks) - 1), micro_batch_size
    )
    best: tuple[float, list[int], tuple[PipelineRank, ...]] | None = None
    for order in _orders(shape.ranks) if reorder else [shape.ranks]:
        cuts = _best_cuts(shape, order)
        if cuts is None:
            continue
        seconds = pipeline_seconds(
            [shape.seconds(order[i], cuts[i], cuts[i + 1]) for i in range(len(order))],
            micro_batches,
        )
        if best is None or seconds < best[0] * (1 - _SAME):
            best = (seconds, cuts, order)
    if best is None:
        raise ConfigError([("memory", _no_fit(shape))])
    return shape.plan(best[2], best[1])


def split_layers(
    layers: Sequence[LayerCost],
    ranks: Sequence[PipelineRank],
    counts: Sequence[int],
    *,
    micro_batches: int,
    micro_batch_size: int,
    schedule: str = "1f1b",
) -> StagePlan:
    """The plan that gives ``counts[i]`` layers to ``ranks[i]``, in order (a layout to compare
    with ``plan_stages``'): refused when a stage does not fit its rank's memory."""
    shape = _Shape.checked(layers, ranks, micro_batches, micro_batch_size, schedule)
    if len(counts) != len(ranks) or any(c < 1 for c in counts) or sum(counts) != len(layers):
        raise ConfigError(
            [
                (
                    "counts",
                    f"must give each of the {len(ranks)} ranks at least one layer and "
                    f"{len(layers)} in all, got {list(counts)}",
                )
            ]
        )
    cuts = [0, *itertools.accumulate(counts)]
    plan = shape.plan(shape.ranks, cuts)
    for s in plan.stages:
        if s.memory > s.limit:
            raise ConfigError(
                [
                    (
                        "counts",
                        f"stage {s.index} (layers {s.first}-{s.end - 1}) needs "
                        f"{_size(s.memory)}, above rank {s.rank}'s memory of {_size(s.limit)}",
                    )
                ]
            )
    return plan


def even_counts(layers: int, stages: int) -> list[int]:
    """``layers`` in ``stages`` near-equal runs, the first ones a layer longer."""
    size, extra = divmod(layers, stages)
    return [size + (i < extra) for i in range(stages)]


@dataclass(frozen=True, slots=True)
class _Shape:
    """The checked inputs, with prefix sums over the layers."""

    layers: tuple[LayerCost, ...]
    ranks: tuple[PipelineRank, ...]
    micro_batches: int
    micro_batch_size: int
    schedule: Schedule
    work: tuple[float, ...]  # prefix sums of seconds
    state: tuple[int, ...]
    activations: tuple[int, ...]

    @classmethod
    def checked(
        cls,
        layers: Sequence[LayerCost],
        ranks: Sequence[PipelineRank],
        micro_batches: int,
        micro_batch_size: int,
        schedule: str,
    ) -> _Shape:
        problems = _problems(layers, ranks, micro_batches, micro_batch_size)
        try:
            known = check_schedule(schedule)
        except ConfigError as exc:
            problems += exc.problems
            known = "1f1b"
        if known == "1f1b" and not problems and micro_batches < len(ranks):
            problems.append(
                (
                    "micro_batches",
                    f"1f1b needs at least as many micro-batches as stages ({len(ranks)}), got "
                    f"{micro_batches}: raise micro_batches or use 'gpipe'",
                )
            )
        if problems:
            raise ConfigError(problems)
        return cls(
            tuple(layers),
            tuple(ranks),
            micro_batches,
            micro_batch_size,
            known,
            tuple(itertools.accumulate((x.seconds for x in layers), initial=0.0)),
            tuple(itertools.accumulate((x.state_bytes for x in layers), initial=0)),
            tuple(itertools.accumulate((x.activation_bytes for x in layers), initial=0)),
        )

    def in_flight(self, position: int) -> int:
        """Micro-batches whose activations stage ``position`` holds at once."""
        if self.schedule == "gpipe":
            return self.micro_batches
        return min(self.micro_batches, len(self.ranks) - position)

    def seconds(self, rank: PipelineRank, first: int, end: int) -> float:
        return self.micro_batch_size * (self.work[end] - self.work[first]) / rank.speed

    def memory(self, position: int, first: int, end: int) -> int:
        held = self.activations[end] - self.activations[first]
        return (
            self.state[end]
            - self.state[first]
            + self.in_flight(position) * (self.micro_batch_size * held)
        )

    def plan(self, order: Sequence[PipelineRank], cuts: Sequence[int]) -> StagePlan:
        stages = tuple(
            Stage(
                index=i,
                rank=r.rank,
                speed=r.speed,
                first=cuts[i],
                end=cuts[i + 1],
                seconds=self.seconds(r, cuts[i], cuts[i + 1]),
                memory=self.memory(i, cuts[i], cuts[i + 1]),
                limit=r.memory,
                in_flight=self.in_flight(i),
            )
            for i, r in enumerate(order)
        )
        return StagePlan(
            stages, self.layers, self.schedule, self.micro_batches, self.micro_batch_size
        )


def _problems(
    layers: Sequence[LayerCost],
    ranks: Sequence[PipelineRank],
    micro_batches: int,
    micro_batch_size: int,
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    for name, value in (("micro_batches", micro_batches), ("micro_batch_size", micro_batch_size)):
        if not is_integer(value) or value < 1:
            problems.append((name, f"must be a whole number >= 1, got {value!r}"))
    problems += _fleet_problems(layers, ranks)
    if len(layers) < len(ranks):
        problems.append(
            (
                "layers",
                f"{len(layers)} layers cannot fill {len(ranks)} stages (each runs at least one "
                "layer): use fewer ranks",
            )
        )
    return problems


def _fleet_problems(
    layers: Sequence[LayerCost], ranks: Sequence[PipelineRank]
) -> list[tuple[str, str]]:
    """Every bad cost of a layer and bad field of a rank, by its path."""
    problems: list[tuple[str, str]] = []
    for i, layer in enumerate(layers):
        if not (is_number(layer.seconds) and layer.seconds >= 0):
            problems.append((f"layers[{i}].seconds", f"must be >= 0, got {layer.seconds!r}"))
        for field in ("state_bytes", "activation_bytes", "parameter_bytes"):
            value = getattr(layer, field)
            if field == "parameter_bytes" and value is None:
                continue
            if not is_integer(value) or value < 0:
                problems.append((f"layers[{i}].{field}", f"must be bytes >= 0, got {value!r}"))
    seen: set[int] = set()
    for i, r in enumerate(ranks):
        if not is_integer(r.rank) or r.rank < 0:
            problems.append((f"ranks[{i}].rank", f"must be a rank >= 0, got {r.rank!r}"))
        elif r.rank in seen:
            problems.append((f"ranks[{i}].rank", f"rank {r.rank} is listed twice; list each once"))
        else:
            seen.add(r.rank)
        if not is_positive(r.speed):
            problems.append((f"ranks[{i}].speed", f"must be > 0, got {r.speed!r}"))
        if not is_integer(r.memory) or r.memory <= 0:
            problems.append((f"ranks[{i}].memory", f"must be bytes > 0, got {r.memory!r}"))
    if not ranks:
        problems.append(("ranks", "needs at least one rank, got none"))
    return problems


def check_fleet(
    layers: Sequence[LayerCost], ranks: Sequence[PipelineRank], *, micro_batch_size: int
) -> None:
    """Refuse, before any layout of ``ranks`` is planned, bad costs or ranks (each by its path)
    and a layer that no rank holds on its own with one micro-batch of ``micro_batch_size`` in
    flight, the fewest any stage holds (naming the layer and the largest rank)."""
    problems = _fleet_problems(layers, ranks)
    if not is_integer(micro_batch_size) or micro_batch_size < 1:
        problems.append(
            ("micro_batch_size", f"must be a whole number >= 1, got {micro_batch_size!r}")
        )
    if problems:
        raise ConfigError(problems)
    _refuse_oversized_layers(layers, ranks, 1, micro_batch_size)


def _refuse_oversized_layers(
    layers: Sequence[LayerCost],
    ranks: Sequence[PipelineRank],
    fewest: int,
    micro_batch_size: int,
) -> None:
    """A layer that fits no rank on its own, at the ``fewest`` micro-batches in flight any stage
    holds, makes every layout fail: name it and the largest rank."""
    largest = max(ranks, key=lambda r: r.memory)
    for i, layer in enumerate(layers):
        activations = fewest * micro_batch_size * layer.activation_bytes
        need = layer.state_bytes + activations
        if need > largest.memory:
            held = (
                f"{_size(layer.state_bytes)} of parameters, gradients and optimizer state + "
                f"{_size(activations)} of activations for {fewest} micro-batch(es) of "
                f"{micro_batch_size}"
            )
            raise ConfigError(
                [
                    (
                        "memory",
                        f"layer {i} ({layer.name!r}) needs {_size(need)} ({held}), more than "
                        f"the largest rank, rank {largest.rank} with {_size(largest.memory)}: "
                        "give a rank more memory, split the layer, or use smaller micro-batches",
                    )
                ]
            )


def _no_fit(shape: _Shape) -> str:
    """Why no split fits, every layer fitting some rank on its own."""
    state = shape.state[-1]
    held = sum(r.memory for r in shape.ranks)
    return (
        f"no split of the {len(shape.layers)} layers over the {_ranks(len(shape.ranks))} fits "
        f"their memory: the layers hold {_size(state)} of parameters, gradients and optimizer "
        f"state before activations ({_size(shape.activations[-1] * shape.micro_batch_size)} a "
        f"micro-batch of {shape.micro_batch_size}), the ranks {_size(held)} in all: add ranks or "
        "memory, or use smaller or fewer micro-batches in flight ('1f1b' holds fewer than "
        "'gpipe')"
    )


def _ranks(n: int) -> str:
    return "1 rank" if n == 1 else f"{n} ranks"


def _size(n: int) -> str:
    return f"{n:,} bytes ({format_size(n)})"


def _orders(ranks: tuple[PipelineRank, ...]) -> Iterable[tuple[PipelineRank, ...]]:
    """Orders of ``ranks`` to try, the given one first: every distinct one (ranks alike in
    speed and memory are interchangeable) while there are at most ``_MAX_ORDERS``, else the
    given order, by speed each way and by memory each way."""
    kinds = [(r.speed, r.memory) for r in ranks]
    distinct = math.factorial(len(ranks))
    for kind in set(kinds):
        distinct //= math.factorial(kinds.count(kind))
    if distinct > _MAX_ORDERS:
        yield ranks
        for key in (lambda r: r.speed, lambda r: r.memory):
            yield tuple(sorted(ranks, key=key, reverse=True))
            yield tuple(sorted(ranks, key=key))
        return
    yield from _distinct(ranks)


def _distinct(ranks: tuple[PipelineRank, ...]) -> Iterator[tuple[PipelineRank, ...]]:
    """Every order of ``ranks`` with a distinct sequence of kinds, ranks of a kind in their
    given order, in the order ``itertools.permutations`` first yields each (the given one
    first): built directly, in (distinct orders × ranks) steps, where walking every
    permutation took n! (12 ranks of two kinds: minutes)."""
    place = {id(r): i for i, r in enumerate(ranks)}
    left: dict[tuple[float, int], list[PipelineRank]] = {}
    for r in ranks:
        left.setdefault((r.speed, r.memory), []).append(r)
    taken = dict.fromkeys(left, 0)
    order: list[PipelineRank] = []

    def extend() -> Iterator[tuple[PipelineRank, ...]]:
        if len(order) == len(ranks):
            yield tuple(order)
            return
        # Each kind's next rank, by its place in the given order: permutations' order.
        nexts = sorted(
            (place[id(group[taken[kind]])], kind)
            for kind, group in left.items()
            if taken[kind] < len(group)
        )
        for _, kind in nexts:
            order.append(left[kind][taken[kind]])
            taken[kind] += 1
            yield from extend()
            taken[kind] -= 1
            order.pop()

    yield from extend()


def _best_cuts(shape: _Shape, order: Sequence[PipelineRank]) -> list[int] | None:
    """The layer boundaries for ``order``: the least slowest stage among splits that fit, then
    the least total time within it; None when no split fits."""
    count, stages = len(shape.layers), len(order)

    def spans(i: int, end: int) -> Iterable[tuple[int, float]]:
        """(first, seconds) of each fitting stage i ending at ``end``, leaving a layer to each
        stage before it."""
        for first in range(i, end):
            if shape.memory(i, first, end) <= order[i].memory:
                yield first, shape.seconds(order[i], first, end)

    inf = math.inf
    # slowest[i][end]: the least slowest stage over stages 0..i-1 covering layers [0, end).
    slowest = [[inf] * (count + 1) for _ in range(stages + 1)]
    slowest[0][0] = 0.0
    for i in range(stages):
        for end in range(i + 1, count - (stages - i - 1) + 1):
            for first, t in spans(i, end):
                slowest[i + 1][end] = min(slowest[i + 1][end], max(slowest[i][first], t))
    bound = slowest[stages][count]
    if bound == inf:
        return None
    cap = bound * (1 + _SAME)
    # total[i][end]: the least total time of such a prefix with no stage above the bound.
    total = [[inf] * (count + 1) for _ in range(stages + 1)]
    back = [[0] * (count + 1) for _ in range(stages + 1)]
    total[0][0] = 0.0
    for i in range(stages):
        for end in range(i + 1, count - (stages - i - 1) + 1):
            for first, t in spans(i, end):
                if t <= cap and total[i][first] + t < total[i + 1][end]:
                    total[i + 1][end], back[i + 1][end] = total[i][first] + t, first
    cuts = [count]
    for i in range(stages, 0, -1):
        cuts.append(back[i][cuts[-1]])
    return cuts[::-1]
