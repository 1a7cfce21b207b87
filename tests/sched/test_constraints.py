"""Per-item placement constraints (``only``), retry budgets and executor-measured service time:
what the execution engine needs from the dispatcher."""

from __future__ import annotations

import pytest

from hetero.errors import ConfigError, NoCapableDevice, UnknownDevice
from hetero.sched import Cause, Dispatcher, ItemState, ManualClock, Run, WakeAt, WorkItem
from hetero.sched.instructions import Finish
from hetero.sched.registry import make_policy, policy_names
from tests.fleets import make_devices
from tests.sched.policies import OPTIONS

GB = 2**30


def dispatcher(policy: str = "shortest_expected_delay", **options: object) -> Dispatcher:
    return Dispatcher(
        make_devices([4.0, 1.0, 1.0], memory=[4 * GB, 16 * GB, 16 * GB]),
        make_policy(policy, OPTIONS.get(policy, {})),
        ManualClock(),
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("policy", policy_names())
def test_only_keeps_an_item_on_its_devices_whatever_the_policy(policy: str) -> None:
    d = dispatcher(policy)
    placed = set()
    for k in range(12):
        for ins in d.submit(WorkItem(cost=1, id=k), only=["d1", "d2"]):
            if isinstance(ins, Run):
                placed.add(ins.device_id)
    d.validate_state()
    assert placed <= {"d1", "d2"}
    # d0, the fastest, is idle but may neither take nor steal them.
    for k in range(12):
        if d.state_of(k) is ItemState.RUNNING:
            d.complete(k)
            d.validate_state()
    assert all(d.records[k].device in (1, 2) for k in range(12))


def test_only_with_unknown_or_no_devices_is_refused() -> None:
    d = dispatcher()
    with pytest.raises(UnknownDevice, match="'gpu9'"):
        d.submit(WorkItem(id="a"), only=["gpu9"])
    with pytest.raises(NoCapableDevice, match="may run on no device"):
        d.submit(WorkItem(id="b"), only=[])
    assert d.active == 0


def test_memory_is_checked_against_the_allowed_devices_only() -> None:
    d = dispatcher()
    with pytest.raises(NoCapableDevice, match="largest device it may use, d0, has 4 GiB"):
        d.submit(WorkItem(memory=8 * GB, id="big"), only=["d0"])


def test_a_retry_budget_per_item_overrides_max_retries() -> None:
    d = dispatcher(max_retries=5)
    (run,) = d.submit(WorkItem(id="x"), retries=0)
    assert isinstance(run, Run)
    out = d.fail("x", "boom")
    assert [type(i) for i in out] == [Finish]
    assert d.state_of("x") is ItemState.FAILED
    with pytest.raises(ConfigError, match="retries"):
        d.submit(WorkItem(id="y"), retries=-1)


def test_service_time_from_the_executor_feeds_the_speed_model() -> None:
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0]), make_policy("round_robin"), clock, slots=[2])
    d.submit(WorkItem(cost=2.0, id="a"))
    d.submit(WorkItem(cost=2.0, id="b"))
    clock.advance(4.0)  # both held for 4 s, but the worker ran "a" alone for 0.5 s
    d.complete("a", service_time=0.5)
    assert d.perf.speed()[0] == pytest.approx(4.0)  # a first measurement is taken as it is
    d.complete("b")  # by default: cost × slots / time held = 2 × 2 / 4
    assert d.perf.speed()[0] == pytest.approx(4.0 + 0.2 * (1.0 - 4.0))


def test_a_timeout_per_item_overrides_the_dispatchers() -> None:
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0]), make_policy("round_robin"), clock, timeout=100.0)
    assert d.submit(WorkItem(id="short"), timeout=0.5)[0] == WakeAt(0.5)
    assert not any(type(i) is WakeAt for i in d.submit(WorkItem(id="default")))  # 100 s: later
    assert d.next_deadline() == 0.5
    clock.advance(0.5)
    out = d.expire()
    assert [(type(i).__name__, getattr(i, "item", i).id) for i in out[:-1]] == [
        ("Stop", "short"),
        ("Finish", "short"),
        ("Run", "default"),
    ]
    assert out[0].cause is out[1].cause is Cause.TIMED_OUT  # type: ignore[union-attr]
    assert out[-1] == WakeAt(100.0)  # the next deadline, announced by expire
    assert d.records["short"].reason == "timed out after 0.5s"


def test_every_way_an_item_ends_carries_its_cause() -> None:
    """Executors map causes to HTTP codes and trace statuses by value, never by the reason's
    words."""
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0, 1.0]), make_policy("round_robin"), clock, max_retries=0)
    d.submit(WorkItem(id="lost"))
    d.submit(WorkItem(id="failed"))
    (stop, finish) = [i for i in d.device_down("d0", "gone") if type(i) is not Run]
    assert (stop.cause, finish.cause) == (Cause.DEVICE_LOST, Cause.DEVICE_LOST)
    (finish,) = d.fail("failed", "RuntimeError: boom")
    assert finish.cause is Cause.FAILED and finish.state is ItemState.FAILED
    d.submit(WorkItem(id="cancelled"))
    assert [i.cause for i in d.cancel("cancelled")] == [Cause.CANCELLED, Cause.CANCELLED]
    d.submit(WorkItem(id="abandoned"))
    assert d.abandon("abandoned", "no device left")[-1].cause is Cause.ABANDONED
    d.submit(WorkItem(id="done"))
    assert d.complete("done")[0].cause is Cause.DONE
    d.validate_state()


def test_memory_held_outside_the_dispatcher_keeps_items_that_need_memory_away() -> None:
    d = dispatcher("round_robin")
    d.set_external_memory("d1", 15 * GB)  # d1 nearly full: 1 of its 16 GiB free
    d.set_external_memory("d2", 15 * GB)
    placed = [i.device_id for i in d.submit(WorkItem(memory=2 * GB, id="a")) if isinstance(i, Run)]
    assert placed == ["d0"]
    assert d.submit(WorkItem(memory=3 * GB, id="b")) == []  # d0 has 2 GiB left: it waits
    out = d.set_external_memory("d2", 0)  # d2 frees its memory: the waiting item goes there
    assert [(i.item.id, i.device_id) for i in out if isinstance(i, Run)] == [("b", "d2")]
    d.validate_state()
    with pytest.raises(ConfigError, match="used"):
        d.set_external_memory("d0", -1)


def test_requeue_places_an_item_again_without_charging_an_attempt() -> None:
    d = dispatcher("round_robin", max_retries=0)
    assert [type(i) for i in d.submit(WorkItem(id="x"))] == [Run]
    out = d.requeue("x", "worker stopped for another item")
    again = [i for i in out if isinstance(i, Run)]
    assert again and d.state_of("x") is ItemState.RUNNING
    assert d.records["x"].failures == 0 and d.records["x"].attempts == 1
    assert not d.records["x"].excluded  # the same device stays eligible
    d.complete("x")
    assert d.state_of("x") is ItemState.DONE
    d.validate_state()


def test_free_items_spread_over_idle_devices_instead_of_all_landing_on_the_first() -> None:
    d = Dispatcher(
        make_devices([1.0, 1.0, 1.0]), make_policy("shortest_expected_delay"), ManualClock()
    )
    d.device_down("d2")
    for k in range(4):
        d.submit(WorkItem(cost=0, id=k))
    placed = [d.view.ids[d.records[k].device] for k in range(4)]
    assert sorted(placed) == ["d0", "d0", "d1", "d1"]  # never the unusable d2
    d.validate_state()


def test_preemption_never_moves_an_item_onto_a_device_going_down() -> None:
    # Found by the dispatcher property: while device_down moved d0's running items one by one,
    # a retried one preempted the other, still listed as running on d0, and took its slot there.
    d = Dispatcher(
        make_devices([0.5, 0.5, 0.5]),
        make_policy("adaptive"),
        ManualClock(),
        slots=[2] * 3,
        preemption=True,
        stealing=False,
    )
    d.device_down("d1")
    for k, priority in enumerate([1, 1, 0, 0, 0]):
        d.submit(WorkItem(cost=1.0, priority=priority, id=k))
    out = d.device_down("d0")
    assert not [i for i in out if isinstance(i, Run) and i.device_id == "d0"]
    d.validate_state()


def test_a_timeout_no_timer_can_wait_is_refused_naming_it() -> None:
    for bad in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ConfigError, match="timeout: must be finite seconds > 0 or None"):
            Dispatcher(make_devices([1.0]), make_policy("round_robin"), ManualClock(), timeout=bad)
