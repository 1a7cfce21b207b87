"""``tail_budget``: shortest expected delay that keeps the fastest devices for the items that
need them."""

from __future__ import annotations

import math

import numpy as np

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policies.load import check_overtake_weight
from hetero.sched.policy import BoolArray, Policy, masked_argmin
from hetero.sched.registry import register
from hetero.sched.view import FleetView

__all__ = ["TailBudget"]

# Costs seen before the split and the budget are first drawn from them; until then the policy
# places as shortest_expected_delay does.
_WARMUP = 64


def _check_quantile(name: str, value: float) -> None:
    if not 0 < value < 1:
        raise ConfigError(f"option {name}={value!r}; allowed: a number between 0 and 1")


@register
class TailBudget(Policy):
    """Shortest expected delay that keeps the fastest devices for the items only they can finish
    in good time. The default strategy.

    Sending every item where it would finish soonest (``shortest_expected_delay``) fills the
    fastest devices with work a slower device would also have finished in good time; the largest
    items, which only the fastest devices finish quickly, then wait behind it and make the tail.
    So:

    - an item among the smaller ``split_quantile`` of recent costs (the smaller half by default)
      goes where it would finish soonest: these items make the median;
    - so does an item of a batch (``WorkItem.batch``: a map's, a task graph's), whose measure
      is the batch's makespan: sparing the fastest devices would leave them idle at its end;
    - so does a larger one whose soonest device can start it at once;
    - any other larger item goes to the slowest device that would still finish it within the
      *budget*; where none would, to the soonest.

    The budget is ``budget`` seconds if given, else ``budget_factor`` × the time the
    ``tail_quantile`` cost of recent items (the 99th percentile by default) takes on the fastest
    usable device: the time the fleet's largest items need anyway. Finish times are expected ones:
    what is left of the running items (``FleetView.elapsed_work``) and, with size-ordered queues,
    only the queued work the item would wait for, plus ``overtake_weight`` × the delay it adds to
    the larger items it passes (as in ``shortest_expected_delay``). Recent costs are those of the
    last ``window`` items placed; until 64 have been seen it places each where it would finish
    soonest.

    It buys the tail and the median with some of the mean: larger items run on slower devices
    when the fastest are busy (docs/scheduling.md has the measured trade-off).
    """

    name = "tail_budget"
    places_by_delay = True

    def __init__(
        self,
        *,
        overtake_weight: float = 3.0,
        budget: float | None = None,
        budget_factor: float = 1.2,
        tail_quantile: float = 0.99,
        split_quantile: float = 0.5,
        window: int = 4096,
    ) -> None:
        check_overtake_weight(overtake_weight)
        if budget is not None and not 0 < budget < math.inf:
            raise ConfigError(f"option budget={budget!r}; allowed: seconds > 0, or None")
        if not 0 < budget_factor < math.inf:
            raise ConfigError(f"option budget_factor={budget_factor!r}; allowed: a number > 0")
        _check_quantile("tail_quantile", tail_quantile)
        _check_quantile("split_quantile", split_quantile)
        if window < _WARMUP:
            raise ConfigError(f"option window={window!r}; allowed: an integer >= {_WARMUP}")
        self.overtake_weight = overtake_weight
        self.budget = budget
        self.budget_factor = budget_factor
        self.tail_quantile = tail_quantile
        self.split_quantile = split_quantile
        self.window = window
        self._costs = np.zeros(window)
        self._seen = 0
        self._refresh_at = _WARMUP
        #: Items of this cost and more are the larger ones (inf until the warm-up is over).
        self.split_cost = math.inf
        #: The ``tail_quantile`` cost of recent items.
        self.tail_cost = math.inf

    def _note(self, cost: float) -> None:
        """Remember ``cost``; now and then draw the split and the tail cost from recent costs."""
        self._costs[self._seen % self.window] = cost
        self._seen += 1
        if self._seen >= self._refresh_at:
            recent = self._costs[: min(self._seen, self.window)]
            split, tail = np.quantile(recent, [self.split_quantile, self.tail_quantile])
            self.split_cost, self.tail_cost = float(split), float(tail)
            # Often while the window fills, then every eighth of a window.
            self._refresh_at = self._seen + min(self._seen, self.window // 8)

    def budget_for(self, item: WorkItem, view: FleetView) -> float:
        """Seconds within which a larger ``item`` may go to a slower device than its soonest."""
        if self.budget is not None:
            return self.budget
        return self.budget_factor * self.tail_cost * view.perf.fastest_inv(item.kind)

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        cost = item.cost
        self._note(cost)
        inv = view.perf.inv_speed(item.kind)
        score = view.delay_score(cost, inv, self.overtake_weight, remaining=True)
        if allowed is not None:
            score[~allowed] = np.inf  # inv is inf on unusable devices already
        best = int(score.argmin())
        if not score[best] < math.inf:
            return None
        if not cost > 0 or cost < self.split_cost or item.batch:
            return best
        if view.starts_now(best):
            return best
        within = score <= self.budget_for(item, view)
        if not within.any():
            return best
        # The slowest devices within the budget; of those, the soonest.
        return masked_argmin(score, within & (inv >= inv[within].max()))
