"""Devices: specs, the accelerator catalog, discovery, topology and fleets built from config."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hetero._lazy import lazy_exports

if _TYPE_CHECKING:
    from hetero.devices.catalog import (
        Catalog,
        CatalogComparison,
        get_catalog,
    )
    from hetero.devices.discovery import (
        get_device_list,
    )
    from hetero.devices.fleet import (
        build_fleet,
    )
    from hetero.devices.spec import (
        DTYPES,
        Device,
        DeviceKind,
        DeviceSpec,
        DeviceState,
        DeviceType,
    )
    from hetero.devices.topology import (
        DeviceGroup,
        Link,
        LinkKind,
        Topology,
        read_topology,
    )

_EXPORTS = {
    "Catalog": "hetero.devices.catalog",
    "CatalogComparison": "hetero.devices.catalog",
    "get_catalog": "hetero.devices.catalog",
    "get_device_list": "hetero.devices.discovery",
    "build_fleet": "hetero.devices.fleet",
    "DTYPES": "hetero.devices.spec",
    "Device": "hetero.devices.spec",
    "DeviceKind": "hetero.devices.spec",
    "DeviceSpec": "hetero.devices.spec",
    "DeviceState": "hetero.devices.spec",
    "DeviceType": "hetero.devices.spec",
    "DeviceGroup": "hetero.devices.topology",
    "Link": "hetero.devices.topology",
    "LinkKind": "hetero.devices.topology",
    "Topology": "hetero.devices.topology",
    "read_topology": "hetero.devices.topology",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "DTYPES",
    "Catalog",
    "CatalogComparison",
    "Device",
    "DeviceGroup",
    "DeviceKind",
    "DeviceSpec",
    "DeviceState",
    "DeviceType",
    "Link",
    "LinkKind",
    "Topology",
    "build_fleet",
    "get_catalog",
    "get_device_list",
    "read_topology",
]
