"""Policies that read live load: connections, outstanding work and expected delay."""

from __future__ import annotations

import bisect

import numpy as np

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policy import BoolArray, Policy, masked_argmin
from hetero.sched.registry import register
from hetero.sched.view import FleetView

__all__ = [
    "LeastConnections",
    "LeastWork",
    "PowerOfTwo",
    "ShortestExpectedDelay",
    "WeightedLeastConnections",
]


@register
class LeastConnections(Policy):
    """The device with the fewest items placed on it. Good for identical devices and items of
    unknown size; on a mixed fleet it still over-feeds slow devices."""

    name = "least_connections"

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        return masked_argmin(view.in_flight.astype(np.float64), mask)


@register
class WeightedLeastConnections(Policy):
    """Fewest items per unit of speed: ``(in flight + 1) / speed``. A good choice when item
    sizes are unknown or similar: it needs no cost estimates."""

    name = "weighted_least_connections"

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        return masked_argmin((view.in_flight + 1) * view.inv_speed(item.kind), allowed)


@register
class LeastWork(Policy):
    """The device with the least outstanding work (estimated cost), whatever its speed. Use when
    costs are known and devices are alike; on a mixed fleet prefer shortest_expected_delay."""

    name = "least_work"

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        return masked_argmin(view.outstanding, mask)


def check_overtake_weight(overtake_weight: float) -> None:
    if not 0 <= overtake_weight < float("inf"):
        raise ConfigError(f"option overtake_weight={overtake_weight!r}; allowed: a number >= 0")


@register
class ShortestExpectedDelay(Policy):
    """The device that would finish the item soonest: ``(work ahead of it + cost) / speed``.

    Often the lowest mean latency on a mixed fleet when item costs are known (tokens, FLOPs):
    it sends work to fast devices until their queues make a slower one quicker. With
    size-ordered queues it counts only the work the item would really wait for, plus the delay
    it adds to the larger items it passes (``overtake_weight``). The default strategy,
    ``tail_budget``, builds on it for a lower median and tail.
    """

    name = "shortest_expected_delay"
    places_by_delay = True

    def __init__(self, *, overtake_weight: float = 2.0) -> None:
        check_overtake_weight(overtake_weight)
        self.overtake_weight = overtake_weight

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        inv = view.perf.inv_speed(item.kind)
        # inv_speed is inf on unusable devices, so without a mask no extra pass is needed.
        if allowed is None:
            return view.soonest(item.cost, inv, self.overtake_weight)
        return masked_argmin(view.delay_score(item.cost, inv, self.overtake_weight), allowed)


@register
class PowerOfTwo(Policy):
    """Two different devices sampled in proportion to their speed as now learned; the one with
    the lower expected delay wins (counted as ``shortest_expected_delay`` does,
    ``overtake_weight`` included).

    Near shortest_expected_delay's quality at O(log n) per decision, and without herding when
    many routers decide at once on slightly stale load: use it for very large fleets.
    """

    name = "power_of_two"

    def __init__(self, *, seed: int | None = None, overtake_weight: float = 2.0) -> None:
        check_overtake_weight(overtake_weight)
        self.overtake_weight = overtake_weight
        self._rng = np.random.default_rng(seed)
        self._cumulative: list[float] = []
        self._seen = -1  # PerfModel.changes when _cumulative was built
        self._age = 0  # picks since

    def bind(self, view: FleetView) -> None:
        self._cumulative = np.cumsum(view.speed()).tolist()
        self._seen = view.perf.changes
        self._age = 0

    def _sample(self, mask: BoolArray, other: int = -1) -> int | None:
        cumulative = self._cumulative
        total = cumulative[-1]
        for _ in range(8):
            i = bisect.bisect_right(cumulative, float(self._rng.random()) * total)
            i = min(i, len(cumulative) - 1)
            if mask[i] and i != other:
                return i
        return None

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        # Sample by the speeds learned since, not the priors: rebuilt when they changed, at
        # most once per len/16 picks so that a large fleet keeps O(log n) per pick on average.
        self._age += 1
        if view.perf.changes != self._seen and self._age * 16 >= len(self._cumulative):
            self.bind(view)
        mask = view.usable if allowed is None else allowed
        a = self._sample(mask)
        b = None if a is None else self._sample(mask, a)
        inv = view.inv_speed(item.kind)
        cost, weight = item.cost, self.overtake_weight
        if a is None or b is None:
            # Few devices allowed: sampling keeps missing, so rank them all.
            return masked_argmin(view.delay_score(cost, inv, weight), mask)
        delay_a = view.delay_at(a, cost, float(inv[a]), weight)
        delay_b = view.delay_at(b, cost, float(inv[b]), weight)
        return a if delay_a <= delay_b else b
