"""Scenario tests: simulated time is the test clock, so whole runs are asserted as exact logs."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from hetero.sched import Policy, WorkItem
from hetero.sched.registry import make_policy
from hetero.sim.engine import Simulator
from tests.fleets import make_devices


def arrivals(*rows: tuple[float, float]) -> Iterator[tuple[float, WorkItem]]:
    for i, (t, cost) in enumerate(rows):
        yield t, WorkItem(cost=cost, id=i)


def sed() -> Policy:
    return make_policy("shortest_expected_delay")


def test_exact_log_on_a_two_device_fleet() -> None:
    sim = Simulator(make_devices([2.0, 1.0]), sed(), dispatcher_options={"stealing": False})
    log: list = []
    result = sim.run(arrivals((0.0, 2.0), (0.0, 1.0), (0.5, 2.0), (3.0, 1.0)), log=log)
    assert log == [
        (0.0, "run", 0, "d0"),  # 1 s on d0
        (0.0, "run", 1, "d1"),  # d0 busy: 2 s there vs 1 s on d1
        (1.0, "done", 0, ""),  # item 2 was queued on d0 at 0.5 (2 s there vs 3 s on d1)
        (1.0, "run", 2, "d0"),
        (1.0, "done", 1, ""),
        (2.0, "done", 2, ""),
        (3.0, "run", 3, "d0"),
        (3.5, "done", 3, ""),
    ]
    assert result.completed == 4 and result.failed == 0
    assert result.metrics.p50 == pytest.approx(1.0)
    # Each latency comes with its item's cost, in completion order (for latency by size).
    assert list(zip(result.costs, result.latencies, strict=True)) == [
        (2.0, 1.0),
        (1.0, 1.0),
        (2.0, 1.5),
        (1.0, 0.5),
    ]


def test_failure_and_recovery_move_work_and_lose_nothing() -> None:
    sim = Simulator(make_devices([1.0, 1.0]), sed(), keep_finished=True)
    log: list = []
    result = sim.run(
        arrivals((0.0, 4.0), (0.0, 4.0), (1.0, 1.0)),
        failures=[("d0", 2.0, 3.0)],
        log=log,
    )
    assert (2.0, "stop", 0, "d0") in log
    # Item 0 restarts on d1 after item 1; nothing runs on d0 while it is down.
    assert not any(row[1] == "run" and row[3] == "d0" and 2.0 <= row[0] < 3.0 for row in log)
    assert result.completed == 3 and result.failed == 0
    sim.dispatcher.validate_state()


def test_timeouts_fail_with_reason() -> None:
    sim = Simulator(make_devices([1.0]), sed(), dispatcher_options={"timeout": 1.5})
    result = sim.run(arrivals((0.0, 1.0), (0.0, 1.0), (0.0, 1.0)))
    assert result.completed == 1
    assert result.failed == 2
    assert result.failure_reasons == {"timed out after 1.5s": 2}


def test_queue_full_rejects_arrivals() -> None:
    sim = Simulator(make_devices([1.0]), sed(), dispatcher_options={"max_queue_size": 1})
    log: list = []
    result = sim.run(arrivals((0.0, 1.0), (0.0, 1.0), (0.0, 1.0)), log=log)
    assert result.rejected == 1 and result.completed == 2
    assert (0.0, "rejected", 2, "") in log


def test_devices_down_forever_end_waiting_items_with_a_reason() -> None:
    sim = Simulator(make_devices([1.0]), sed())
    result = sim.run(arrivals((0.0, 1.0), (2.0, 1.0)), failures=[("d0", 1.5, None)])
    assert result.completed == 1 and result.failed == 1
    assert "no usable device" in next(iter(result.failure_reasons))


def test_actual_speed_differs_from_catalog() -> None:
    sim = Simulator(make_devices([1.0]), sed(), actual_speed={"d0": 0.5})
    result = sim.run(arrivals((0.0, 1.0)))
    assert result.metrics.elapsed == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown device"):
        Simulator(make_devices([1.0]), sed(), actual_speed={"nope": 2.0})


def test_same_seed_same_run() -> None:
    def run() -> list:
        log: list = []
        sim = Simulator(make_devices([2.5, 1.0, 1.0]), make_policy("power_of_two", {"seed": 3}))
        sim.run(arrivals(*[(i * 0.3, 1.0 + (i % 3)) for i in range(50)]), log=log)
        return log

    assert run() == run()


def test_time_series_averages_utilization_over_each_interval() -> None:
    # One device busy from 0 to 4 s then idle until an item at 8 s: half busy overall.
    sim = Simulator(make_devices([1.0]), sed(), samples=10)
    result = sim.run(arrivals((0.0, 4.0), (8.0, 0.5)), expected_duration=10.0)
    series = result.series
    assert series.t[0] == pytest.approx(1.0) and series.interval == pytest.approx(1.0)
    np.testing.assert_allclose(series.utilization[:4, 0], 1.0)
    np.testing.assert_allclose(series.utilization[4:8, 0], 0.0)
    assert series.queue_length.max() == 0


def test_time_series_stays_bounded_however_long_the_run() -> None:
    # 2,000 items of 5 s each on one device: 10,000 simulated seconds. Without expected_duration
    # the first interval is 1/200 s, two million samples before the series was bounded.
    sim = Simulator(make_devices([1.0]), sed())
    result = sim.run(arrivals(*[(0.0, 5.0)] * 2000))
    series = result.series
    assert result.completed == 2000
    assert 200 <= series.t.size <= 400
    assert series.t[-1] > 10_000 - series.interval
    np.testing.assert_allclose(np.diff(series.t), series.interval)
    np.testing.assert_allclose(series.utilization[:, 0], 1.0)  # busy throughout
    assert (np.diff(series.queue_length) <= 0).all() and series.queue_length[0] > 1900


def test_merged_time_series_is_the_one_sampled_at_the_final_interval() -> None:
    # Busy for exactly the first 8 of 16 s, bar a 0.1 s item at the very end.
    work = ((0.0, 8.0), (15.9, 0.1))
    merged = Simulator(make_devices([1.0]), sed(), samples=4).run(
        arrivals(*work), expected_duration=1.0
    )
    series = merged.series
    assert series.interval == pytest.approx(4.0)
    np.testing.assert_allclose(series.t, [4.0, 8.0, 12.0, 16.0])
    np.testing.assert_allclose(series.utilization[:, 0], [1.0, 1.0, 0.0, 0.1 / 4])
    direct = Simulator(make_devices([1.0]), sed(), samples=4).run(
        arrivals(*work), expected_duration=16.0
    )
    np.testing.assert_allclose(series.t, direct.series.t)
    np.testing.assert_allclose(series.utilization, direct.series.utilization)
    np.testing.assert_array_equal(series.queue_length, direct.series.queue_length)


def test_an_earlier_deadline_replaces_the_pending_expiry_event() -> None:
    # Each arrival brings a deadline earlier than all before it, and item 0 holds the only device
    # until every other item has timed out: one expiry event per deadline, not one per arrival
    # since (those made the run quadratic).
    n = 300
    items = [(0.0, WorkItem(cost=100.0, id=0))]
    items += [(i * 0.01, WorkItem(cost=1.0, id=i, deadline=50.0 - i * 0.1)) for i in range(1, n)]
    result = Simulator(make_devices([1.0]), sed()).run(iter(items), expected_duration=100.0)
    assert result.completed == 1 and result.failed == n - 1
    assert result.events == n + 1 + (n - 1)  # arrivals, item 0's completion, the expiries
