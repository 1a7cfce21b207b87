"""hetero: run data-parallel work on fleets of different accelerators.

The public API is what ``__all__`` lists; everything else is private and may change.
"""

from __future__ import annotations

from hetero._version import __version__
from hetero.config import (
    CommunicationConfig,
    DeviceConfig,
    HeteroConfig,
    LoggingConfig,
    SchedulerConfig,
    load_config,
    parse_config,
)
from hetero.devices import (
    Catalog,
    CatalogComparison,
    Device,
    DeviceKind,
    DeviceSpec,
    DeviceState,
    build_fleet,
    get_catalog,
    get_device_list,
)
from hetero.errors import (
    AllocationError,
    BackendError,
    ConfigError,
    DeviceError,
    HeteroError,
    InvalidTransition,
    NoCapableDevice,
    QueueFull,
    TaskFailed,
)
from hetero.log import set_log_level
from hetero.sched import (
    CostModel,
    Dispatcher,
    FleetView,
    ItemState,
    ManualClock,
    MonotonicClock,
    PerfModel,
    Policy,
    WorkItem,
    make_policy,
    policy_names,
)
from hetero.sim import SimResult, Simulator, WorkloadSpec, load_workload, simulate
from hetero.units import format_size, parse_size

__all__ = [
    "AllocationError",
    "BackendError",
    "Catalog",
    "CatalogComparison",
    "CommunicationConfig",
    "ConfigError",
    "CostModel",
    "Device",
    "DeviceConfig",
    "DeviceError",
    "DeviceKind",
    "DeviceSpec",
    "DeviceState",
    "Dispatcher",
    "FleetView",
    "HeteroConfig",
    "HeteroError",
    "InvalidTransition",
    "ItemState",
    "LoggingConfig",
    "ManualClock",
    "MonotonicClock",
    "NoCapableDevice",
    "PerfModel",
    "Policy",
    "QueueFull",
    "SchedulerConfig",
    "SimResult",
    "Simulator",
    "TaskFailed",
    "WorkItem",
    "WorkloadSpec",
    "__version__",
    "build_fleet",
    "format_size",
    "get_catalog",
    "get_device_list",
    "load_config",
    "load_workload",
    "make_policy",
    "parse_config",
    "parse_size",
    "policy_names",
    "set_log_level",
    "simulate",
]
