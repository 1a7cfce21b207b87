"""Size-ordered device queues with aging, and the placement that knows about them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.sched import Dispatcher, ManualClock, WorkItem
from hetero.sched.perf import PerfModel
from hetero.sched.registry import make_policy
from hetero.sched.view import SIZE_CLASSES, FleetView
from tests.fleets import make_devices
from tests.sched.policies import Always


def run_order(d: Dispatcher, clock: ManualClock, device: int = 0) -> list[int | str]:
    """Complete whatever runs on ``device`` until it is idle; the ids in the order they ran."""
    order: list[int | str] = []
    while d._running[device]:
        (rec,) = d._running[device]
        order.append(rec.item.id)
        clock.advance(rec.item.cost)
        d.complete(rec.item.id)
        d.validate_state()
    return order


def one_device(clock: ManualClock, **options: object) -> Dispatcher:
    return Dispatcher(make_devices([1.0]), Always(0), clock, stealing=False, **options)  # type: ignore[arg-type]


def test_size_order_runs_small_items_first_within_a_priority() -> None:
    clock = ManualClock()
    d = one_device(clock)
    d.submit(WorkItem(cost=1, id="first"))  # runs at once
    for cost, name in [(8, "big"), (2, "mid"), (1, "small")]:
        d.submit(WorkItem(cost=cost, id=name))
    d.submit(WorkItem(cost=9, priority=1, id="urgent"))  # priority still comes first
    assert run_order(d, clock) == ["first", "urgent", "small", "mid", "big"]


def test_fifo_order_keeps_arrival_order() -> None:
    clock = ManualClock()
    d = one_device(clock, queue_order="fifo")
    for cost, name in [(1, "first"), (8, "big"), (2, "mid"), (1, "small")]:
        d.submit(WorkItem(cost=cost, id=name))
    assert run_order(d, clock) == ["first", "big", "mid", "small"]


def test_aging_bounds_how_long_a_large_item_is_passed_over() -> None:
    # With aging 2, the 5 s item's key is its arrival + 10 s: a 1 s item (key arrival + 2 s)
    # passes it only if it arrives less than 8 s after it.
    clock = ManualClock()
    d = one_device(clock, aging=2.0)
    d.submit(WorkItem(cost=20, id="running"))  # keeps the device busy for 20 s
    d.submit(WorkItem(cost=5, id="large"))  # arrives at 0
    clock.advance(7.0)
    d.submit(WorkItem(cost=1, id="soon"))  # key 9 < 10: passes
    clock.advance(2.0)
    d.submit(WorkItem(cost=1, id="late"))  # key 11 > 10: waits behind
    clock.advance(11.0)
    d.complete("running")
    assert run_order(d, clock) == ["soon", "large", "late"]


def test_max_bypass_caps_the_window_for_the_largest_items() -> None:
    clock = ManualClock()
    d = one_device(clock, aging=100.0, max_bypass=3.0)
    d.submit(WorkItem(cost=50, id="running"))
    d.submit(WorkItem(cost=40, id="huge"))  # window min(4000, 3) s
    clock.advance(1.5)
    d.submit(WorkItem(cost=0.01, id="inside"))  # key 1.5 + 1 < 3
    clock.advance(2.5)
    d.submit(WorkItem(cost=0.01, id="outside"))  # key 4 + 1 > 3
    clock.advance(46.0)
    d.complete("running")
    assert run_order(d, clock) == ["inside", "huge", "outside"]


def test_the_aging_window_is_timed_on_the_fastest_device() -> None:
    # Everything goes to the slow d0; d1 is 4x faster. With aging 2 the 8-unit item's window is
    # 2 x 8 / 4 = 4 s, what it would take on d1, not the 16 s it takes on d0: an item sent to a
    # slow device is not passed over for longer than on the fast one.
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0, 4.0]), Always(0), clock, stealing=False, aging=2.0)
    d.submit(WorkItem(cost=20, id="running"))
    d.submit(WorkItem(cost=8, id="large"))  # key 0 + 4
    clock.advance(3.0)
    d.submit(WorkItem(cost=1, id="soon"))  # key 3 + 0.5 < 4: passes
    clock.advance(2.0)
    d.submit(WorkItem(cost=1, id="late"))  # key 5.5 > 4: waits behind (it would pass a 16 s window)
    clock.advance(15.0)
    d.complete("running")
    assert run_order(d, clock) == ["soon", "large", "late"]


def test_elapsed_work_is_what_the_running_items_have_done_so_far() -> None:
    clock = ManualClock()
    d = Dispatcher(make_devices([2.0, 1.0]), Always(0), clock, stealing=False)
    d.submit(WorkItem(cost=3, id="running"))  # on d0, speed 2
    d.submit(WorkItem(cost=1, id="queued"))  # queued behind it: no work done yet
    clock.advance(1.0)
    assert list(d.view.elapsed_work()) == [2.0, 0.0]
    assert list(d.view.delay_score(1.0, d.perf.inv_speed(), 0.0, remaining=True)) == [1.5, 1.0]
    assert list(d.view.delay_score(1.0, d.perf.inv_speed(), 0.0)) == [2.5, 1.0]
    clock.advance(5.0)  # past its expected end: never more than its cost
    assert list(d.view.elapsed_work()) == [3.0, 0.0]
    d.complete("running")  # the queued one starts now
    assert list(d.view.elapsed_work()) == [0.0, 0.0]
    d.validate_state()


def test_a_device_with_a_prefetch_slot_works_through_its_items_in_turn() -> None:
    """Two slots, one of them a prefetch (parallel 1): the second item waits in the worker, so
    the device has done its speed times the time since the latest start, not twice that."""
    clock = ManualClock()
    d = Dispatcher(
        make_devices([2.0, 1.0]), Always(0), clock, stealing=False, slots=[2, 2], parallel=[1, 1]
    )
    d.submit(WorkItem(cost=4, id="a"))
    d.submit(WorkItem(cost=4, id="b"))  # sent at once, held in the prefetch slot
    clock.advance(1.0)
    assert list(d.view.elapsed_work()) == [2.0, 0.0]  # 2 units of "a"; counted twice before
    clock.advance(1.0)
    d.complete("a", service_time=2.0)  # "b" really starts now; "c" is sent behind it
    d.submit(WorkItem(cost=4, id="c"))
    clock.advance(0.5)
    assert list(d.view.elapsed_work()) == [1.0, 0.0]
    d.validate_state()


def test_a_closed_batch_keeps_deep_enough_for_the_slowest_device_to_fill_its_slots() -> None:
    d = Dispatcher(make_devices([8.0, 2.0, 1.0]), Always(0), ManualClock())
    assert d.view.batch_depth() == 11 + 3  # total speed / slowest, plus one item per device
    prefetching = Dispatcher(
        make_devices([8.0, 2.0, 1.0]), Always(0), ManualClock(), slots=[2] * 3, parallel=[1] * 3
    )
    assert prefetching.view.batch_depth() == 22 + 3  # ... times the slowest device's slots


@pytest.mark.parametrize(("order", "stolen"), [("size", "big"), ("fifo", "mid")])
def test_a_thief_takes_the_item_that_would_start_last(order: str, stolen: str) -> None:
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0, 1.0]), Always(0), clock, queue_order=order)
    d.device_down("d1")
    d.submit(WorkItem(cost=10, id="running"))
    for cost, name in [(6, "big"), (1, "small"), (2, "mid")]:
        d.submit(WorkItem(cost=cost, id=name))
    d.device_up("d1")  # an idle device: it steals the item that would start last on d0
    assert [r.item.id for r in d._running[1]] == [stolen]
    d.validate_state()


@pytest.mark.parametrize(
    ("options", "weight", "expected"),
    [
        ({"queue_order": "fifo"}, 0.0, "d1"),  # FIFO: behind 84 units on d0, 21 s
        ({}, 0.0, "d0"),  # size order: only the running item is ahead, 1.25 s < 2 s
        ({}, 2.0, "d1"),  # ...but it would push two 10 s items back: 2.25 s > 2 s
    ],
)
def test_shortest_expected_delay_knows_the_queue_order(
    options: dict[str, object], weight: float, expected: str
) -> None:
    clock = ManualClock()
    d = Dispatcher(
        make_devices([4.0, 0.5]),
        make_policy("shortest_expected_delay", {"overtake_weight": weight}),
        clock,
        stealing=False,
        **options,  # type: ignore[arg-type]
    )
    d.submit(WorkItem(cost=4, id="running"))  # 1 s on d0
    for name in ("big1", "big2"):
        d.submit(WorkItem(cost=40, id=name))  # 10 s each on d0 (vs 80 s on d1)
    assert [d.records[i].device for i in ("running", "big1", "big2")] == [0, 0, 0]
    d.submit(WorkItem(cost=1, id="new"))
    assert d.view.ids[d.records["new"].device] == expected
    d.validate_state()


def test_bad_queue_options_are_config_errors() -> None:
    with pytest.raises(ConfigError) as info:
        Dispatcher(
            make_devices([1.0]),
            Always(0),
            ManualClock(),
            queue_order="lifo",
            aging=-1,
            max_bypass=float("inf"),
        )
    fields = [path for path, _ in info.value.problems]
    assert fields == ["queue_order", "aging", "max_bypass"]
    assert "allowed: size, fifo" in str(info.value)
    with pytest.raises(ConfigError, match="overtake_weight"):
        make_policy("shortest_expected_delay", {"overtake_weight": -1})


@settings(max_examples=300, deadline=None)
@given(
    first=st.floats(0.0, 1e15, exclude_min=True),
    costs=st.lists(st.floats(0.0, 1e12), min_size=1, max_size=20),
    steps=st.integers(-3, 3),
)
def test_size_classes_are_half_octaves_from_the_first_cost(
    first: float, costs: list[float], steps: int
) -> None:
    # The view finds a class by bisection over precomputed bounds; the bounds must class every
    # cost as the formula does, the floats either side of each bound included.
    devices = make_devices([1.0])
    view = FleetView(devices, PerfModel(devices), ManualClock())
    view.size_class(first)
    base = math.floor(2.0 * math.log2(first)) - SIZE_CLASSES // 2
    near = [math.nextafter(b, math.inf if steps > 0 else 0.0) for b in view._class_bounds]
    for cost in [*costs, *view._class_bounds, *near]:
        expected = 0 if cost <= 0 else min(max(int(2.0 * math.log2(cost) - base), 0), 63)
        assert view.size_class(cost) == expected
