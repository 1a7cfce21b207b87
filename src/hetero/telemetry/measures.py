"""How well a run kept its fleet busy: the definitions every report of hetero uses.

The simulator (``FleetMetrics.makespan_efficiency``, ``load_balance_factor``, ``imbalance``)
and the profiler (``ProfileSummary.efficiency``, ``load_balance``) both compute their numbers
here, so that a policy scores the same in ``hetero simulate`` as on the engine.
``docs/profiling.md`` explains how to read them.

Two measures of evenness, which read in opposite directions:

- ``load_balance``: mean utilization over the highest, in [0, 1]; 1.0 is even.
- ``imbalance``: the highest utilization over the lowest, >= 1; 1.0 is even. This is the
  "load balance factor" of the design seed (001) with its grading (``imbalance_grade``):
  below 1.1 excellent, below 1.2 good, above 1.5 poor.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "efficiency",
    "ideal_makespan",
    "imbalance",
    "imbalance_grade",
    "load_balance",
]

# Seed 001's grading of ``imbalance``: below 1.1 excellent, below 1.2 good, above 1.5 poor.
# The seed leaves 1.2 to 1.5 unnamed; "fair" fills it.
_EXCELLENT_BELOW = 1.1
_GOOD_BELOW = 1.2
_POOR_ABOVE = 1.5


def ideal_makespan(work: float, speeds: Iterable[float]) -> float | None:
    """How long ``work`` (cost units) takes when split exactly in proportion to ``speeds``
    (cost units per second, one per device of the fleet, idle ones included): ``work`` over
    their sum. ``None`` when the fleet has no speed."""
    total = math.fsum(speeds)
    return work / total if total > 0 else None


def efficiency(ideal: float | None, makespan: float) -> float | None:
    """``ideal / makespan``: 1.0 is a perfect split, 0.5 a run that took twice as long. A device
    left idle lowers it by its share of the fleet's speed. ``None`` when the ideal is undefined
    or the makespan is not positive."""
    return ideal / makespan if ideal is not None and makespan > 0 else None


def load_balance(utilization: Iterable[float]) -> float | None:
    """The mean utilization of the fleet's devices over the highest one's, in [0, 1].

    1.0 when every device was busy as long as the busiest; an idle device counts as 0, so two
    idle devices of five give at most 0.6. It measures evenness by busy time, which a
    speed-aware split equalizes: a fast and a slow device both busy to the end score 1.0.
    ``None`` when no device was busy at all. Seed 001's load balance factor is the other way
    round: ``imbalance``.
    """
    values = list(utilization)
    highest = max(values, default=0.0)
    return math.fsum(values) / len(values) / highest if highest > 0 else None


def imbalance(utilization: Iterable[float]) -> float | None:
    """The busiest device's utilization over the least busy one's: >= 1, 1.0 when every
    device was equally busy (seed 001's load balance factor, ``max / min``).

    ``math.inf`` when a device sat idle while another worked: no ratio says how uneven that
    is. ``None`` when no device was busy at all.
    """
    values = list(utilization)
    highest = max(values, default=0.0)
    if highest <= 0:
        return None
    lowest = min(values)
    return highest / lowest if lowest > 0 else math.inf


def imbalance_grade(value: float | None) -> str | None:
    """Seed 001's word for an ``imbalance``: ``excellent`` (< 1.1), ``good`` (< 1.2),
    ``fair`` (up to 1.5) or ``poor`` (> 1.5, a device idle included); ``None`` for none
    (or NaN: nothing ran)."""
    if value is None or math.isnan(value):
        return None
    if value < _EXCELLENT_BELOW:
        return "excellent"
    if value < _GOOD_BELOW:
        return "good"
    return "fair" if value <= _POOR_ABOVE else "poor"
