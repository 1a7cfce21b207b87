"""DevicePool beyond a fixed set of devices: links that decide the pick, MIG slices that never
share an allocation, devices that join and leave, leases that run out, a compute minimum."""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest

from hetero.devices.fake_nvml import nvswitch_box, pcie_box
from hetero.devices.spec import Device, DeviceSpec
from hetero.devices.topology import Topology
from hetero.devices.topology_nvml import read_topology
from hetero.errors import AllocationError, ConfigError, DeviceError
from hetero.plan.allocation import Allocation, EndCause
from hetero.plan.pool import DevicePool
from hetero.plan.request import Affinity, AllocationRequest
from hetero.sched.clock import ManualClock
from tests.plan.pools import A100, GIB, H100, L4, T4, dev, req
from tests.processes import wait_for


def box(spec: DeviceSpec, n: int, node: str = "box", prefix: str = "") -> list[Device]:
    return [Device(id=f"{prefix}gpu:{i}", spec=spec, node=node) for i in range(n)]


def pcie() -> Topology:
    """4× L4: gpu:0-1 PIX (64 GB/s), gpu:2-3 PXB (57.6), SYS (32) across the sockets."""
    return read_topology(pcie_box(), environ={})


# -- topology decides ------------------------------------------------------------------------


def test_the_best_connected_pair_beats_the_best_fit() -> None:
    for topology in (None, {"box": pcie()}):
        pool = DevicePool(box(L4, 4), topology=topology)
        pool.allocate(req(memory=8 * GIB, affinity=Affinity(devices=["gpu:0"])))
        pool.allocate(req(exclusive=True, affinity=Affinity(devices=["gpu:1"])))
        pair = pool.allocate(req(2)).device_ids
        # Best fit alone takes gpu:0 (least left over) and a GPU across the sockets; the links
        # say gpu:2-3 (PXB) beat any pair with gpu:0 (SYS).
        assert pair == (("gpu:0", "gpu:2") if topology is None else ("gpu:2", "gpu:3"))
        pool.validate_state()


def test_equal_links_leave_the_best_fit_alone() -> None:
    picks = []
    for topology in (None, {"box": read_topology(nvswitch_box(), environ={})}):
        pool = DevicePool(box(H100, 8), topology=topology)
        pool.allocate(req(memory=40 * GIB, affinity=Affinity(devices=["gpu:5"])))
        picks.append(pool.allocate(req(4, memory=GIB)).device_ids)
    assert picks[0] == picks[1] == ("gpu:0", "gpu:1", "gpu:2", "gpu:5")


def test_the_node_with_the_faster_group_wins() -> None:
    devices = box(L4, 4, node="a") + box(L4, 4, node="b", prefix="b-")
    b = Topology(
        tuple(dataclasses.replace(d, id=f"b-{d.id}") for d in pcie().devices), pcie().links
    )
    without = DevicePool(devices)
    with_links = DevicePool(devices, topology={"a": pcie(), "b": b})
    for pool in (without, with_links):
        pool.allocate(req(exclusive=True, affinity=Affinity(devices=["gpu:1"])))
    # Node a has gpu:0, 2, 3 left (best pair PXB, 57.6 GB/s); node b a PIX pair (64 GB/s).
    assert without.allocate(req(2)).device_ids == ("gpu:0", "gpu:2")
    assert with_links.allocate(req(2)).device_ids == ("b-gpu:0", "b-gpu:1")


def test_a_device_is_found_in_its_topology_by_pci_bus_id() -> None:
    topology = pcie()
    devices = [
        Device(id=f"host/{d.id}", spec=L4, node="box", pci_bus_id=d.pci_bus_id)
        for d in topology.devices
    ]
    pool = DevicePool(devices, topology={"box": topology})
    pool.allocate(req(exclusive=True, affinity=Affinity(devices=["host/gpu:1"])))
    assert pool.allocate(req(2)).device_ids == ("host/gpu:2", "host/gpu:3")


def test_bad_topology_arguments() -> None:
    with pytest.raises(ConfigError, match=r"topology\['box'\]: expected a Topology, got 'x'"):
        DevicePool(box(L4, 1), topology={"box": "x"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"topology: expected \{node: Topology\}"):
        DevicePool(box(L4, 1), topology=pcie())  # type: ignore[arg-type]


# -- MIG slices --------------------------------------------------------------------------------


def slices(gpu: str, n: int, node: str = "a") -> list[Device]:
    return [
        dev(f"{gpu}/mig{i}", A100, node=node, memory=10 * GIB, parent=f"GPU-{gpu}")
        for i in range(n)
    ]


def test_one_allocation_never_holds_two_slices_of_one_gpu() -> None:
    pool = DevicePool([*slices("g0", 7), dev("whole", A100)])
    pair = pool.allocate(req(2, exclusive=True))
    assert pair.device_ids == ("g0/mig0", "whole")
    # Other allocations take the other slices of g0, one each.
    assert [pool.allocate(req(exclusive=True)).device_ids for _ in range(6)] == [
        (f"g0/mig{i}",) for i in range(1, 7)
    ]
    pool.validate_state()


def test_slices_of_one_gpu_cannot_make_a_group_and_the_error_says_why() -> None:
    pool = DevicePool([*slices("g0", 4), *slices("g1", 3)])
    assert len(set(pool.allocate(req(2)).device_ids) & {d.id for d in slices("g0", 4)}) == 1
    with pytest.raises(AllocationError) as info:
        pool.allocate(req(3))
    assert str(info.value) == (
        "request can never be met by this pool: need 3 × device; the pool has 7 devices, "
        "2 on distinct GPUs (MIG slices of one GPU never share an allocation)"
    )


def test_the_best_fitting_slice_of_a_gpu_is_taken() -> None:
    small = dev("g0/small", A100, memory=5 * GIB, parent="GPU-g0")
    pool = DevicePool([*slices("g0", 2), small, dev("g1", T4)])
    assert pool.allocate(req(2, memory=4 * GIB)).device_ids == ("g0/small", "g1")


def test_a_whole_gpu_listed_beside_its_slices_counts_as_that_gpu() -> None:
    whole = Device(id="gpu:0", spec=A100, node="a", uuid="GPU-g0")
    pool = DevicePool([whole, *slices("g0", 2)])
    with pytest.raises(AllocationError, match="1 on distinct GPUs"):
        pool.allocate(req(2))


# -- devices joining and leaving ------------------------------------------------------------------


def test_removing_a_device_ends_its_allocations_with_the_reason() -> None:
    clock = ManualClock(100.0)
    pool = DevicePool([dev("a0"), dev("a1"), dev("b0", node="b")], clock=clock)
    job = pool.allocate(req(2, affinity=Affinity(same_node=True), name="job"))
    other = pool.allocate(req(affinity=Affinity(devices=["b0"]), name="other"))
    assert pool.remove_device("a1", reason="maintenance") == (job,)
    assert job.released and not pool.holds(job)
    assert job.end is not None and job.end.cause is EndCause.DEVICE_REMOVED
    assert job.end.reason == "device 'a1' was removed from the pool: maintenance"
    assert job.end.at == 100.0
    with pytest.raises(
        AllocationError,
        match="allocation 'job' has ended: device 'a1' was removed from the pool: maintenance",
    ):
        job.release()
    with job:  # a with block's exit has nothing to give back
        pass
    # Every device of the ended allocation is free again; the other allocation lives on.
    snapshot = pool.snapshot()
    assert [u.id for u in snapshot.devices] == ["a0", "b0"]
    assert snapshot.devices[0].holders == {} and snapshot.allocations == {"other": ("b0",)}
    assert other.end is None
    assert job.to_dict()["end"] == {
        "cause": "device_removed",
        "reason": "device 'a1' was removed from the pool: maintenance",
        "at": 100.0,
    }
    assert pool.remove_device("a0") == ()
    with pytest.raises(DeviceError, match="no device 'a1' in this pool"):
        pool.remove_device("a1")
    pool.validate_state()


def test_added_devices_are_used_and_ids_stay_unique() -> None:
    pool = DevicePool([dev("a0")])
    with pytest.raises(AllocationError, match="can never be met"):
        pool.allocate(req(2))
    pool.add_device(dev("a1"))
    assert pool.allocate(req(2)).device_ids == ("a0", "a1")
    assert [d.id for d in pool.devices] == ["a0", "a1"]
    with pytest.raises(ConfigError, match=r"device\.id: duplicate id 'a1'"):
        pool.add_device(dev("a1"))
    with pytest.raises(ConfigError, match="device: expected a Device, got 'a2'"):
        pool.add_device("a2")  # type: ignore[arg-type]
    # A removed id can come back.
    pool.remove_device("a1")
    pool.add_device(dev("a1"))
    pool.validate_state()


def test_a_waiter_is_woken_by_a_device_that_joins() -> None:
    pool = DevicePool([dev("a0")])
    pool.allocate(req(exclusive=True))
    got: list[Allocation] = []
    waiter = threading.Thread(target=lambda: got.append(pool.allocate(req(), timeout=60)))
    waiter.start()
    wait_for(lambda: pool.waiting == 1)
    pool.add_device(dev("a1"))
    waiter.join(60)
    assert [a.device_ids for a in got] == [("a1",)]


def test_a_waiter_the_pool_can_no_longer_serve_raises() -> None:
    pool = DevicePool([dev("a0"), dev("a1")])
    pool.allocate(req(exclusive=True, affinity=Affinity(devices=["a0"])))
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            pool.allocate(req(2), timeout=60)
        except AllocationError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    wait_for(lambda: pool.waiting == 1)
    pool.remove_device("a1")
    waiter.join(60)
    assert [str(e).split(":")[0] for e in errors] == ["request can never be met by this pool"]


def test_bad_membership_arguments() -> None:
    pool = DevicePool([dev("a0")])
    with pytest.raises(ConfigError, match="reason: expected text or None, got 3"):
        pool.remove_device("a0", reason=3)  # type: ignore[arg-type]


# -- leases ------------------------------------------------------------------------------------


def test_a_lease_ends_the_allocation_when_it_runs_out() -> None:
    clock = ManualClock()
    pool = DevicePool([dev("a0")], clock=clock)
    lease = pool.allocate(req(exclusive=True, lease=30, name="short"))
    assert lease.expires_at == 30 and lease.lease == 30
    assert pool.snapshot().expires == {"short": 30}
    assert pool.try_allocate(req()) is None
    clock.advance(29.5)
    assert pool.holds(lease)
    clock.advance(0.5)
    assert pool.try_allocate(req()) is not None  # the lease ended on this call
    assert lease.released and lease.end is not None
    assert lease.end.cause is EndCause.LEASE_EXPIRED and lease.end.at == 30
    assert lease.end.reason == "its lease of 30 s ran out without a renewal"
    with pytest.raises(AllocationError, match="'short' has ended: its lease of 30 s ran out"):
        lease.release()
    with pytest.raises(AllocationError, match="'short' has ended"):
        lease.renew()
    pool.validate_state()


def test_renewing_restarts_the_lease() -> None:
    clock = ManualClock()
    pool = DevicePool([dev("a0")], clock=clock)
    lease = pool.allocate(req(lease=10))
    clock.advance(8)
    assert lease.renew() == 18
    clock.advance(8)
    assert lease.renew(lease=5) == 21 and lease.lease == 5
    clock.advance(5)
    assert pool.expire() == (lease,)
    assert pool.expire() == ()
    plain = pool.allocate(req())
    with pytest.raises(AllocationError, match="'alloc-2' has no lease to renew; pass lease="):
        plain.renew()
    assert plain.renew(lease=60) == 81  # a lease can be given later
    with pytest.raises(ConfigError, match=r"lease: expected seconds > 0 \(None: no lease\)"):
        plain.renew(lease=0)


def test_expire_wakes_a_waiter() -> None:
    clock = ManualClock()
    pool = DevicePool([dev("a0")], clock=clock)
    pool.allocate(req(exclusive=True, lease=60))
    got: list[Allocation] = []
    waiter = threading.Thread(target=lambda: got.append(pool.allocate(req(), timeout=math.inf)))
    waiter.start()
    wait_for(lambda: pool.waiting == 1)
    clock.advance(60)
    assert len(pool.expire()) == 1
    waiter.join(60)
    assert [a.device_ids for a in got] == [("a0",)]


def test_a_waiter_wakes_for_a_lease_that_runs_out_in_real_time() -> None:
    pool = DevicePool([dev("a0")])
    pool.allocate(req(exclusive=True, lease=0.05))
    # Nobody calls the pool meanwhile: the waiter's own wait ends when the lease does.
    assert pool.allocate(req(), timeout=60).device_ids == ("a0",)


# -- compute ---------------------------------------------------------------------------------


def test_min_tflops_of_a_dtype_filters_devices() -> None:
    pool = DevicePool([dev("t4", T4), dev("a100", A100), dev("h100", H100)])
    # bf16 dense: T4 65 (its fp16), A100 312, H100 989.
    assert pool.allocate(req(min_tflops=300)).device_ids == ("a100",)
    assert pool.allocate(req(min_tflops=900, dtype="bf16")).device_ids == ("h100",)
    with pytest.raises(AllocationError) as info:
        pool.allocate(req(3, min_tflops=100, dtype="fp16"))
    assert str(info.value) == (
        "request can never be met by this pool: need 3 × device, at least 100 fp16 TFLOPS "
        "each; the pool has 3 devices, 2 reach 100 fp16 TFLOPS"
    )


@pytest.mark.parametrize(
    ("fields", "path", "text"),
    [
        ({"min_tflops": 0}, "min_tflops", "expected TFLOPS > 0 (None: no minimum), got 0"),
        ({"min_tflops": math.inf}, "min_tflops", "got inf"),
        ({"min_tflops": "100"}, "min_tflops", "got '100'"),
        ({"dtype": "bf8"}, "dtype", "allowed: fp64, fp32"),
        ({"lease": -1}, "lease", "expected seconds > 0 (None: no lease), got -1"),
        ({"lease": True}, "lease", "got True"),
    ],
)
def test_compute_and_lease_errors(fields: dict[str, object], path: str, text: str) -> None:
    with pytest.raises(ConfigError) as info:
        AllocationRequest(**fields)  # type: ignore[arg-type]
    assert [p for p, _ in info.value.problems] == [path]
    assert text in str(info.value)


def test_describe_names_compute_and_lease() -> None:
    request = req(2, min_tflops=100, dtype="fp8", lease=30)
    assert request.describe() == "2 × device, at least 100 fp8 TFLOPS each, leased for 30 s"
