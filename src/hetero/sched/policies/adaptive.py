"""Weights learned from what devices actually deliver."""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policies.load import check_overtake_weight
from hetero.sched.policy import BoolArray, Completed, Policy, masked_argmin
from hetero.sched.registry import register
from hetero.sched.view import FleetView

__all__ = ["Adaptive"]


@register
class Adaptive(Policy):
    """Shortest expected delay (``overtake_weight`` as there) with speeds measured over a
    sliding window of completions.

    Starts from the catalog speeds and re-weights every ``every_completions`` completions or
    ``every_seconds`` (clock time), whichever comes first, from each device's last ``window``
    completions (work done / busy seconds). Use it when the catalog may be wrong: thermal
    throttling, a noisy neighbour, a model that runs worse on one architecture.
    """

    name = "adaptive"
    places_by_delay = True

    def __init__(
        self,
        *,
        every_completions: int = 100,
        every_seconds: float = 5.0,
        window: int = 200,
        overtake_weight: float = 2.0,
    ) -> None:
        if every_completions < 1:
            raise ConfigError(f"option every_completions={every_completions!r}; allowed: >= 1")
        if not every_seconds > 0:
            raise ConfigError(f"option every_seconds={every_seconds!r}; allowed: > 0")
        if window < 1:
            raise ConfigError(f"option window={window!r}; allowed: >= 1")
        check_overtake_weight(overtake_weight)
        self.overtake_weight = overtake_weight
        self.every_completions = every_completions
        self.every_seconds = every_seconds
        self.window = window
        self._view: FleetView | None = None
        self._inv: npt.NDArray[np.float64] = np.zeros(0)
        self._samples: list[deque[tuple[float, float]]] = []
        self._since = 0
        self._last_update = 0.0
        self.updates = 0

    def bind(self, view: FleetView) -> None:
        # Bound again when devices join: what it learned of the others stays.
        known = len(getattr(self, "_samples", ()))
        inv = 1.0 / view.speed()
        if known:
            inv[:known] = self._inv[:known]
        self._view = view
        self._inv = inv
        self._samples = getattr(self, "_samples", [])[:known] + [
            deque(maxlen=self.window) for _ in range(view.n - known)
        ]
        if not known:
            self._last_update = view.now

    @property
    def speeds(self) -> npt.NDArray[np.float64]:
        """The speeds the policy currently believes (work units per second)."""
        return 1.0 / self._inv

    def observe(self, event: Completed) -> None:
        if event.seconds <= 0 or event.cost <= 0 or not self._samples:
            return
        self._samples[event.index].append((event.cost, event.seconds))
        self._since += 1
        assert self._view is not None
        if (
            self._since >= self.every_completions
            or self._view.now - self._last_update >= self.every_seconds
        ):
            self._update(self._view)

    def _update(self, view: FleetView) -> None:
        for i, samples in enumerate(self._samples):
            if samples:
                work = sum(w for w, _ in samples)
                busy = sum(s for _, s in samples)
                # Each of a device's slots runs at speed / slots.
                self._inv[i] = busy / (work * float(view.slots[i]))
        self._since = 0
        self._last_update = view.now
        self.updates += 1

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        return masked_argmin(view.delay_score(item.cost, self._inv, self.overtake_weight), mask)
