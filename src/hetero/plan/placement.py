"""Which usable devices a request gets: best fit on the fewest nodes, the best-connected group
where the links tell groups apart, and never two MIG slices of one GPU. Pure functions over
``(leftover bytes, position, node)`` entries; ``DevicePool`` calls them under its lock."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from hetero.devices.spec import Device
from hetero.devices.topology import best_group_indices
from hetero.plan.request import AllocationRequest

__all__ = ["Links", "Usable", "gpu_of", "one_slice_per_gpu", "pick"]

#: A device that can take the request now: memory it would have left over, its position in
#: the pool, its node.
Usable = tuple[int, int, str]
#: GB/s between every pair of the devices at these positions (0 where unknown).
Links = Callable[[Sequence[int]], npt.NDArray[np.float64]]


def gpu_of(device: Device) -> str | None:
    """The physical GPU ``device`` is on, if known: a MIG slice's ``parent``, else the GPU's own
    UUID."""
    return device.parent or device.uuid


def one_slice_per_gpu(usable: Sequence[Usable], devices: Sequence[Device]) -> list[Usable]:
    """``usable`` sorted, keeping of the devices on one physical GPU (``gpu_of``: the MIG
    slices of one GPU, or a GPU listed beside its slices) only the one that fits best. A
    process sees one slice and slices have no path between them, so one allocation (one
    collective) never holds two of them; which one it takes changes no other choice."""
    seen: set[str] = set()
    kept = []
    for entry in sorted(usable):
        gpu = gpu_of(devices[entry[1]])
        if gpu is not None:
            if gpu in seen:
                continue
            seen.add(gpu)
        kept.append(entry)
    return kept


def pick(
    usable: Sequence[Usable], request: AllocationRequest, links: Links | None = None
) -> list[int] | None:
    """Positions of ``request.count`` devices out of ``usable``; ``None`` when nothing fits.

    Best fit on the fewest nodes: whole nodes with the most usable devices first, then the rest
    from the node that offers the best-connected group of that many (see ``_best_connected``;
    without ``links`` every group is alike), and among equals, where they leave the least
    memory over; ``spread`` takes each node's best fit. Ties go to the lower position, so the
    pick is deterministic.
    """
    count = request.count
    by_node: dict[str, list[tuple[int, int]]] = {}
    for leftover, position, node in sorted(usable):
        by_node.setdefault(node, []).append((leftover, position))
    fits = list(by_node.values())
    if request.grouping == "spread":
        best = sorted(node_fits[0] for node_fits in fits)
        return sorted(p for _, p in best[:count]) if len(best) >= count else None
    fits.sort(
        key=lambda node_fits: (-len(node_fits), sum(left for left, _ in node_fits), node_fits[0])
    )
    # Whole nodes, largest first, until the next one could finish the request by itself.
    taken: list[tuple[int, int]] = []
    first = 0
    while first < len(fits) and len(taken) + len(fits[first]) < count:
        taken.extend(fits[first])
        first += 1
    if first == len(fits) or (taken and request.grouping == "one_node"):
        return None
    rest = count - len(taken)
    options = [
        (*_best_connected(node_fits, rest, links), node_fits[0])
        for node_fits in fits[first:]
        if len(node_fits) >= rest
    ]
    _, last, _ = min(options, key=lambda o: (-o[0], sum(left for left, _ in o[1]), o[2]))
    return sorted(p for _, p in taken + last)


def _best_connected(
    node_fits: list[tuple[int, int]], rest: int, links: Links | None
) -> tuple[float, list[tuple[int, int]]]:
    """The ``rest`` devices to take from one node's ``(leftover, position)`` list (best fit
    first), and their slowest link in GB/s.

    The best-fitting ones, unless the node's links tell groups apart: then the group whose
    slowest link is fastest (``best_group_indices``; ties to the larger total bandwidth, then
    to the better fit). A single device has no link (``inf``); so has every group when there
    are no ``links``.
    """
    if links is None or rest == 1:
        return math.inf, node_fits[:rest]
    matrix = links([p for _, p in node_fits])
    pairs = np.triu_indices(len(node_fits), 1)
    if rest == len(node_fits) or np.ptp(matrix[pairs]) == 0:
        chosen: Sequence[int] = range(rest)
    else:
        chosen, _ = best_group_indices(matrix, rest)
    group = list(chosen)
    slowest = matrix[np.ix_(group, group)][np.triu_indices(rest, 1)].min()
    return float(slowest), [node_fits[i] for i in group]
