"""How the GPUs of one machine are wired, and which of them work best together.

``read_topology`` (``topology_nvml.py``) asks NVML (or a ``FakeNVML``) how every pair of GPUs is
connected — through the NVSwitch fabric, by direct NVLinks, or along a PCIe path named as
``nvidia-smi topo -m`` names it (PIX, PXB, PHB, NODE, SYS) — and where each GPU sits (NUMA node, CPU
affinity). The result is a ``Topology``: link kinds, a bandwidth matrix, and ``best_group(k)``, the
k GPUs whose slowest link is the fastest. A topology that contradicts itself (a device listed twice,
a link that differs by direction) is refused. ``rank_order`` (``rings.py``) orders the ranks of a
job so that ring neighbours share the fastest links; ``NodeTopology`` links the nodes of a cluster
through the NICs each reports, and says which rack each node is in.

Bandwidths are bidirectional GB/s, the convention of the catalog's ``interconnect_gbs``; they are
nominal link rates, not measurements. Beside each link's bandwidth are its latency (NCCL's
figure for the medium) and hops (the links a transfer crosses). docs/topology.md gives the
figures and their sources.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.devices.network import Nic
from hetero.devices.spec import DeviceSpec
from hetero.errors import AllocationError, ConfigError, DeviceError

__all__ = [
    "CROSS_RACK_HOPS",
    "EXACT_SEARCH_LIMIT",
    "LINK_HOPS",
    "NET_LATENCY_US",
    "NVLINK_GBS_PER_LINK",
    "NVLINK_LATENCY_US",
    "PCIE_LATENCY_US",
    "PCIE_PATH_FACTOR",
    "SAME_RACK_HOPS",
    "DeviceGroup",
    "Link",
    "LinkKind",
    "NodeLink",
    "NodeTopology",
    "Topology",
    "TopologyDevice",
    "best_group_indices",
    "catalog_pcie_generation",
    "link_latency_us",
    "nvlink_gbs_per_link",
    "pcie_gbs",
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
DEFAULT_PCIE_WIDTH = 16

#: Largest number of devices ``best_group_indices`` searches exactly; above it, greedy.
EXACT_SEARCH_LIMIT = 16

#: Latency in µs of one step of a small message over each medium: NCCL's hardware latencies
#: (``hwLat`` in ``src/graph/tuning.cc``, ring algorithm, LL protocol): NVLink 0.6, PCIe 1.0,
#: the network 2.7. NCCL gives every PCIe path one figure, and so does hetero.
NVLINK_LATENCY_US = 0.6
PCIE_LATENCY_US = 1.0
NET_LATENCY_US = 2.7

#: The fewest links a transfer crosses on each kind of path: NV goes GPU to GPU; NVS and PIX
#: through one switch; PHB through the host bridge; PXB through two PCIe switches; NODE
#: through two host bridges of one socket; SYS through both sockets.
LINK_HOPS: Mapping[LinkKind, int] = {
    LinkKind.SELF: 0,
    LinkKind.NVLINK: 1,
    LinkKind.NVSWITCH: 2,
    LinkKind.PIX: 2,
    LinkKind.PXB: 3,
    LinkKind.PHB: 2,
    LinkKind.NODE: 3,
    LinkKind.SYS: 3,
}


def link_latency_us(kind: LinkKind) -> float:
    """Nominal latency of a link of ``kind`` (0 for a device and itself)."""
    if kind is LinkKind.SELF:
        return 0.0
    if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
        return NVLINK_LATENCY_US
    return PCIE_LATENCY_US


def nvlink_gbs_per_link(spec: DeviceSpec) -> float:
    """Bidirectional GB/s of one NVLink of ``spec``'s generation (from its ``interconnect``)."""
    found = re.fullmatch(r"nvlink(\d+)", spec.interconnect.casefold())
    if found is None:
        return _DEFAULT_NVLINK_GBS
    return NVLINK_GBS_PER_LINK.get(int(found.group(1)), _DEFAULT_NVLINK_GBS)


def pcie_gbs(
    kind: LinkKind, generation: int = _DEFAULT_PCIE_GENERATION, width: int = DEFAULT_PCIE_WIDTH
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


def catalog_pcie_generation(spec: DeviceSpec) -> int:
    """The PCIe generation of ``spec``'s ``PCIeN`` interconnect; Gen3 when it names none."""
    found = re.fullmatch(r"pcie(\d+)", spec.interconnect.casefold())
    return int(found.group(1)) if found else _DEFAULT_PCIE_GENERATION


@dataclass(frozen=True, slots=True)
class Link:
    """The connection between two GPUs: its kind, NVLink count (0 on PCIe), GB/s, latency in
    µs and hops; latency and hops left out (negative) are the kind's nominal ones
    (``link_latency_us``, ``LINK_HOPS``)."""

    kind: LinkKind
    gbs: float
    nvlinks: int = 0
    latency_us: float = -1.0
    hops: int = -1

    def __post_init__(self) -> None:
        if self.latency_us < 0:
            object.__setattr__(self, "latency_us", link_latency_us(self.kind))
        if self.hops < 0:
            object.__setattr__(self, "hops", LINK_HOPS[self.kind])

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
            "latency_us": self.latency_us,
            "hops": self.hops,
        }


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
        problems = _contradictions(self.devices, self.links)
        if problems:
            raise ConfigError(problems)

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
        latency = [
            [_format_latency(link.latency_us, link.hops) for link in row] for row in self.links
        ]
        legend = "\n".join(f"  {label:<5} {meaning}" for label, meaning in _LEGEND)
        return (
            _grid("", [*self.ids, "NUMA", "CPU affinity", "model"], self.ids, kinds)
            + "\n\n"
            + _grid("GB/s", self.ids, self.ids, gbs)
            + "\n\n"
            + _grid("µs/hops", self.ids, self.ids, latency)
            + "\n\nLegend:\n"
            + legend
            + "\n"
            + _LATENCY_LEGEND
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [d.to_dict() for d in self.devices],
            "links": [[link.label for link in row] for row in self.links],
            "bandwidth_gbs": [[round(link.gbs, 3) for link in row] for row in self.links],
            "latency_us": [[link.latency_us for link in row] for row in self.links],
            "hops": [[link.hops for link in row] for row in self.links],
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
_LATENCY_LEGEND = (
    "µs/hops: latency of one small step over the link (NCCL's figure for NVLink or PCIe) / "
    "links a transfer crosses"
)


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _format_gbs(link: Link) -> str:
    return "-" if link.kind is LinkKind.SELF else f"{round(link.gbs, 1):g}"


def _format_latency(latency_us: float | None, hops: int | None) -> str:
    """``0.6/1``; ``-`` for a device and itself, ``?`` for what is not known."""
    if hops == 0:
        return "-"
    us = "?" if latency_us is None else f"{latency_us:g}"
    return f"{us}/{'?' if hops is None else hops}"


def _grid(corner: str, header: Sequence[str], rows: Sequence[str], cells: list[list[str]]) -> str:
    table = [[corner, *header], *([name, *row] for name, row in zip(rows, cells, strict=True))]
    widths = [max(len(line[c]) for line in table) for c in range(len(table[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    )


def _contradictions(
    devices: Sequence[TopologyDevice], links: Sequence[Sequence[Link]]
) -> list[tuple[str, str]]:
    """What a topology says that cannot be true: a device listed twice, a device whose link to
    itself is not ``X``, ``X`` between two devices, a link that differs by direction."""
    problems: list[tuple[str, str]] = []
    first: dict[str, int] = {}
    for i, device in enumerate(devices):
        if device.id in first:
            problems.append(
                (
                    f"devices[{i}].id",
                    f"{device.id!r} is listed twice (also devices[{first[device.id]}])",
                )
            )
        first.setdefault(device.id, i)
    for i, row in enumerate(links):
        for j, link in enumerate(row):
            a, b = devices[i].id, devices[j].id
            if i == j and link.kind is not LinkKind.SELF:
                problems.append(
                    (f"links[{i}][{j}]", f"the link of {a} to itself must be X, got {link.label}")
                )
            elif i != j and link.kind is LinkKind.SELF:
                problems.append(
                    (f"links[{i}][{j}]", f"X (a device itself) between two devices, {a} and {b}")
                )
            elif i < j and link != links[j][i]:
                # The first of label, rate, latency and hops that differs is what contradicts
                # itself, in the matrix a topology file gives it in.
                back = links[j][i]
                matrix = next(
                    (
                        name
                        for name, x, y in (
                            ("links", link.label, back.label),
                            ("bandwidth_gbs", link.gbs, back.gbs),
                            ("latency_us", link.latency_us, back.latency_us),
                            ("hops", link.hops, back.hops),
                        )
                        if x != y
                    ),
                    "links",
                )
                timing = matrix in ("latency_us", "hops")
                problems.append(
                    (
                        f"{matrix}[{j}][{i}]",
                        f"{a} → {b} is {_in_words(link, timing)} but {b} → {a} is "
                        f"{_in_words(back, timing)}; a link is the same both ways",
                    )
                )
    return problems


def _in_words(link: Link, timing: bool = False) -> str:
    words = f"{link.label} at {link.gbs:g} GB/s"
    return f"{words}, {link.latency_us:g} µs, {link.hops} hops" if timing else words


# --- between nodes -------------------------------------------------------------------------------


#: Short names of the fabrics in link labels.
_FABRIC_LABEL: Mapping[str, str] = {"infiniband": "IB", "ethernet": "ETH"}


#: Switch-to-switch links a transfer between two nodes crosses: within one rack, node → the
#: rack's top-of-rack switch → node; across racks, up to a spine and down again (a two-tier
#: leaf-spine network, the racks' switches as its leaves).
SAME_RACK_HOPS = 2
CROSS_RACK_HOPS = 4


@dataclass(frozen=True, slots=True)
class NodeLink:
    """How two nodes reach each other: the fabric they share and its rate, Gb/s each way (the
    slower node's NICs on that fabric, summed); ``fabric`` is ``None`` when they share none, or
    for a node and itself. ``latency_us`` is NCCL's network figure (``NET_LATENCY_US``) when
    they share a fabric; ``hops`` the links crossed (``SAME_RACK_HOPS``, ``CROSS_RACK_HOPS``),
    ``None`` when a node's rack is not known."""

    fabric: str | None
    gbps: float
    latency_us: float | None = None
    hops: int | None = None

    @property
    def gbs(self) -> float:
        """Bidirectional GB/s, the unit of GPU links: Gb/s each way × 2 / 8."""
        return self.gbps / 4

    @property
    def label(self) -> str:
        """``IB 1600G``, ``ETH 100G``, ``-`` (no shared fabric)."""
        if self.fabric is None:
            return "-"
        return f"{_FABRIC_LABEL.get(self.fabric, self.fabric)} {self.gbps:g}G"

    def to_dict(self) -> dict[str, Any]:
        return {
            "fabric": self.fabric,
            "label": self.label,
            "gbps": self.gbps,
            "gbs": self.gbs,
            "latency_us": self.latency_us,
            "hops": self.hops,
        }


_SAME_NODE = NodeLink(None, 0.0, 0.0, 0)


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """The nodes of a cluster, the NICs each reports and the rack each is in (``racks``, one
    per node, ``None`` where unknown; left out, none is known); ``link(a, b)`` is the best
    fabric both have (see ``NodeLink``). A node with no NICs known reaches no other."""

    nodes: tuple[str, ...]
    nics: tuple[tuple[Nic, ...], ...]
    racks: tuple[str | None, ...] = ()

    def __post_init__(self) -> None:
        if len(self.nics) != len(self.nodes):
            raise DeviceError(
                f"node topology: {len(self.nodes)} nodes but NICs for {len(self.nics)}"
            )
        if not self.racks:
            object.__setattr__(self, "racks", (None,) * len(self.nodes))
        elif len(self.racks) != len(self.nodes):
            raise DeviceError(
                f"node topology: {len(self.nodes)} nodes but racks for {len(self.racks)}"
            )
        problems: list[tuple[str, str]] = []
        first: dict[str, int] = {}
        for i, node in enumerate(self.nodes):
            if node in first:
                problems.append(
                    (f"nodes[{i}]", f"{node!r} is listed twice (also nodes[{first[node]}])")
                )
            first.setdefault(node, i)
        for i, rack in enumerate(self.racks):
            if rack is not None and (not isinstance(rack, str) or not rack.strip()):
                problems.append(
                    (f"nodes[{i}].rack", f"expected a rack name or None (unknown), got {rack!r}")
                )
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_nics(
        cls, nics: Mapping[str, Sequence[Nic]], racks: Mapping[str, str] | None = None
    ) -> NodeTopology:
        """Nodes in the mapping's order, each with its NICs and its rack in ``racks`` (a node
        missing there: unknown). A rack for a node not in ``nics`` is an error."""
        racks = dict(racks or {})
        stray = [node for node in racks if node not in nics]
        if stray:
            raise ConfigError(
                [
                    (
                        f"racks[{node!r}]",
                        f"no node {node!r}; the nodes are {', '.join(nics) or 'none'}",
                    )
                    for node in stray
                ]
            )
        return cls(
            tuple(nics),
            tuple(tuple(n) for n in nics.values()),
            tuple(racks.get(node) for node in nics),
        )

    def rack(self, node: str) -> str | None:
        """The rack ``node`` is in; ``None`` when not known."""
        return self.racks[self.index(node)]

    def same_rack(self, a: str, b: str) -> bool | None:
        """Whether nodes ``a`` and ``b`` share a rack; ``None`` when either's is unknown (a
        node is always in its own rack)."""
        if self.index(a) == self.index(b):
            return True
        ra, rb = self.rack(a), self.rack(b)
        return None if ra is None or rb is None else ra == rb

    @property
    def rack_of(self) -> dict[str, str]:
        """Node -> rack, for the nodes whose rack is known."""
        return {n: r for n, r in zip(self.nodes, self.racks, strict=True) if r is not None}

    def __len__(self) -> int:
        return len(self.nodes)

    def index(self, node: str) -> int:
        if node in self.nodes:
            return self.nodes.index(node)
        raise DeviceError(
            f"no node {node!r} in this topology; it has {', '.join(self.nodes) or 'no nodes'}"
        )

    def link(self, a: str, b: str) -> NodeLink:
        """The link between nodes ``a`` and ``b``: for each fabric both have, the slower node's
        total Gb/s on it; the fastest such fabric (InfiniBand on a tie)."""
        i, j = self.index(a), self.index(b)
        if i == j:
            return _SAME_NODE
        together = self.same_rack(a, b)
        hops = None if together is None else SAME_RACK_HOPS if together else CROSS_RACK_HOPS
        totals = [_fabric_totals(self.nics[i]), _fabric_totals(self.nics[j])]
        shared = [
            (min(totals[0][f], totals[1][f]), f == "infiniband", f)
            for f in totals[0]
            if f in totals[1]
        ]
        if not shared:
            return NodeLink(None, 0.0, None, hops)
        gbps, _, fabric = max(shared)
        return NodeLink(fabric, gbps, NET_LATENCY_US, hops)

    @property
    def bandwidth(self) -> npt.NDArray[np.float64]:
        """Bidirectional GB/s between every pair of nodes; 0 on the diagonal and where they
        share no fabric."""
        return np.array([[self.link(a, b).gbs for b in self.nodes] for a in self.nodes])

    def format_matrix(self) -> str:
        """The fabric and rate of every pair, then GB/s, then each node's NICs."""
        if not self.nodes:
            return "no nodes"
        gbs = [
            ["-" if a == b else f"{round(self.link(a, b).gbs, 1):g}" for b in self.nodes]
            for a in self.nodes
        ]
        latency = [
            [_format_latency(self.link(a, b).latency_us, self.link(a, b).hops) for b in self.nodes]
            for a in self.nodes
        ]
        nics = [
            [
                rack or "-",
                ", ".join(f"{n.name} {n.fabric} {n.gbps:g} Gb/s" for n in node_nics)
                or "none known",
            ]
            for rack, node_nics in zip(self.racks, self.nics, strict=True)
        ]
        return (
            _grid("", self.nodes, self.nodes, self._labels())
            + "\n\n"
            + _grid("GB/s", self.nodes, self.nodes, gbs)
            + "\n\n"
            + _grid("µs/hops", self.nodes, self.nodes, latency)
            + "\n\n"
            + _grid("node", ["rack", "NICs"], self.nodes, nics)
            + "\n\nIB #G / ETH #G: the fabric both nodes have, # Gb/s each way (the slower "
            "node's NICs on it, summed); -: no shared fabric; GB/s: both ways, as GPU links; "
            "µs/hops: NCCL's network latency / links crossed (2 within a rack, 4 across racks, "
            "? where a rack is not known)"
        )

    def to_dict(self) -> dict[str, Any]:
        links = [[self.link(a, b) for b in self.nodes] for a in self.nodes]
        return {
            "nodes": [
                {"name": node, "rack": rack, "nics": [n.to_dict() for n in nics]}
                for node, rack, nics in zip(self.nodes, self.racks, self.nics, strict=True)
            ],
            "links": self._labels(),
            "bandwidth_gbs": [[round(v, 3) for v in row] for row in self.bandwidth.tolist()],
            "latency_us": [[link.latency_us for link in row] for row in links],
            "hops": [[link.hops for link in row] for row in links],
        }

    def _labels(self) -> list[list[str]]:
        return [["X" if a == b else self.link(a, b).label for b in self.nodes] for a in self.nodes]


def _fabric_totals(nics: Sequence[Nic]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for nic in nics:
        totals[nic.fabric] = totals.get(nic.fabric, 0.0) + nic.gbps
    return totals


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
