"""Racks for ``Affinity.same_rack``: the usable devices grouped by the rack of their node, and
a request's pick made within one rack.

Racks come from where nodes say them: a fleet config's device entries (``rack:``, carried as
``Device.rack``) or a nodes file (``NodeTopology.racks``, ``rack_of``), both of which a
``DevicePool`` takes. A node whose rack is not known is a rack of its own, so a same-rack
request never spans it and another node. Pure functions over ``placement``'s ``(leftover
bytes, position, node)`` entries, for the pool to call under its lock as it calls
``placement.pick``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetero.plan.placement import Links, Usable, pick
from hetero.plan.request import AllocationRequest

__all__ = ["by_rack", "pick_in_one_rack", "pick_placed", "rack_key", "rack_label"]


def rack_key(node: str, rack_of: Mapping[str, str]) -> str:
    """``rack:<name>`` for a node of a known rack, ``node:<name>`` (a rack of its own) else."""
    rack = rack_of.get(node)
    return f"rack:{rack}" if rack is not None else f"node:{node}"


def rack_label(key: str) -> str:
    """A ``rack_key`` in words, as error messages name it."""
    what, _, name = key.partition(":")
    return f"rack {name!r}" if what == "rack" else f"node {name!r} (rack unknown)"


def by_rack(usable: Sequence[Usable], rack_of: Mapping[str, str]) -> dict[str, list[Usable]]:
    """``usable`` split by the rack of each entry's node, in first-seen order; a node missing
    from ``rack_of`` is keyed ``node:<name>``, a rack of its own."""
    racks: dict[str, list[Usable]] = {}
    for entry in usable:
        racks.setdefault(rack_key(entry[2], rack_of), []).append(entry)
    return racks


def pick_placed(
    usable: Sequence[Usable],
    request: AllocationRequest,
    rack_of: Mapping[str, str],
    links: Links | None = None,
) -> list[int] | None:
    """The pick ``request`` gets: within one rack for ``same_rack`` (``pick_in_one_rack``),
    else ``placement.pick``, whose one-node rule already keeps ``same_node`` in one rack."""
    if request.affinity.same_rack and not request.affinity.one_node:
        return pick_in_one_rack(usable, request, rack_of, links)
    return pick(usable, request, links)


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
