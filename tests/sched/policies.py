"""Policies and policy options that more than one scheduler test module uses."""

from __future__ import annotations

from typing import Any

from hetero.sched import FleetView, Policy, WorkItem
from hetero.sched.policy import BoolArray, masked_argmin

#: Policies whose constructor needs arguments get some that fit the generated fleets
#: (``tests.fleets.make_devices``: d0, d1, …).
OPTIONS: dict[str, dict[str, Any]] = {
    "tiered": {"thresholds": [1.0], "tiers": [["gpu"], ["gpu"]]},
    "affinity": {"rules": {"big": ["d0"]}},
    "capacity_aware": {"on_no_fit": "wait"},
}


class Always(Policy):
    """Every item to one device (while it is usable and allowed)."""

    name = "test_always"

    def __init__(self, index: int = 0) -> None:
        self.index = index

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        return self.index if mask[self.index] else masked_argmin(view.outstanding, mask)
