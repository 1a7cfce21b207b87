"""The ``Policy`` contract, filters that compose in front of any policy, and events policies see.

A policy is pure: it reads the ``FleetView`` (and its injected clock) and returns a decision; it
never reads wall time, sleeps or does I/O. So one policy runs unchanged in the simulator, the
local engine, on Ray and in the router.

Policies implement one method, ``pick(item, view, allowed)``, returning a device *position* (or
``None`` to leave the item waiting). ``allowed`` is ``None`` (every usable device) or a boolean
mask that filters in front of the policy have narrowed. ``choose`` wraps ``pick`` and returns the
device id; the dispatcher calls ``pick`` directly so its hot path stays free of id look-ups.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from hetero.errors import NoCapableDevice, Rejected
from hetero.sched.item import WorkItem
from hetero.sched.view import FleetView

__all__ = ["Completed", "Composite", "Event", "Filter", "Policy", "Rejected", "masked_argmin"]

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(slots=True)  # not frozen: built on every completion, and frozen costs 4x
class Completed:
    """An item finished on device ``index``: ``seconds`` of service, ``latency`` since submit."""

    index: int
    kind: str
    cost: float
    seconds: float
    latency: float
    ok: bool = True


Event = Completed


def masked_argmin(score: FloatArray, allowed: BoolArray | None) -> int | None:
    """Position of the lowest finite score among ``allowed`` devices (first one on ties)."""
    if allowed is not None:
        score = np.where(allowed, score, np.inf)
    i = int(score.argmin())
    return i if score[i] < np.inf else None


class Policy(ABC):
    """Decides which device gets a work item. Subclasses set ``name`` and implement ``pick``."""

    name: ClassVar[str] = ""
    #: True when ``pick`` already minimises expected finish time over every allowed device, so
    #: the dispatcher need not look for an idle device to steal a just-queued item.
    places_by_delay: ClassVar[bool] = False

    def bind(self, view: FleetView) -> None:  # noqa: B027 - optional hook with a no-op default
        """Called once when a dispatcher attaches the policy to its fleet (precompute here)."""

    @abstractmethod
    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        """Position of the device for ``item`` among ``allowed`` (``None``: all usable), or
        ``None`` to keep it waiting. Raise ``Rejected`` if it can never run."""

    def choose(self, item: WorkItem, view: FleetView) -> str | None:
        """The id of the device for ``item``, or ``None`` to keep it waiting."""
        i = self.pick(item, view, None)
        return None if i is None else view.ids[i]

    def observe(self, event: Event) -> None:  # noqa: B027 - optional hook with a no-op default
        """Learn from a completion (adaptive policies override this)."""

    def admits(self, item: WorkItem, view: FleetView, index: int) -> bool:
        """Whether ``item`` may run on device ``index`` (asked before work is stolen for it)."""
        return bool(view.usable[index])


class Filter(ABC):
    """Narrows the devices an item may go to, in front of any policy."""

    @abstractmethod
    def allow(self, item: WorkItem, view: FleetView, allowed: BoolArray) -> BoolArray | None:
        """The narrowed mask, or ``None`` when the item should wait for now.
        Raise ``Rejected`` if no device could ever take it."""

    def bind(self, view: FleetView) -> None:  # noqa: B027 - optional hook with a no-op default
        """Called once with the fleet (resolve device names to positions here)."""


class Composite(Policy):
    """``filters`` applied in order in front of ``policy``."""

    def __init__(self, filters: Sequence[Filter], policy: Policy) -> None:
        self.filters = list(filters)
        self.policy = policy
        if not type(self).name:  # a named subclass keeps its own name
            self.name = policy.name  # type: ignore[misc]
        self.places_by_delay = policy.places_by_delay  # type: ignore[misc]

    def bind(self, view: FleetView) -> None:
        for f in self.filters:
            f.bind(view)
        self.policy.bind(view)

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        for f in self.filters:
            narrowed = f.allow(item, view, mask)
            if narrowed is None:
                return None
            mask = narrowed
        return self.policy.pick(item, view, mask)

    def observe(self, event: Event) -> None:
        self.policy.observe(event)

    def admits(self, item: WorkItem, view: FleetView, index: int) -> bool:
        mask = np.zeros(view.n, dtype=bool)
        mask[index] = bool(view.usable[index])
        for f in self.filters:
            try:
                narrowed = f.allow(item, view, mask)
            except NoCapableDevice:
                return False
            if narrowed is None or not narrowed[index]:
                return False
            mask = narrowed
        return self.policy.admits(item, view, index)
