"""Turn a fleet config into ``Device`` objects: real devices found on this machine, emulated ones
built from the catalog."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from hetero.devices.catalog import get_catalog
from hetero.devices.discovery import bus_id_key, get_device_list
from hetero.devices.spec import Device, DeviceKind
from hetero.errors import DeviceError
from hetero.units import format_size

if TYPE_CHECKING:  # config imports the catalog, which lives in this package
    from hetero.config import DeviceConfig, HeteroConfig

__all__ = ["build_fleet", "fleet_for"]


def build_fleet(config: HeteroConfig, discovered: list[Device] | None = None) -> list[Device]:
    """The devices ``config`` describes. ``discovered`` defaults to ``get_device_list()``.

    Real entries are matched against discovered devices (GPU by index, UUID or PCI bus id);
    emulated entries become ``count`` devices with the catalog spec of ``model``. Every entry
    that cannot be built is named in one ``DeviceError``.
    """
    if not config.devices:
        raise DeviceError(
            "the config lists no devices (only replicas, which hetero serve routes to); "
            "add a devices: section to run work here"
        )
    real = [d for d in config.devices if not d.emulate]
    if discovered is None and real:
        # A fleet of CPUs needs no GPU discovery (nor torch, which it may import).
        discovered = get_device_list(gpus=any(d.type is not DeviceKind.CPU for d in real))
    per_model: Counter[str] = Counter()
    fleet: list[Device] = []
    unbuilt: list[str] = []
    for i, entry in enumerate(config.devices):
        if entry.emulate:
            fleet.extend(_emulated(entry, per_model))
            continue
        try:
            fleet.append(_real(i, entry, discovered or []))
        except DeviceError as exc:
            unbuilt.append(str(exc))
    # A rack is a node's: one entry naming it places every device on that node (the config
    # refuses two entries of one node naming different racks).
    racks = {entry.node: entry.rack for entry in config.devices if entry.rack is not None}
    for device in fleet:
        device.rack = racks.get(device.node)
    if len(unbuilt) == 1:
        raise DeviceError(unbuilt[0])
    if unbuilt:
        raise DeviceError(
            f"{len(unbuilt)} devices cannot be built on this machine:\n"
            + "\n".join(f"  - {line}" for line in unbuilt)
        )
    return fleet


def fleet_for(config: HeteroConfig | None) -> list[Device]:
    """The devices of ``config``, or this machine's when there is none."""
    return get_device_list() if config is None else build_fleet(config)


def _emulated(entry: DeviceConfig, per_model: Counter[str]) -> list[Device]:
    assert entry.model is not None  # guaranteed by config validation
    spec = get_catalog().get(entry.model)
    devices = []
    for k in range(entry.count):
        index = per_model[spec.model]
        per_model[spec.model] += 1
        if entry.name is None:
            device_id = f"{spec.model.lower()}:{index}"
        else:
            device_id = entry.name if entry.count == 1 else f"{entry.name}:{k}"
        devices.append(
            Device(
                id=device_id,
                spec=spec,
                node=entry.node,
                local_index=index,
                emulated=True,
                speed_override=entry.speed,
                memory_limit=entry.memory_limit,
                cores=entry.cores,
                tags=frozenset(entry.tags),
            )
        )
    return devices


def _real(i: int, entry: DeviceConfig, discovered: list[Device]) -> Device:
    candidates = [d for d in discovered if d.kind is entry.type]
    where = f"devices[{i}]"
    if entry.type is DeviceKind.CPU:
        if not candidates:
            raise DeviceError(f"{where}: no CPU was discovered on this machine")
        found = candidates[0]
        available = found.cores or 0
        if entry.cores is not None and available and entry.cores > available:
            raise DeviceError(
                f"{where}.cores: {entry.cores} cores requested but this machine has {available}; "
                f"allowed: 1 to {available}"
            )
    else:
        wanted = 0 if entry.id is None else entry.id
        found_or_none = next((d for d in candidates if _matches(d, wanted)), None)
        if found_or_none is None:
            raise DeviceError(f"{where}.id: {_not_found(entry.type, wanted, candidates)}")
        found = found_or_none
    if entry.memory_limit is not None and entry.memory_limit > found.spec.memory_bytes:
        raise DeviceError(
            f"{where}.memory_limit: {format_size(entry.memory_limit)} is above the "
            f"{format_size(found.spec.memory_bytes)} of {found.id} ({found.model}); "
            f"allowed: at most {format_size(found.spec.memory_bytes)}"
        )
    found.memory_limit = entry.memory_limit
    found.cores = entry.cores or found.cores
    found.speed_override = entry.speed
    found.node = entry.node
    found.tags = frozenset(entry.tags)
    if entry.memory_limit is not None:
        found.state.memory_total = found.memory_bytes
    if entry.name is not None:
        found.id = entry.name
    return found


def _not_found(kind: DeviceKind, wanted: int | str, candidates: list[Device]) -> str:
    """Why no device of ``candidates`` is ``wanted``, and what there is instead."""
    have = ", ".join(
        f"{d.local_index} ({d.model}{f', {d.uuid}' if d.parent else ''})" for d in candidates
    )
    text = str(wanted).strip()
    if any(d.parent and d.parent.lower() == text.lower() for d in candidates):
        why = f"GPU {text} is in MIG mode, so its slices are the devices: name one by its UUID"
    elif text.lower().startswith("mig-"):
        why = (
            f"no MIG slice {text} on this machine: it was destroyed, or re-created under a new "
            "UUID (re-creating a MIG instance changes its UUID)"
        )
    else:
        why = f"no {kind.value} {wanted!r} on this machine"
    return f"{why}; found: {have or 'none'}. Set emulate: true with a model to run it emulated."


def _matches(device: Device, wanted: int | str) -> bool:
    if isinstance(wanted, int):
        return device.local_index == wanted
    text = wanted.strip().lower()
    if text.isdigit():
        return device.local_index == int(text)
    uuid = (device.uuid or "").lower()
    if uuid and text.removeprefix("gpu-") == uuid.removeprefix("gpu-"):
        return True
    return ":" in text and bus_id_key(device.pci_bus_id or "") == bus_id_key(text)
