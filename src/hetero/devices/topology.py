"""How the GPUs of one machine are wired, and which of them work best together.

``read_topology`` asks NVML (or a ``FakeNVML``) how every pair of GPUs is connected — through the
NVSwitch fabric, by direct NVLinks, or along a PCIe path named as ``nvidia-smi topo -m`` names it
(PIX, PXB, PHB, NODE, SYS) — and where each GPU sits (NUMA node, CPU affinity). The result is a
``Topology``: link kinds, a bandwidth matrix, and ``best_group(k)``, the k GPUs whose slowest link
is the fastest.

Bandwidths are bidirectional GB/s, the convention of the catalog's ``interconnect_gbs``; they are
nominal link rates, not measurements. docs/topology.md gives the figures and their sources.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.devices.catalog import get_catalog
from hetero.devices.discovery import bus_id_key, nvml_text, optional_module, visible_gpu_indices
from hetero.devices.spec import DeviceKind, DeviceSpec
from hetero.errors import AllocationError, ConfigError, DeviceError

__all__ = [
    "EXACT_SEARCH_LIMIT",
    "NVLINK_GBS_PER_LINK",
    "PCIE_PATH_FACTOR",
    "DeviceGroup",
    "Link",
    "LinkKind",
    "Topology",
    "TopologyDevice",
    "best_group_indices",
    "nvlink_gbs_per_link",
    "pcie_gbs",
    "read_topology",
]

log = logging.getLogger("hetero.topology")


class LinkKind(str, Enum):
    """How two GPUs reach each other, fastest first; values are ``nvidia-smi topo -m``'s labels."""

    SELF = "X"
    NVSWITCH = "NVS"
    NVLINK = "NV"
    PIX = "PIX"  # one PCIe switch between them
    PXB = "PXB"  # several PCIe switches, no host bridge
    PHB = "PHB"  # a PCIe host bridge (the CPU's root complex)
    NODE = "NODE"  # several host bridges within one NUMA node
    SYS = "SYS"  # across NUMA nodes: the sockets' SMP interconnect (QPI/UPI, Infinity Fabric)

    def __str__(self) -> str:
        return self.value


#: Bidirectional GB/s of one NVLink by NVLink generation: each generation's per-GPU total over its
#: link count (P100 160/4, V100 300/6, A100 600/12, H100 900/18, B200 1800/18).
NVLINK_GBS_PER_LINK: Mapping[int, float] = {1: 40.0, 2: 50.0, 3: 50.0, 4: 50.0, 5: 100.0}
# Generations 2-4 share 50 GB/s; used when the catalog names no NVLink generation for a model.
_DEFAULT_NVLINK_GBS = 50.0

#: Share of the PCIe link rate that GPU-to-GPU traffic keeps along each PCIe path. PIX runs at
#: link rate; NCCL models a host bridge on Intel CPUs as costing 1/6 more (PHB ≈ 0.8) and a
#: socket crossing at half of a Gen3 x16 link (QPI 6 of 12 GB/s, SYS = 0.5); PXB and NODE are
#: placed between their neighbours (assumptions, see docs/topology.md).
PCIE_PATH_FACTOR: Mapping[LinkKind, float] = {
    LinkKind.PIX: 1.0,
    LinkKind.PXB: 0.9,
    LinkKind.PHB: 0.8,
    LinkKind.NODE: 0.7,
    LinkKind.SYS: 0.5,
}
# PCIe generation assumed when neither NVML nor the catalog tells it: Gen3, the oldest in use in
# data centers, so an unknown link is never overrated.
_DEFAULT_PCIE_GENERATION = 3
_DEFAULT_PCIE_WIDTH = 16

#: Largest number of devices ``best_group_indices`` searches exactly; above it, greedy.
EXACT_SEARCH_LIMIT = 16

# 64-bit words asked of nvmlDeviceGetCpuAffinity: room for 1,024 CPUs.
_CPU_SET_WORDS = 16


def nvlink_gbs_per_link(spec: DeviceSpec) -> float:
    """Bidirectional GB/s of one NVLink of ``spec``'s generation (from its ``interconnect``)."""
    found = re.fullmatch(r"nvlink(\d+)", spec.interconnect.casefold())
    if found is None:
        return _DEFAULT_NVLINK_GBS
    return NVLINK_GBS_PER_LINK.get(int(found.group(1)), _DEFAULT_NVLINK_GBS)


def pcie_gbs(
    kind: LinkKind, generation: int = _DEFAULT_PCIE_GENERATION, width: int = _DEFAULT_PCIE_WIDTH
) -> float:
    """Bidirectional GB/s between two GPUs on PCIe ``generation`` x``width`` along path ``kind``.

    A x16 link carries 8 GB/s at Gen1 and twice as much each generation (Gen3 ≈ 32, Gen4 ≈ 64,
    Gen5 ≈ 128, as the catalog records them); the path keeps ``PCIE_PATH_FACTOR[kind]`` of it.
    """
    if kind not in PCIE_PATH_FACTOR:
        allowed = ", ".join(k.value for k in PCIE_PATH_FACTOR)
        raise ConfigError([("kind", f"{kind.value} is not a PCIe path; expected one of {allowed}")])
    for name, value in (("generation", generation), ("width", width)):
        if value < 1:
            raise ConfigError([(name, f"{value} is not a PCIe {name}; it must be at least 1")])
    x16 = 8.0 * 2.0 ** (generation - 1)
    return x16 * width / 16 * PCIE_PATH_FACTOR[kind]


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between two GPUs: its kind, NVLink count (0 on PCIe) and GB/s."""

    kind: LinkKind
    gbs: float
    nvlinks: int = 0

    @property
    def label(self) -> str:
        """``nvidia-smi topo -m`` style: ``NV12``, ``NVS18``, ``PIX``, ``SYS``, ``X``."""
        if self.kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
            return f"{self.kind}{self.nvlinks}"
        return str(self.kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "label": self.label,
            "nvlinks": self.nvlinks,
            "gbs": round(self.gbs, 3),
        }


_SELF = Link(LinkKind.SELF, 0.0)


@dataclass(frozen=True, slots=True)
class TopologyDevice:
    """One GPU of a topology: hetero's id, catalog model, PCI bus id and host placement."""

    id: str
    model: str
    pci_bus_id: str | None = None
    numa_node: int | None = None
    cpus: tuple[int, ...] = ()  # CPUs the GPU is local to (its CPU affinity); () when unknown

    @property
    def cpu_affinity(self) -> str:
        """``cpus`` as ranges, as nvidia-smi writes them (``0-31,64-95``); ``""`` when unknown."""
        ranges = []
        for _, run in itertools.groupby(enumerate(self.cpus), lambda p: p[1] - p[0]):
            ids = [cpu for _, cpu in run]
            ranges.append(f"{ids[0]}-{ids[-1]}" if len(ids) > 1 else str(ids[0]))
        return ",".join(ranges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "pci_bus_id": self.pci_bus_id,
            "numa_node": self.numa_node,
            "cpu_affinity": self.cpu_affinity,
        }


@dataclass(frozen=True, slots=True)
class DeviceGroup:
    """The devices ``Topology.best_group`` chose, their slowest link, and how it was found."""

    ids: tuple[str, ...]
    indices: tuple[int, ...]
    bottleneck: Link | None  # None for a group of one: it has no links
    exact: bool  # False when the greedy search (more than EXACT_SEARCH_LIMIT devices) chose

    @property
    def bottleneck_gbs(self) -> float | None:
        return None if self.bottleneck is None else self.bottleneck.gbs

    def to_dict(self) -> dict[str, Any]:
        return {
            "ids": list(self.ids),
            "bottleneck": None if self.bottleneck is None else self.bottleneck.to_dict(),
            "search": "exact" if self.exact else "greedy",
        }


@dataclass(frozen=True, slots=True)
class Topology:
    """The GPUs of one machine and the link between every pair (``links[i][j]``, symmetric)."""

    devices: tuple[TopologyDevice, ...] = ()
    links: tuple[tuple[Link, ...], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.devices)
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise DeviceError(f"topology: links must be a {n}×{n} matrix, one row per device")

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    @property
    def bandwidth(self) -> npt.NDArray[np.float64]:
        """GB/s between every pair of devices; the diagonal (no link to itself) is 0."""
        return np.array([[link.gbs for link in row] for row in self.links], dtype=np.float64)

    def index(self, device: str | int) -> int:
        """Position of a device given by id or position; ``DeviceError`` for an unknown one."""
        if isinstance(device, int) and 0 <= device < len(self):
            return device
        if isinstance(device, str) and device in self.ids:
            return self.ids.index(device)
        raise DeviceError(f"no device {device!r} in this topology; it has {', '.join(self.ids)}")

    def link(self, a: str | int, b: str | int) -> Link:
        """The link between two devices, given by id (``gpu:0``) or position."""
        return self.links[self.index(a)][self.index(b)]

    def best_group(self, k: int) -> DeviceGroup:
        """The ``k`` devices whose slowest link among them is the fastest (see
        ``best_group_indices``); ``AllocationError`` when ``k`` is not 1 to ``len(self)``."""
        indices, exact = best_group_indices(self.bandwidth, k)
        pairs = itertools.combinations(indices, 2)
        slowest = min((self.links[i][j] for i, j in pairs), key=lambda lk: lk.gbs, default=None)
        return DeviceGroup(tuple(self.ids[i] for i in indices), indices, slowest, exact)

    def format_matrix(self) -> str:
        """Link kinds, NUMA nodes and CPU affinity, then GB/s, as ``nvidia-smi topo -m`` lays
        them out, with a legend."""
        if not self.devices:
            return "no GPUs"
        kinds = [
            [*(link.label for link in row), _dash(d.numa_node), d.cpu_affinity or "-", d.model]
            for d, row in zip(self.devices, self.links, strict=True)
        ]
        gbs = [[_format_gbs(link) for link in row] for row in self.links]
        legend = "\n".join(f"  {label:<5} {meaning}" for label, meaning in _LEGEND)
        return (
            _grid("", [*self.ids, "NUMA", "CPU affinity", "model"], self.ids, kinds)
            + "\n\n"
            + _grid("GB/s", self.ids, self.ids, gbs)
            + "\n\nLegend:\n"
            + legend
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [d.to_dict() for d in self.devices],
            "links": [[link.label for link in row] for row in self.links],
            "bandwidth_gbs": [[round(link.gbs, 3) for link in row] for row in self.links],
        }


_LEGEND = (
    ("X", "self"),
    ("NVS#", "through the NVSwitch fabric, # NVLinks per GPU"),
    ("NV#", "# direct NVLinks"),
    ("PIX", "one PCIe switch"),
    ("PXB", "several PCIe switches, no host bridge"),
    ("PHB", "a PCIe host bridge (the CPU)"),
    ("NODE", "several host bridges within one NUMA node"),
    ("SYS", "across NUMA nodes (the sockets' interconnect)"),
)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _format_gbs(link: Link) -> str:
    return "-" if link.kind is LinkKind.SELF else f"{round(link.gbs, 1):g}"


def _grid(corner: str, header: Sequence[str], rows: Sequence[str], cells: list[list[str]]) -> str:
    table = [[corner, *header], *([name, *row] for name, row in zip(rows, cells, strict=True))]
    widths = [max(len(line[c]) for line in table) for c in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


# --- choosing a group ---------------------------------------------------------------------------


def best_group_indices(
    bandwidth: npt.ArrayLike, k: int, *, exact_up_to: int = EXACT_SEARCH_LIMIT
) -> tuple[tuple[int, ...], bool]:
    """The ``k`` devices (positions, ascending) that maximise the slowest link among them.

    Ties go to the larger total bandwidth, then to the lower positions. Up to ``exact_up_to``
    devices a branch-and-bound search is exact; above it a greedy search runs (see ``_greedy``).
    Returns the positions and whether the search was exact. ``bandwidth`` is a symmetric matrix
    whose diagonal is ignored.
    """
    matrix = np.asarray(bandwidth, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ConfigError([("bandwidth", f"must be a square matrix, got shape {matrix.shape}")])
    n = matrix.shape[0]
    if not 1 <= k <= n:
        allowed = f"a group has 1 to {n} devices" if n else "there are no devices to group"
        raise AllocationError(f"k={k} is out of range: {allowed}")
    greedy = _greedy(matrix, k)
    if n > exact_up_to:
        return greedy, False
    return _exact(matrix.tolist(), k, _score(matrix, greedy)[0]), True


def _score(matrix: npt.NDArray[np.float64], group: Sequence[int]) -> tuple[float, float]:
    """(slowest link, total bandwidth) of ``group``; a single device's slowest link is +inf."""
    sub = matrix[np.ix_(group, group)][np.triu_indices(len(group), 1)]
    return (float(sub.min()) if sub.size else math.inf, float(sub.sum()))


def _exact(bw: list[list[float]], k: int, floor: float) -> tuple[int, ...]:
    """Branch and bound over groups in lexicographic order.

    ``floor`` is a slowest link some group is known to reach (the greedy one's): a partial group
    whose slowest link is already below it, or below the best found so far, is cut, and so is a
    prefix with too few devices left after it. Equal bottlenecks are not cut, because a tie is
    broken by the total.
    """
    n = len(bw)
    best: tuple[tuple[float, float], tuple[int, ...]] = ((-math.inf, -math.inf), ())

    def extend(group: list[int], start: int, low: float, total: float) -> None:
        nonlocal best
        if len(group) == k:
            if (low, total) > best[0]:
                best = ((low, total), tuple(group))
            return
        cut = max(floor, best[0][0])
        for c in range(start, n - (k - len(group)) + 1):
            row = bw[c]
            new_low = min([low, *(row[g] for g in group)])
            if new_low < cut:
                continue
            extend([*group, c], c + 1, new_low, total + sum(row[g] for g in group))

    extend([], 0, math.inf, 0.0)
    return best[1]


def _greedy(matrix: npt.NDArray[np.float64], k: int) -> tuple[int, ...]:
    """Grow a group from every device in turn, each step adding the device whose slowest link to
    the group is fastest (ties: larger total, then lower position); keep the best group grown.

    O(n² k) and no guarantee: a group reachable only through a slower first pick can be missed.
    """
    n = matrix.shape[0]
    positions = np.arange(n)
    best: tuple[tuple[float, float], tuple[int, ...]] = ((-math.inf, -math.inf), ())
    for seed in range(n):
        group = [seed]
        free = np.ones(n, dtype=bool)
        free[seed] = False
        low, total = matrix[seed].copy(), matrix[seed].copy()
        while len(group) < k:
            cand = positions[free]
            # lexsort's last key is the primary one: fastest slowest link, larger total, lower id.
            pick = int(cand[np.lexsort((-cand, total[cand], low[cand]))[-1]])
            group.append(pick)
            free[pick] = False
            low = np.minimum(low, matrix[pick])
            total += matrix[pick]
        chosen = tuple(sorted(group))
        score = _score(matrix, chosen)
        if score > best[0]:
            best = (score, chosen)
    return best[1]


# --- reading NVML --------------------------------------------------------------------------------


def read_topology(nvml: Any | None = None, *, environ: Mapping[str, str] | None = None) -> Topology:
    """The topology of this machine's NVIDIA GPUs through NVML (``nvml`` replaces ``pynvml``,
    e.g. with a ``FakeNVML``).

    Devices are the GPUs ``CUDA_VISIBLE_DEVICES`` (from ``environ``, default ``os.environ``)
    leaves visible, with the ids discovery gives them (``gpu:0``, ...). A missing library or driver
    is not an error: the topology is then empty. A query the driver does not support degrades its
    answer (see docs/topology.md) instead of failing.
    """
    module = nvml if nvml is not None else optional_module("pynvml")
    if module is None:
        return Topology()
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError or a loader error: no NVIDIA GPUs
        log.debug("NVML unavailable: %s", exc)
        return Topology()
    try:
        return _Reader(module).read(os.environ if environ is None else environ)
    except Exception as exc:  # a driver failing mid-way is not the caller's error
        log.warning("NVML failed while reading the GPU topology (%s); reporting no GPUs", exc)
        return Topology()
    finally:
        with contextlib.suppress(Exception):  # shutting down after a failure
            module.nvmlShutdown()


@dataclass(slots=True)
class _NvLinks:
    """Where one GPU's active NVLinks go."""

    active: int = 0
    to_gpu: Counter[int] = field(default_factory=Counter)  # NVML index of the peer -> links
    to_switch: int = 0


class _Reader:
    """One pass over NVML; every query that fails is logged and answered ``None``."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.levels: dict[int, LinkKind] = {
            nvml.NVML_TOPOLOGY_INTERNAL: LinkKind.PIX,  # GPUs on one board: an on-board switch
            nvml.NVML_TOPOLOGY_SINGLE: LinkKind.PIX,
            nvml.NVML_TOPOLOGY_MULTIPLE: LinkKind.PXB,
            nvml.NVML_TOPOLOGY_HOSTBRIDGE: LinkKind.PHB,
            nvml.NVML_TOPOLOGY_NODE: LinkKind.NODE,
            nvml.NVML_TOPOLOGY_SYSTEM: LinkKind.SYS,
        }

    def query(self, fn: Callable[..., Any], *args: Any) -> Any | None:
        try:
            return fn(*args)
        except Exception as exc:  # unsupported queries degrade the answer
            log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def read(self, environ: Mapping[str, str]) -> Topology:
        nvml = self.nvml
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        buses = []
        listed = []
        for i, h in enumerate(handles):
            uuid = self.query(nvml.nvmlDeviceGetUUID, h)
            pci = self.query(nvml.nvmlDeviceGetPciInfo, h)
            buses.append(nvml_text(pci.busId) if pci else "")
            listed.append((i, nvml_text(uuid) if uuid else "", buses[-1]))
        order = visible_gpu_indices(environ.get("CUDA_VISIBLE_DEVICES"), listed)
        by_bus = {bus_id_key(bus): i for i, bus in enumerate(buses) if bus}
        catalog = get_catalog()
        names = {i: self.query(nvml.nvmlDeviceGetName, handles[i]) or "GPU" for i in order}
        specs = {i: catalog.resolve(nvml_text(name), DeviceKind.GPU) for i, name in names.items()}
        nvlinks = {i: self.nvlinks(handles[i], by_bus) for i in order}
        numa, cpus = self.placement([handles[i] for i in order])
        devices = tuple(
            TopologyDevice(f"gpu:{o}", specs[i].model, buses[i] or None, numa[o], cpus[o])
            for o, i in enumerate(order)
        )
        links = tuple(
            tuple(
                _SELF if a == b else self.link(handles, a, b, specs, nvlinks, (numa[x], numa[y]))
                for y, b in enumerate(order)
            )
            for x, a in enumerate(order)
        )
        return Topology(devices, links)

    def nvlinks(self, handle: Any, by_bus: Mapping[str, int]) -> _NvLinks:
        """Count one GPU's active NVLinks by the peer (a GPU or the NVSwitch) each reaches.

        Links are numbered from 0; the first one NVML rejects ends the list (a GPU without
        NVLink rejects link 0).
        """
        nvml = self.nvml
        found = _NvLinks()
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except Exception as exc:  # past the last link, or no NVLink at all
                log.debug("NVML nvmlDeviceGetNvLinkState(link %d) failed: %s", link, exc)
                break
            if not active:
                continue
            found.active += 1
            remote = self.query(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is None:
                continue  # active, but to an unknown end: counted only in ``active``
            peer = by_bus.get(bus_id_key(nvml_text(remote.busId)))
            if peer is not None:
                found.to_gpu[peer] += 1
                continue
            kind = self.query(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            # Older drivers cannot tell the remote type; a non-GPU end is then taken as a switch.
            if kind is None or kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                found.to_switch += 1
        return found

    def link(
        self,
        handles: Sequence[Any],
        a: int,
        b: int,
        specs: Mapping[int, DeviceSpec],
        nvlinks: Mapping[int, _NvLinks],
        numa: tuple[int | None, int | None],
    ) -> Link:
        nvml = self.nvml
        per_link = min(nvlink_gbs_per_link(specs[a]), nvlink_gbs_per_link(specs[b]))
        direct = max(nvlinks[a].to_gpu[b], nvlinks[b].to_gpu[a])
        if direct:
            return Link(LinkKind.NVLINK, direct * per_link, direct)
        p2p = self.query(
            nvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], nvml.NVML_P2P_CAPS_INDEX_NVLINK
        )
        switched = min(nvlinks[a].to_switch, nvlinks[b].to_switch)
        # Two GPUs on the fabric reach each other unless NVML says peer access over NVLink fails.
        if switched and p2p in (None, nvml.NVML_P2P_STATUS_OK):
            return Link(LinkKind.NVSWITCH, switched * per_link, switched)
        shared = min(nvlinks[a].active, nvlinks[b].active)
        if p2p == nvml.NVML_P2P_STATUS_OK and shared:
            # NVLink works between them but NVML cannot say where the links go: nvidia-smi's
            # NV# reading, the links the pair could share.
            return Link(LinkKind.NVLINK, shared * per_link, shared)
        ancestor = self.query(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
        kind = None if ancestor is None else self.levels.get(ancestor)
        if kind is None:  # no PCIe answer: the NUMA nodes still tell a socket crossing
            same_node = numa[0] is not None and numa[0] == numa[1]
            kind = LinkKind.NODE if same_node else LinkKind.SYS
        (gen_a, width_a), (gen_b, width_b) = (self.pcie_link(handles[x], specs[x]) for x in (a, b))
        return Link(kind, pcie_gbs(kind, min(gen_a, gen_b), min(width_a, width_b)))

    def pcie_link(self, handle: Any, spec: DeviceSpec) -> tuple[int, int]:
        """(generation, width) of a GPU's PCIe link: NVML's maximum, else the catalog's
        ``PCIeN`` interconnect, else Gen3 x16."""
        generation = self.query(self.nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
        if not generation:
            found = re.fullmatch(r"pcie(\d+)", spec.interconnect.casefold())
            generation = int(found.group(1)) if found else _DEFAULT_PCIE_GENERATION
        width = self.query(self.nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
        return int(generation), int(width or _DEFAULT_PCIE_WIDTH)

    def placement(self, handles: Sequence[Any]) -> tuple[list[int | None], list[tuple[int, ...]]]:
        """NUMA node and local CPUs of each GPU.

        The NUMA node comes from ``nvmlDeviceGetNumaNodeId`` where the driver has it; otherwise
        GPUs with the same CPU affinity share a node, numbered in the order of their lowest CPU.
        """
        nvml = self.nvml
        cpus = []
        for h in handles:
            words = self.query(nvml.nvmlDeviceGetCpuAffinity, h, _CPU_SET_WORDS)
            cpus.append(_cpu_ids(words) if words is not None else ())
        numa: list[int | None] = []
        for h in handles:
            node = self.query(nvml.nvmlDeviceGetNumaNodeId, h)
            numa.append(int(node) if node is not None and int(node) >= 0 else None)
        if all(n is None for n in numa):  # mixing the two numberings would not compare
            classes = sorted({c for c in cpus if c})
            numa = [classes.index(c) if c else None for c in cpus]
        return numa, cpus


def _cpu_ids(words: Sequence[int]) -> tuple[int, ...]:
    """The CPU ids set in an NVML CPU mask (64-bit words, lowest CPUs first)."""
    return tuple(
        64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    )
