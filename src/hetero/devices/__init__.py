"""Devices: specs, the accelerator catalog, discovery (MIG slices included), topology and fleets
built from config."""

from __future__ import annotations

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hetero._lazy import lazy_exports

#: Each public name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "Catalog": "hetero.devices.catalog",
    "CatalogComparison": "hetero.devices.catalog",
    "get_catalog": "hetero.devices.catalog",
    "get_device_list": "hetero.devices.discovery",
    "build_fleet": "hetero.devices.fleet",
    "shared_parents": "hetero.devices.mig",
    "DTYPES": "hetero.devices.spec",
    "Device": "hetero.devices.spec",
    "DeviceKind": "hetero.devices.spec",
    "DeviceSpec": "hetero.devices.spec",
    "DeviceState": "hetero.devices.spec",
    "DeviceType": "hetero.devices.spec",
    "DeviceGroup": "hetero.devices.topology",
    "Link": "hetero.devices.topology",
    "LinkKind": "hetero.devices.topology",
    "NodeTopology": "hetero.devices.topology",
    "Topology": "hetero.devices.topology",
    "rank_order": "hetero.devices.rings",
    "read_topology": "hetero.devices.topology_nvml",
    "read_topology_file": "hetero.devices.topology_file",
    "Nic": "hetero.devices.network",
    "read_nics": "hetero.devices.network",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if _TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports. Nothing here runs; tests/test_public_api.py checks that both say the same.
    from hetero.devices.catalog import Catalog as Catalog
    from hetero.devices.catalog import CatalogComparison as CatalogComparison
    from hetero.devices.catalog import get_catalog as get_catalog
    from hetero.devices.discovery import get_device_list as get_device_list
    from hetero.devices.fleet import build_fleet as build_fleet
    from hetero.devices.mig import shared_parents as shared_parents
    from hetero.devices.network import Nic as Nic
    from hetero.devices.network import read_nics as read_nics
    from hetero.devices.rings import rank_order as rank_order
    from hetero.devices.spec import DTYPES as DTYPES
    from hetero.devices.spec import Device as Device
    from hetero.devices.spec import DeviceKind as DeviceKind
    from hetero.devices.spec import DeviceSpec as DeviceSpec
    from hetero.devices.spec import DeviceState as DeviceState
    from hetero.devices.spec import DeviceType as DeviceType
    from hetero.devices.topology import DeviceGroup as DeviceGroup
    from hetero.devices.topology import Link as Link
    from hetero.devices.topology import LinkKind as LinkKind
    from hetero.devices.topology import NodeTopology as NodeTopology
    from hetero.devices.topology import Topology as Topology
    from hetero.devices.topology_file import read_topology_file as read_topology_file
    from hetero.devices.topology_nvml import read_topology as read_topology
