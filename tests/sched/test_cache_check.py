"""``CacheCheck``: the prefix index's predictions against an engine's prefix-cache counters, and
``PrefixAffinity.engine_cache``, which scales the index's capacity by the verdicts."""

from __future__ import annotations

import pytest

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.sched.cache_check import FLOOR, MIN_QUERIES, STEP, CacheCheck
from hetero.sched.clock import ManualClock
from hetero.sched.item import WorkItem
from hetero.sched.perf import PerfModel
from hetero.sched.policies.prefix import PrefixAffinity
from hetero.sched.prefix import Prefix
from hetero.sched.view import FleetView


def checked(devices: int = 1) -> CacheCheck:
    check = CacheCheck()
    for _ in range(devices):
        check.add_device()
    return check


def test_no_verdict_before_the_first_read_or_on_too_little_evidence() -> None:
    check = checked()
    check.placed(0, 10.0, 10.0)
    assert check.read(0, 50_000, 0) is None  # the first read is the baseline
    check.placed(0, 10.0, 10.0)
    assert check.read(0, 50_000 + MIN_QUERIES - 1, 0) is None  # too few tokens looked up
    check.placed(0, 1.0, 1.0)  # enough of both now: the engine found none of them
    assert check.read(0, 60_000, 0) == STEP
    fresh = checked()
    fresh.read(0, 0, 0)
    fresh.placed(0, 2.0, 2.0)  # too few blocks predicted, however many tokens
    assert fresh.read(0, 100_000, 0) is None and fresh.factor(0) == 1.0


def test_an_engine_that_finds_none_of_the_predicted_hits_shrinks_the_capacity_to_the_floor() -> (
    None
):
    check = checked()
    check.read(0, 0, 0)
    queries, factors = 0, []
    for _ in range(6):
        check.placed(0, 40.0, 50.0)  # the index expected 80% cached
        queries += 10_000
        factor = check.read(0, queries, 0)  # the engine found nothing (caching off)
        assert factor is not None
        factors.append(factor)
    assert factors[0] == STEP and factors[1] == STEP**2
    assert factors[-1] == FLOOR


def test_hits_as_predicted_change_nothing_and_hits_beyond_grow_it_back() -> None:
    check = checked()
    check.read(0, 0, 0)
    check.placed(0, 40.0, 50.0)
    assert check.read(0, 10_000, 2_000) == 0.25  # 20% against 80% predicted
    check.placed(0, 40.0, 50.0)
    assert check.read(0, 20_000, 2_000 + 6_000) is None  # 60%: within the shortfall
    assert check.factor(0) == 0.25
    check.placed(0, 20.0, 50.0)  # 40% predicted (the smaller index forgot some)
    assert check.read(0, 30_000, 8_000 + 8_000) == 0.5  # 80% found: it holds more
    check.placed(0, 20.0, 50.0)
    assert check.read(0, 40_000, 16_000 + 8_000) == 1.0
    check.placed(0, 20.0, 50.0)
    assert check.read(0, 50_000, 24_000 + 9_000) is None  # at 1 already


def test_counters_that_went_down_are_a_restart_and_forget_drops_the_predictions() -> None:
    check = checked(2)
    check.read(0, 100_000, 50_000)
    check.placed(0, 40.0, 50.0)
    assert check.read(0, 20_000, 0) is None  # restarted: a new baseline, no verdict
    check.placed(0, 40.0, 50.0)
    assert check.read(0, 30_000, 8_000) is None  # 80% as predicted
    check.read(1, 0, 0)
    check.placed(1, 40.0, 50.0)
    check.forget(1)  # its engine restarted: those predictions are not its counters'
    assert check.read(1, 10_000, 0) is None and check.factor(1) == 1.0


def policy_on(devices: int) -> tuple[PrefixAffinity, FleetView]:
    spec = get_catalog().get("A100-80GB")
    fleet = [Device(id=f"d{i}", spec=spec, emulated=True) for i in range(devices)]
    view = FleetView(fleet, PerfModel(fleet), ManualClock())
    policy = PrefixAffinity(capacity_blocks=64)
    policy.bind(view)
    return policy, view


def test_the_index_keeps_the_engine_size_times_what_its_counters_bear_out() -> None:
    policy, view = policy_on(2)
    shared = tuple(range(1, 41))
    policy.engine_cache(0, blocks=100, queries=0, hits=0)
    assert policy.index.capacity(0) == 100
    for k in range(5):
        item = WorkItem(cost=100.0, prefix=Prefix((*shared, 1000 + k), 1.0, span=41.5))
        assert policy.pick(item, view, None) == 0  # the first, then where the prefix is cached
    # The engine found none of the 160 blocks the index expected cached: a quarter is kept.
    policy.engine_cache(0, queries=20_000, hits=0)
    assert policy.index.capacity(0) == 25
    assert policy.index.held(0) == 25
    policy.engine_cache(0, blocks=200)  # a new size read: the same share of it
    assert policy.index.capacity(0) == 50
    assert policy.index.capacity(1) == 64  # the other device is untouched
    policy.forget(0)
    assert policy.index.held(0) == 0 and policy.index.capacity(0) == 50


def test_a_negative_engine_size_is_refused() -> None:
    policy, _ = policy_on(1)
    with pytest.raises(ValueError, match="blocks >= 0"):
        policy.engine_cache(0, blocks=-1)
    assert policy.index.capacity(0) == 64
