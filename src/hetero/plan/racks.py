"""Racks for ``Affinity.same_rack``: the usable devices grouped by the rack of their node, and
a request's pick made within one rack.

Racks come from where nodes say them: a nodes file (``NodeTopology.racks``, ``rack_of``). A
node whose rack is not known is a rack of its own, so a same-rack request never spans it and
another node. Pure functions over ``placement``'s ``(leftover bytes, position, node)``
entries, for the pool to call under its lock as it calls ``placement.pick``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetero.plan.placement import Links, Usable, pick
from hetero.plan.request import AllocationRequest

__all__ = ["by_rack", "pick_in_one_rack"]


def by_rack(usable: Sequence[Usable], rack_of: Mapping[str, str]) -> dict[str, list[Usable]]:
    """``usable`` split by the rack of each entry's node, in first-seen order; a node missing
    from ``rack_of`` is keyed ``node:<name>``, a rack of its own."""
    racks: dict[str, list[Usable]] = {}
    for entry in usable:
        node = entry[2]
        rack = rack_of.get(node)
        racks.setdefault(f"rack:{rack}" if rack is not None else f"node:{node}", []).append(entry)
    return racks


def pick_in_one_rack(
    usable: Sequence[Usable],
    request: AllocationRequest,
    rack_of: Mapping[str, str],
    links: Links | None = None,
) -> list[int] | None:
    """Positions of ``request.count`` devices all in one rack (``placement.pick`` within each
    rack); ``None`` when no rack can take the request.

    Of the racks that can, the pick on the fewest nodes wins, then the one that leaves the
    least memory over, then the lowest positions, so the choice is deterministic.
    """
    best: tuple[tuple[int, int, list[int]], list[int]] | None = None
    for entries in by_rack(usable, rack_of).values():
        chosen = pick(entries, request, links)
        if chosen is None:
            continue
        left = {position: (leftover, node) for leftover, position, node in entries}
        nodes = len({left[p][1] for p in chosen})
        key = (nodes, sum(left[p][0] for p in chosen), chosen)
        if best is None or key < best[0]:
            best = (key, chosen)
    return None if best is None else best[1]
