"""How well a run kept its fleet busy: the definitions every report of hetero uses.

The simulator (``FleetMetrics.makespan_efficiency``, ``load_balance_factor``) and the profiler
(``ProfileSummary.efficiency``, ``load_balance``) both compute their numbers here, so that a
policy scores the same in ``hetero simulate`` as on the engine. ``docs/profiling.md`` explains
how to read them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = ["efficiency", "ideal_makespan", "load_balance"]


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
    ``None`` when no device was busy at all.
    """
    values = list(utilization)
    highest = max(values, default=0.0)
    return math.fsum(values) / len(values) / highest if highest > 0 else None
