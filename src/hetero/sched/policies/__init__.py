"""The built-in policies; importing this package registers them by name."""

from __future__ import annotations

from hetero.sched.policies.adaptive import Adaptive
from hetero.sched.policies.budget import TailBudget
from hetero.sched.policies.composed import AffinityPolicy, CapacityAware, Tiered
from hetero.sched.policies.filters import AffinityFilter, CapacityFilter
from hetero.sched.policies.load import (
    LeastConnections,
    LeastWork,
    PowerOfTwo,
    ShortestExpectedDelay,
    WeightedLeastConnections,
)
from hetero.sched.policies.prefix import PrefixAffinity
from hetero.sched.policies.simple import RandomChoice, RoundRobin
from hetero.sched.policies.slo import SloRouting
from hetero.sched.policies.weighted import Weighted

__all__ = [
    "Adaptive",
    "AffinityFilter",
    "AffinityPolicy",
    "CapacityAware",
    "CapacityFilter",
    "LeastConnections",
    "LeastWork",
    "PowerOfTwo",
    "PrefixAffinity",
    "RandomChoice",
    "RoundRobin",
    "ShortestExpectedDelay",
    "SloRouting",
    "TailBudget",
    "Tiered",
    "Weighted",
    "WeightedLeastConnections",
]
