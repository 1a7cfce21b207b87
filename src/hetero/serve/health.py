"""Gray-failure detection for replicas: one far slower than the replicas declared like it.

Pure code, so it is tested without servers. The circuit breaker every device is judged by lives
in the core (``hetero.sched.health``).
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence

__all__ = ["gray_replicas"]


def gray_replicas(
    learned: Sequence[float],
    classes: Sequence[Hashable | None],
    completed: Sequence[int],
    ratio: float,
    min_done: int,
) -> list[tuple[int, float]]:
    """Replicas far slower than their peers, as ``(position, its speed over its peers'
    median)``: a learned speed below ``ratio`` times the median of the replicas of its class
    (declared alike: the same ``classes`` entry; ``None`` is no class and is never compared),
    counting only replicas with at least ``min_done`` completions."""
    peers: dict[Hashable, list[int]] = {}
    for i, kind in enumerate(classes):
        if kind is not None and completed[i] >= min_done:
            peers.setdefault(kind, []).append(i)
    gray = []
    for members in peers.values():
        if len(members) < 2:
            continue  # nothing to compare with
        # The true median: of two replicas, their mean, so that neither is its own yardstick.
        median = statistics.median(learned[i] for i in members)
        # Far below, not at the edge: a speed equal to the bound up to rounding is not gray.
        bound = ratio * median * (1 - 1e-9)
        gray += [(i, learned[i] / median) for i in members if learned[i] < bound]
    return sorted(gray)
