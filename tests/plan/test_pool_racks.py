"""DevicePool and ``Affinity.same_rack``: the pick stays in one rack, what cannot be met says
what each rack could give, and racks come from the pool's ``racks``, a nodes file, or the
``rack:`` of a fleet config's device entries."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hetero.config import load_config, parse_config
from hetero.devices.catalog import get_catalog
from hetero.devices.fleet import build_fleet
from hetero.devices.spec import Device
from hetero.devices.topology_file import read_node_topology_file
from hetero.errors import AllocationError, ConfigError
from hetero.plan.allocation import Allocation
from hetero.plan.pool import DevicePool
from hetero.plan.request import Affinity, AllocationRequest, AntiAffinity

L4 = get_catalog().get("L4")
RACKS = {"a": "r1", "b": "r1", "c": "r2", "d": "r2"}
SAME_RACK = Affinity(same_rack=True)


def devices() -> list[Device]:
    """Emulated L4s on four nodes in two racks, listed a, c, b, d: a and c have two each, b and
    d one, so a pick without racks takes a's two and then one of c's (the lowest position)."""
    layout = [("a", 2), ("c", 2), ("b", 1), ("d", 1)]
    return [
        Device(id=f"{node}{i}", spec=L4, node=node, emulated=True)
        for node, n in layout
        for i in range(n)
    ]


@pytest.fixture
def pool() -> Iterator[DevicePool]:
    pool = DevicePool(devices(), racks=RACKS)
    yield pool
    pool.validate_state()


def racks_of(allocation: Allocation, pool: DevicePool) -> set[str]:
    known = pool.racks
    return {known.get(node, f"?{node}") for node in allocation.nodes}


def test_a_same_rack_request_gets_devices_of_one_rack(pool: DevicePool) -> None:
    plain = pool.allocate(AllocationRequest(3))
    # Fewest nodes first: a's two, then one of c's, across the racks.
    assert plain.device_ids == ("a0", "a1", "c0") and racks_of(plain, pool) == {"r1", "r2"}
    plain.release()
    # Both racks can give three on two nodes, leaving as much over: r1 has the lower positions.
    job = pool.allocate(AllocationRequest(3, affinity=SAME_RACK))
    assert job.device_ids == ("a0", "a1", "b0") and racks_of(job, pool) == {"r1"}
    # r1 is taken (exclusively), so the next three come from r2.
    busy = AllocationRequest(3, exclusive=True, affinity=SAME_RACK)
    first = pool.allocate(busy)
    assert first.device_ids == ("c0", "c1", "d0") and racks_of(first, pool) == {"r2"}


def test_without_same_rack_a_request_may_span_racks(pool: DevicePool) -> None:
    # Four fit in no rack, but the pool has six.
    job = pool.allocate(AllocationRequest(4))
    assert len(job.device_ids) == 4 and racks_of(job, pool) == {"r1", "r2"}


def test_no_rack_big_enough_is_refused_naming_what_each_rack_gives(pool: DevicePool) -> None:
    with pytest.raises(AllocationError) as caught:
        pool.allocate(AllocationRequest(4, affinity=SAME_RACK))
    assert str(caught.value) == (
        "request can never be met by this pool: need 4 × device, in one rack; the pool has 6 "
        "devices; no rack has 4 fitting devices: rack 'r1' has 3, rack 'r2' has 3"
    )
    # try_allocate raises too: None would hide the mistake behind an endless retry.
    with pytest.raises(AllocationError, match="no rack has 4 fitting devices"):
        pool.try_allocate(AllocationRequest(4, affinity=SAME_RACK))
    assert pool.snapshot().allocations == {}


def test_busy_racks_are_named_with_what_each_could_give_now(pool: DevicePool) -> None:
    exclusive = AllocationRequest(exclusive=True, affinity=Affinity(devices=["a0"]))
    pool.allocate(exclusive)
    pool.allocate(AllocationRequest(exclusive=True, affinity=Affinity(devices=["d0"])))
    request = AllocationRequest(3, exclusive=True, affinity=SAME_RACK)
    assert pool.try_allocate(request) is None
    with pytest.raises(AllocationError) as caught:
        pool.allocate(request)
    assert str(caught.value) == (
        "cannot allocate 3 × device, exclusive, in one rack now: of 6 matching devices, 2 held "
        "exclusively; no rack has 3 usable devices: rack 'r1' has 2, rack 'r2' has 2 "
        "(pass timeout= to wait for releases)"
    )
    # Without the rack rule the four free devices would do.
    assert len(pool.allocate(AllocationRequest(3, exclusive=True)).device_ids) == 3


def test_a_waiting_same_rack_request_takes_the_rack_a_release_completes(
    pool: DevicePool,
) -> None:
    holders = [
        pool.allocate(AllocationRequest(exclusive=True, affinity=Affinity(devices=[d])))
        for d in ("a0", "d0")
    ]
    got: list[Allocation] = []
    request = AllocationRequest(3, exclusive=True, affinity=SAME_RACK)
    waiter = threading.Thread(target=lambda: got.append(pool.allocate(request, timeout=60)))
    waiter.start()
    deadline = time.monotonic() + 10
    while pool.waiting == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    holders[1].release()  # d0 comes back: r2 has three free again
    waiter.join(10)
    assert got and got[0].device_ids == ("c0", "c1", "d0")


def test_same_node_stays_stricter_and_both_together_mean_one_node(pool: DevicePool) -> None:
    with pytest.raises(AllocationError, match="at most 2 on one node"):
        pool.allocate(AllocationRequest(3, affinity=Affinity(same_node=True)))
    both = pool.allocate(AllocationRequest(2, affinity=Affinity(same_node=True, same_rack=True)))
    assert set(both.nodes) == {"a"}


def test_same_rack_with_spread_nodes_takes_distinct_nodes_of_one_rack(pool: DevicePool) -> None:
    spread = AntiAffinity(spread_nodes=True)
    job = pool.allocate(AllocationRequest(2, affinity=SAME_RACK, anti_affinity=spread))
    assert job.nodes == ("a", "b")
    with pytest.raises(AllocationError) as caught:
        pool.allocate(AllocationRequest(3, affinity=SAME_RACK, anti_affinity=spread))
    assert str(caught.value).endswith(
        "no rack has 3 fitting devices on distinct nodes: rack 'r1' has 2, rack 'r2' has 2"
    )


def test_a_node_of_unknown_rack_is_a_rack_of_its_own() -> None:
    edge = [Device(id=f"e{i}", spec=L4, node="edge") for i in range(2)]
    pool = DevicePool(devices() + edge, racks=RACKS)
    # Without racks at all, every node is its own rack: same_rack is same_node then.
    alone = DevicePool(devices())
    with pytest.raises(AllocationError) as caught:
        alone.allocate(AllocationRequest(3, affinity=SAME_RACK))
    assert str(caught.value).endswith(
        "no rack has 3 fitting devices: node 'a' (rack unknown) has 2, node 'c' (rack unknown) "
        "has 2, node 'b' (rack unknown) has 1, node 'd' (rack unknown) has 1"
    )
    # Exclusively hold r1 and r2 down to one free device each: only edge's two fit together.
    for device in ("a0", "a1", "c0", "c1"):
        pool.allocate(AllocationRequest(exclusive=True, affinity=Affinity(devices=[device])))
    pair = pool.allocate(AllocationRequest(2, exclusive=True, affinity=SAME_RACK))
    assert pair.device_ids == ("e0", "e1")
    with pytest.raises(AllocationError, match=r"node 'edge' \(rack unknown\) has 0"):
        pool.allocate(AllocationRequest(2, exclusive=True, affinity=SAME_RACK))
    pool.validate_state()


def test_racks_from_a_nodes_file(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    lines = [
        f"  - {{name: {n}, rack: {r}, nics: [{{name: ib0, gbps: 400}}]}}" for n, r in RACKS.items()
    ]
    path.write_text("nodes:\n" + "\n".join(lines) + "\n")
    pool = DevicePool(devices(), racks=read_node_topology_file(path))
    assert pool.racks == RACKS
    job = pool.allocate(AllocationRequest(3, affinity=SAME_RACK))
    assert racks_of(job, pool) == {"r1"}
    pool.validate_state()


def test_racks_from_a_config_file_entry(tmp_path: Path) -> None:
    path = tmp_path / "hetero_config.yaml"
    path.write_text(
        "devices:\n"
        "  - {type: gpu, model: L4, emulate: true, count: 2, node: a, rack: r1}\n"
        "  - {type: gpu, model: L4, emulate: true, count: 2, node: c, rack: r2}\n"
        "  - {type: gpu, model: L4, emulate: true, node: b, rack: r1}\n"
        "  - {type: gpu, model: L4, emulate: true, node: d, rack: r2}\n"
        "  - {type: gpu, model: L4, emulate: true, node: d}   # d's rack, from the entry above\n"
    )
    fleet = build_fleet(load_config(path))
    assert [(d.node, d.rack) for d in fleet] == [
        ("a", "r1"), ("a", "r1"), ("c", "r2"), ("c", "r2"), ("b", "r1"), ("d", "r2"), ("d", "r2"),
    ]  # fmt: skip
    pool = DevicePool(fleet)  # no racks= needed: the devices carry them
    assert pool.racks == RACKS
    plain = pool.allocate(AllocationRequest(3))
    assert racks_of(plain, pool) == {"r1", "r2"}
    plain.release()
    job = pool.allocate(AllocationRequest(4, affinity=SAME_RACK))
    assert racks_of(job, pool) == {"r2"}  # r1 has only three
    pool.validate_state()


def test_config_refuses_a_blank_rack_and_two_racks_for_one_node() -> None:
    entry = {"type": "gpu", "model": "L4", "emulate": True, "node": "a"}
    with pytest.raises(ConfigError) as caught:
        parse_config(
            {"devices": [{**entry, "rack": "r1"}, {**entry, "rack": "r2"}, {**entry, "rack": " "}]}
        )
    assert caught.value.problems == [
        ("devices[2].rack", "expected a rack name (left out: unknown), got ' '"),
        (
            "devices[1].rack",
            "'r2' contradicts devices[0].rack 'r1' for node 'a': a node is in one rack; "
            "allowed: 'r1' or left out",
        ),
    ]


def test_the_pool_refuses_racks_that_contradict_each_other() -> None:
    moved = [*devices(), Device(id="x", spec=L4, node="a", rack="r2")]
    with pytest.raises(ConfigError) as caught:
        DevicePool(moved, racks=RACKS)
    assert caught.value.problems == [
        (
            "devices[6].rack",
            "'r2' contradicts rack 'r1' that the pool has for node 'a' (a node is in one rack); "
            "allowed: 'r1' or None",
        )
    ]
    with pytest.raises(ConfigError, match=r"racks\['a'\]: expected a rack name, got ''"):
        DevicePool(devices(), racks={"a": ""})
    with pytest.raises(ConfigError, match=r"racks: expected \{node: rack\} or a NodeTopology"):
        DevicePool(devices(), racks=["r1"])  # type: ignore[arg-type]


def test_a_device_that_joins_brings_its_rack_or_takes_its_nodes(pool: DevicePool) -> None:
    with pytest.raises(ConfigError, match=r"device.rack: 'r9' contradicts rack 'r1'"):
        pool.add_device(Device(id="a9", spec=L4, node="a", rack="r9"))
    assert "a9" not in [d.id for d in pool.devices]
    pool.add_device(Device(id="a9", spec=L4, node="a"))  # a's rack, r1, without saying it
    pool.add_device(Device(id="e0", spec=L4, node="e", rack="r2"))  # a new node of r2
    assert pool.racks == {**RACKS, "e": "r2"}
    job = pool.allocate(AllocationRequest(4, exclusive=True, affinity=SAME_RACK))
    assert job.device_ids == ("a0", "a1", "b0", "a9")
    other = pool.allocate(AllocationRequest(4, exclusive=True, affinity=SAME_RACK))
    assert other.device_ids == ("c0", "c1", "d0", "e0") and racks_of(other, pool) == {"r2"}


def test_validate_state_catches_a_same_rack_allocation_across_racks(pool: DevicePool) -> None:
    job = pool.allocate(AllocationRequest(3, affinity=SAME_RACK))
    assert job.nodes == ("a", "b")
    pool._rack_of["b"] = "r2"  # books broken behind the pool's back
    with pytest.raises(AssertionError, match="asked for one rack but spans"):
        pool.validate_state()
    pool._rack_of["b"] = "r1"
