"""Runtime membership: devices join, drain and leave while work runs, and the core's invariants
hold (``validate_state``, every item ends exactly once, nothing runs where it may not)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.sched import Dispatcher, Finish, ItemState, ManualClock, Run, Stop, WorkItem
from hetero.sched.registry import make_policy
from tests.fleets import make_devices

POLICIES = ["shortest_expected_delay", "round_robin", "power_of_two", "adaptive", "weighted"]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), st.floats(0.1, 5.0), st.integers(0, 2)),
        st.tuples(st.just("complete"), st.integers(0, 10**6)),
        st.tuples(st.just("fail"), st.integers(0, 10**6)),
        st.tuples(st.just("add"), st.sampled_from([0.5, 1.0, 2.5]), st.integers(1, 2)),
        st.tuples(st.just("drain"), st.integers(0, 10**6)),
        st.tuples(st.just("remove"), st.integers(0, 10**6)),
        st.tuples(st.just("back"), st.integers(0, 10**6)),
        st.tuples(st.just("slots"), st.integers(0, 10**6), st.integers(1, 4)),
    ),
    max_size=70,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(POLICIES), steps=ops, stealing=st.booleans())
def test_devices_that_come_and_go_lose_and_duplicate_nothing(
    policy: str, steps: list[tuple], stealing: bool
) -> None:
    clock = ManualClock()
    d = Dispatcher(
        make_devices([1.0, 2.5]), make_policy(policy), clock, stealing=stealing, max_retries=2
    )
    running: dict[int | str, int] = {}
    finishes: Counter[int | str] = Counter()
    admitted: set[int | str] = set()
    added = 0

    def apply(out: list) -> None:
        for ins in out:
            if isinstance(ins, Run):
                assert ins.item.id not in running, "started twice at once"
                assert d.view.running[ins.device] <= d.view.slots[ins.device], "over its slots"
                assert ins.device not in d._removed and not d._holds[ins.device]
                running[ins.item.id] = ins.device
            elif isinstance(ins, Stop):
                running.pop(ins.item.id, None)
            else:
                assert isinstance(ins, Finish)
                finishes[ins.item.id] += 1
                running.pop(ins.item.id, None)

    for k, step in enumerate(steps):
        kind = step[0]
        ids = d.view.ids
        if kind == "submit":
            apply(d.submit(WorkItem(cost=step[1], priority=step[2], id=k)))
            admitted.add(k)
        elif kind in ("complete", "fail") and running:
            item_id = sorted(running, key=str)[step[1] % len(running)]
            running.pop(item_id)
            apply(d.complete(item_id) if kind == "complete" else d.fail(item_id, "boom"))
        elif kind == "add":
            device = make_devices([step[1]])[0]
            device.id = f"n{added}"
            apply(d.add_device(device, slots=step[2]))
            added += 1
        elif kind == "drain":
            apply(d.drain_device(ids[step[1] % len(ids)]))
        elif kind == "remove":
            apply(d.remove_device(ids[step[1] % len(ids)]))
        elif kind == "slots":  # a replica's capacity learned up or down while work runs
            apply(d.set_slots(ids[step[1] % len(ids)], step[2]))
        elif kind == "back":
            device = d.view.devices[step[1] % len(ids)]
            if d.view.index[device.id] in d._removed:
                apply(d.add_device(device))
            else:
                apply(d.device_up(device.id))
        d.validate_state()
        for item_id, i in running.items():
            assert d.records[item_id].device == i
            assert i not in d._removed, "an item runs on a removed device"
    # Bring one device back if none is left, then finish everything.
    if not d.view.usable.any():
        removed = sorted(d._removed)
        apply(d.add_device(d.view.devices[removed[0]]) if removed else d.device_up(d.view.ids[0]))
    for _ in range(10 * len(admitted) + 10):
        if not running:
            break
        apply(d.complete(next(iter(running))))
    d.validate_state()
    assert d.active == 0, "an admitted item never ended"
    assert set(finishes) == admitted and set(finishes.values()) <= {1}, "lost or ended twice"
    assert all(d.state_of(i) in (ItemState.DONE, ItemState.FAILED) for i in admitted)


def test_a_joining_device_takes_waiting_work_at_once() -> None:
    d = Dispatcher(make_devices([1.0]), make_policy("shortest_expected_delay"), ManualClock())
    for k in range(3):
        d.submit(WorkItem(cost=1.0, id=k))
    new = make_devices([4.0])[0]
    new.id = "fast"
    out = d.add_device(new)
    assert [(i.item.id, i.device_id) for i in out if isinstance(i, Run)] == [(2, "fast")]
    assert d.members == ["d0", "fast"]
    d.validate_state()


def test_work_restricted_to_every_device_so_far_stays_off_a_device_that_joins_later() -> None:
    d = Dispatcher(make_devices([1.0]), make_policy("shortest_expected_delay"), ManualClock())
    for k in range(3):  # "every device", as a router names its model's replicas: all of them
        d.submit(WorkItem(cost=1.0, id=k), only=["d0"])
    new = make_devices([4.0])[0]
    new.id = "fast"
    assert not [i for i in d.add_device(new) if isinstance(i, Run)]  # not on its list
    d.submit(WorkItem(cost=1.0, id="any"), only=["d0", "fast"])  # every device again
    assert d.records["any"].device == 1
    d.complete(0)
    assert all(d.records[k].device == 0 for k in range(3))
    d.validate_state()


def test_draining_lets_running_work_finish_and_removing_moves_it_uncharged() -> None:
    d = Dispatcher(make_devices([1.0, 1.0]), make_policy("round_robin"), ManualClock())
    for k in range(4):
        d.submit(WorkItem(cost=1.0, id=k))  # 0, 2 run; 1, 3 queue (one per device)
    out = d.drain_device("d1")
    assert not [i for i in out if isinstance(i, Stop)]  # running work stays
    assert d.records[1].device == 1 and d.state_of(1) is ItemState.RUNNING
    assert d.records[3].device == 0  # its queued work moved
    out = d.remove_device("d1")
    assert [(type(i).__name__, i.item.id) for i in out] == [("Stop", 1)]
    assert d.records[1].device == 0 and d.records[1].failures == 0
    assert d.members == ["d0"]
    with pytest.raises(ConfigError, match="removed from the fleet"):
        d.device_up("d1")
    with pytest.raises(ConfigError, match="already in the fleet"):
        d.add_device(d.view.devices[0])
    d.validate_state()


def test_a_draining_device_that_goes_down_stops_what_it_runs() -> None:
    d = Dispatcher(make_devices([1.0, 1.0]), make_policy("round_robin"), ManualClock())
    for k in range(2):
        d.submit(WorkItem(cost=1.0, id=k))  # 0 on d0, 1 on d1
    d.drain_device("d1")
    out = d.device_down("d1", "circuit open")
    assert [(type(i).__name__, i.item.id) for i in out][:1] == [("Stop", 1)]
    assert d.records[1].device == 0 and d.records[1].failures == 1  # charged: it failed there
    assert d.device_down("d1") == []  # already down
    d.validate_state()
    d.device_up("d1")  # healthy again: takes work, no longer draining
    d.complete(0)
    d.complete(1)
    d.submit(WorkItem(cost=1.0, id=2))
    d.submit(WorkItem(cost=1.0, id=3))
    assert {d.records[k].device for k in (2, 3)} == {0, 1}
    d.validate_state()
