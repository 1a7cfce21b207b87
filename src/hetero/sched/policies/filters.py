"""Filters that compose in front of any policy: memory capacity and affinity."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policies.selectors import select
from hetero.sched.policy import BoolArray, Filter, Rejected
from hetero.sched.view import FleetView
from hetero.units import format_size

__all__ = ["AffinityFilter", "CapacityFilter"]

_ON_NO_FIT = ("wait", "reject")


class CapacityFilter(Filter):
    """Only devices whose free memory holds the item (``WorkItem.memory``).

    When none has room now, ``on_no_fit="wait"`` keeps the item waiting and ``"reject"`` fails
    it; an item larger than every device's whole memory is always rejected, with the reason.
    """

    def __init__(self, on_no_fit: str = "wait") -> None:
        if on_no_fit not in _ON_NO_FIT:
            raise ConfigError(f"option on_no_fit={on_no_fit!r}; allowed: {', '.join(_ON_NO_FIT)}")
        self.on_no_fit = on_no_fit

    def allow(self, item: WorkItem, view: FleetView, allowed: BoolArray) -> BoolArray | None:
        need = item.memory
        if need == 0:
            return allowed
        ever = allowed & (view.mem_total >= need)
        if not ever.any():
            biggest = int(view.mem_total[allowed].max()) if allowed.any() else 0
            raise Rejected(
                f"item {item.id!r} needs {format_size(need)} but the largest usable device has "
                f"{format_size(biggest)}"
            )
        free = view.mem_free()
        now = ever & (free >= need)
        if now.any():
            return now
        if self.on_no_fit == "reject":
            raise Rejected(
                f"item {item.id!r} needs {format_size(need)}; the most free on any usable device "
                f"is {format_size(int(free[allowed].max()))} (on_no_fit=reject)"
            )
        return None


class AffinityFilter(Filter):
    """Items tagged with a rule's tag go only to that rule's devices.

    ``rules`` maps an item tag to device selectors (id, catalog model, kind or ``tag:NAME``).
    When every bound device is busy elsewhere or down, ``fallback=True`` lets the item go to any
    device and ``fallback=False`` keeps it waiting. Untagged items go anywhere.
    """

    def __init__(self, rules: Mapping[str, Sequence[str]], fallback: bool = True) -> None:
        if not isinstance(rules, Mapping) or not rules:
            raise ConfigError(f"option rules={rules!r}; allowed: a mapping of tag -> [selectors]")
        for tag, selectors in rules.items():
            if isinstance(selectors, str) or not isinstance(selectors, Sequence) or not selectors:
                raise ConfigError(
                    f"option rules[{tag!r}]={selectors!r}; allowed: a non-empty list of selectors"
                )
        self.rules = {str(tag): list(selectors) for tag, selectors in rules.items()}
        self.fallback = fallback
        self._masks: dict[str, npt.NDArray[np.bool_]] = {}

    def bind(self, view: FleetView) -> None:
        self._masks = {tag: select(sel, view, f"rules[{tag!r}]") for tag, sel in self.rules.items()}

    def allow(self, item: WorkItem, view: FleetView, allowed: BoolArray) -> BoolArray | None:
        bound = [self._masks[t] for t in item.tags if t in self._masks]
        if not bound:
            return allowed
        mask = bound[0] if len(bound) == 1 else np.logical_or.reduce(bound)
        narrowed = allowed & mask
        if narrowed.any():
            return narrowed
        return allowed if self.fallback else None
