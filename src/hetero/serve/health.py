"""Per-replica health: a circuit breaker fed by requests and probes, and gray-failure detection.

Pure code over an injected clock, so the state machines are tested without servers or sleeps.

::

    closed ──(threshold failures in a row)──► open ──(cooldown passed)──► half_open
       ▲                                        ▲                            │
       └──────────────(a success)───────────────┼────────────(a failure)─────┘
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Breaker", "CircuitState", "gray_replicas"]


class CircuitState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return str(self.value)


class Breaker:
    """Opens after ``threshold`` consecutive failures; after ``cooldown`` seconds one probe
    (a health check) may close it again, and a failure then reopens it at once."""

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

    def failure(self, now: float, reason: str) -> bool:
        """Count a failure; True when this one opened the circuit."""
        self.failures += 1
        self.last_error = reason
        if self.state is CircuitState.OPEN:
            return False
        if self.state is CircuitState.HALF_OPEN or self.failures >= self.threshold:
            self.state = CircuitState.OPEN
            self.opened_at = now
            return True
        return False

    def success(self) -> bool:
        """Count a success; True when it closed an open or half-open circuit."""
        self.failures = 0
        if self.state is CircuitState.CLOSED:
            return False
        self.state = CircuitState.CLOSED
        return True

    def may_probe(self, now: float) -> bool:
        """Whether an open circuit has cooled down (it turns half-open: one probe decides)."""
        if self.state is CircuitState.OPEN and now - self.opened_at >= self.cooldown:
            self.state = CircuitState.HALF_OPEN
        return self.state is not CircuitState.OPEN


def gray_replicas(
    learned: list[float], prior: list[float], completed: list[int], ratio: float, min_done: int
) -> list[int]:
    """Positions of replicas far slower than their device class: learned speed over prior
    below ``ratio`` times the fleet's median of that quotient (so the prior's unit cancels),
    counting only replicas with at least ``min_done`` completions."""
    quotients = [
        (i, learned[i] / prior[i])
        for i in range(len(learned))
        if completed[i] >= min_done and prior[i] > 0
    ]
    if len(quotients) < 2:
        return []  # nothing to compare with
    ordered = sorted(q for _, q in quotients)
    median = ordered[len(ordered) // 2]
    # Far below, not at the edge: a quotient equal to the bound up to rounding is not gray.
    bound = ratio * median * (1 - 1e-9)
    return [i for i, q in quotients if q < bound]
