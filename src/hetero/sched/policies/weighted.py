"""Static weights from the catalog: each device gets work in proportion to its speed."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policy import BoolArray, Policy
from hetero.sched.registry import register
from hetero.sched.view import FleetView

__all__ = ["Weighted"]

_BY = ("speed", "memory", "both")
_VARIANTS = ("smooth", "random")


@register
class Weighted(Policy):
    """Work in proportion to fixed weights: catalog speed (``by="speed"``), memory, or both.

    Use it when items are alike and you want a predictable split (2×A100 + 2×V100 → 5/7 of the
    items on the A100s) without load feedback. ``variant="smooth"`` is nginx's smooth weighted
    round robin (an exact, evenly spread split); ``"random"`` draws in proportion to the weights.
    It does not react to queues: under uneven item sizes prefer ``shortest_expected_delay``.
    """

    name = "weighted"

    def __init__(
        self, *, by: str = "speed", variant: str = "smooth", seed: int | None = None
    ) -> None:
        if by not in _BY:
            raise ConfigError(f"option by={by!r}; allowed: {', '.join(_BY)}")
        if variant not in _VARIANTS:
            raise ConfigError(f"option variant={variant!r}; allowed: {', '.join(_VARIANTS)}")
        self.by = by
        self.variant = variant
        self._rng = np.random.default_rng(seed)
        self._weights: npt.NDArray[np.float64] = np.zeros(0)
        self._current: npt.NDArray[np.float64] = np.zeros(0)
        self._cumulative: npt.NDArray[np.float64] = np.zeros(0)

    def bind(self, view: FleetView) -> None:
        speed = view.speed() / view.speed().max()
        memory = view.mem_total / max(int(view.mem_total.max()), 1)
        weights = {"speed": speed, "memory": memory, "both": speed * memory}[self.by]
        self._weights = weights.astype(np.float64)
        self._current = np.zeros(view.n)
        self._cumulative = np.cumsum(self._weights)

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        if self.variant == "random":
            return self._draw(mask)
        weights = np.where(mask, self._weights, 0.0)
        total = float(weights.sum())
        if total <= 0.0:
            return None
        self._current += weights
        i = int(np.where(mask, self._current, -np.inf).argmax())
        self._current[i] -= total
        return i

    def _draw(self, mask: BoolArray) -> int | None:
        cumulative = self._cumulative
        for _ in range(8):  # O(log n) draws; a few misses are cheaper than re-weighting
            i = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], "right"))
            i = min(i, len(cumulative) - 1)
            if mask[i]:
                return i
        weights = np.where(mask, self._weights, 0.0)
        total = float(weights.sum())
        if total <= 0.0:
            return None
        return int(self._rng.choice(len(weights), p=weights / total))
