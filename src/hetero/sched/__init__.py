"""The scheduling core: work items, policies, the performance model, the dispatcher, metrics."""

from __future__ import annotations

from hetero.sched.clock import Clock, ManualClock, MonotonicClock
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.driver import Driver
from hetero.sched.health import Breaker, CircuitState, Hold
from hetero.sched.instructions import Finish, Instruction, Run, Stop, WakeAt
from hetero.sched.item import (
    TERMINAL,
    TRANSITIONS,
    Cause,
    CostModel,
    ItemRecord,
    ItemState,
    Tokens,
    WorkItem,
)
from hetero.sched.metrics import DeviceMetrics, FleetMetrics, Metrics
from hetero.sched.options import DispatchOptions
from hetero.sched.perf import PerfModel
from hetero.sched.policy import Completed, Composite, Filter, Policy, Rejected
from hetero.sched.prefix import Prefix, PrefixIndex, prefix_blocks
from hetero.sched.registry import make_policy, policy_names, register
from hetero.sched.view import FleetView

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Breaker",
    "Cause",
    "CircuitState",
    "Clock",
    "Completed",
    "Composite",
    "CostModel",
    "DeviceMetrics",
    "DispatchOptions",
    "Dispatcher",
    "Driver",
    "Filter",
    "Finish",
    "FleetMetrics",
    "FleetView",
    "Hold",
    "Instruction",
    "ItemRecord",
    "ItemState",
    "ManualClock",
    "Metrics",
    "MonotonicClock",
    "PerfModel",
    "Policy",
    "Prefix",
    "PrefixIndex",
    "Rejected",
    "Run",
    "Stop",
    "Tokens",
    "WakeAt",
    "WorkItem",
    "make_policy",
    "policy_names",
    "prefix_blocks",
    "register",
]
