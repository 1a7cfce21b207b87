"""Telemetry: what the engine records about every task attempt, and the profiler that turns
those records into a Perfetto timeline and an HTML report."""

from __future__ import annotations

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
]
