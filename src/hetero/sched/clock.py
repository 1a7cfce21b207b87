"""Clocks. Policies and the dispatcher read time only through a ``Clock``, so the simulator's
virtual clock, a test's manual clock and the router's real clock are interchangeable."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from operator import getitem, setitem
from typing import Protocol

__all__ = ["Clock", "ManualClock", "MonotonicClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary, fixed origin; never goes backwards."""
        ...


class MonotonicClock:
    """Real time (``time.monotonic``)."""

    __slots__ = ()

    #: ``time.monotonic`` itself rather than a method that calls it: the router reads the clock
    #: about seven times a request, and a Python frame per read was most of its cost.
    now = staticmethod(time.monotonic)


class ManualClock:
    """Time that moves only when told: the clock of tests and of the simulator."""

    __slots__ = ("_time", "now")

    def __init__(self, start: float = 0.0) -> None:
        self._time = [start]
        # A read without a Python frame: the simulator's dispatcher asks for every event.
        self.now: Callable[[], float] = partial(getitem, self._time, 0)  # type: ignore[assignment]

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        self._time[0] += seconds

    def set(self, t: float) -> None:
        if t < self._time[0]:
            raise ValueError(f"cannot move a clock backwards (from {self._time[0]} to {t})")
        self._time[0] = t

    def setter(self) -> Callable[[float], None]:
        """``set`` without the check, and without a Python frame: for a caller whose times
        never go back (the simulator, which takes them in order from its event heap)."""
        return partial(setitem, self._time, 0)
