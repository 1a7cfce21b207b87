"""DevicePool: every constraint and its error, all-or-nothing commits, waiting, threads, and a
stateful model check against a brute-force oracle. Topology, MIG slices, membership and leases
are in test_pool_changes.py."""

from __future__ import annotations

import itertools
import json
import random
import threading
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hetero.devices.spec import Device
from hetero.errors import AllocationError, ConfigError, DeviceError
from hetero.plan.allocation import Allocation, EndCause
from hetero.plan.holdings import Holders
from hetero.plan.pool import DevicePool
from hetero.plan.request import Affinity, AllocationRequest, AntiAffinity
from hetero.sched.clock import ManualClock
from tests.plan.pools import A100, GIB, H100, L4, T4, dev, req
from tests.processes import wait_for


def two_nodes() -> DevicePool:
    """Node a: a0, a1 (A100) and t0 (T4); node b: b0, b1, b2 (A100)."""
    devices = [dev("a0"), dev("a1"), dev("t0", T4)]
    devices += [dev(f"b{i}", node="b") for i in range(3)]
    return DevicePool(devices)


def state(pool: DevicePool) -> dict[str, object]:
    return pool.snapshot().to_dict()


# -- the request value object --------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "path", "text"),
    [
        ({"count": 0}, "count", "got 0"),
        ({"count": True}, "count", "got True"),
        ({"memory": -1}, "memory", "got -1"),
        ({"memory": "40GB"}, "memory", "parse_size"),
        ({"exclusive": 1}, "exclusive", "true or false"),
        ({"kind": "gpx"}, "kind", "closest: gpu"),
        ({"model": "A100-8GB"}, "model", "closest: A100-80GB"),
        ({"kind": "cpu", "model": "A100-80GB"}, "kind", "contradicts model A100-80GB"),
        ({"name": ""}, "name", "non-empty"),
        ({"affinity": {"same_node": True}}, "affinity", "expected an Affinity"),
    ],
)
def test_request_errors_name_field_value_and_allowed(
    fields: dict[str, object], path: str, text: str
) -> None:
    with pytest.raises(ConfigError) as info:
        req(**fields)
    assert [p for p, _ in info.value.problems] == [path]
    assert text in str(info.value)


def test_request_reports_every_problem_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        req(0, kind="gpx", memory=-1, exclusive="yes")
    assert [p for p, _ in info.value.problems] == ["count", "memory", "exclusive", "kind"]


@pytest.mark.parametrize(
    ("build", "path", "text"),
    [
        (lambda: Affinity(devices="a0"), "affinity.devices", "list of names"),
        (lambda: Affinity(tags=["ok", ""]), "affinity.tags", "non-empty strings"),
        (lambda: Affinity(interconnect=""), "affinity.interconnect", "'nvlink'"),
        (lambda: Affinity(same_node="yes"), "affinity.same_node", "true or false"),
        (lambda: AntiAffinity(level="nodes"), "anti_affinity.level", "closest: node"),
        (lambda: AntiAffinity(avoid=[1]), "anti_affinity.avoid", "got 1"),
        (
            lambda: req(
                2, affinity=Affinity(same_node=True), anti_affinity=AntiAffinity(spread_nodes=True)
            ),
            "anti_affinity.spread_nodes",
            "drop one",
        ),
        (lambda: req(3, affinity=Affinity(devices=["a0", "a1"])), "count", "names only 2"),
        (
            lambda: req(name="x", anti_affinity=AntiAffinity(allocations=["x"])),
            "anti_affinity.allocations",
            "cannot avoid itself",
        ),
    ],
)
def test_affinity_errors(build: Callable[[], object], path: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.problems[0][0] == path
    assert text in str(info.value)


def test_request_resolves_driver_names_and_kind_strings() -> None:
    request = req(model="NVIDIA A100-SXM4-80GB", kind="GPU", affinity=Affinity(devices=["a0"]))
    assert request.model == "A100-80GB"
    assert request.kind is A100.kind
    assert request.affinity.devices == ("a0",)
    assert hash(request) == hash(
        req(model="A100-80GB", kind="gpu", affinity=Affinity(devices=["a0"]))
    )


def test_pool_rejects_duplicate_ids() -> None:
    with pytest.raises(ConfigError, match=r"devices\[1\]\.id: duplicate id 'x'"):
        DevicePool([dev("x"), dev("x", node="b")])


# -- constraints -----------------------------------------------------------------------------


def test_kind_and_model_select_devices() -> None:
    pool = two_nodes()
    assert pool.allocate(req(model="T4")).device_ids == ("t0",)
    with pytest.raises(AllocationError, match="2 are A100-80GB"):
        DevicePool([dev("a0"), dev("a1"), dev("t0", T4)]).allocate(req(3, model="A100-80GB"))
    with pytest.raises(AllocationError, match=r"0 are cpus"):
        pool.allocate(req(kind="cpu"))


def test_devices_are_shared_up_to_their_memory() -> None:
    pool = DevicePool([dev("a0")])
    first = pool.allocate(req(memory=50 * GIB))
    second = pool.allocate(req(memory=30 * GIB))
    assert first.device_ids == second.device_ids == ("a0",)
    assert pool.snapshot().devices[0].memory_free == 0
    with pytest.raises(AllocationError, match="1 with less than 1 GiB free"):
        pool.allocate(req(memory=GIB))
    with pytest.raises(AllocationError, match=r"can never be met.*0 have at least 81 GiB"):
        pool.allocate(req(memory=81 * GIB))


def test_exclusive_needs_an_unheld_device_and_keeps_others_off() -> None:
    pool = DevicePool([dev("a0"), dev("a1")])
    shared = pool.allocate(req(memory=GIB))
    exclusive = pool.allocate(req(exclusive=True))
    assert exclusive.device_ids == ("a1",)
    with pytest.raises(AllocationError, match="1 shared by other allocations, 1 held exclusively"):
        pool.allocate(req(exclusive=True))
    with pytest.raises(AllocationError, match="1 held exclusively"):
        pool.allocate(req(2))
    shared.release()
    assert pool.allocate(req(exclusive=True)).device_ids == ("a0",)


def test_same_node_message_counts_each_node() -> None:
    pool = two_nodes()
    with pytest.raises(AllocationError) as info:
        pool.allocate(req(4, model="A100-80GB", memory=40 * GIB, affinity=Affinity(same_node=True)))
    assert str(info.value) == (
        "request can never be met by this pool: need 4 × A100-80GB with 40 GiB free each, on one "
        "node; the pool has 6 devices, 5 are A100-80GB, 5 have at least 40 GiB; at most 3 on one "
        "node: node 'a' has 2, node 'b' has 3"
    )
    assert pool.allocate(req(3, model="A100-80GB", affinity=Affinity(same_node=True))).nodes == (
        "b",
    )


def test_busy_message_names_reasons_and_usable_devices_per_node() -> None:
    pool = two_nodes()
    pool.allocate(req(model="A100-80GB", exclusive=True, affinity=Affinity(devices=["b0"])))
    pool.mark_unhealthy("b1")
    pool.allocate(req(2, model="A100-80GB", memory=60 * GIB, affinity=Affinity(same_node=True)))
    with pytest.raises(AllocationError) as info:
        pool.allocate(req(2, model="A100-80GB", memory=40 * GIB, affinity=Affinity(same_node=True)))
    assert str(info.value) == (
        "cannot allocate 2 × A100-80GB with 40 GiB free each, on one node now: of 5 matching "
        "devices, 2 with less than 40 GiB free, 1 held exclusively, 1 unhealthy; at most 1 usable "
        "on one node: node 'a' has 0, node 'b' has 1 (pass timeout= to wait for releases)"
    )


def test_interconnect_family_on_one_node() -> None:
    devices = [dev("h0", H100), dev("h1", H100), dev("l0", L4), dev("l1", L4)]
    pool = DevicePool([*devices, dev("h2", H100, node="b")])
    assert pool.allocate(req(2, affinity=Affinity(interconnect="NVLink"))).device_ids == (
        "h0",
        "h1",
    )
    assert pool.allocate(req(2, affinity=Affinity(interconnect="pcie4"))).device_ids == (
        "l0",
        "l1",
    )
    with pytest.raises(AllocationError, match="3 have nvlink4 interconnect; at most 2 on one"):
        pool.allocate(req(3, affinity=Affinity(interconnect="nvlink4")))
    with pytest.raises(AllocationError) as info:
        pool.allocate(req(affinity=Affinity(interconnect="nvlnk")))
    assert str(info.value) == (
        "affinity.interconnect: no device in this pool has 'nvlnk'; closest: NVLink, NVLink4; "
        "the pool has: NVLink4, PCIe4"
    )


def test_named_devices_only_and_unknown_ids() -> None:
    pool = two_nodes()
    assert pool.allocate(req(2, affinity=Affinity(devices=["b2", "a1"]))).device_ids == (
        "a1",
        "b2",
    )
    with pytest.raises(AllocationError, match=r"affinity\.devices: no device 'b9'.*closest: b"):
        pool.allocate(req(affinity=Affinity(devices=["a0", "b9"])))


def test_tags_must_all_be_carried() -> None:
    pool = DevicePool([dev("a0", tags=["fast"]), dev("a1", tags=["fast", "ib"]), dev("a2")])
    assert pool.allocate(req(affinity=Affinity(tags=["ib", "fast"]))).device_ids == ("a1",)
    with pytest.raises(AllocationError, match=r"2 carry fast$"):
        pool.allocate(req(3, affinity=Affinity(tags=["fast"])))


def test_spread_nodes_puts_each_device_on_its_own_node() -> None:
    pool = two_nodes()
    allocation = pool.allocate(
        req(2, model="A100-80GB", anti_affinity=AntiAffinity(spread_nodes=True))
    )
    assert sorted(allocation.nodes) == ["a", "b"]
    with pytest.raises(
        AllocationError, match=r"matching devices on only 2 nodes: node 'a' has 3, node 'b' has 3$"
    ):
        pool.allocate(req(3, anti_affinity=AntiAffinity(spread_nodes=True)))


def test_avoid_ids_and_named_allocations() -> None:
    pool = two_nodes()
    with pytest.raises(AllocationError, match=r"anti_affinity\.avoid: no device 'x0'"):
        pool.allocate(req(anti_affinity=AntiAffinity(avoid=["x0"])))
    avoid_a0 = req(model="A100-80GB", anti_affinity=AntiAffinity(avoid=["a0"]))
    assert pool.allocate(avoid_a0).device_ids == ("a1",)
    web0 = pool.allocate(req(model="A100-80GB", name="web-0"))
    away = AntiAffinity(allocations=["web-0"])
    web1 = pool.allocate(req(model="A100-80GB", name="web-1", anti_affinity=away))
    assert web1.device_ids != web0.device_ids
    node_away = AntiAffinity(allocations=["web-0"], level="node")
    assert pool.allocate(req(anti_affinity=node_away)).nodes != web0.nodes
    with pytest.raises(AllocationError, match="no live allocation named 'web-2'; closest: web-"):
        pool.allocate(req(anti_affinity=AntiAffinity(allocations=["web-2"])))
    with pytest.raises(AllocationError, match=r"'gone' \(no allocation is live\)"):
        DevicePool([dev("a0")]).allocate(req(anti_affinity=AntiAffinity(allocations=["gone"])))


def test_unhealthy_devices_are_never_allocated() -> None:
    pool = DevicePool([dev("a0"), dev("a1")])
    pool.mark_unhealthy("a0")
    assert pool.allocate(req()).device_ids == ("a1",)
    with pytest.raises(AllocationError, match="1 unhealthy, 1 shared by other allocations"):
        pool.allocate(req(exclusive=True))
    pool.mark_healthy("a0")
    assert pool.allocate(req(exclusive=True)).device_ids == ("a0",)
    with pytest.raises(DeviceError, match="no device 'a9' in this pool; closest: a"):
        pool.mark_unhealthy("a9")


# -- choosing --------------------------------------------------------------------------------


def test_best_fit_takes_the_device_left_with_least_memory() -> None:
    pool = DevicePool([dev("big"), dev("small", memory=50 * GIB), dev("t0", T4)])
    assert pool.allocate(req(memory=40 * GIB)).device_ids == ("small",)
    assert pool.allocate(req(memory=10 * GIB)).device_ids == ("small",)
    assert pool.allocate(req(memory=10 * GIB)).device_ids == ("t0",)


def test_fewest_nodes_then_best_fit_on_the_last() -> None:
    pool = two_nodes()
    assert pool.allocate(req(3, model="A100-80GB")).device_ids == ("b0", "b1", "b2")
    pool = two_nodes()
    assert pool.allocate(req(4, model="A100-80GB")).nodes == ("a", "b")
    pool = DevicePool([dev("a0"), dev("t0", T4), dev("b0", node="b"), dev("b1", node="b")])
    # One device: the T4 fits tighter than any A100, whichever node it is on.
    assert pool.allocate(req(memory=GIB)).device_ids == ("t0",)
    assert pool.allocate(req(2)).device_ids == ("a0", "t0")
    assert pool.allocate(req(3)).device_ids == ("a0", "t0", "b0")


def test_the_pick_is_deterministic() -> None:
    picks = []
    for _ in range(2):
        pool = two_nodes()
        picks.append([pool.allocate(req(n, memory=n * GIB)).device_ids for n in (1, 2, 1, 2)])
    assert picks[0] == picks[1]


# -- all or nothing --------------------------------------------------------------------------


def test_a_failed_pick_leaves_the_pool_unchanged() -> None:
    pool = two_nodes()
    pool.allocate(req(2, memory=GIB, affinity=Affinity(same_node=True)))
    before = state(pool)
    for request in (req(5, memory=80 * GIB), req(6, exclusive=True)):
        with pytest.raises(AllocationError):
            pool.allocate(request)
        assert pool.try_allocate(request) is None
        assert state(pool) == before
    pool.validate_state()


class _FailingDevice(Device):
    """A device whose memory accounting breaks when asked (a fault injected into the pick)."""

    broken = False

    @property
    def memory_bytes(self) -> int:
        if self.broken:
            raise RuntimeError("memory read failed")
        return self.spec.memory_bytes


def test_an_exception_during_the_pick_holds_nothing() -> None:
    flaky = _FailingDevice(id="b2", spec=A100, node="b")
    pool = DevicePool([dev("b0", node="b"), dev("b1", node="b"), flaky])
    before = state(pool)
    flaky.broken = True
    with pytest.raises(RuntimeError, match="memory read failed"):
        pool.allocate(req(3, memory=GIB))
    flaky.broken = False
    assert state(pool) == before
    pool.validate_state()


def test_an_exception_during_the_commit_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = two_nodes()
    kept = pool.allocate(req(memory=GIB))
    before = state(pool)
    hold = Holders.hold
    calls = itertools.count()

    def hold_then_fail(self: object, name: str, memory: int, exclusive: bool) -> None:
        if next(calls) == 2:
            raise KeyboardInterrupt
        hold(self, name, memory, exclusive)  # type: ignore[arg-type]

    monkeypatch.setattr(Holders, "hold", hold_then_fail)
    with pytest.raises(KeyboardInterrupt):
        pool.allocate(req(3, memory=GIB))
    assert state(pool) == before
    pool.validate_state()
    monkeypatch.undo()
    kept.release()
    assert all(u.memory_free == u.memory_bytes for u in pool.snapshot().devices)


# -- release and lifecycle ---------------------------------------------------------------------


def test_release_is_an_error_twice_and_a_context_manager_releases() -> None:
    pool = two_nodes()
    allocation = pool.allocate(req(2))
    assert pool.holds(allocation) and not allocation.released
    allocation.release()
    assert allocation.released
    with pytest.raises(AllocationError, match="allocation 'alloc-1' was already released"):
        pool.release(allocation)
    with pool.allocate(req(6)) as everything:
        assert len(everything.devices) == 6
    assert everything.released
    with pool.allocate(req()) as early:
        early.release()
    with pytest.raises(AllocationError, match="belongs to another pool"):
        two_nodes().release(early)
    assert state(pool)["allocations"] == {}


def test_names_are_unique_among_live_allocations() -> None:
    pool = two_nodes()
    pool.allocate(req(name="alloc-2"))
    assert pool.allocate(req()).name == "alloc-1"
    assert pool.allocate(req()).name == "alloc-3"
    job = pool.allocate(req(name="job"))
    with pytest.raises(AllocationError, match="name: allocation 'job' is live"):
        pool.try_allocate(req(name="job"))
    job.release()
    assert pool.allocate(req(name="job")).name == "job"


def test_try_allocate_raises_for_impossible_requests() -> None:
    pool = DevicePool([dev("a0")])
    with pytest.raises(AllocationError, match="can never be met"):
        pool.try_allocate(req(2))
    assert pool.try_allocate(req(exclusive=True)) is not None
    assert pool.try_allocate(req()) is None


def test_snapshot_reports_holders_and_is_json_ready() -> None:
    pool = DevicePool([dev("a0"), dev("a1", node="b")])
    pool.allocate(req(memory=30 * GIB, name="s", affinity=Affinity(devices=["a0"])))
    pool.allocate(req(exclusive=True, memory=GIB, name="x"))
    usage = {u.id: u for u in pool.snapshot().devices}
    assert dict(usage["a0"].holders) == {"s": 30 * GIB}
    assert usage["a0"].memory_free == 50 * GIB
    assert usage["a1"].exclusive == "x"
    data = json.loads(json.dumps(pool.snapshot().to_dict()))
    assert data["allocations"] == {"s": ["a0"], "x": ["a1"]}
    assert data["waiting"] == 0


def test_validate_state_catches_broken_books() -> None:
    pool = two_nodes()
    allocation = pool.allocate(req(2, memory=GIB))
    pool.validate_state()
    pool._holdings.holders[0].memory["ghost"] = 1
    with pytest.raises(AssertionError, match="held by released allocations"):
        pool.validate_state()
    del pool._holdings.holders[0].memory["ghost"]
    books = pool._holdings
    books.holders[books.position[allocation.device_ids[0]]].memory.clear()
    with pytest.raises(AssertionError, match="does not record"):
        pool.validate_state()


# -- waiting ---------------------------------------------------------------------------------


def test_a_waiter_is_woken_by_a_release() -> None:
    pool = two_nodes()
    everything = pool.allocate(req(6, exclusive=True))
    got: list[Allocation] = []
    waiter = threading.Thread(target=lambda: got.append(pool.allocate(req(3), timeout=60)))
    waiter.start()
    wait_for(lambda: pool.waiting == 1)
    everything.release()
    waiter.join(60)
    assert [a.device_ids for a in got] == [("a0", "a1", "t0")]
    assert pool.waiting == 0


def test_a_waiter_is_woken_when_a_device_comes_back() -> None:
    pool = DevicePool([dev("a0")])
    pool.mark_unhealthy("a0")
    got: list[Allocation] = []
    waiter = threading.Thread(target=lambda: got.append(pool.allocate(req(), timeout=60)))
    waiter.start()
    wait_for(lambda: pool.waiting == 1)
    pool.mark_healthy("a0")
    waiter.join(60)
    assert [a.device_ids for a in got] == [("a0",)]


def test_timeout_raises_with_the_reason() -> None:
    pool = DevicePool([dev("a0")])
    pool.allocate(req(exclusive=True, name="owner"))
    with pytest.raises(AllocationError) as info:
        pool.allocate(req(), timeout=0.01)
    assert str(info.value) == (
        "timed out after 0.01 s waiting for 1 × device: of 1 matching devices, 1 held exclusively; "
        "0 usable in all"
    )
    assert pool.waiting == 0
    with pytest.raises(AllocationError, match="can never be met"):
        pool.allocate(req(2), timeout=60)  # impossible: no wait at all


@pytest.mark.parametrize("timeout", [-1, float("nan"), "5", True])
def test_invalid_timeouts(timeout: object) -> None:
    with pytest.raises(ConfigError, match="timeout: expected seconds >= 0"):
        DevicePool([dev("a0")]).allocate(req(), timeout=timeout)  # type: ignore[arg-type]


def test_threads_hammering_allocate_and_release_leave_clean_books() -> None:
    pool = two_nodes()
    requests = [
        req(1, memory=20 * GIB),
        req(2, memory=30 * GIB, affinity=Affinity(same_node=True)),
        req(2, exclusive=True),
        req(3, model="A100-80GB", anti_affinity=AntiAffinity(avoid=["a0"])),
        req(2, model="A100-80GB", anti_affinity=AntiAffinity(spread_nodes=True)),
        req(1, model="T4", memory=16 * GIB),
    ]
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            start.wait()
            for _ in range(300):
                request = rng.choice(requests)
                if rng.random() < 0.5:
                    allocation = pool.try_allocate(request)
                else:
                    allocation = pool.allocate(request, timeout=60)
                if allocation is not None:
                    assert len(allocation.devices) == request.count
                    allocation.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    pool.validate_state()
    snapshot = pool.snapshot()
    assert snapshot.allocations == {} and snapshot.waiting == 0
    assert all(u.memory_free == u.memory_bytes and not u.holders for u in snapshot.devices)


# -- stateful model check --------------------------------------------------------------------

IDS = ("n0a", "n0b", "n0t", "n1a", "n1t", "n2a")


def small_fleet() -> list[Device]:
    """Six devices on three nodes with a few bytes each, so memory runs out quickly; n0a and
    n0b are two MIG slices of one GPU."""
    nodes = {"n0": ("n0a", "n0b", "n0t"), "n1": ("n1a", "n1t"), "n2": ("n2a",)}
    memory = {"n0a": 8, "n0b": 8, "n0t": 4, "n1a": 8, "n1t": 4, "n2a": 6}
    parents = {"n0a": "GPU-0", "n0b": "GPU-0"}
    return [
        dev(i, T4 if i.endswith("t") else A100, node=node, memory=memory[i], parent=parents.get(i))
        for node, ids in nodes.items()
        for i in ids
    ]


def suits(
    d: Device, request: AllocationRequest, held: dict[str, Allocation], now: bool, away: set[str]
) -> bool:
    """Whether ``d`` meets the request's per-device constraints (``now``: in the held state)."""
    if request.model and d.model != request.model:
        return False
    if d.memory_bytes < request.memory or d.id in request.anti_affinity.avoid or d.id in away:
        return False
    if not now:
        return True
    holders = [a for a in held.values() if d.id in a.device_ids]
    free = d.memory_bytes - sum(a.memory for a in holders)
    return (
        d.state.healthy
        and not any(a.exclusive for a in holders)
        and not (request.exclusive and holders)
        and free >= request.memory
    )


def feasible(
    request: AllocationRequest,
    devices: list[Device],
    held: dict[str, Allocation],
    now: bool,
    away: set[str],
) -> bool:
    """Brute force: does any set of ``request.count`` devices meet every constraint?"""
    fitting = [d for d in devices if suits(d, request, held, now, away)]
    for chosen in itertools.combinations(fitting, request.count):
        gpus = [d.parent for d in chosen if d.parent is not None]
        if len(set(gpus)) < len(gpus):
            continue  # two slices of one GPU never share an allocation
        nodes = [d.node for d in chosen]
        if request.grouping == "one_node" and len(set(nodes)) > 1:
            continue
        if request.grouping == "spread" and len(set(nodes)) < len(nodes):
            continue
        return True
    return False


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.devices = small_fleet()
        self.clock = ManualClock()
        self.pool = DevicePool(self.devices, clock=self.clock)
        self.held: dict[str, Allocation] = {}
        self.expires: dict[str, float] = {}

    @rule(
        count=st.integers(1, 3),
        model=st.sampled_from([None, "A100-80GB", "T4"]),
        memory=st.integers(0, 9),
        exclusive=st.booleans(),
        grouping=st.sampled_from(["any", "one_node", "spread"]),
        level=st.sampled_from(["device", "node"]),
        avoid=st.sets(st.sampled_from(IDS), max_size=2),
        lease=st.none() | st.sampled_from([5.0, 10.0]),
        data=st.data(),
    )
    def allocate(
        self,
        count: int,
        model: str | None,
        memory: int,
        exclusive: bool,
        grouping: str,
        level: str,
        avoid: set[str],
        lease: float | None,
        data: st.DataObject,
    ) -> None:
        others = data.draw(st.sets(st.sampled_from(sorted(self.held) or ["-"]), max_size=2))
        others.discard("-")
        request = AllocationRequest(
            count=count,
            model=model,
            memory=memory,
            exclusive=exclusive,
            affinity=Affinity(same_node=grouping == "one_node"),
            anti_affinity=AntiAffinity(
                spread_nodes=grouping == "spread",
                avoid=sorted(avoid),
                allocations=sorted(others),
                level=level,
            ),
            lease=lease,
        )
        away = {i for name in others for i in self.held[name].device_ids}
        if level == "node":
            nodes = {d.node for d in self.devices if d.id in away}
            away = {d.id for d in self.devices if d.node in nodes}
        if not feasible(request, self.devices, self.held, now=False, away=away):
            event("impossible")
            with pytest.raises(AllocationError, match="can never be met"):
                self.pool.try_allocate(request)
            return
        free = {u.id: u.memory_free for u in self.pool.snapshot().devices}
        allocation = self.pool.try_allocate(request)
        assert (allocation is not None) == feasible(
            request, self.devices, self.held, now=True, away=away
        )
        event("busy" if allocation is None else f"allocated {grouping}")
        if allocation is None:
            return
        assert len(allocation.devices) == count
        assert not away & set(allocation.device_ids)
        if count == 1 and grouping == "any":
            # Best fit: no usable device would have been left with less memory over.
            chosen = allocation.device_ids[0]
            usable = [d.id for d in self.devices if suits(d, request, self.held, True, away)]
            assert free[chosen] == min(free[i] for i in usable)
        self.held[allocation.name] = allocation
        if lease is not None:
            self.expires[allocation.name] = self.clock.now() + lease

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.held)))
        allocation = self.held.pop(name)
        self.expires.pop(name, None)
        allocation.release()
        with pytest.raises(AllocationError, match="already released"):
            allocation.release()

    @rule(seconds=st.sampled_from([1.0, 4.0, 6.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        due = {n for n, at in self.expires.items() if at <= self.clock.now()}
        ended = {a.name for a in self.pool.expire()}
        assert ended == due
        for name in due:
            end = self.held.pop(name).end
            assert end is not None and end.cause is EndCause.LEASE_EXPIRED
            del self.expires[name]

    @rule(device_id=st.sampled_from(IDS))
    def remove_and_add_back(self, device_id: str) -> None:
        holding = {n for n, a in self.held.items() if device_id in a.device_ids}
        ended = self.pool.remove_device(device_id, reason="swapped")
        assert {a.name for a in ended} == holding
        for name in holding:
            end = self.held.pop(name).end
            assert end is not None and end.cause is EndCause.DEVICE_REMOVED
            self.expires.pop(name, None)
        assert device_id not in {u.id for u in self.pool.snapshot().devices}
        (device,) = [d for d in self.devices if d.id == device_id]
        self.pool.add_device(device)

    @rule(device_id=st.sampled_from(IDS), healthy=st.booleans())
    def set_health(self, device_id: str, healthy: bool) -> None:
        if healthy:
            self.pool.mark_healthy(device_id)
        else:
            self.pool.mark_unhealthy(device_id)

    @invariant()
    def books_balance(self) -> None:
        self.pool.validate_state()
        snapshot = self.pool.snapshot()
        assert set(snapshot.allocations) == set(self.held)
        for usage in snapshot.devices:
            mine = {n: a for n, a in self.held.items() if usage.id in a.device_ids}
            assert dict(usage.holders) == {n: a.memory for n, a in mine.items()}
            assert (
                0 <= usage.memory_free == usage.memory_bytes - sum(a.memory for a in mine.values())
            )
            if any(a.exclusive for a in mine.values()):
                assert len(mine) == 1
        for name, allocation in self.held.items():
            assert snapshot.allocations[name] == allocation.device_ids
            assert len(allocation.device_ids) == allocation.request.count
        assert dict(snapshot.expires) == self.expires


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
