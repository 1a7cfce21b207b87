"""Device health in the core: why a device takes no new work (``Hold``), and the circuit
breaker that engine devices and replicas alike are judged by.

Pure code over an injected clock, so the state machines are tested without servers or sleeps.

::

    closed ──(threshold failures in a row)──► open ──(cooldown passed, a probe answers)──► half_open
       ▲                                        ▲                                              │
       └───────────(a request succeeds)─────────┼──────────────(a failure)─────────────────────┘

A half-open device takes work again: the first item's outcome decides. A probe (a replica's health
check, an engine's fresh worker) never closes a circuit by itself, nor clears a closed one's
failures: a hung replica still answers its health check.
"""

from __future__ import annotations

from enum import Enum

from hetero.errors import ConfigError

__all__ = ["Breaker", "CircuitState", "Hold"]


class Hold(str, Enum):
    """A reason a device takes no new work (``Dispatcher.hold``). Holds add up: the device takes
    work again once the last is released. Work queued there moves elsewhere; what runs there
    finishes, unless the executor stops it."""

    DRAINING = "draining"  # asked to: by an operator, or before it leaves
    CIRCUIT_OPEN = "circuit open"  # failed too often in a row; a cooldown and a trial follow
    GRAY = "gray failure"  # far slower than the devices declared like it, for a cooldown
    SATURATED = "saturated"  # its engine refused work (HTTP 429) until its retry-after
    STOPPING = "stopping a task"  # its worker is stopping a task and has not let go of it
    REMOVED = "removed"  # left the fleet (``Dispatcher.remove_device``)

    def __str__(self) -> str:
        return str(self.value)


class CircuitState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"

    def __str__(self) -> str:
        return str(self.value)


class Breaker:
    """Opens after ``threshold`` consecutive failures; after ``cooldown`` seconds a probe that
    answers half-opens it, and then the next item's outcome closes or reopens it."""

    def __init__(self, threshold: int = 3, cooldown: float = 5.0) -> None:
        if threshold < 1:
            raise ConfigError([("breaker_threshold", f"must be >= 1, got {threshold!r}")])
        if not cooldown > 0:
            raise ConfigError([("breaker_cooldown", f"must be > 0 seconds, got {cooldown!r}")])
        self.threshold = threshold
        self.cooldown = cooldown
        self.state = CircuitState.CLOSED
        self.failures = 0  # in a row
        self.opened_at = 0.0
        self.last_error = ""

    def failure(self, now: float, reason: str, may_open: bool = True) -> bool:
        """Count a failure; True when this one opened the circuit. ``may_open=False`` counts it
        and leaves the circuit as it is (the device is the last that can serve some work)."""
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
        """An item succeeded; True when that closed a half-open circuit. An open circuit stays
        open: the item began before it opened."""
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
