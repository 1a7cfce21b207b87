"""Devices: specs, the accelerator catalog, discovery, topology and fleets built from config."""

from __future__ import annotations

from hetero.devices.catalog import Catalog, CatalogComparison, get_catalog
from hetero.devices.discovery import get_device_list
from hetero.devices.fleet import build_fleet
from hetero.devices.spec import DTYPES, Device, DeviceKind, DeviceSpec, DeviceState, DeviceType
from hetero.devices.topology import DeviceGroup, Link, LinkKind, Topology, read_topology

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
