"""The autoscaler's policy, pure: a fake clock (the times passed to ``decide``) and a fleet that
follows its actions (``SimFleet``), no sleeping, no I/O."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero.serve.autoscale as autoscale
from hetero.errors import ConfigError
from hetero.serve.autoscale.policy import (
    LONGEST_WAIT,
    Action,
    Member,
    PolicyOptions,
    ReplicaType,
    ScalePolicy,
    Traffic,
    TypeFleet,
)

TICK = 5.0
LOW = Traffic(rate=1.0)


@dataclass
class SimFleet:
    """Replicas that do what the policy says: a start is warm ``startup`` seconds later, a
    drained replica is gone ``drain_s`` seconds after its drain."""

    types: list[str]
    startup: float = 0.0
    drain_s: float = 0.0
    starting: dict[str, list[Member]] = field(default_factory=dict)
    warm: dict[str, list[Member]] = field(default_factory=dict)
    draining: dict[str, list[Member]] = field(default_factory=dict)
    ids: int = 0

    def __post_init__(self) -> None:
        for name in self.types:
            self.starting.setdefault(name, [])
            self.warm.setdefault(name, [])
            self.draining.setdefault(name, [])

    def add_warm(self, name: str, n: int = 1, since: float = 0.0, load: int = 0) -> None:
        for _ in range(n):
            self.ids += 1
            self.warm[name].append(Member(f"{name}-{self.ids}", since, load))

    def advance(self, now: float) -> None:
        for name in self.types:
            ready = [m for m in self.starting[name] if now - m.since >= self.startup]
            self.starting[name] = [m for m in self.starting[name] if m not in ready]
            self.warm[name] += [Member(m.id, now) for m in ready]
            self.draining[name] = [m for m in self.draining[name] if now - m.since < self.drain_s]

    def apply(self, now: float, actions: list[Action]) -> None:
        for a in actions:
            if a.kind == "start":
                for _ in range(a.count):
                    self.ids += 1
                    self.starting[a.type_name].append(Member(f"{a.type_name}-{self.ids}", now))
            else:
                (victim,) = [m for m in self.warm[a.type_name] if m.id == a.replica]
                self.warm[a.type_name].remove(victim)
                self.draining[a.type_name].append(Member(victim.id, now))
        self.advance(now)

    def view(self) -> dict[str, TypeFleet]:
        return {
            n: TypeFleet(tuple(self.starting[n]), tuple(self.warm[n]), tuple(self.draining[n]))
            for n in self.types
        }

    def count(self, name: str) -> int:
        return len(self.starting[name]) + len(self.warm[name]) + len(self.draining[name])


class Target:
    """A sizer whose answer the test sets."""

    def __init__(self, **wanted: int) -> None:
        self.wanted = wanted

    def __call__(self, traffic: Traffic) -> Mapping[str, int]:
        return self.wanted


def one_type(
    max_count: int = 5, min_count: int = 0, **options: float
) -> tuple[ScalePolicy, Target]:
    sizer = Target(a=1)
    policy = ScalePolicy(
        [ReplicaType("a", startup_s=30, max_count=max_count, min_count=min_count)],
        sizer,
        PolicyOptions(**options),  # type: ignore[arg-type]
    )
    return policy, sizer


def run(
    policy: ScalePolicy, fleet: SimFleet, start: float, end: float, step: float = TICK
) -> list[Action]:
    """Tick from ``start`` to ``end`` (inclusive), the fleet following; every action."""
    done: list[Action] = []
    now = start
    while now <= end:
        actions = policy.decide(now, LOW, fleet.view())
        fleet.apply(now, actions)
        done += actions
        now += step
    return done


# ---------------------------------------------------------------------- up


def test_a_sustained_need_starts_replicas_after_up_after() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"], startup=100)
    fleet.add_warm("a")
    sizer.wanted = {"a": 3}
    assert run(policy, fleet, 0, 10) == []
    (start,) = run(policy, fleet, 15, 15)
    assert (start.kind, start.type_name, start.count, start.at) == ("start", "a", 2, 15)
    assert start.reason == "target 3 > 1 (warm 1, starting 0) for 15 s at 1.0 req/s"
    # The two still starting count: the need is met, nothing more starts while they warm up.
    assert run(policy, fleet, 20, 120) == []
    assert len(fleet.warm["a"]) == 3


def test_a_blip_shorter_than_up_after_starts_nothing() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"])
    fleet.add_warm("a")
    for now, wanted in [(0, 4), (5, 4), (10, 4), (15, 1), (20, 4), (25, 4), (30, 1)]:
        sizer.wanted = {"a": wanted}
        assert policy.decide(now, LOW, fleet.view()) == []


def test_the_start_covers_the_highest_target_of_the_up_window() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"], startup=100)
    fleet.add_warm("a")
    for now, wanted in [(0, 2), (5, 4), (10, 3)]:
        sizer.wanted = {"a": wanted}
        fleet.apply(now, policy.decide(now, LOW, fleet.view()))
    sizer.wanted = {"a": 2}
    (start,) = policy.decide(15, LOW, fleet.view())
    assert start.count == 3  # 4 at its peak, one warm


def test_replicas_still_starting_count_as_capacity() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"], startup=10_000)
    fleet.add_warm("a")
    fleet.starting["a"].append(Member("slow", since=-500))  # far slower than expected
    sizer.wanted = {"a": 2}
    assert run(policy, fleet, 0, 60) == []
    fleet = SimFleet(["a"], startup=10_000)
    fleet.add_warm("a")
    fleet.starting["a"].append(Member("slow", since=0))
    sizer.wanted = {"a": 3}
    actions = run(policy, fleet, 100, 200)
    assert [(a.kind, a.count) for a in actions] == [("start", 1)]
    assert "(warm 1, starting 1)" in actions[0].reason


def test_min_count_is_kept_at_once_without_hysteresis() -> None:
    policy, sizer = one_type(min_count=2)
    sizer.wanted = {"a": 0}
    fleet = SimFleet(["a"], startup=1000)
    (start,) = policy.decide(0, LOW, fleet.view())
    assert (start.count, start.reason) == (2, "0 < min_count 2")


# ---------------------------------------------------------------------- down


def test_scale_down_waits_for_down_after_of_quiet_then_drains_one_at_a_time() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"], drain_s=30)
    fleet.add_warm("a", 3)
    sizer.wanted = {"a": 1}
    assert run(policy, fleet, 0, 295) == []
    (first,) = run(policy, fleet, 300, 300)
    assert first.kind == "drain" and first.at == 300
    assert first.reason.startswith("target 1 < 3 (warm 3, starting 0) for 300 s at 1.0 req/s")
    # The next waits out the cooldown after the first.
    assert run(policy, fleet, 305, 415) == []
    (second,) = run(policy, fleet, 420, 420)
    assert second.kind == "drain"
    assert run(policy, fleet, 425, 3000) == []
    assert len(fleet.warm["a"]) == 1


def test_a_brief_spike_in_the_down_window_keeps_the_capacity() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 3)
    sizer.wanted = {"a": 1}
    run(policy, fleet, 0, 195)
    sizer.wanted = {"a": 3}  # one tick at the capacity: the quiet starts again after it
    run(policy, fleet, 200, 200)
    sizer.wanted = {"a": 1}
    assert run(policy, fleet, 205, 500) == []
    (drain,) = run(policy, fleet, 505, 505)
    assert drain.kind == "drain"


def test_scale_down_judges_by_the_highest_target_of_the_down_window() -> None:
    policy, sizer = one_type()
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 4)
    sizer.wanted = {"a": 1}
    run(policy, fleet, 0, 245)
    sizer.wanted = {"a": 3}  # below the 4 there are: the quiet goes on
    run(policy, fleet, 250, 250)
    sizer.wanted = {"a": 1}
    assert [a.kind for a in run(policy, fleet, 255, 300)] == ["drain"]
    # With 3 left, the 3 of t=250 is not below them: no second drain until it leaves the
    # window, though the cooldown is over at 420.
    assert run(policy, fleet, 305, 550) == []
    (second,) = run(policy, fleet, 555, 555)
    assert second.kind == "drain" and second.reason.startswith("target 1 < 3")


def test_the_drained_replica_is_the_least_loaded_then_the_newest() -> None:
    policy, sizer = one_type(down_after=0, cooldown=0)
    sizer.wanted = {"a": 0}
    fleet = SimFleet(["a"])
    fleet.warm["a"] += [Member("old", 0, load=1), Member("new", 50, load=1), Member("busy", 60, 9)]
    (drain,) = policy.decide(100, LOW, fleet.view())
    assert drain.replica == "new"
    assert drain.reason.endswith("new has 1 in flight")


def test_the_last_warm_replica_of_the_fleet_is_never_drained() -> None:
    sizer = Target(a=0, b=0)
    types = [ReplicaType("a", 10, 3), ReplicaType("b", 10, 3)]
    policy = ScalePolicy(types, sizer, PolicyOptions(down_after=0, cooldown=0))
    fleet = SimFleet(["a", "b"], drain_s=1)
    fleet.add_warm("a")
    fleet.add_warm("b")
    actions = run(policy, fleet, 0, 7200)
    assert [a.kind for a in actions] == ["drain"]  # one of the two, in the first tick
    assert len(fleet.warm["a"]) + len(fleet.warm["b"]) == 1
    assert policy.status(7200)["b"]["held"] == "the last warm replica of the fleet"


def test_min_count_holds_against_scale_down() -> None:
    policy, sizer = one_type(min_count=2, down_after=0, cooldown=0)
    sizer.wanted = {"a": 0}
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 4)
    run(policy, fleet, 0, 7200)
    assert len(fleet.warm["a"]) == 2


def test_drains_wait_while_the_hour_holds_max_actions_and_starts_never_wait() -> None:
    policy, sizer = one_type(max_count=20, down_after=0, cooldown=0, max_actions_per_hour=3)
    sizer.wanted = {"a": 1}
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 10)
    drains = run(policy, fleet, 0, 3595, step=60)
    assert len(drains) == 2  # the third action of the hour is kept for a start
    assert policy.status(3595)["a"]["held"] == "2 actions in the last hour (max_actions_per_hour)"
    assert len(run(policy, fleet, 3600, 3600)) == 1  # the first drain is an hour old
    # Starts count too: after two starts, no drain fits in the hour.
    policy, sizer = one_type(
        max_count=20, up_after=0, down_after=0, cooldown=0, max_actions_per_hour=3
    )
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 4)
    sizer.wanted = {"a": 5}
    assert [a.kind for a in run(policy, fleet, 0, 0)] == ["start"]
    sizer.wanted = {"a": 6}
    assert [a.kind for a in run(policy, fleet, 60, 60)] == ["start"]
    sizer.wanted = {"a": 1}
    assert run(policy, fleet, 120, 3595, step=60) == []
    assert [a.kind for a in run(policy, fleet, 3600, 3600)] == ["drain"]
    policy, sizer = one_type(max_count=20, up_after=0, max_actions_per_hour=2)
    fleet = SimFleet(["a"])
    starts = []
    for i in range(1, 5):
        sizer.wanted = {"a": i}
        starts += run(policy, fleet, i, i)
    assert [a.count for a in starts] == [1, 1, 1, 1]
    assert "3 starts in the last hour, over max_actions_per_hour 2" in starts[2].reason


def test_a_need_right_after_a_drain_waits_out_the_cooldown() -> None:
    policy, sizer = one_type(down_after=0, up_after=15)
    sizer.wanted = {"a": 1}
    fleet = SimFleet(["a"], drain_s=1000)
    fleet.add_warm("a", 2)
    assert [a.kind for a in run(policy, fleet, 0, 0)] == ["drain"]
    sizer.wanted = {"a": 2}
    assert run(policy, fleet, 5, 115) == []
    assert policy.status(115)["a"]["held"] == "drained 115 s ago (cooldown 120 s)"
    (start,) = run(policy, fleet, 120, 120)
    assert start.kind == "start"


def undone_drains(
    policy: ScalePolicy, sizer: Target, fleet: SimFleet, rounds: int
) -> tuple[list[float], float]:
    """``rounds`` times: type a is quiet until it drains one of its two replicas, then the need
    comes back past the cooldown and a start undoes the drain. Returns the wait before each
    drain and the time after."""
    now, waits = 0.0, []
    for _ in range(rounds):
        sizer.wanted = {"a": 1}  # quiet until it drains one
        quiet_from = now
        while not (done := policy.decide(now, LOW, fleet.view())):
            fleet.apply(now, done)
            now += TICK
        fleet.apply(now, done)
        assert [a.kind for a in done] == ["drain"]
        waits.append(now - quiet_from)
        now += 150  # the need comes back past the cooldown: a start undoes the drain
        sizer.wanted = {"a": 2}
        started = run(policy, fleet, now, now + 20)
        assert [a.kind for a in started] == ["start"]
        now += 20 + TICK
        fleet.advance(now + 30)  # the start is warm
        now += 30
    return waits, now


def test_a_drain_the_need_undoes_doubles_the_wait_before_the_next_and_a_lasting_one_halves_it() -> (
    None
):
    """Near the boundary between two fleet sizes the target flickers: each drain that a start
    undoes soon after makes the next drain wait twice as long, up to max_down_after."""
    policy, sizer = one_type(
        up_after=15, down_after=300, cooldown=120, max_down_after=1200, max_actions_per_hour=20
    )
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 2)
    waits, now = undone_drains(policy, sizer, fleet, 4)
    assert waits == [300, 600, 1200, 1200]
    assert policy.status(now)["a"]["down_after_s"] == 1200
    # A start long after the last drain undoes nothing: the wait halves back.
    sizer.wanted = {"a": 1}
    assert [a.kind for a in run(policy, fleet, now, now + 1200)] == ["drain"]
    sizer.wanted = {"a": 3}
    later = now + 1200 + 3 * 1200
    assert [a.kind for a in run(policy, fleet, later, later + 20)] == ["start"]
    assert policy.status(later)["a"]["down_after_s"] == 600


def test_by_default_the_wait_grows_to_forty_minutes_at_most() -> None:
    """An hour's wait held replicas the day no longer needed; 40 minutes (LONGEST_WAIT) is the
    default cap, or down_after where that is longer."""
    policy, sizer = one_type(up_after=15, down_after=300, cooldown=120, max_actions_per_hour=20)
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 2)
    waits, _ = undone_drains(policy, sizer, fleet, 5)
    assert waits == [300, 600, 1200, 2400, LONGEST_WAIT]
    assert PolicyOptions(down_after=3000).longest_down_after == 3000


def undo_two_drains(policy: ScalePolicy, sizer: Target, fleet: SimFleet) -> float:
    """Drain one of type a's two replicas and start it again soon after, twice: its wait
    before a drain is then four times down_after (300 s -> 1,200). Returns the time after."""
    now = 0.0
    for _ in range(2):
        sizer.wanted = {**sizer.wanted, "a": 1}
        while not (done := policy.decide(now, LOW, fleet.view())):
            now += TICK
        fleet.apply(now, done)
        now += 150
        sizer.wanted = {**sizer.wanted, "a": 2}
        assert [a.kind for a in run(policy, fleet, now, now + 20)] == ["start"]
        now += 20 + TICK
        fleet.advance(now + 30)
        now += 30
    assert policy.status(now)["a"]["down_after_s"] == 1200
    return now


def test_a_target_two_or_more_below_drains_after_down_after_whatever_the_longer_wait() -> None:
    """The longer wait is for a target flickering between this size and the next: after a
    burst, a fleet two or more above its target drains after down_after, down to one above
    the target, and the last step waits the type's longer wait."""
    policy, sizer = one_type(
        up_after=15, down_after=300, cooldown=120, max_down_after=1200, max_actions_per_hour=20
    )
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 2)
    now = undo_two_drains(policy, sizer, fleet)
    sizer.wanted = {"a": 5}  # a burst: three more
    assert [a.count for a in run(policy, fleet, now, now + 20)] == [3]
    now += 20 + TICK
    fleet.advance(now + 30)
    now += 30
    assert len(fleet.warm["a"]) == 5
    sizer.wanted = {"a": 1}  # it is over
    quiet_from, drains = now, []
    while len(fleet.warm["a"]) > 2:
        done = policy.decide(now, LOW, fleet.view())
        fleet.apply(now, done)
        drains += [now - quiet_from for a in done if a.kind == "drain"]
        now += TICK
    assert drains == [300, 420, 540]  # down_after, then a cooldown apart: 5 -> 4 -> 3 -> 2
    while not (done := policy.decide(now, LOW, fleet.view())):
        now += TICK
    assert [a.kind for a in done] == ["drain"] and now - quiet_from >= 1200  # 2 -> 1


def test_a_mix_swapping_gpus_drains_at_the_longer_wait_not_as_a_fleet_shrinking() -> None:
    """A target two below that comes with a start of another type is the mix moving to other
    GPUs (and it may move back): the type waits its longer wait, as one above would."""
    sizer = Target(a=2, b=0)
    options = PolicyOptions(
        up_after=15, down_after=300, cooldown=120, max_down_after=1200, max_actions_per_hour=20
    )
    types = [ReplicaType("a", startup_s=30, max_count=5), ReplicaType("b", 30, max_count=5)]
    policy = ScalePolicy(types, sizer, options)
    fleet = SimFleet(["a", "b"])
    fleet.add_warm("a", 2)
    now = undo_two_drains(policy, sizer, fleet)
    sizer.wanted = {"a": 4, "b": 0}
    run(policy, fleet, now, now + 20)
    now += 20 + TICK
    fleet.advance(now + 30)
    now += 30
    assert len(fleet.warm["a"]) == 4
    sizer.wanted = {"a": 2, "b": 1}  # the mix swaps two A for one B
    start, drains = now, []
    while now <= start + 1500 and not drains:
        done = policy.decide(now, LOW, fleet.view())
        fleet.apply(now, done)
        drains = [now for a in done if a.kind == "drain"]
        now += TICK
    assert drains and drains[0] - start >= 1200  # not at 300, as a shrinking fleet would


# ---------------------------------------------------------------------- caps


def test_max_count_caps_starts_and_draining_replicas_count_against_it() -> None:
    policy, sizer = one_type(max_count=3, up_after=0)
    sizer.wanted = {"a": 10}
    fleet = SimFleet(["a"], startup=1000, drain_s=1000)
    fleet.add_warm("a")
    fleet.draining["a"].append(Member("leaving", -1))
    (start,) = policy.decide(0, LOW, fleet.view())
    assert start.count == 1  # 3 - warm 1 - draining 1
    assert "(the sizer asked 10, max_count 3)" in start.reason
    fleet.apply(0, [start])
    assert policy.decide(5, LOW, fleet.view()) == []
    assert policy.status(5)["a"]["held"] == "at max_count 3 (1 of them draining)"


# ---------------------------------------------------------------------- properties

TYPES = [ReplicaType("a", 20, max_count=4), ReplicaType("b", 60, max_count=3, min_count=1)]
OPTIONS = PolicyOptions(up_after=15, down_after=60, cooldown=120, max_actions_per_hour=4)
steps = st.lists(
    st.tuples(
        st.floats(1, 240),  # seconds to the next tick
        st.integers(0, 6),  # target of a
        st.integers(0, 6),  # target of b
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(steps=steps, startup=st.sampled_from([0.0, 30.0, 400.0]), drain_s=st.floats(0, 200))
def test_no_flapping_whatever_the_targets(
    steps: list[tuple[float, int, int]], startup: float, drain_s: float
) -> None:
    sizer = Target()
    policy = ScalePolicy(TYPES, sizer, OPTIONS)
    fleet = SimFleet(["a", "b"], startup=startup, drain_s=drain_s)
    fleet.add_warm("b")
    now = 0.0
    actions: list[Action] = []
    for dt, a, b in steps:
        now += dt
        sizer.wanted = {"a": a, "b": b}
        fleet.advance(now)
        done = policy.decide(now, LOW, fleet.view())
        fleet.apply(now, done)
        actions += done
        for t in TYPES:  # caps, draining replicas included; the floor kept
            assert fleet.count(t.name) <= t.max_count
            assert len(fleet.warm[t.name]) + len(fleet.starting[t.name]) >= t.min_count
        assert sum(len(w) for w in fleet.warm.values()) >= 1  # never the last warm one
    for i, x in enumerate(actions):  # the hourly guard, over any hour: a drain and the
        if x.kind == "drain":  # actions before it leave one of the hour for a start
            hour = sum(1 for y in actions[: i + 1] if y.at > x.at - 3600)
            assert hour <= OPTIONS.max_actions_per_hour - 1
    for t in TYPES:  # no start and drain of one type within the cooldown, in either order
        mine = [x for x in actions if x.type_name == t.name]
        for x in mine:
            for y in mine:
                if x.kind == "start" and y.kind == "drain":
                    assert abs(x.at - y.at) >= OPTIONS.cooldown, (x, y)
                if x is not y and x.kind == y.kind == "drain":
                    assert abs(x.at - y.at) >= OPTIONS.cooldown, (x, y)


@settings(max_examples=100, deadline=None)
@given(
    blips=st.lists(st.tuples(st.integers(1, 2), st.integers(2, 6)), min_size=1, max_size=40),
)
def test_needs_shorter_than_up_after_never_start_anything(
    blips: list[tuple[int, int]],
) -> None:
    """Targets that stay above capacity for fewer ticks than up_after spans, separated by a
    tick at capacity, start nothing (and a fleet above every target drains nothing early)."""
    policy, sizer = one_type(max_count=10, up_after=15)
    fleet = SimFleet(["a"])
    fleet.add_warm("a")
    now = 0.0
    for ticks, wanted in blips:
        for _ in range(ticks):  # at most 2 ticks 5 s apart: a need of 5 s, under 15
            sizer.wanted = {"a": wanted}
            assert policy.decide(now, LOW, fleet.view()) == []
            now += TICK
        sizer.wanted = {"a": 1}
        assert policy.decide(now, LOW, fleet.view()) == []
        now += TICK


# ---------------------------------------------------------------------- records


def test_the_decision_log_is_bounded_and_reads_as_status() -> None:
    policy, sizer = one_type(max_count=10_000, up_after=0, log_size=5, max_actions_per_hour=100)
    fleet = SimFleet(["a"])
    for i in range(1, 9):
        sizer.wanted = {"a": i}
        run(policy, fleet, i, i)
    assert len(policy.log) == 5 and policy.log[-1].at == 8
    shown = policy.log[-1].as_dict(now=10)
    assert shown == {
        "kind": "start",
        "type": "a",
        "count": 1,
        "ago_s": 2,
        "reason": "target 8 > 7 (warm 7, starting 0) for 0 s at 1.0 req/s",
    }
    assert policy.status(10)["a"]["target"] == 8


def test_types_the_sizer_does_not_know_want_none_and_names_it_does_not_know_are_ignored() -> None:
    sizer = Target(zzz=5)
    policy = ScalePolicy([ReplicaType("a", 1, 2)], sizer, PolicyOptions(down_after=0))
    fleet = SimFleet(["a"])
    fleet.add_warm("a", 2)
    (drain,) = policy.decide(0, LOW, fleet.view())
    assert drain.kind == "drain"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ReplicaType("a", 10, 0), "a.max_count: must be >= 1"),
        (lambda: ReplicaType("a", -1, 2), "a.startup_s: must be seconds >= 0"),
        (lambda: ReplicaType("a", 1, 2, min_count=3), "a.min_count: must be between 0"),
        (lambda: PolicyOptions(up_after=-1), "up_after: must be seconds >= 0"),
        (lambda: PolicyOptions(max_actions_per_hour=0), "max_actions_per_hour: must be >= 1"),
        (
            lambda: PolicyOptions(down_after=600, max_down_after=300),
            "max_down_after: must be at least down_after",
        ),
        (lambda: ScalePolicy([], Target()), "at least one replica type"),
        (lambda: ScalePolicy([ReplicaType("a", 1, 1)] * 2, Target()), "duplicate replica type"),
    ],
)
def test_bad_settings_are_config_errors(build: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()  # type: ignore[operator]


def test_the_package_exports_what_its_modules_define() -> None:
    path = Path(autoscale.__file__ or "")
    checked: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom)
                checked |= {a.name: str(stmt.module) for a in stmt.names}
    assert checked == autoscale._EXPORTS
    modules = {m for m in autoscale._EXPORTS.values()}
    every = {n for m in modules for n in importlib.import_module(m).__all__}
    assert every == set(autoscale.__all__)
    for name, module in autoscale._EXPORTS.items():
        assert getattr(autoscale, name) is getattr(importlib.import_module(module), name)


def test_the_policy_imports_neither_aiohttp_nor_ray() -> None:
    code = "import sys, hetero.serve.autoscale.policy; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert not {"aiohttp", "ray", "hetero.serve.router"} & set(out.stdout.split())
