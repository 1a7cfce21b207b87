"""A user's own policy, loaded by import path in test_policies."""

from __future__ import annotations

from hetero.sched import FleetView, Policy, WorkItem
from hetero.sched.policy import BoolArray


class AlwaysLast(Policy):
    name = "always_last"

    def __init__(self, *, offset: int = 0) -> None:
        self.offset = offset

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        return view.n - 1 - self.offset
