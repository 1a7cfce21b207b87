"""The one instruction loop (``Driver``) and the dispatcher's ending of stranded items, as pure
code on a manual clock."""

from __future__ import annotations

from hetero.sched import (
    Cause,
    Dispatcher,
    Finish,
    Instruction,
    ItemState,
    ManualClock,
    Run,
    Stop,
    WorkItem,
    make_policy,
)
from hetero.sched.driver import Driver
from hetero.sched.health import Hold
from tests.fleets import make_devices


class Recorder(Driver):
    """Carries out nothing; records what it was told, and stops on a Stop's device free up."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        super().__init__(dispatcher)
        self.seen: list[tuple[str, object]] = []
        self.armed: list[float] = []

    def on_run(self, ins: Run) -> None:
        self.seen.append(("run", ins.item.id))

    def on_stop(self, ins: Stop) -> list[Instruction]:
        self.seen.append(("stop", ins.item.id))
        return []

    def on_finish(self, ins: Finish) -> None:
        self.seen.append((ins.state.value, ins.item.id))

    def arm_timer(self, at: float) -> None:
        self.armed.append(at)


def make(clock: ManualClock, speeds: tuple[float, ...] = (1.0,), **options: object) -> Recorder:
    policy = make_policy("shortest_expected_delay")
    return Recorder(Dispatcher(make_devices(speeds), policy, clock, **options))  # type: ignore[arg-type]


def test_the_timer_is_armed_only_when_the_earliest_deadline_moves_earlier() -> None:
    clock = ManualClock()
    driver = make(clock)
    d = driver.dispatcher
    driver.apply(d.submit(WorkItem(cost=1.0, id="a"), timeout=10.0))
    driver.apply(d.submit(WorkItem(cost=1.0, id="b"), timeout=20.0))  # later: no new timer
    driver.apply(d.submit(WorkItem(cost=1.0, id="c"), timeout=5.0))  # earlier: armed again
    assert driver.armed == [10.0, 5.0]
    assert driver.wake_at == 5.0


def test_expire_ends_what_is_due_and_arms_the_next_deadline() -> None:
    clock = ManualClock()
    driver = make(clock)
    d = driver.dispatcher
    driver.apply(d.submit(WorkItem(cost=100.0, id="a"), timeout=5.0))  # runs, times out
    driver.apply(d.submit(WorkItem(cost=1.0, id="b"), timeout=50.0))  # waits behind it
    clock.set(5.0)
    driver.expire()
    assert ("stop", "a") in driver.seen and ("failed", "a") in driver.seen
    assert ("run", "b") in driver.seen  # the slot the timeout freed is filled at once
    assert driver.armed[-1] == 50.0 and driver.wake_at == 50.0
    assert d.records["a"].state is ItemState.FAILED


def test_instructions_are_carried_out_in_order_with_what_follows_after() -> None:
    clock = ManualClock()
    d = Dispatcher(make_devices((1.0,)), make_policy("shortest_expected_delay"), clock)
    seen: list[str] = []

    class FollowUp(Recorder):
        def on_stop(self, ins: Stop) -> list[Instruction]:
            seen.append(f"stop {ins.item.id}")
            return [Finish(WorkItem(id="follow"), ItemState.CANCELLED, "", Cause.CANCELLED)]

        def on_finish(self, ins: Finish) -> None:
            seen.append(f"finish {ins.item.id}")

    item = WorkItem(id="x")
    FollowUp(d).apply(
        [
            Stop(item, 0, "why", Cause.CANCELLED),
            Finish(item, ItemState.CANCELLED, "why", Cause.CANCELLED),
        ]
    )
    # The batch first, in the dispatcher's order, then what it led to.
    assert seen == ["stop x", "finish x", "finish follow"]


def test_items_no_device_may_run_again_are_abandoned_with_the_reason() -> None:
    clock = ManualClock()
    driver = make(clock, speeds=(1.0, 1.0))
    d = driver.dispatcher
    for name in ("a", "b", "c"):
        driver.apply(d.submit(WorkItem(cost=1.0, id=name), only=["d0"]))
    driver.apply(d.submit(WorkItem(cost=1.0, id="free")))
    driver.apply(d.device_down("d0"))
    # Down is not gone: without down_is_final nothing is stranded.
    assert d.abandon_stranded("never") == []
    out = d.abandon_stranded("no device left", down_is_final=True)
    driver.apply(out)
    ended = {ins.item.id: ins for ins in out if isinstance(ins, Finish)}
    assert set(ended) == {"a", "b", "c"}
    assert all(f.cause is Cause.ABANDONED and f.reason == "no device left" for f in ended.values())
    assert d.records["free"].state is not ItemState.FAILED
    d.validate_state()


def test_removing_the_last_device_an_item_may_use_ends_it_at_once() -> None:
    clock = ManualClock()
    driver = make(clock, speeds=(1.0, 1.0))
    d = driver.dispatcher
    driver.apply(d.submit(WorkItem(cost=1.0, id="a"), only=["d1"]))
    driver.apply(d.submit(WorkItem(cost=1.0, id="b"), only=["d1"]))  # queued behind a
    driver.apply(d.submit(WorkItem(cost=1.0, id="c")))
    out = d.remove_device("d1")
    ended = [(ins.item.id, ins.cause) for ins in out if isinstance(ins, Finish)]
    assert ended == [("a", Cause.ABANDONED), ("b", Cause.ABANDONED)]
    assert "no device it may use is left" in d.records["a"].reason
    assert d.records["c"].state is not ItemState.FAILED
    d.validate_state()


# --- holds: why a device takes no new work ------------------------------------------------------


def test_holds_add_up_and_the_device_takes_work_once_the_last_is_released() -> None:
    clock = ManualClock()
    driver = make(clock, speeds=(4.0, 1.0))
    d = driver.dispatcher
    driver.apply(d.hold("d0", Hold.GRAY))
    driver.apply(d.hold("d0", Hold.SATURATED))
    driver.apply(d.submit(WorkItem(cost=1.0, id="a")))
    assert d.records["a"].device == 1  # the fast device is held
    driver.apply(d.release("d0", Hold.GRAY))
    assert d.holds("d0") == {Hold.SATURATED} and not d.view.usable[0]
    driver.apply(d.release("d0", Hold.SATURATED))
    assert d.holds("d0") == frozenset() and d.view.usable[0]
    d.validate_state()


def test_a_held_device_finishes_what_it_runs_and_a_down_one_stays_down_when_released() -> None:
    clock = ManualClock()
    driver = make(clock, speeds=(1.0, 1.0))
    d = driver.dispatcher
    driver.apply(d.submit(WorkItem(cost=1.0, id="a"), only=["d0"]))
    driver.apply(d.hold("d0", Hold.CIRCUIT_OPEN))
    assert d.records["a"].state is ItemState.RUNNING  # held, not stopped
    clock.set(1.0)
    driver.apply(d.complete("a"))
    driver.apply(d.device_down("d0"))
    driver.apply(d.release("d0", Hold.CIRCUIT_OPEN))
    assert d.is_down("d0") and not d.view.usable[0]  # released, but still down
    driver.apply(d.device_up("d0"))
    assert d.view.usable[0] and d.holds("d0") == frozenset()
    d.validate_state()


def test_removal_is_a_hold_that_release_does_not_end() -> None:
    clock = ManualClock()
    driver = make(clock, speeds=(1.0, 1.0))
    d = driver.dispatcher
    driver.apply(d.remove_device("d1"))
    assert Hold.REMOVED in d.holds("d1")
    assert d.release("d1", Hold.REMOVED) == [] and not d.view.usable[1]
    d.validate_state()
