"""The order of a job's ranks: ring neighbours on the fastest links (``rank_order``), a ring
through a bandwidth matrix (``ring_order``), and the matrix of a group of devices across their
nodes' topologies (``device_bandwidth``)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hetero.devices.discovery import bus_id_key
from hetero.devices.spec import Device
from hetero.devices.topology import NodeTopology, Topology
from hetero.errors import ConfigError

__all__ = ["RING_SEARCH_STARTS", "device_bandwidth", "rank_order", "ring_order"]

#: Largest number of devices ``ring_order`` grows a ring from every device for; above it, from
#: the first device only.
RING_SEARCH_STARTS = 64


def ring_order(bandwidth: npt.ArrayLike) -> list[int]:
    """A ring through every device that keeps its slowest link between neighbours fast.

    Returns positions starting with 0; position ``order[k]`` neighbours ``order[k + 1]`` and
    the last neighbours the first. Greedy (nearest neighbour): from a start, step each time to
    the unvisited device with the fastest link to the current one (ties: the lower position).
    Rings are grown from every start up to ``RING_SEARCH_STARTS`` devices; the ring with the
    fastest slowest link wins among those and the positions in their given order (ties: the
    larger total, then the given order, then the earlier start), so the result is never worse
    than the given order. It is then turned to begin at 0, running towards the lower of 0's
    two neighbours. No guarantee of the best ring (a bottleneck travelling-salesman problem).
    """
    matrix = np.asarray(bandwidth, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ConfigError([("bandwidth", f"must be a square matrix, got shape {matrix.shape}")])
    n = matrix.shape[0]
    if n <= 2:
        return list(range(n))
    best: tuple[tuple[float, float], list[int]] | None = None
    starts = range(n if n <= RING_SEARCH_STARTS else 1)
    for ring in itertools.chain([list(range(n))], (_nearest_neighbour(matrix, s) for s in starts)):
        edges = matrix[ring, np.roll(ring, -1)]
        score = (float(edges.min()), float(edges.sum()))
        if best is None or score > best[0]:
            best = (score, ring)
    assert best is not None
    ring = best[1]
    at = ring.index(0)
    ring = ring[at:] + ring[:at]
    return ring if ring[1] < ring[-1] else [0, *reversed(ring[1:])]


def _nearest_neighbour(matrix: npt.NDArray[np.float64], start: int) -> list[int]:
    free = np.ones(matrix.shape[0], dtype=bool)
    free[start] = False
    ring = [start]
    for _ in range(matrix.shape[0] - 1):
        candidates = np.flatnonzero(free)
        # argmax takes the first of equal links: the lower position.
        step = int(candidates[np.argmax(matrix[ring[-1], candidates])])
        ring.append(step)
        free[step] = False
    return ring


def device_bandwidth(
    devices: Sequence[Device],
    topology: Topology | Mapping[str, Topology],
    nodes: NodeTopology | None = None,
) -> npt.NDArray[np.float64]:
    """Bidirectional GB/s between every pair of ``devices``, 0 where it is not known.

    ``topology`` is the topology of the one machine all devices are on, or one per node
    (``{node: Topology}``). A device is found in its node's topology by id, else by PCI bus id
    (so a MIG slice that carries its GPU's bus id takes that GPU's links). Devices on different
    nodes are linked as ``nodes`` links their nodes. Two devices found at the same GPU (slices
    of one GPU) get 0: they never work as two ranks.
    """
    by_node = _per_node(devices, topology)
    found = _find_in_topologies(devices, by_node)
    n = len(devices)
    matrix = np.zeros((n, n))
    for i, j in itertools.combinations(range(n), 2):
        a, b = devices[i], devices[j]
        x, y = found[i], found[j]
        if a.node != b.node:
            if nodes is not None and a.node in nodes.nodes and b.node in nodes.nodes:
                matrix[i, j] = matrix[j, i] = nodes.link(a.node, b.node).gbs
        elif x is not None and y is not None:
            matrix[i, j] = matrix[j, i] = by_node[a.node].links[x][y].gbs
    return matrix


def rank_order(
    devices: Sequence[Device],
    topology: Topology | Mapping[str, Topology],
    *,
    nodes: NodeTopology | None = None,
) -> list[int]:
    """The order in which to hand ranks to ``devices`` so that ring neighbours share fast links.

    Returns ``order``, a permutation of ``range(len(devices))`` with ``order[0] == 0``: rank
    ``r`` runs on ``devices[order[r]]``, and ranks ``r`` and ``r + 1`` (and the last rank and
    rank 0) are neighbours in the ring that ring all-reduce sends along. Links come from
    ``device_bandwidth(devices, topology, nodes)``.

    The devices of one node stay together. On one node the order is ``ring_order`` of its
    links. Over several nodes each node's devices form a chain (its ring opened at its slowest
    link; the first node's chain starts at ``devices[0]``), and the chains follow the order the
    nodes first appear in ``devices``, or with ``nodes`` and more than two nodes, a
    ``ring_order`` of the node links starting at the first device's node.
    """
    matrix = device_bandwidth(devices, topology, nodes)
    members: dict[str, list[int]] = {}
    for i, device in enumerate(devices):
        members.setdefault(device.node, []).append(i)
    names = list(members)
    if nodes is not None and len(names) > 2:
        known = [name in nodes.nodes for name in names]
        links = [
            [nodes.link(a, b).gbs if known[x] and known[y] else 0.0 for y, b in enumerate(names)]
            for x, a in enumerate(names)
        ]
        names = [names[k] for k in ring_order(links)]
    order: list[int] = []
    for n, name in enumerate(names):
        group = members[name]
        sub = matrix[np.ix_(group, group)]
        ring = ring_order(sub)
        chain = ring if len(names) == 1 else _open_ring(ring, sub, keep_start=n == 0)
        order += [group[k] for k in chain]
    return order


def _open_ring(ring: list[int], matrix: npt.NDArray[np.float64], keep_start: bool) -> list[int]:
    """``ring`` as a chain without its slowest link (``keep_start``: still starting at
    ``ring[0]``, without the slower of its two links)."""
    n = len(ring)
    if n <= 2:
        return ring
    edges = [float(matrix[ring[k], ring[(k + 1) % n]]) for k in range(n)]
    if keep_start:
        return ring if edges[-1] <= edges[0] else [ring[0], *reversed(ring[1:])]
    cut = int(np.argmin(edges))
    return ring[cut + 1 :] + ring[: cut + 1]


def _per_node(
    devices: Sequence[Device], topology: Topology | Mapping[str, Topology]
) -> Mapping[str, Topology]:
    if isinstance(topology, Topology):
        on = sorted({d.node for d in devices})
        if len(on) > 1:
            raise ConfigError(
                [
                    (
                        "topology",
                        f"one Topology describes one machine, but the devices are on nodes "
                        f"{', '.join(on)}; pass one per node as {{node: Topology}}",
                    )
                ]
            )
        return dict.fromkeys(on, topology)
    bad = [node for node, topo in topology.items() if not isinstance(topo, Topology)]
    if bad:
        raise ConfigError(
            [(f"topology[{bad[0]!r}]", f"expected a Topology, got {topology[bad[0]]!r}")]
        )
    return topology


def _find_in_topologies(
    devices: Sequence[Device], topologies: Mapping[str, Topology]
) -> list[int | None]:
    """Each device's position in its node's topology (by id, else PCI bus id), or None."""
    keys: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    found: list[int | None] = []
    for device in devices:
        topology = topologies.get(device.node)
        if topology is None:
            found.append(None)
            continue
        if device.node not in keys:
            keys[device.node] = (
                {d.id: i for i, d in enumerate(topology.devices)},
                {
                    bus_id_key(d.pci_bus_id): i
                    for i, d in enumerate(topology.devices)
                    if d.pci_bus_id
                },
            )
        by_id, by_bus = keys[device.node]
        position = by_id.get(device.id)
        if position is None and device.pci_bus_id:
            position = by_bus.get(bus_id_key(device.pci_bus_id))
        found.append(position)
    return found
