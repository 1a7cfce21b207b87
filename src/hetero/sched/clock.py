"""Clocks. Policies and the dispatcher read time only through a ``Clock``, so the simulator's
virtual clock, a test's manual clock and the router's real clock are interchangeable."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary, fixed origin; never goes backwards."""
        ...


class MonotonicClock:
    """Real time (``time.monotonic``)."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """Time that moves only when told: the clock of tests and of the simulator."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        self._now += seconds

    def set(self, t: float) -> None:
        if t < self._now:
            raise ValueError(f"cannot move a clock backwards (from {self._now} to {t})")
        self._now = t
