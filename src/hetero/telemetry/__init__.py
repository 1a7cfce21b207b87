"""Telemetry: what the engine records about every task attempt, the profiler that turns
those records into a Perfetto timeline and an HTML report, and the measures (efficiency, load
balance) that the profiler and the simulator share."""

from __future__ import annotations

from hetero.telemetry.measures import (
    efficiency,
    ideal_makespan,
    imbalance,
    imbalance_grade,
    load_balance,
)
from hetero.telemetry.profile import (
    PROFILE_DIR_ENV,
    PROFILE_NAME_ENV,
    DeviceSummary,
    Profile,
    ProfileSummary,
)
from hetero.telemetry.trace import DeviceInfo, TaskTrace

__all__ = [
    "PROFILE_DIR_ENV",
    "PROFILE_NAME_ENV",
    "DeviceInfo",
    "DeviceSummary",
    "Profile",
    "ProfileSummary",
    "TaskTrace",
    "efficiency",
    "ideal_makespan",
    "imbalance",
    "imbalance_grade",
    "load_balance",
]
