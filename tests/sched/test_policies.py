"""Policies as pure code: a FleetView built by hand, a manual clock, load set directly."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.sched import Completed, Composite, FleetView, ManualClock, PerfModel, WorkItem
from hetero.sched.policies import AffinityFilter, CapacityFilter
from hetero.sched.policy import Rejected
from hetero.sched.registry import make_policy, policy_names
from tests.fleets import make_devices

GIB = 1024**3
ALL = [
    "adaptive", "affinity", "capacity_aware", "least_connections", "least_work",
    "power_of_two", "prefix_affinity", "random", "round_robin", "shortest_expected_delay", "slo",
    "tail_budget", "tiered",
    "weighted", "weighted_least_connections",
]  # fmt: skip
OPTIONS: dict[str, dict[str, Any]] = {
    "tiered": {"thresholds": [10.0], "tiers": [["d0"], ["gpu"]]},
    "affinity": {"rules": {"big": ["d0"]}},
}


def view_of(speeds: list[float], memory: list[int] | None = None) -> FleetView:
    devices = make_devices(speeds, memory)
    return FleetView(devices, PerfModel(devices), ManualClock())


def bound(name: str, view: FleetView, **options: Any) -> Any:
    policy = make_policy(name, {**OPTIONS.get(name, {}), **options})
    policy.bind(view)
    return policy


def test_every_policy_is_registered() -> None:
    assert policy_names() == ALL


def test_weighted_smooth_sends_five_sevenths_to_the_a100s() -> None:
    view = view_of([2.5, 2.5, 1.0, 1.0])
    policy = bound("weighted", view)
    picks = Counter(policy.pick(WorkItem(), view, None) for _ in range(700))
    assert picks[0] + picks[1] == 500 and picks[2] + picks[3] == 200
    first = [policy.pick(WorkItem(), view, None) for _ in range(7)]
    assert first.count(0) + first.count(1) == 5  # exact in every window of 7


def test_weighted_random_is_proportional() -> None:
    view = view_of([2.5, 2.5, 1.0, 1.0])
    policy = bound("weighted", view, variant="random", seed=7)
    picks = Counter(policy.pick(WorkItem(), view, None) for _ in range(10_000))
    assert (picks[0] + picks[1]) / 10_000 == pytest.approx(2.5 / 3.5, abs=0.015)


def test_weighted_by_memory() -> None:
    view = view_of([1.0, 1.0], memory=[16 * GIB, 8 * GIB])
    policy = bound("weighted", view, by="memory")
    picks = Counter(policy.pick(WorkItem(), view, None) for _ in range(300))
    assert picks[0] == 200 and picks[1] == 100


def test_round_robin_cycles_and_skips_unusable() -> None:
    view = view_of([1.0, 1.0, 1.0])
    policy = bound("round_robin", view)
    assert [policy.pick(WorkItem(), view, None) for _ in range(4)] == [0, 1, 2, 0]
    view.set_usable(1, False)
    assert [policy.pick(WorkItem(), view, None) for _ in range(3)] == [2, 0, 2]


def test_sed_prefers_fast_until_its_queue_makes_slow_quicker() -> None:
    view = view_of([2.5, 1.0])
    policy = bound("shortest_expected_delay", view)
    assert policy.pick(WorkItem(cost=1.0), view, None) == 0
    view.outstanding[0] = 2.0  # (2 + 1) / 2.5 = 1.2 s > 1 / 1 = 1 s
    assert policy.pick(WorkItem(cost=1.0), view, None) == 1
    assert policy.choose(WorkItem(cost=1.0), view) == "d1"


def test_sed_counts_an_items_own_service_time_on_a_many_slot_device() -> None:
    # d0: speed 4 over 4 slots runs each item at 1; d1: one slot at 2. Idle, d1 finishes a unit
    # item in 0.5 s and d0 in 1 s, although d0's total throughput is twice d1's.
    devices = make_devices([4.0, 2.0])
    view = FleetView(devices, PerfModel(devices), ManualClock(), slots=[4, 1])
    assert bound("shortest_expected_delay", view).pick(WorkItem(cost=1.0), view, None) == 1
    assert view.delay_at(0, 1.0, 0.25, 2.0) == pytest.approx(1.0)  # power_of_two's measure
    assert view.expected_delay("default", 1.0).tolist() == pytest.approx([1.0, 0.5])
    view.outstanding[1] = 3.0  # d1 busy: (3 + 1) / 2 = 2 s; d0 still 1 s
    view.size_order = False
    assert bound("shortest_expected_delay", view).pick(WorkItem(cost=1.0), view, None) == 0
    # Slots that only hold the next item ready (parallel 1): d0 runs each item at its full 4.
    view = FleetView(devices, PerfModel(devices), ManualClock(), slots=[4, 1], parallel=[1, 1])
    assert view.expected_delay("default", 1.0).tolist() == pytest.approx([0.25, 0.5])
    with pytest.raises(ValueError, match="parallel must be 2 integers from 1 to the slots"):
        FleetView(devices, PerfModel(devices), ManualClock(), slots=[4, 1], parallel=[1, 2])


def test_weighted_least_connections_and_least_work() -> None:
    view = view_of([2.5, 1.0])
    wlc = bound("weighted_least_connections", view)
    view.in_flight[:] = [2, 0]  # 3 / 2.5 = 1.2 vs 1 / 1
    assert wlc.pick(WorkItem(), view, None) == 1
    view.in_flight[:] = [1, 0]  # 2 / 2.5 = 0.8 vs 1
    assert wlc.pick(WorkItem(), view, None) == 0
    lw = bound("least_work", view)
    view.outstanding[:] = [0.5, 0.4]
    assert lw.pick(WorkItem(), view, None) == 1
    lc = bound("least_connections", view)
    assert lc.pick(WorkItem(), view, None) == 1


def test_power_of_two_never_picks_unusable_and_takes_the_lower_delay() -> None:
    view = view_of([1.0] * 8)
    view.set_usable(3, False)
    view.outstanding[:] = np.arange(8.0)
    policy = bound("power_of_two", view, seed=1)
    picks = [policy.pick(WorkItem(), view, None) for _ in range(500)]
    assert 3 not in picks
    assert Counter(picks)[0] > Counter(picks)[7]
    allowed = np.zeros(8, dtype=bool)
    allowed[5] = True
    assert policy.pick(WorkItem(), view, allowed) == 5


def test_power_of_two_compares_two_devices_sampled_by_the_speeds_learned() -> None:
    view = view_of([1.0, 1.0])  # alike by the catalog
    policy = bound("power_of_two", view, seed=3)
    view.perf.observe(0, "default", 1.0, 1.0)  # device 0 runs at its catalog speed
    for _ in range(20):  # device 1 proves ten times slower
        view.perf.observe(1, "default", 1.0, 10.0)
    # Sampled twice by the priors, device 1 would be both samples a quarter of the time.
    assert {policy.pick(WorkItem(cost=1.0), view, None) for _ in range(400)} == {0}
    view = view_of([1.0] * 20)
    policy = bound("power_of_two", view, seed=3)
    view.perf.observe(0, "default", 1.0, 1.0)
    for i in range(1, 20):
        for _ in range(30):
            view.perf.observe(i, "default", 1.0, 100.0)  # all but device 0 become 100x slower
    view.outstanding[0] = 5.0  # still the sooner to finish: 6 s against 100 s
    picks = Counter(policy.pick(WorkItem(cost=1.0), view, None) for _ in range(400))
    assert picks[0] > 300  # sampled by speed, device 0 is nearly always one of the two


def test_adaptive_learns_a_device_is_slower_than_its_catalog() -> None:
    view = view_of([1.0, 1.0])
    policy = bound("adaptive", view, every_completions=10)
    for _ in range(20):  # device 0 really takes 2 s per unit, device 1 takes 1 s
        policy.observe(Completed(0, "default", cost=1.0, seconds=2.0, latency=2.0))
        policy.observe(Completed(1, "default", cost=1.0, seconds=1.0, latency=1.0))
    np.testing.assert_allclose(policy.speeds, [0.5, 1.0])
    view.outstanding[:] = [0.2, 1.0]  # (0.2 + 1) / 0.5 = 2.4 s vs (1 + 1) / 1 = 2 s
    assert policy.pick(WorkItem(cost=1.0), view, None) == 1


def test_adaptive_updates_on_time_too() -> None:
    view = view_of([1.0, 1.0])
    policy = bound("adaptive", view, every_completions=1000, every_seconds=5.0)
    policy.observe(Completed(0, "default", cost=1.0, seconds=4.0, latency=4.0))
    assert policy.updates == 0
    view.clock.advance(6.0)  # type: ignore[attr-defined]
    policy.observe(Completed(0, "default", cost=1.0, seconds=4.0, latency=4.0))
    assert policy.updates == 1 and policy.speeds[0] == pytest.approx(0.25)


def test_capacity_wait_and_reject() -> None:
    view = view_of([1.0, 1.0], memory=[8 * GIB, 16 * GIB])
    waiting = bound("capacity_aware", view)
    assert waiting.pick(WorkItem(memory=12 * GIB), view, None) == 1
    view.mem_used[1] = 10 * GIB
    assert waiting.pick(WorkItem(memory=12 * GIB), view, None) is None
    rejecting = bound("capacity_aware", view, on_no_fit="reject")
    with pytest.raises(Rejected, match="needs 12 GiB; the most free on any usable device is 8 GiB"):
        rejecting.pick(WorkItem(memory=12 * GIB, id="x"), view, None)
    with pytest.raises(Rejected, match="needs 20 GiB but the largest usable device has 16 GiB"):
        waiting.pick(WorkItem(memory=20 * GIB), view, None)
    assert waiting.name == "capacity_aware"


def test_tiered_routing_and_overflow() -> None:
    view = view_of([1.0, 1.0, 6.0])
    policy = bound("tiered", view, thresholds=[10.0], tiers=[["d0", "d1"], ["d2"]])
    assert policy.pick(WorkItem(cost=1.0), view, None) in (0, 1)
    assert policy.pick(WorkItem(cost=50.0), view, None) == 2
    assert policy.pick(WorkItem(cost=50.0, complexity=1.0), view, None) in (0, 1)
    view.in_flight[:] = [2, 2, 0]  # the small tier is saturated (2 × 1 slot)
    assert policy.pick(WorkItem(cost=1.0), view, None) == 2
    view.in_flight[:] = [2, 2, 5]  # everything saturated: stay in its own tier
    assert policy.pick(WorkItem(cost=1.0), view, None) in (0, 1)
    assert not policy.admits(WorkItem(cost=50.0), view, 0)
    with pytest.raises(ValueError, match="selector 'H100' matches no device"):
        bound("tiered", view, thresholds=[1.0], tiers=[["gpu"], ["H100"]])
    with pytest.raises(ConfigError, match="strictly increasing"):
        make_policy("tiered", {"thresholds": [2.0, 1.0], "tiers": [["gpu"]] * 3})


def test_affinity_binding_and_fallback() -> None:
    view = view_of([1.0, 6.0])
    policy = bound("affinity", view, rules={"big": ["d0"]})
    assert policy.pick(WorkItem(tags=frozenset({"big"})), view, None) == 0
    assert policy.pick(WorkItem(), view, None) == 1
    view.set_usable(0, False)
    assert policy.pick(WorkItem(tags=frozenset({"big"})), view, None) == 1
    strict = bound("affinity", view, rules={"big": ["d0"]}, fallback=False)
    assert strict.pick(WorkItem(tags=frozenset({"big"})), view, None) is None


def test_filters_compose_in_front_of_any_policy() -> None:
    view = view_of([1.0, 1.0, 1.0], memory=[4 * GIB, 16 * GIB, 16 * GIB])
    policy = Composite(
        [CapacityFilter(), AffinityFilter({"x": ["d0", "d1"]})], make_policy("round_robin")
    )
    policy.bind(view)
    item = WorkItem(memory=8 * GIB, tags=frozenset({"x"}))
    assert [policy.pick(item, view, None) for _ in range(3)] == [1, 1, 1]
    assert policy.admits(item, view, 1) and not policy.admits(item, view, 0)


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"scheduler.options.colour.*allowed: by, seed, variant"):
        make_policy("weighted", {"colour": "red"})
    with pytest.raises(ConfigError, match=r"variant='fast'; allowed: smooth, random"):
        make_policy("weighted", {"variant": "fast"})
    with pytest.raises(ConfigError, match=r"unknown strategy 'fastest'; valid names: adaptive"):
        make_policy("fastest")
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_pkg\.mod'"):
        make_policy("no_such_pkg.mod:Policy")
    with pytest.raises(ConfigError, match=r"is not a hetero\.sched\.Policy subclass"):
        make_policy("hetero.units:parse_size")


def test_custom_policy_by_import_path() -> None:
    policy = make_policy("tests.sched.custom_policy:AlwaysLast", {"offset": 0})
    view = view_of([1.0, 1.0, 1.0])
    assert policy.choose(WorkItem(), view) == "d2"


@settings(max_examples=200, deadline=None)
@given(
    name=st.sampled_from(ALL),
    speeds=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=50),
    data=st.data(),
)
def test_pick_is_allowed_usable_or_none(name: str, speeds: list[float], data: Any) -> None:
    n = len(speeds)
    view = view_of(speeds)
    usable = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    for i, ok in enumerate(usable):
        view.set_usable(i, ok)
    allowed_list = data.draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=n, max_size=n)))
    allowed = None if allowed_list is None else np.array(allowed_list) & view.usable
    options = dict(OPTIONS.get(name, {}))
    if name == "tiered":
        options["tiers"] = [["gpu"], ["gpu"]]
    if name == "affinity":
        options["rules"] = {"big": ["gpu"]}
    policy = make_policy(name, options)
    policy.bind(view)
    ok = view.usable if allowed is None else allowed
    for cost in (0.5, 20.0):
        i = policy.pick(WorkItem(cost=cost, tags=frozenset({"big"})), view, allowed)
        if ok.any():
            assert i is not None and ok[i]
        else:
            assert i is None
