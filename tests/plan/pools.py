"""Devices and requests of the DevicePool tests (test_pool.py, test_pool_changes.py)."""

from __future__ import annotations

from collections.abc import Iterable

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device, DeviceSpec
from hetero.plan.request import AllocationRequest

GIB = 2**30
CATALOG = get_catalog()
A100 = CATALOG.get("A100-80GB")  # NVLink3, 80 GiB
H100 = CATALOG.get("H100-SXM-80GB")  # NVLink4
L4 = CATALOG.get("L4")  # PCIe4, 24 GiB
T4 = CATALOG.get("T4")  # PCIe3, 16 GiB


def dev(
    device_id: str,
    spec: DeviceSpec = A100,
    node: str = "a",
    tags: Iterable[str] = (),
    memory: int | None = None,
    parent: str | None = None,
) -> Device:
    return Device(
        id=device_id,
        spec=spec,
        node=node,
        tags=frozenset(tags),
        memory_limit=memory,
        parent=parent,
    )


def req(count: int = 1, **fields: object) -> AllocationRequest:
    return AllocationRequest(count=count, **fields)  # type: ignore[arg-type]
