"""The experts of a mixture-of-experts layer placed on ranks by speed within memory.

A gate that spreads tokens evenly over E experts of one shape sends each about the same
number, so a rank's share of the layer's expert work is its number of experts, and its time
that number over its speed. ``place_experts`` gives every rank at least one expert and then
minimises the slowest rank's ``experts / speed``: the largest experts first, each to the rank
whose time after taking it is least among the ranks it fits (the experts' state, ``memory``,
left over), keeping one expert back for each rank still without one. For experts of one size
that is the least slowest rank there is (the apportionment's greedy, exact for min-max);
experts of different sizes make the fit a bin packing, which this greedy may find no layout for
where one exists, and it says so. ``place_experts_evenly`` is the layout that ignores speed
(contiguous runs of near-equal length), to compare with. Pure code: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetero._checks import is_integer, is_positive
from hetero.errors import ConfigError
from hetero.train.stages import even_counts
from hetero.units import format_size

__all__ = ["ExpertPlacement", "ExpertRank", "place_experts", "place_experts_evenly"]


@dataclass(frozen=True, slots=True)
class ExpertRank:
    """A rank of the process group, its relative ``speed`` and the ``memory`` (bytes) it has
    for experts' state."""

    rank: int
    speed: float
    memory: int


@dataclass(frozen=True, slots=True)
class ExpertPlacement:
    """``owners[e]`` is the rank that holds expert ``e``; ``ranks`` in rank order (0 .. R − 1),
    ``expert_bytes[e]`` the state expert ``e`` holds."""

    owners: tuple[int, ...]
    ranks: tuple[ExpertRank, ...]
    expert_bytes: tuple[int, ...]

    def experts_of(self, rank: int) -> tuple[int, ...]:
        """The experts ``rank`` holds, ascending."""
        return tuple(e for e, owner in enumerate(self.owners) if owner == rank)

    @property
    def counts(self) -> tuple[int, ...]:
        """Each rank's number of experts, in rank order."""
        return tuple(self.owners.count(r.rank) for r in self.ranks)

    def memory(self, rank: int) -> int:
        """The bytes of ``rank``'s experts."""
        return sum(
            b for b, owner in zip(self.expert_bytes, self.owners, strict=True) if owner == rank
        )

    def load(self, rank: int) -> float:
        """``rank``'s experts over its speed: its time for the layer's expert work, relative."""
        return len(self.experts_of(rank)) / self.ranks[rank].speed

    @property
    def slowest(self) -> ExpertRank:
        """The rank of the largest ``load``, which sets the layer's pace."""
        return max(self.ranks, key=lambda r: self.load(r.rank))

    def to_dict(self) -> dict[str, Any]:
        return {
            "owners": list(self.owners),
            "ranks": [
                {
                    "rank": r.rank,
                    "speed": r.speed,
                    "experts": list(self.experts_of(r.rank)),
                    "memory": self.memory(r.rank),
                    "limit": r.memory,
                }
                for r in self.ranks
            ],
        }


def place_experts(expert_bytes: Sequence[int], ranks: Sequence[ExpertRank]) -> ExpertPlacement:
    """Each of ``len(expert_bytes)`` experts (their state in bytes) on one of ``ranks``, in
    proportion to speed within every rank's memory, each rank holding at least one."""
    sizes, by_rank = _checked(expert_bytes, ranks)
    free = {r.rank: r.memory for r in by_rank}
    held = {r.rank: 0 for r in by_rank}
    owners = [-1] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda e: (-sizes[e], e))
    for placed, e in enumerate(order):
        fits = [r for r in by_rank if free[r.rank] >= sizes[e]]
        empty = [r for r in fits if held[r.rank] == 0]
        # Keep the last experts for the ranks still without one.
        if sum(1 for n in held.values() if n == 0) >= len(sizes) - placed:
            fits = empty
        if not fits:
            raise ConfigError([("memory", _no_fit(sizes, by_rank))])
        best = min(fits, key=lambda r: ((held[r.rank] + 1) / r.speed, r.rank))
        owners[e] = best.rank
        held[best.rank] += 1
        free[best.rank] -= sizes[e]
    return ExpertPlacement(tuple(owners), by_rank, sizes)


def place_experts_evenly(
    expert_bytes: Sequence[int], ranks: Sequence[ExpertRank]
) -> ExpertPlacement:
    """The experts in contiguous runs of near-equal length, rank 0 the first (speed ignored);
    refused when a rank's run does not fit its memory."""
    sizes, by_rank = _checked(expert_bytes, ranks)
    owners: list[int] = []
    for r, count in zip(by_rank, even_counts(len(sizes), len(by_rank)), strict=True):
        owners += [r.rank] * count
    placement = ExpertPlacement(tuple(owners), by_rank, sizes)
    for r in by_rank:
        if placement.memory(r.rank) > r.memory:
            experts = placement.experts_of(r.rank)
            raise ConfigError(
                [
                    (
                        "memory",
                        f"rank {r.rank}'s even share, experts {experts[0]}-{experts[-1]}, needs "
                        f"{_size(placement.memory(r.rank))}, above its memory of "
                        f"{_size(r.memory)}: use place_experts, which sizes shares by memory",
                    )
                ]
            )
    return placement


def _checked(
    expert_bytes: Sequence[int], ranks: Sequence[ExpertRank]
) -> tuple[tuple[int, ...], tuple[ExpertRank, ...]]:
    """The sizes and the ranks in rank order, or a ConfigError with every problem; then
    one naming an expert no rank can hold."""
    problems: list[tuple[str, str]] = []
    for e, size in enumerate(expert_bytes):
        if not is_integer(size) or size < 0:
            problems.append((f"expert_bytes[{e}]", f"must be bytes >= 0, got {size!r}"))
    if not expert_bytes:
        problems.append(("expert_bytes", "needs at least one expert, got none"))
    for i, r in enumerate(ranks):
        if not is_positive(r.speed):
            problems.append((f"ranks[{i}].speed", f"must be > 0, got {r.speed!r}"))
        if not is_integer(r.memory) or r.memory <= 0:
            problems.append((f"ranks[{i}].memory", f"must be bytes > 0, got {r.memory!r}"))
    numbers = sorted(r.rank for r in ranks if is_integer(r.rank))
    if numbers != list(range(len(ranks))):
        listed = [r.rank for r in ranks]
        problems.append(("ranks", f"must be ranks 0 .. {len(ranks) - 1}, each once, got {listed}"))
    if ranks and len(expert_bytes) < len(ranks):
        problems.append(
            (
                "ranks",
                f"{len(ranks)} ranks for {len(expert_bytes)} experts: every rank holds at "
                f"least one expert, so use at most {len(expert_bytes)} ranks or more experts",
            )
        )
    if problems:
        raise ConfigError(problems)
    by_rank = tuple(sorted(ranks, key=lambda r: r.rank))
    largest = max(by_rank, key=lambda r: (r.memory, -r.rank))
    for e, size in enumerate(expert_bytes):
        if size > largest.memory:
            raise ConfigError(
                [
                    (
                        "memory",
                        f"expert {e} needs {_size(size)}, more than the largest rank, rank "
                        f"{largest.rank} with {_size(largest.memory)}: give a rank more memory "
                        "or make the experts smaller",
                    )
                ]
            )
    return tuple(expert_bytes), by_rank


def _no_fit(sizes: tuple[int, ...], ranks: tuple[ExpertRank, ...]) -> str:
    return (
        f"found no layout of the {len(sizes)} experts ({_size(sum(sizes))} in all, one at "
        f"least on each rank) within the {len(ranks)} ranks' memory ("
        f"{', '.join(_size(r.memory) for r in ranks)}): add memory or ranks, or make the "
        "experts smaller"
    )


def _size(n: int) -> str:
    return f"{n:,} bytes ({format_size(n)})"
