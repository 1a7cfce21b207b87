"""Per-replica health: a circuit breaker fed by requests and probes, and gray-failure detection.

Pure code over an injected clock, so the state machines are tested without servers or sleeps.

::

    closed ──(threshold failures in a row)──► open ──(cooldown passed, a probe answers)──► half_open
       ▲                                        ▲                                              │
       └───────────(a request succeeds)─────────┼──────────────(a failure)─────────────────────┘

A half-open replica takes requests again: the first one decides. A health probe never closes a
circuit by itself, nor clears a closed one's failures: a hung replica still answers its health
check.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from enum import Enum

__all__ = ["Breaker", "CircuitState", "gray_replicas"]


class CircuitState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return str(self.value)


class Breaker:
    """Opens after ``threshold`` consecutive failures; after ``cooldown`` seconds a probe that
    answers half-opens it, and then the next request's outcome closes or reopens it."""

    def __init__(self, threshold: int = 3, cooldown: float = 5.0) -> None:
        if threshold < 1:
            raise ValueError(f"breaker threshold must be >= 1, got {threshold}")
        if not cooldown > 0:
            raise ValueError(f"breaker cooldown must be > 0 seconds, got {cooldown!r}")
        self.threshold = threshold
        self.cooldown = cooldown
        self.state = CircuitState.CLOSED
        self.failures = 0  # in a row
        self.opened_at = 0.0
        self.last_error = ""

    def failure(self, now: float, reason: str, may_open: bool = True) -> bool:
        """Count a failure; True when this one opened the circuit. ``may_open=False`` counts it
        and leaves the circuit as it is (the replica is the last one of its model)."""
        self.failures += 1
        self.last_error = reason
        if self.state is CircuitState.OPEN or not may_open:
            return False
        if self.state is CircuitState.HALF_OPEN or self.failures >= self.threshold:
            self.state = CircuitState.OPEN
            self.opened_at = now
            return True
        return False

    def success(self) -> bool:
        """A request succeeded; True when that closed a half-open circuit. An open circuit
        stays open: the request began before it opened."""
        if self.state is CircuitState.OPEN:
            return False
        self.failures = 0
        if self.state is CircuitState.CLOSED:
            return False
        self.state = CircuitState.CLOSED
        return True

    def probe_ok(self, now: float) -> bool:
        """A health probe answered; True when that half-opened an open circuit whose cooldown
        has passed (it may take requests again)."""
        if self.state is CircuitState.OPEN and now - self.opened_at >= self.cooldown:
            self.state = CircuitState.HALF_OPEN
            return True
        return False


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
