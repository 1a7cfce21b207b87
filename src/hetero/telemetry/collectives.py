"""What a rank spends in collectives: per op name, the calls, the seconds blocked in them and the
bytes passed.

``hetero.comm`` records every call into this process's :data:`RECORDER`; a profile takes the
difference of two snapshots (:meth:`RankCollectives.since`). Free of torch, so that the
profiler reads it without the optional extra. Times are ``time.monotonic()`` seconds, one
clock for every process of a Linux machine, so the windows of ranks on one machine compare.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetero.errors import HeteroError

__all__ = [
    "RECORDER",
    "CollectiveRecorder",
    "OpStats",
    "RankCollectives",
    "merge_ranks",
    "read_rank_files",
]


@dataclass(slots=True, frozen=True)
class OpStats:
    """One op's calls on one rank: ``count`` calls, ``seconds`` the rank spent blocked in them
    (an async call's issue and its ``wait()``), ``bytes`` the size of the tensors it passed."""

    count: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def __add__(self, other: OpStats) -> OpStats:
        return OpStats(
            self.count + other.count, self.seconds + other.seconds, self.bytes + other.bytes
        )

    def __sub__(self, other: OpStats) -> OpStats:
        return OpStats(
            self.count - other.count, self.seconds - other.seconds, self.bytes - other.bytes
        )


@dataclass(slots=True, frozen=True)
class RankCollectives:
    """One rank's collectives over the window ``started`` → ``ended``, by op name
    (``all_reduce``, ``reduce``, ``broadcast``, ``all_gather``, ``all_gather_object``,
    ``reduce_scatter``, ``all_to_all``, ``barrier``, ``send``, ``recv``)."""

    rank: int
    world_size: int
    ops: dict[str, OpStats] = field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0

    @property
    def calls(self) -> int:
        return sum(s.count for s in self.ops.values())

    @property
    def seconds(self) -> float:
        return math.fsum(s.seconds for s in self.ops.values())

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.ops.values())

    @property
    def share(self) -> float | None:
        """``seconds`` over the window: the part of the rank's time spent in collectives;
        ``None`` for an empty window."""
        span = self.ended - self.started
        return self.seconds / span if span > 0 else None

    def since(self, earlier: RankCollectives) -> RankCollectives:
        """What happened between the snapshot ``earlier`` and this one (ops with no call
        left out)."""
        ops = {}
        for name, stats in self.ops.items():
            delta = stats - earlier.ops.get(name, OpStats())
            if delta.count or delta.seconds > 0:
                ops[name] = delta
        return RankCollectives(self.rank, self.world_size, ops, earlier.ended, self.ended)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RankCollectives:
        """The inverse of :meth:`to_dict`; ``ValueError`` or ``KeyError`` or ``TypeError``
        where ``data`` is not one."""
        ops = {
            str(name): OpStats(int(op["count"]), float(op["seconds"]), int(op["bytes"]))
            for name, op in dict(data["ops"]).items()
        }
        return cls(
            int(data["rank"]),
            int(data["world_size"]),
            ops,
            float(data["started"]),
            float(data["ended"]),
        )


class CollectiveRecorder:
    """This process's running totals, by op name; they only grow, so any number of readers
    (``hetero.comm.stats``, each open profile) measure their own windows by difference."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, OpStats] = {}
        self._rank = 0
        self._world_size = 1
        self._created = time.monotonic()

    def join(self, rank: int, world_size: int) -> None:
        """Which rank the calls that follow are made by (``hetero.comm.init`` says)."""
        with self._lock:
            self._rank, self._world_size = rank, world_size

    def record(self, op: str, seconds: float, nbytes: int, calls: int = 1) -> None:
        """Add a call of ``op`` (``calls=0``: more time of one already counted, as an async
        call's ``wait()``)."""
        with self._lock:
            self._totals[op] = self._totals.get(op, OpStats()) + OpStats(calls, seconds, nbytes)

    def snapshot(self) -> RankCollectives:
        """The totals so far, as a window from this recorder's creation to now."""
        with self._lock:
            return RankCollectives(
                self._rank, self._world_size, dict(self._totals), self._created, time.monotonic()
            )


#: This process's recorder, which ``hetero.comm`` feeds.
RECORDER = CollectiveRecorder()


def merge_ranks(parts: Iterable[RankCollectives]) -> list[RankCollectives]:
    """One entry per rank, in rank order: the parts of a rank (a restarted rank's processes,
    say) summed op by op over the union of their windows."""
    by_rank: dict[int, RankCollectives] = {}
    for part in parts:
        seen = by_rank.get(part.rank)
        if seen is None:
            by_rank[part.rank] = part
            continue
        ops = dict(seen.ops)
        for name, stats in part.ops.items():
            ops[name] = ops.get(name, OpStats()) + stats
        by_rank[part.rank] = RankCollectives(
            part.rank,
            max(seen.world_size, part.world_size),
            ops,
            min(seen.started, part.started),
            max(seen.ended, part.ended),
        )
    return [by_rank[r] for r in sorted(by_rank)]


def read_rank_files(paths: Iterable[Path]) -> list[RankCollectives]:
    """The files that ranks profiled under ``HETERO_PROFILE_DIR`` wrote
    (``<name>.collectives.<pid>.json``), merged per rank (:func:`merge_ranks`). Raises
    :class:`HeteroError` naming a file that cannot be read or is not such a file."""
    parts = []
    for path in paths:
        try:
            parts.append(RankCollectives.from_dict(json.loads(path.read_text("utf-8"))))
        except OSError as exc:
            raise HeteroError(f"cannot read {path}: {exc.strerror or exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise HeteroError(
                f"{path} is not a rank's collective record (from hetero.comm under "
                f"HETERO_PROFILE_DIR): {type(exc).__name__}: {exc}"
            ) from exc
    return merge_ranks(parts)
