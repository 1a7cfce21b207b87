"""How many requests a replica takes at once, learned while it serves: its *capacity*.

An inference engine batches continuously: it has no fixed slot count, each request slows as the
batch grows, and past some point it queues requests itself (vLLM's ``num_requests_waiting``)
or grows latency faster than throughput. A router that forwards everything at once loses the
choice of where a request runs; one that holds a fixed guess throttles a fast replica or floods
a slow one. ``ConcurrencyLimit`` learns the number instead, from what the replica shows:

- the engine's published cap (SGLang's ``max_running_requests``): never more than that;
- the engine's queue: when it reports requests waiting on two reads in a row (one can be a
  request between two scheduler steps), the router's share of what runs there now is the
  limit (``in_flight - waiting``);
- each reply's pace (a stream's time per output token, or a whole reply's latency per unit of
  work) against the replica's unloaded pace (the fastest seen, following replies that ran
  alone, so that a replica that became slower for good is not read as overloaded): above
  ``tolerance`` times it, and by more than ``min_excess`` seconds in all, the replica no
  longer keeps up, and the limit drops to ``backoff`` of what runs there, at most once per
  round trip (the replies of one round trip all tell of the same overload);
- a reply that keeps up while the replica is full raises the limit: by one per reply until
  the first sign of overload (doubling per round trip, as TCP's slow start), then by one per
  full round of replies.

A drop below what runs there means nothing new is sent until the replica drains below it. The
dispatcher holds the limit as the device's slots (``Dispatcher.set_slots``), so placement and
the router's own queue follow it; the speed model keeps each request's speed.

Pure code: no clock of its own, no I/O; the router feeds it and a test drives it with numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero.errors import ConfigError

__all__ = ["CapacityOptions", "ConcurrencyLimit"]


@dataclass(frozen=True, slots=True)
class CapacityOptions:
    """How capacity is learned (``hetero serve`` flags ``--capacity-*``)."""

    initial: int = 1
    """Requests at once on a replica whose cap is neither declared nor published, to start; slow
    start doubles it each round trip while replies keep up. One, as TCP's slow start begins
    small: until its first reply, a replica's speed is the fleet's guess, and a replica ten
    times slower than that guess would take every request of a burst before its first reply
    told (two vLLM CPU replicas 25x apart, multi-turn chat: starting at 8, 4% of requests went
    to the slow one, 96% met the SLO; starting at 1, 100%). A fast replica pays a few round
    trips."""
    maximum: int = 4096
    """Never more requests at once than this on one replica."""
    tolerance: float = 8.0
    """A reply slower per unit of work than this many times the replica's unloaded pace means
    the replica does not keep up. A request added while replies run ``r`` times slower than
    alone adds about ``1/r²`` of a lone request's throughput (each step's time grows linearly
    with the batch), so 8 stops where one more adds under 2%. A GPU engine's pace hardly grows
    until its KV cache fills, and then its queue says so; a CPU engine's grows with every
    request while its throughput still does (a vLLM CPU replica: 8x slower per token at 32
    requests, 4.5x the throughput): a tolerance of 2 held it near 4 requests and queued the
    rest in the router."""
    backoff: float = 0.9
    """On overload, the limit becomes this fraction of the requests running there."""
    drift: float = 0.02
    """How fast the unloaded pace follows the replies that ran alone (a fraction of the gap per
    reply), so that it tracks a replica that became slower for good."""
    min_excess: float = 0.05
    """Seconds a slow reply must have lost against its unloaded pace to count: below that the
    difference is the round trip and the router's own work, not the replica (an instant
    replica's replies are several times their unloaded pace whenever the router is busy)."""

    def __post_init__(self) -> None:
        problems = []
        if isinstance(self.initial, bool) or not isinstance(self.initial, int) or self.initial < 1:
            problems.append(("initial", f"must be an integer >= 1, got {self.initial!r}"))
        if isinstance(self.maximum, bool) or not isinstance(self.maximum, int) or self.maximum < 1:
            problems.append(("maximum", f"must be an integer >= 1, got {self.maximum!r}"))
        if not (isinstance(self.tolerance, int | float) and 1 < self.tolerance < math.inf):
            problems.append(("tolerance", f"must be a number > 1, got {self.tolerance!r}"))
        if not (isinstance(self.backoff, int | float) and 0 < self.backoff < 1):
            problems.append(("backoff", f"must be between 0 and 1, got {self.backoff!r}"))
        if not (isinstance(self.drift, int | float) and 0 <= self.drift <= 1):
            problems.append(("drift", f"must be from 0 to 1, got {self.drift!r}"))
        if not (isinstance(self.min_excess, int | float) and 0 <= self.min_excess < math.inf):
            problems.append(("min_excess", f"must be a number >= 0, got {self.min_excess!r}"))
        if problems:
            raise ConfigError(problems)


class ConcurrencyLimit:
    """One replica's learned capacity (see the module's docstring).

    ``declared`` (the user's ``slots=``) is where it starts, not a bound: observation moves it.
    """

    __slots__ = (
        "_hold_until",
        "_waiting_reads",
        "base",
        "cap",
        "growing",
        "limit",
        "options",
        "reason",
    )

    def __init__(self, options: CapacityOptions | None = None, declared: int | None = None) -> None:
        self.options = options = options or CapacityOptions()
        start = declared if declared is not None else options.initial
        self.limit = float(min(start, options.maximum))
        self.cap: int | None = None  # the engine's own, when it publishes one
        self.growing = True  # slow start until the first sign of overload
        # Seconds per unit of each measure ("work": a whole reply's latency per unit of work;
        # "token": a stream's time per output token after the first) when it keeps up.
        self.base: dict[str, float] = {}
        self.reason = "declared" if declared is not None else "initial"
        self._hold_until = -math.inf
        self._waiting_reads = 0

    @property
    def slots(self) -> int:
        """The limit as a whole number of requests (at least one)."""
        return max(1, int(self.limit))

    def set_cap(self, cap: int | None) -> None:
        """The engine publishes how many requests it runs at once (``None``: it stopped saying).
        A first cap replaces the starting guess: the engine's word beats it."""
        if cap is not None and cap < 1:
            return
        first = self.cap is None and self.reason == "initial"
        self.cap = cap
        if cap is None:
            return
        bound = min(cap, self.options.maximum)
        if first or self.limit > bound:
            self.limit = float(bound)
            self.reason = "engine cap"

    def on_load(self, now: float, in_flight: int, waiting: int) -> None:
        """A read of the engine's queue: ``waiting`` requests it has not started while the
        router has ``in_flight`` there."""
        if waiting <= 0 or in_flight <= 0:
            self._waiting_reads = 0
            return
        self._waiting_reads += 1
        if self._waiting_reads < 2:
            return
        running = max(1, in_flight - waiting)
        if running < self.limit:
            self.limit = float(running)
            self.reason = f"engine queued {waiting}"
        self.growing = False
        self._hold_until = now

    def on_reply(
        self,
        now: float,
        in_flight: int,
        pace: float,
        latency: float,
        measure: str = "work",
        units: float = math.inf,
    ) -> None:
        """A reply: ``pace`` seconds per unit of ``measure`` over ``units`` of it, ``latency``
        seconds in all, and ``in_flight`` requests still on the replica after it ended. Each
        measure is compared with its own unloaded value only."""
        if not (pace > 0 and math.isfinite(pace)):
            return
        # A reply too quick to time (a stream whose chunks arrived together, a few tokens)
        # shows no overload and must not set the unloaded pace, which would make every later
        # reply look many times slower.
        if pace * units >= self.options.min_excess and self._slow(measure, in_flight, pace, units):
            if in_flight > 0 and now >= self._hold_until:
                base = self.base[measure]
                self.limit = max(1.0, min(self.limit, in_flight + 1) * self.options.backoff)
                self.reason = f"replies {pace / base:.1f}x slower than unloaded"
                self.growing = False
                self._hold_until = now + latency
            return
        if in_flight + 1 >= self.slots and self._waiting_reads == 0:
            self._grow()

    def _slow(self, measure: str, in_flight: int, pace: float, units: float) -> bool:
        """Fold a timed reply into the unloaded pace; whether it was slower than tolerated,
        and by more than a round trip's noise in all."""
        base = self.base.get(measure)
        if base is None or pace < base:
            self.base[measure] = base = pace
        elif in_flight == 0:
            # It ran alone, or nearly: its pace now is its unloaded pace, which follows a
            # replica that became slower for good.
            self.base[measure] = base = base + self.options.drift * (pace - base)
        options = self.options
        return pace > options.tolerance * base and (pace - base) * units >= options.min_excess

    def _grow(self) -> None:
        step = 1.0 if self.growing else 1.0 / self.limit
        ceiling = float(min(self.cap or self.options.maximum, self.options.maximum))
        if self.limit < ceiling:
            self.limit = min(self.limit + step, ceiling)
            self.reason = "keeps up"
