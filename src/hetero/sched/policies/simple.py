"""Policies that ignore how fast devices are: the baselines."""

from __future__ import annotations

import numpy as np

from hetero.sched.item import WorkItem
from hetero.sched.policy import BoolArray, Policy
from hetero.sched.registry import register
from hetero.sched.view import FleetView

__all__ = ["RandomChoice", "RoundRobin"]


@register
class RoundRobin(Policy):
    """Each device in turn. Use only when devices really are alike: on a mixed fleet the slowest
    device gets as much work as the fastest and sets the pace (it is the baseline to beat)."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        i = self._next % view.n
        if not mask[i]:
            candidates = np.flatnonzero(mask)
            if candidates.size == 0:
                return None
            # The next allowed device after i, wrapping around.
            k = int(np.searchsorted(candidates, i))
            i = int(candidates[k % candidates.size])
        self._next = i + 1
        return i


@register
class RandomChoice(Policy):
    """A uniformly random device. Stateless and cheap; like round robin it ignores speed, so use
    it as a baseline or for identical devices."""

    name = "random"

    def __init__(self, *, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        i = int(self._rng.integers(view.n))
        if mask[i]:
            return i
        candidates = np.flatnonzero(mask)
        return int(self._rng.choice(candidates)) if candidates.size else None
