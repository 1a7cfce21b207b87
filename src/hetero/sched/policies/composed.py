"""Named policies built from a filter or tiers in front of a ranking policy."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policies.filters import AffinityFilter, CapacityFilter
from hetero.sched.policies.selectors import select
from hetero.sched.policy import BoolArray, Composite, Policy, masked_argmin
from hetero.sched.registry import make_policy, register
from hetero.sched.view import FleetView

__all__ = ["AffinityPolicy", "CapacityAware", "Tiered"]


def _ranker(name: str) -> Policy:
    return make_policy(name, field="scheduler.options.ranker")


@register
class CapacityAware(Composite):
    """Memory first, then load: only devices whose free memory fits the item, ranked by
    ``ranker`` (default shortest_expected_delay). Use when items differ a lot in memory (long
    contexts, big batches) so that nothing is sent where it would run out of memory."""

    name = "capacity_aware"

    def __init__(self, *, on_no_fit: str = "wait", ranker: str = "shortest_expected_delay") -> None:
        super().__init__([CapacityFilter(on_no_fit)], _ranker(ranker))


@register
class AffinityPolicy(Composite):
    """Kinds of work bound to device sets by tag (``rules: {vision: [A100-80GB], small: [T4]}``),
    ranked by ``ranker`` inside the set. Use to keep a model on the devices that hold its weights
    or to reserve big devices for big work; ``fallback`` decides whether bound work may spill."""

    name = "affinity"

    def __init__(
        self,
        *,
        rules: Mapping[str, Sequence[str]],
        fallback: bool = True,
        ranker: str = "shortest_expected_delay",
    ) -> None:
        super().__init__([AffinityFilter(rules, fallback)], _ranker(ranker))


@register
class Tiered(Policy):
    """Complexity thresholds map items to device tiers (``thresholds: [100, 1000]`` and three
    ``tiers`` of selectors, cheapest first); balanced by expected delay inside a tier, and an
    item overflows to the next tier up when every device of its tier has ``saturation`` × slots
    items. Use to keep small requests on small devices and big ones on big devices."""

    name = "tiered"
    places_by_delay = True

    def __init__(
        self,
        *,
        thresholds: Sequence[float],
        tiers: Sequence[Sequence[str]],
        saturation: float = 2.0,
    ) -> None:
        thresholds = [float(t) for t in thresholds]
        if any(b <= a for a, b in itertools.pairwise(thresholds)):
            raise ConfigError(f"option thresholds={thresholds!r}; allowed: strictly increasing")
        if len(tiers) != len(thresholds) + 1:
            raise ConfigError(
                f"option tiers has {len(tiers)} tiers; allowed: len(thresholds) + 1 = "
                f"{len(thresholds) + 1}"
            )
        if not saturation > 0:
            raise ConfigError(f"option saturation={saturation!r}; allowed: > 0")
        self.thresholds = thresholds
        self.tiers = [list(t) for t in tiers]
        self.saturation = saturation
        self._masks: list[npt.NDArray[np.bool_]] = []

    def bind(self, view: FleetView) -> None:
        self._masks = [select(t, view, f"tiers[{k}]") for k, t in enumerate(self.tiers)]

    def admits(self, item: WorkItem, view: FleetView, index: int) -> bool:
        own = bisect.bisect_right(self.thresholds, item.tier_key)
        return bool(view.usable[index]) and any(m[index] for m in self._masks[own:])

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        base = view.usable if allowed is None else allowed
        own = bisect.bisect_right(self.thresholds, item.tier_key)
        first: npt.NDArray[np.bool_] | None = None
        for mask in self._masks[own:]:
            here = base & mask
            if not here.any():
                continue  # a tier with nothing usable overflows too
            if first is None:
                first = here
            if (view.in_flight[here] < view.slots[here] * self.saturation).any():
                return masked_argmin(view.expected_delay(item.kind, item.cost), here)
        # Every tier from its own up is saturated: queue in the first usable one, or anywhere.
        return masked_argmin(
            view.expected_delay(item.kind, item.cost), first if first is not None else base
        )
