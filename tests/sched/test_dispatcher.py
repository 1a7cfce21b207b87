from __future__ import annotations

import numpy as np
import pytest

from hetero.errors import ConfigError, InvalidTransition, QueueFull
from hetero.sched import (
    Dispatcher,
    Finish,
    FleetView,
    ItemState,
    ManualClock,
    Policy,
    Rejected,
    Run,
    Stop,
    WakeAt,
    WorkItem,
)
from hetero.sched.policy import BoolArray, masked_argmin
from tests.fleets import make_devices
from tests.sched.policies import Always


class Fastest(Policy):
    """Shortest expected delay, written out here so these tests do not depend on the library's."""

    name = "test_sed"

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        return masked_argmin(view.expected_delay(item.kind, item.cost), allowed)


class Never(Policy):
    name = "test_never"

    def __init__(self, reject: bool = False) -> None:
        self.reject = reject

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        if self.reject:
            raise Rejected(f"item needs {item.memory} bytes")
        return None


def log(out: list) -> list[tuple]:
    rows = []
    for ins in out:
        if isinstance(ins, Run):
            rows.append(("run", ins.item.id, ins.device_id))
        elif isinstance(ins, Stop):
            rows.append(("stop", ins.item.id, ins.device))
        elif isinstance(ins, Finish):
            rows.append((ins.state.value, ins.item.id, ins.reason))
        else:
            assert isinstance(ins, WakeAt)  # when to call expire: not an item's event
    return rows


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def make(clock: ManualClock, policy: Policy | None = None, speeds=(2.5, 1.0), **kw) -> Dispatcher:
    d = Dispatcher(make_devices(list(speeds)), policy or Fastest(), clock, **kw)
    return d


def test_exact_log_of_a_small_run(clock: ManualClock) -> None:
    d = make(clock, stealing=False)
    got = []
    got += log(d.submit(WorkItem(cost=2.5, id="a")))  # fast device: 1 s
    got += log(d.submit(WorkItem(cost=1.0, id="b")))  # fast busy (2 s) vs slow (1 s): slow
    got += log(d.submit(WorkItem(cost=2.5, id="c")))  # fast (2 s) vs slow (3.5 s): queue on fast
    clock.advance(1.0)
    got += log(d.complete("a"))
    got += log(d.complete("b"))
    clock.advance(1.0)
    got += log(d.complete("c"))
    assert got == [
        ("run", "a", "d0"),
        ("run", "b", "d1"),
        ("done", "a", ""),
        ("run", "c", "d0"),
        ("done", "b", ""),
        ("done", "c", ""),
    ]
    assert [s.value for s in d.records["c"].history] == ["pending", "queued", "running", "done"]
    d.validate_state()
    report = d.metrics.report(d.view)
    assert report.completed == 3
    assert report.devices[0].completed == 2


def test_queue_full_is_backpressure_not_loss(clock: ManualClock) -> None:
    d = make(clock, Always(0), max_queue_size=2, stealing=False)
    d.submit(WorkItem(id=1))  # runs, so not waiting
    d.submit(WorkItem(id=2))
    d.submit(WorkItem(id=3))
    with pytest.raises(QueueFull, match="max_queue_size=2"):
        d.submit(WorkItem(id=4))
    assert 4 not in d.records
    clock.advance(1)
    d.complete(1)
    d.submit(WorkItem(id=4))
    d.validate_state()


def test_duplicate_live_id_is_refused(clock: ManualClock) -> None:
    d = make(clock)
    d.submit(WorkItem(id="x"))
    with pytest.raises(ValueError, match="already in flight"):
        d.submit(WorkItem(id="x"))


def test_timeout_fails_queued_and_running_items(clock: ManualClock) -> None:
    d = make(clock, Always(0), timeout=5.0, stealing=False)
    d.submit(WorkItem(id="run"))
    d.submit(WorkItem(id="wait"))
    d.submit(WorkItem(id="own", deadline=2.0))
    assert d.next_deadline() == 2.0
    clock.set(2.0)
    assert log(d.expire()) == [("failed", "own", "timed out after 2s")]
    clock.set(5.0)
    assert log(d.expire()) == [
        ("stop", "run", 0),
        ("failed", "run", "timed out after 5s"),
        ("failed", "wait", "timed out after 5s"),
    ]
    assert d.state_of("wait") is ItemState.FAILED
    assert d.next_deadline() is None
    d.validate_state()


def test_failed_attempt_retries_on_another_device(clock: ManualClock) -> None:
    d = make(clock, Always(0), max_retries=1)
    assert log(d.submit(WorkItem(id="x"))) == [("run", "x", "d0")]
    assert log(d.fail("x", "CUDA error")) == [("run", "x", "d1")]
    assert d.state_of("x") is ItemState.RUNNING
    assert log(d.fail("x", "CUDA error")) == [("failed", "x", "CUDA error after 2 attempts")]
    hist = [s.value for s in d.records["x"].history]
    assert hist == ["pending", "queued", "running", "retrying", "queued", "running", "failed"]
    d.validate_state()


def test_non_retryable_failure_ends_at_once(clock: ManualClock) -> None:
    d = make(clock)
    d.submit(WorkItem(id="x"))
    assert log(d.fail("x", "bad input", retryable=False)) == [("failed", "x", "bad input")]


def test_device_down_moves_its_work_and_gets_nothing_more(clock: ManualClock) -> None:
    d = make(clock, speeds=(2.5, 1.0, 1.0), stealing=False)
    for i in range(3):
        d.submit(WorkItem(id=i, cost=2.5))
    assert d.records[0].device == 0
    out = log(d.device_down("d0", "NVML: GPU fell off the bus"))
    assert out[0] == ("stop", 0, 0)
    assert all(r[0] != "failed" for r in out)
    assert d.records[0].state in (ItemState.QUEUED, ItemState.RUNNING)
    assert d.records[0].device != 0
    for i in range(3, 10):
        d.submit(WorkItem(id=i))
        assert d.records[i].device != 0
    d.validate_state()
    d.device_up("d0")
    d.validate_state()


def test_preemption_requeues_the_victim_and_loses_nothing(clock: ManualClock) -> None:
    d = make(clock, speeds=(1.0,), preemption=True)
    d.submit(WorkItem(id="low", priority=0, cost=10))
    clock.advance(1)
    out = log(d.submit(WorkItem(id="high", priority=5, cost=1)))
    assert out == [("stop", "low", 0), ("run", "high", "d0")]
    assert d.state_of("low") is ItemState.QUEUED
    clock.advance(1)
    assert log(d.complete("high")) == [("done", "high", ""), ("run", "low", "d0")]
    clock.advance(10)
    assert log(d.complete("low")) == [("done", "low", "")]
    hist = [s.value for s in d.records["low"].history]
    assert hist == ["pending", "queued", "running", "preempted", "queued", "running", "done"]
    d.validate_state()


def test_no_preemption_of_equal_priority_or_when_disabled(clock: ManualClock) -> None:
    d = make(clock, speeds=(1.0,), preemption=True)
    d.submit(WorkItem(id="a", priority=1))
    assert log(d.submit(WorkItem(id="b", priority=1))) == []
    off = make(ManualClock(), speeds=(1.0,), preemption=False)
    off.submit(WorkItem(id="a", priority=0))
    assert log(off.submit(WorkItem(id="b", priority=9))) == []


def test_idle_device_steals_queued_work(clock: ManualClock) -> None:
    d = make(clock, Always(1), speeds=(2.5, 1.0))
    d.submit(WorkItem(id="a", cost=1))
    out = log(d.submit(WorkItem(id="b", cost=1)))  # queued behind a on the slow d1
    assert out == [("run", "b", "d0")]
    assert [s.value for s in d.records["b"].history] == ["pending", "queued", "queued", "running"]
    d.validate_state()


def test_no_steal_when_it_would_not_finish_sooner(clock: ManualClock) -> None:
    d = make(clock, Always(0), speeds=(10.0, 1.0))
    d.submit(WorkItem(id="a", cost=1))
    assert log(d.submit(WorkItem(id="b", cost=1))) == []  # 0.2 s on d0 beats 1 s on d1


def test_waiting_items_run_in_priority_order(clock: ManualClock) -> None:
    d = make(clock, Always(0), speeds=(1.0,))
    d.submit(WorkItem(id="first"))
    for name, prio in [("lo", 0), ("hi", 3), ("mid", 1)]:
        d.submit(WorkItem(id=name, priority=prio))
    order = []
    for _ in range(4):
        clock.advance(1)
        running = next(r for r in d.records.values() if r.state is ItemState.RUNNING)
        order += [r[1] for r in log(d.complete(running.item.id)) if r[0] == "run"]
    assert order == ["hi", "mid", "lo"]


def test_policy_that_waits_keeps_items_pending_then_places_them(clock: ManualClock) -> None:
    policy = Always(0)
    d = make(clock, policy, speeds=(1.0,))
    d.device_down("d0")
    assert log(d.submit(WorkItem(id="x"))) == []
    assert d.state_of("x") is ItemState.PENDING
    assert log(d.device_up("d0")) == [("run", "x", "d0")]
    d.validate_state()


def test_rejection_fails_with_the_policy_reason(clock: ManualClock) -> None:
    d = make(clock, Never(reject=True))
    assert log(d.submit(WorkItem(id="x", memory=99))) == [("failed", "x", "item needs 99 bytes")]
    d.validate_state()


def test_cancel_anywhere(clock: ManualClock) -> None:
    d = make(clock, Always(0), speeds=(1.0,), stealing=False)
    d.submit(WorkItem(id="r"))
    d.submit(WorkItem(id="q"))
    assert log(d.cancel("q")) == [("cancelled", "q", "cancelled")]
    assert log(d.cancel("r", "user asked")) == [("stop", "r", 0), ("cancelled", "r", "user asked")]
    assert d.cancel("r") == []
    d.validate_state()


def test_invalid_transition_carries_history(clock: ManualClock) -> None:
    d = make(clock)
    d.submit(WorkItem(id="x"))
    rec = d.records["x"]
    with pytest.raises(InvalidTransition, match="running -> pending") as info:
        rec.move(ItemState.PENDING)
    assert info.value.history == ["pending", "queued", "running"]
    with pytest.raises(ValueError, match="not running"):
        d.submit(WorkItem(id="y"))
        d.cancel("y")
        d.complete("y")


def test_slots_run_items_concurrently(clock: ManualClock) -> None:
    d = Dispatcher(make_devices([1.0]), Fastest(), clock, slots=[2])
    assert len(d.submit(WorkItem(id=1))) == 1
    assert len(d.submit(WorkItem(id=2))) == 1
    assert d.submit(WorkItem(id=3)) == []
    assert int(d.view.running[0]) == 2
    np.testing.assert_array_equal(d.view.in_flight, [3])
    d.validate_state()


def test_perf_model_learns_from_completions(clock: ManualClock) -> None:
    d = make(clock, Always(0), speeds=(2.0, 1.0))
    for i in range(30):
        d.submit(WorkItem(id=i, cost=1.0))
        clock.advance(1.0)  # really 1 unit/s, not 2
        d.complete(i)
    assert d.perf.speed()[0] == pytest.approx(1.0, rel=0.01)


def test_from_config() -> None:
    from hetero import parse_config

    config = parse_config(
        {
            "devices": [
                {"type": "gpu", "model": "A100-80GB", "emulate": True, "count": 2},
                {"type": "gpu", "model": "T4", "emulate": True},
            ],
            "scheduler": {
                "strategy": "weighted",
                "options": {"variant": "random", "seed": 1},
                "max_queue_size": 7,
                "timeout": 3.0,
                "max_retries": 0,
                "preemption": True,
                "stealing": False,
                "batch_sizes": {"T4": 4},
            },
        }
    )
    clock = ManualClock()
    d = Dispatcher.from_config(config, clock=clock)
    assert d.view.ids == ["a100-80gb:0", "a100-80gb:1", "t4:0"]
    assert (d.policy.name, d.max_queue_size, d.timeout, d.max_retries) == ("weighted", 7, 3.0, 0)
    assert d.preemption and not d.stealing
    assert d.perf.batch_sizes(100)[2] == 4
    wake, run = d.submit(WorkItem(id=1))
    assert wake == WakeAt(3.0)  # its timeout's deadline
    assert run.device_id.startswith(("a100", "t4"))  # type: ignore[union-attr]


def test_complete_learns_from_the_work_an_item_turned_out_to_be() -> None:
    # An LLM request costed at its max_tokens (100) stops after 25 tokens: the device did 25
    # units in 1 s, so its speed (1.0 by the catalog) must move towards 25, not 100.
    clock = ManualClock()
    d = Dispatcher(make_devices([1.0]), Fastest(), clock)
    d.perf.alpha = 1.0  # take the last observation as it is
    d.submit(WorkItem(cost=100.0, id="short"))
    clock.advance(1.0)
    d.complete("short", work=25.0)
    assert d.perf.speed()[0] == pytest.approx(25.0)
    d.submit(WorkItem(cost=100.0, id="refused"))
    clock.advance(0.001)
    d.complete("refused", work=0.0)  # no work done: nothing learned
    assert d.perf.speed()[0] == pytest.approx(25.0)
    assert d.state_of("refused") is ItemState.DONE


class OnlyWhenIdle(Policy):
    """Device 0 while it runs nothing, else wait: a policy that holds items back."""

    name = "test_only_when_idle"

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        return 0 if view.running[0] == 0 else None


@pytest.mark.parametrize("late_after", [None, 1.0])
def test_an_item_waiting_past_late_after_goes_behind_those_that_are_not(
    clock: ManualClock, late_after: float | None
) -> None:
    d = make(clock, OnlyWhenIdle(), speeds=(1.0,), late_after=late_after)
    assert log(d.submit(WorkItem(id="busy"))) == [("run", "busy", "d0")]
    d.submit(WorkItem(id="old"))
    clock.advance(2.0)  # "old" has waited past late_after
    d.submit(WorkItem(id="fresh"))
    clock.advance(0.5)
    first = log(d.complete("busy"))
    expected = "old" if late_after is None else "fresh"
    assert first[-1] == ("run", expected, "d0")
    second = log(d.complete(expected))
    assert second[-1][:2] == ("run", "fresh" if late_after is None else "old")
    d.complete(second[-1][1])
    d.validate_state()
    assert d.active == 0 and d.waiting == 0


def test_late_after_is_checked(clock: ManualClock) -> None:
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="late_after"):
            make(clock, late_after=bad)
