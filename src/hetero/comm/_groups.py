"""Process subgroups: ``new_group`` and the ``group=`` every call takes.

A call given a group runs among its ranks alone; on a rank outside it the call takes no part:
it checks its arguments as everywhere, then returns at once, its tensors untouched (the calls
that return a list return an empty one). So code can make the same calls on every rank, as
seed-style ``if rank in group`` code need not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hetero.comm._base import STATE, boundary, require
from hetero.errors import ConfigError, HeteroError

__all__ = ["Group", "new_group"]


@dataclass(frozen=True, slots=True, eq=False)
class Group:
    """Ranks that run collectives among themselves, made by :func:`new_group`.

    ``ranks`` are their ranks in the world, ascending; the i-th entry of a group call's per-rank
    list (``all_gather``'s result, ``reduce_scatter``'s and ``all_to_all``'s inputs) belongs to
    ``ranks[i]``. ``src`` and ``dst`` stay ranks in the world and must be members.
    """

    ranks: tuple[int, ...]
    _pg: Any = field(repr=False)  # torch's group; None on a rank outside it
    _generation: int = field(repr=False)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def member(self) -> bool:
        """Whether this rank is in the group."""
        return self._pg is not None

    @property
    def torch_group(self) -> Any:
        """torch.distributed's group, for the torch APIs that take one (``PipelineStage``);
        None on a rank outside it."""
        return self._pg

    def __contains__(self, rank: object) -> bool:
        return rank in self.ranks

    def rank(self) -> int:
        """This rank's index in the group (its place in ``ranks``)."""
        me = dist.get_rank()
        if not self.member:
            raise HeteroError(
                f"rank {me} is not in the group of ranks {list(self.ranks)}; ask group.member first"
            )
        return self.ranks.index(me)


def new_group(ranks: Iterable[int]) -> Group:
    """A group of ``ranks`` (ranks in the world, in any order; the group orders them).

    Every rank of the world must call it, members or not, with the same ranks, and make its
    groups in the same order as the others: it waits until all have. It lives until
    ``destroy()``; collectives on it time out after ``init``'s ``timeout``, as on the world.
    """
    require()
    n = dist.get_world_size()
    try:
        chosen = list(ranks)
    except TypeError:
        raise ConfigError(
            [("ranks", f"must be a list of ranks, got {type(ranks).__name__}")]
        ) from None
    if not chosen:
        raise ConfigError([("ranks", "needs at least one rank, got none")])
    for r in chosen:
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
            raise ConfigError([("ranks", f"must be ranks in [0, {n}), got {r!r}")])
    repeated = sorted({r for r in chosen if chosen.count(r) > 1})
    if repeated:
        raise ConfigError([("ranks", f"names rank {repeated[0]} more than once; list each once")])
    members = tuple(sorted(chosen))
    with boundary(f"new_group({list(members)})"):
        pg = dist.new_group(list(members), timeout=STATE.timeout)
    inside = dist.get_rank() in members
    return Group(members, pg if inside else None, STATE.generation)


@dataclass(frozen=True, slots=True)
class Scope:
    """Where one call runs: torch's group (None: the world, or a group this rank is not in),
    its ranks in order, this rank's index among them (None: not a member, so the call does
    nothing here), and whether it is the world."""

    pg: Any
    ranks: tuple[int, ...]
    index: int | None
    world: bool = False

    @property
    def size(self) -> int:
        return len(self.ranks)


def scope(group: Group | None) -> Scope:
    """The scope of a call given ``group``, which must be this process group's."""
    require()
    if group is None:
        return Scope(None, tuple(range(dist.get_world_size())), dist.get_rank(), world=True)
    if not isinstance(group, Group):
        raise ConfigError(
            [
                (
                    "group",
                    "must be a Group from hetero.comm.new_group() or None (the world), got "
                    f"{type(group).__name__}",
                )
            ]
        )
    if group._generation != STATE.generation:
        raise HeteroError(
            f"the group of ranks {list(group.ranks)} belonged to a process group that "
            "hetero.comm.destroy() ended; make it again with new_group()"
        )
    index = group.ranks.index(dist.get_rank()) if group.member else None
    return Scope(group._pg, group.ranks, index)


def rank_arg(name: str, value: object, where: Scope) -> int:
    """``value`` as a rank of ``where`` (a rank in the world that is a member)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in where.ranks:
        if where.world:
            allowed = f"a rank in [0, {where.size})"
        else:
            allowed = f"a rank of the group {list(where.ranks)}"
        raise ConfigError([(name, f"must be {allowed}, got {value!r}")])
    return value


def peer_arg(name: str, value: object, where: Scope) -> int:
    """``value`` as a rank of ``where`` other than this one."""
    rank = rank_arg(name, value, where)
    if rank == dist.get_rank():
        raise ConfigError([(name, f"must be another rank than this one ({rank})")])
    return rank


def per_rank(where: Scope) -> str:
    """How the per-rank lists' length is stated in errors."""
    return f"one tensor per rank{'' if where.world else ' of the group'} ({where.size})"
