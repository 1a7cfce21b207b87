"""The scheduling core: work items, policies, the performance model, the dispatcher, metrics."""

from __future__ import annotations

from hetero.sched.clock import Clock, ManualClock, MonotonicClock
from hetero.sched.dispatcher import Dispatcher, Finish, Instruction, Run, Stop, WakeAt
from hetero.sched.item import (
    TERMINAL,
    TRANSITIONS,
    Cause,
    CostModel,
    ItemRecord,
    ItemState,
    WorkItem,
)
from hetero.sched.metrics import DeviceMetrics, FleetMetrics, Metrics
from hetero.sched.options import DispatchOptions
from hetero.sched.perf import PerfModel
from hetero.sched.policy import Completed, Composite, Filter, Policy, Rejected
from hetero.sched.registry import make_policy, policy_names, register
from hetero.sched.view import FleetView

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "Cause",
    "Clock",
    "Completed",
    "Composite",
    "CostModel",
    "DeviceMetrics",
    "DispatchOptions",
    "Dispatcher",
    "Filter",
    "Finish",
    "FleetMetrics",
    "FleetView",
    "Instruction",
    "ItemRecord",
    "ItemState",
    "ManualClock",
    "Metrics",
    "MonotonicClock",
    "PerfModel",
    "Policy",
    "Rejected",
    "Run",
    "Stop",
    "WakeAt",
    "WorkItem",
    "make_policy",
    "policy_names",
    "register",
]
