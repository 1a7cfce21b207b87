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
from hetero.units import format_size, parse_size

__all__ = [
    "AllocationError",
    "BackendError",
    "Catalog",
    "CatalogComparison",
    "CommunicationConfig",
    "ConfigError",
    "Device",
    "DeviceConfig",
    "DeviceError",
    "DeviceKind",
    "DeviceSpec",
    "DeviceState",
    "HeteroConfig",
    "HeteroError",
    "InvalidTransition",
    "LoggingConfig",
    "NoCapableDevice",
    "QueueFull",
    "SchedulerConfig",
    "TaskFailed",
    "__version__",
    "build_fleet",
    "format_size",
    "get_catalog",
    "get_device_list",
    "load_config",
    "parse_config",
    "parse_size",
    "set_log_level",
]
