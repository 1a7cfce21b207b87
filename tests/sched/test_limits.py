"""Memory as a hard limit under every policy, and errors from the hierarchy for unknown ids."""

from __future__ import annotations

import pytest

from hetero.errors import (
    HeteroError,
    ItemNotRunning,
    NoCapableDevice,
    UnknownDevice,
    UnknownItem,
)
from hetero.sched import Dispatcher, ItemState, ManualClock, Run, WorkItem
from hetero.sched.registry import make_policy, policy_names
from tests.fleets import make_devices
from tests.sched.policies import OPTIONS

GB = 2**30


def fleet_dispatcher(policy: str, **options: object) -> Dispatcher:
    """A 4 GiB device and a 16 GiB one (d0, d1), equally fast."""
    return Dispatcher(
        make_devices([1.0, 1.0], memory=[4 * GB, 16 * GB]),
        make_policy(policy, OPTIONS.get(policy, {})),
        ManualClock(),
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("policy", policy_names())
def test_an_item_larger_than_every_device_is_refused_at_submit(policy: str) -> None:
    d = fleet_dispatcher(policy)
    with pytest.raises(NoCapableDevice) as info:
        d.submit(WorkItem(cost=1, memory=10**15, id="huge"))
    message = str(info.value)
    assert "'huge' needs 909.49 TiB of memory; the largest device, d1, has 16 GiB" in message
    assert "huge" not in d.records and d.active == 0


@pytest.mark.parametrize("policy", policy_names())
def test_memory_is_a_hard_limit_whatever_the_policy(policy: str) -> None:
    # Round robin, random, weighted... used to place a 6 GiB item on the 4 GiB device.
    d = fleet_dispatcher(policy, stealing=False)
    placed = []
    for k in range(6):
        d.submit(WorkItem(cost=1, memory=6 * GB, id=k))
        rec = d.records[k]
        placed.append(rec.device)
        assert rec.state is not ItemState.FAILED, rec.reason
    # Two fit on the 16 GiB device at once; the rest wait for its memory, never on d0.
    assert placed[:2] == [1, 1] and placed[2:] == [-1] * 4
    assert [d.state_of(k) for k in range(6)].count(ItemState.PENDING) == 4
    assert (d.view.mem_used <= d.view.mem_total).all()
    d.validate_state()
    # Memory freed by a finished item lets the next one in: 1 starts, 2 takes its place.
    out = d.complete(0)
    assert [(ins.item.id, ins.device) for ins in out if isinstance(ins, Run)] == [(1, 1)]
    assert (d.state_of(2), d.records[2].device) == (ItemState.QUEUED, 1)
    d.validate_state()


def test_a_thief_without_the_memory_does_not_steal() -> None:
    clock = ManualClock()
    d = Dispatcher(
        make_devices([1.0, 5.0], memory=[16 * GB, 4 * GB]), make_policy("round_robin"), clock
    )
    d.device_down("d1")
    d.submit(WorkItem(cost=5, memory=8 * GB, id="a"))
    d.submit(WorkItem(cost=5, memory=6 * GB, id="b"))  # queued behind a on d0
    d.device_up("d1")  # fast and idle, but 4 GiB cannot hold b
    assert d.records["b"].device == 0
    d.validate_state()


def test_unknown_items_and_devices_raise_errors_that_list_what_exists() -> None:
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0, 1.0]), make_policy("round_robin"), clock)
    for k in range(7):
        d.submit(WorkItem(id=f"job{k}"))
    for call in (d.complete, lambda i: d.fail(i, "boom"), d.cancel, d.state_of):
        with pytest.raises(UnknownItem) as info:
            call("nope")
        assert isinstance(info.value, HeteroError) and isinstance(info.value, KeyError)
        message = str(info.value)
        assert message.startswith("cannot ") and "unknown work item 'nope'" in message
        assert "7 items in flight: 'job0', 'job1', 'job2', 'job3', 'job4', …" in message
    for call in (d.device_down, d.device_up):
        with pytest.raises(UnknownDevice, match=r"unknown device 'gpu9'; the fleet has: d0, d1"):
            call("gpu9")
    with pytest.raises(ItemNotRunning, match="it is queued, not running"):
        d.complete("job6")
    assert isinstance(ItemNotRunning("x"), HeteroError)
