"""Properties over random fleets, workloads, failures, preemptions and steals: every admitted
item ends exactly once, none is lost or finished twice, and the dispatcher's books balance."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.errors import NoCapableDevice, QueueFull
from hetero.sched import Dispatcher, Finish, ItemState, ManualClock, Run, Stop, WakeAt, WorkItem
from hetero.sched.registry import make_policy, policy_names
from tests.fleets import make_devices
from tests.sched.policies import OPTIONS

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.floats(0.1, 5.0),
            st.integers(0, 3),
            st.integers(0, 20 * 2**30),  # the devices hold 16 GiB: some never fit
            st.booleans(),
        ),
        st.tuples(st.just("complete"), st.integers(0, 10**6)),
        st.tuples(st.just("fail"), st.integers(0, 10**6), st.booleans()),
        st.tuples(st.just("cancel"), st.integers(0, 10**6)),
        st.tuples(st.just("down"), st.integers(0, 10**6)),
        st.tuples(st.just("up"), st.integers(0, 10**6)),
        st.tuples(st.just("tick"), st.floats(0.0, 3.0)),
    ),
    max_size=60,
)


def assert_not_in_limbo(d: Dispatcher, item: WorkItem) -> None:
    """Just after ``submit``: queued, running or ended, or pending only while no usable device
    with the memory free would take it."""
    rec = d.records[item.id]
    if rec.state is not ItemState.PENDING:
        return
    view = d.view
    free = view.mem_total - view.mem_used
    takers = [
        i
        for i in range(view.n)
        if view.usable[i] and free[i] >= item.memory and d.policy.admits(item, view, i)
    ]
    assert not takers, f"item {item.id} pending while {[view.ids[i] for i in takers]} could run it"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(sorted(policy_names())),
    speeds=st.lists(st.sampled_from([0.5, 1.0, 2.5, 6.0]), min_size=1, max_size=6),
    slots=st.integers(1, 3),
    preemption=st.booleans(),
    stealing=st.booleans(),
    queue_order=st.sampled_from(["size", "fifo"]),
    timeout=st.one_of(st.none(), st.floats(0.5, 10.0)),
    max_queue=st.integers(1, 40),
    steps=ops,
)
def test_every_item_ends_exactly_once(
    policy: str,
    speeds: list[float],
    slots: int,
    preemption: bool,
    stealing: bool,
    queue_order: str,
    timeout: float | None,
    max_queue: int,
    steps: list[tuple],
) -> None:
    clock = ManualClock()
    d = Dispatcher(
        make_devices(speeds),
        make_policy(policy, OPTIONS.get(policy, {})),
        clock,
        slots=[slots] * len(speeds),
        max_queue_size=max_queue,
        timeout=timeout,
        preemption=preemption,
        stealing=stealing,
        queue_order=queue_order,
        max_retries=1,
    )
    finishes: Counter[int | str] = Counter()
    done: Counter[int | str] = Counter()
    running: set[int | str] = set()
    admitted: set[int | str] = set()
    wake = [math.inf]  # the earliest WakeAt since the last expire: when the timer fires

    def apply(out: list) -> None:
        for ins in out:
            if isinstance(ins, WakeAt):
                wake[0] = min(wake[0], ins.at)
            elif isinstance(ins, Run):
                assert ins.item.id not in running, "started twice at once"
                running.add(ins.item.id)
            elif isinstance(ins, Stop):
                running.discard(ins.item.id)
            else:
                assert isinstance(ins, Finish)
                finishes[ins.item.id] += 1
                running.discard(ins.item.id)
                if ins.state is ItemState.DONE:
                    done[ins.item.id] += 1

    next_id = 0
    for step in steps:
        kind = step[0]
        if kind == "submit":
            _, cost, prio, memory, tagged = step
            item = WorkItem(
                cost=cost,
                priority=prio,
                memory=memory,
                id=next_id,
                tags=frozenset({"big"}) if tagged else frozenset(),
            )
            next_id += 1
            try:
                apply(d.submit(item))
                admitted.add(item.id)
            except QueueFull:
                pass
            except NoCapableDevice:
                assert memory > d.view.mem_total.max(), "refused an item that fits a device"
                continue
            assert memory <= d.view.mem_total.max(), "admitted an item no device can hold"
            if item.id in admitted:
                assert_not_in_limbo(d, item)
        elif kind in ("complete", "fail") and running:
            item_id = sorted(running)[step[1] % len(running)]
            running.discard(item_id)  # this attempt has ended, whatever comes next
            apply(d.complete(item_id) if kind == "complete" else d.fail(item_id, "boom", step[2]))
        elif kind == "cancel" and admitted:
            apply(d.cancel(sorted(admitted)[step[1] % len(admitted)]))
        elif kind == "down":
            apply(d.device_down(d.view.ids[step[1] % d.view.n]))
        elif kind == "up":
            apply(d.device_up(d.view.ids[step[1] % d.view.n]))
        elif kind == "tick":
            clock.advance(step[1])
            wake[0] = math.inf  # the timer fired: expire announces the next deadline
            apply(d.expire())
        d.validate_state()
        deadline = d.next_deadline()
        assert deadline is None or wake[0] <= deadline, "a deadline no WakeAt announced"

    # Drain: bring every device back and finish whatever runs, until nothing is left.
    for device_id in d.view.ids:
        apply(d.device_up(device_id))
    for _ in range(10_000):
        if not running:
            break
        item_id = sorted(running)[0]
        running.discard(item_id)
        apply(d.complete(item_id))
        d.validate_state()
    for item_id in sorted(admitted):
        apply(d.cancel(item_id, "drained"))
    d.validate_state()

    assert set(finishes) == admitted, "an admitted item never ended"
    assert all(d.records[i].reason for i in admitted if d.state_of(i) is not ItemState.DONE)
    assert all(n == 1 for n in finishes.values()), "an item ended twice"
    assert all(n == 1 for n in done.values()), "an item finished twice"
    assert d.active == 0
    for item_id in admitted:
        assert d.records[item_id].terminal
