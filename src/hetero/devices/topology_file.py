"""Topology files: a machine's GPU topology, or a cluster's nodes, written down and read back.

The format is what ``hetero topology --json`` prints: ``devices`` (id, model, and optionally PCI
bus id, NUMA node and CPU affinity), ``links`` (an n×n matrix of ``nvidia-smi topo -m`` labels:
``X``, ``NVS18``, ``NV12``, ``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``) and optionally
``bandwidth_gbs`` (GB/s per pair; derived from the labels and the catalog when left out),
``latency_us`` and ``hops`` (per pair; each link kind's nominal figures when left out), in JSON
or YAML. A file of ``nodes`` instead (what ``hetero topology --config … --json`` prints: each
node's ``name``, ``rack`` and ``nics``) describes the nodes of a cluster and the rack each is
in. Every problem, a file that contradicts itself included, is reported at once as a
``ConfigError`` naming the file, the place in it and what is wrong.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hetero._data_files import read_data_file
from hetero._errors_render import show
from hetero.devices.catalog import get_catalog
from hetero.devices.network import FABRICS, Nic
from hetero.devices.spec import DeviceKind
from hetero.devices.topology import (
    PCIE_PATH_FACTOR,
    Link,
    LinkKind,
    NodeTopology,
    Topology,
    TopologyDevice,
    catalog_pcie_generation,
    nvlink_gbs_per_link,
    pcie_gbs,
)
from hetero.errors import ConfigError

__all__ = [
    "node_topology_from_dict",
    "read_any_topology_file",
    "read_node_topology_file",
    "read_topology_file",
    "topology_from_dict",
]

Problems = list[tuple[str, str]]
_T = TypeVar("_T")

# ``source`` and ``group`` are what ``hetero topology --json`` prints beside the topology.
_KEYS = ("devices", "links", "bandwidth_gbs", "latency_us", "hops", "source", "group")
_DEVICE_KEYS = ("id", "model", "pci_bus_id", "numa_node", "cpu_affinity")
_LABELS = "X, NVS<n>, NV<n>, " + ", ".join(kind.value for kind in PCIE_PATH_FACTOR)
# A nodes file: what ``hetero topology --config … --json`` prints; the matrices are derived.
_NODE_FILE_KEYS = ("nodes", "links", "bandwidth_gbs", "latency_us", "hops", "source")
_NODE_KEYS = ("name", "rack", "nics")
_NIC_KEYS = ("name", "fabric", "gbps")


def read_topology_file(path: str | os.PathLike[str]) -> Topology:
    """The topology a JSON or YAML file describes; ``ConfigError`` naming every problem."""
    return _read(path, topology_from_dict)


def read_node_topology_file(path: str | os.PathLike[str]) -> NodeTopology:
    """The nodes (their NICs and racks) a JSON or YAML file describes; ``ConfigError`` naming
    every problem."""
    return _read(path, node_topology_from_dict)


def read_any_topology_file(path: str | os.PathLike[str]) -> Topology | NodeTopology:
    """A GPU topology, or with a ``nodes`` key a cluster's nodes, as the file describes."""
    data = read_data_file(Path(path), "topology")
    if isinstance(data, dict) and "nodes" in data and "devices" not in data:
        return _read(path, node_topology_from_dict, data)
    return _read(path, topology_from_dict, data)


def _read(path: str | os.PathLike[str], parse: Callable[[Any], _T], data: Any = None) -> _T:
    path = Path(path)
    if data is None:
        data = read_data_file(path, "topology")
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(
            [(f"{path}: {where}" if where else str(path), msg) for where, msg in exc.problems]
        ) from None


def topology_from_dict(data: Any) -> Topology:
    """The topology ``data`` (parsed JSON or YAML, as ``Topology.to_dict`` writes it)
    describes; ``ConfigError`` naming every problem."""
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"expected a mapping with 'devices' and 'links', got {show(data)}")]
        )
    problems: Problems = [
        (str(key), f"unknown key {key!r}; allowed keys: {', '.join(_KEYS)}")
        for key in data
        if key not in _KEYS
    ]
    for key in ("devices", "links"):
        if key not in data:
            problems.append((key, "required field is missing"))
    devices = _devices(data.get("devices", []), problems)
    n = len(devices)
    labels = _matrix(data.get("links", []), "links", n, problems, _label)
    bandwidth = None
    if data.get("bandwidth_gbs") is not None:
        bandwidth = _matrix(data["bandwidth_gbs"], "bandwidth_gbs", n, problems, _gbs)
    latency = hops = None
    if data.get("latency_us") is not None:
        latency = _matrix(data["latency_us"], "latency_us", n, problems, _latency)
    if data.get("hops") is not None:
        hops = _matrix(data["hops"], "hops", n, problems, _hops)
    if problems or devices is None or labels is None:
        raise ConfigError(problems)
    gbs = bandwidth or _derived_bandwidth(devices, labels)
    # -1: the link kind's nominal latency or hops (``Link``).
    links = tuple(
        tuple(
            Link(
                kind,
                gbs[i][j],
                count,
                -1.0 if latency is None else latency[i][j],
                -1 if hops is None else hops[i][j],
            )
            for j, (kind, count) in enumerate(row)
        )
        for i, row in enumerate(labels)
    )
    return Topology(tuple(devices), links)


def node_topology_from_dict(data: Any) -> NodeTopology:
    """The nodes ``data`` (parsed JSON or YAML, as ``NodeTopology.to_dict`` writes it) describes:
    each node's name, rack (optional) and NICs; ``ConfigError`` naming every problem. The
    matrices beside them are derived from the NICs and racks, so they are not read."""
    if not isinstance(data, dict):
        raise ConfigError([("", f"expected a mapping with 'nodes', got {show(data)}")])
    problems: Problems = [
        (str(key), f"unknown key {key!r}; allowed keys: {', '.join(_NODE_FILE_KEYS)}")
        for key in data
        if key not in _NODE_FILE_KEYS
    ]
    entries = data.get("nodes")
    if not isinstance(entries, list):
        problems.append(("nodes", f"expected a list of nodes, got {show(entries)}"))
        entries = []
    nics: dict[str, list[Nic]] = {}
    racks: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"nodes[{i}]"
        if not isinstance(entry, dict):
            problems.append((where, f"expected a mapping with name and nics, got {show(entry)}"))
            continue
        for key in entry:
            if key not in _NODE_KEYS:
                allowed = ", ".join(_NODE_KEYS)
                problems.append((f"{where}.{key}", f"unknown key {key!r}; allowed keys: {allowed}"))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append((f"{where}.name", _expected("a non-empty string", entry, "name")))
            continue
        if name in nics:
            problems.append((f"{where}.name", f"{name!r} is listed twice"))
            continue
        rack = entry.get("rack")
        if rack is not None and (not isinstance(rack, str) or not rack.strip()):
            problems.append(
                (f"{where}.rack", f"expected a rack name (left out: unknown), got {show(rack)}")
            )
        elif rack is not None:
            racks[name] = rack
        nics[name] = _nics(entry.get("nics", []), f"{where}.nics", problems)
    if problems:
        raise ConfigError(problems)
    return NodeTopology.from_nics(nics, racks)


def _nics(value: Any, where: str, problems: Problems) -> list[Nic]:
    if not isinstance(value, list):
        problems.append((where, f"expected a list of NICs, got {show(value)}"))
        return []
    found = []
    for i, entry in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            problems.append(
                (at, f"expected a mapping with name, fabric and gbps, got {show(entry)}")
            )
            continue
        unknown = [key for key in entry if key not in _NIC_KEYS]
        for key in unknown:
            problems.append(
                (f"{at}.{key}", f"unknown key {key!r}; allowed keys: {', '.join(_NIC_KEYS)}")
            )
        missing = [key for key in ("name", "gbps") if key not in entry]
        for key in missing:
            problems.append((f"{at}.{key}", "required field is missing"))
        if missing:
            continue
        try:
            found.append(Nic(entry["name"], entry.get("fabric", FABRICS[0]), entry["gbps"]))
        except ConfigError as exc:
            problems.extend((f"{at}.{field}", msg) for field, msg in exc.problems)
    return found


def _devices(value: Any, problems: Problems) -> list[TopologyDevice]:
    if not isinstance(value, list):
        problems.append(("devices", f"expected a list of devices, got {show(value)}"))
        return []
    devices = []
    for i, entry in enumerate(value):
        where = f"devices[{i}]"
        if not isinstance(entry, dict):
            problems.append((where, f"expected a mapping with id and model, got {show(entry)}"))
            continue
        before = len(problems)
        for key in entry:
            if key not in _DEVICE_KEYS:
                allowed = ", ".join(_DEVICE_KEYS)
                problems.append((f"{where}.{key}", f"unknown key {key!r}; allowed keys: {allowed}"))
        for key in ("id", "model"):
            if not isinstance(entry.get(key), str) or not entry[key]:
                problems.append((f"{where}.{key}", _expected("a non-empty string", entry, key)))
        bus = entry.get("pci_bus_id")
        if bus is not None and not isinstance(bus, str):
            problems.append((f"{where}.pci_bus_id", f"expected a PCI bus id, got {show(bus)}"))
        numa = entry.get("numa_node")
        if numa is not None and (isinstance(numa, bool) or not isinstance(numa, int) or numa < 0):
            problems.append(
                (f"{where}.numa_node", f"expected a whole number >= 0, got {show(numa)}")
            )
        cpus = _cpus(entry.get("cpu_affinity") or "", f"{where}.cpu_affinity", problems)
        if len(problems) == before:
            devices.append(TopologyDevice(entry["id"], entry["model"], bus, numa, cpus))
    return devices


def _expected(what: str, entry: dict[str, Any], key: str) -> str:
    return (
        f"expected {what}, got {show(entry[key])}" if key in entry else "required field is missing"
    )


def _cpus(text: Any, where: str, problems: Problems) -> tuple[int, ...]:
    """``"0-31,64-95"`` as CPU ids."""
    if not isinstance(text, str) or not re.fullmatch(r"(\d+(-\d+)?)?(,\d+(-\d+)?)*", text.strip()):
        problems.append((where, f"expected CPU ranges such as '0-31,64-95', got {show(text)}"))
        return ()
    cpus: list[int] = []
    for part in filter(None, text.strip().split(",")):
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(sorted(set(cpus)))


def _label(value: Any) -> tuple[LinkKind, int] | str:
    """A link label as (kind, NVLink count), or what is wrong with it."""
    if isinstance(value, str):
        found = re.fullmatch(r"(NVS|NV)(\d+)", value.strip())
        if found is not None:
            count = int(found.group(2))
            if count >= 1:
                return LinkKind(found.group(1)), count
            return f"{value!r} has no NVLinks; NV and NVS need a count of at least 1"
        if value.strip() in {kind.value for kind in LinkKind} - {"NV", "NVS"}:
            return LinkKind(value.strip()), 0
    return f"unknown link label {show(value)}; allowed: {_LABELS}"


def _gbs(value: Any) -> float | str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"expected GB/s as a number >= 0, got {show(value)}"
    return float(value) if value >= 0 else f"expected GB/s as a number >= 0, got {show(value)}"


def _latency(value: Any) -> float | str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"expected µs as a number >= 0, got {show(value)}"
    return float(value) if value >= 0 else f"expected µs as a number >= 0, got {show(value)}"


def _hops(value: Any) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"expected hops as a whole number >= 0, got {show(value)}"
    return value


def _matrix(
    value: Any, name: str, n: int, problems: Problems, parse: Callable[[Any], Any]
) -> list[list[Any]] | None:
    """``value`` as an n×n matrix of what ``parse`` makes of each cell (a string is a problem)."""
    if (
        not isinstance(value, list)
        or len(value) != n
        or any(not isinstance(row, list) or len(row) != n for row in value)
    ):
        problems.append((name, f"expected a {n}×{n} matrix, one row per device, got {show(value)}"))
        return None
    rows: list[list[Any]] = []
    for i, row in enumerate(value):
        cells = []
        for j, cell in enumerate(row):
            parsed = parse(cell)
            if isinstance(parsed, str):
                problems.append((f"{name}[{i}][{j}]", parsed))
            cells.append(parsed)
        rows.append(cells)
    return rows


def _derived_bandwidth(
    devices: Sequence[TopologyDevice], labels: list[list[tuple[LinkKind, int]]]
) -> list[list[float]]:
    """GB/s from the labels as the NVML reader rates them: NVLinks × the slower generation's
    rate, PCIe paths at the slower card's catalog generation, x16."""
    catalog = get_catalog()
    specs = [catalog.resolve(device.model, DeviceKind.GPU) for device in devices]
    rows = []
    for i, row in enumerate(labels):
        cells = []
        for j, (kind, count) in enumerate(row):
            if kind is LinkKind.SELF:
                cells.append(0.0)
            elif kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
                per_link = min(nvlink_gbs_per_link(specs[i]), nvlink_gbs_per_link(specs[j]))
                cells.append(count * per_link)
            else:
                generation = min(
                    catalog_pcie_generation(specs[i]), catalog_pcie_generation(specs[j])
                )
                cells.append(pcie_gbs(kind, generation))
        rows.append(cells)
    return rows
