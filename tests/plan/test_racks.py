"""``Affinity.same_rack``: the level beside ``same_node``, and the pick within one rack of the
racks a nodes file gives (``hetero.plan.racks``)."""

from __future__ import annotations

import pytest

from hetero.devices.network import Nic
from hetero.devices.topology import NodeTopology
from hetero.errors import ConfigError
from hetero.plan.racks import by_rack, pick_in_one_rack
from hetero.plan.request import Affinity, AllocationRequest, AntiAffinity


def _rack_of() -> dict[str, str]:
    ib = [Nic("ib0", "infiniband", 400)]
    nodes = NodeTopology.from_nics(
        {"a": ib, "b": ib, "c": ib, "edge": ib}, {"a": "r1", "b": "r1", "c": "r2"}
    )
    return nodes.rack_of


def test_same_rack_is_a_level_beside_same_node() -> None:
    rack = Affinity(same_rack=True)
    assert rack.one_rack and not rack.one_node
    assert Affinity(same_node=True).one_rack  # one node is in one rack
    assert not Affinity().one_rack
    request = AllocationRequest(4, affinity=rack)
    assert request.grouping == "any" and "in one rack" in request.describe()
    # Spread over the nodes of one rack: both at once is a valid request.
    AllocationRequest(2, affinity=rack, anti_affinity=AntiAffinity(spread_nodes=True))
    with pytest.raises(ConfigError, match=r"affinity.same_rack.*expected true or false, got 'y'"):
        Affinity(same_rack="y")  # type: ignore[arg-type]


def test_the_pick_stays_in_one_rack() -> None:
    rack_of = _rack_of()  # a, b in r1; c in r2; edge unknown
    # (leftover bytes, position, node): two devices on a, one on b, three on c, two on edge.
    usable = [(10, 0, "a"), (10, 1, "a"), (10, 2, "b"), (5, 3, "c"), (5, 4, "c"), (5, 5, "c")]
    usable += [(1, 6, "edge"), (1, 7, "edge")]
    assert list(by_rack(usable, rack_of)) == ["rack:r1", "rack:r2", "node:edge"]
    request = AllocationRequest(3, affinity=Affinity(same_rack=True))
    # Three fit on r1 (two nodes) and on r2 (one node): the fewer nodes win.
    assert pick_in_one_rack(usable, request, rack_of) == [3, 4, 5]
    # Four fit in no rack, though the pool has eight devices.
    assert (
        pick_in_one_rack(usable, AllocationRequest(4, affinity=request.affinity), rack_of) is None
    )
    # A node of unknown rack is a rack of its own: two fit there, never joined with another.
    two = pick_in_one_rack(
        usable[-2:] + usable[:1], AllocationRequest(2, affinity=request.affinity), rack_of
    )
    assert two == [6, 7]
    spread = AllocationRequest(
        2, affinity=request.affinity, anti_affinity=AntiAffinity(spread_nodes=True)
    )
    assert pick_in_one_rack(usable, spread, rack_of) == [0, 2]  # a and b, both in r1
