"""A replica's learned capacity: ``ConcurrencyLimit`` as pure code driven by numbers, and the
dispatcher's ``set_slots`` that carries it out."""

from __future__ import annotations

import pytest

from hetero.errors import ConfigError
from hetero.sched import Dispatcher, ManualClock, Run, WorkItem
from hetero.sched.capacity import CapacityOptions, ConcurrencyLimit
from hetero.sched.registry import make_policy
from tests.fleets import make_devices


def test_options_name_every_bad_field() -> None:
    with pytest.raises(ConfigError) as info:
        CapacityOptions(
            initial=0, maximum=True, tolerance=1.0, backoff=1.5, drift=-1, min_excess=-0.1
        )
    fields = [field for field, _ in info.value.problems]
    assert fields == ["initial", "maximum", "tolerance", "backoff", "drift", "min_excess"]
    assert "must be a number > 1, got 1.0" in str(info.value)


def test_starts_at_the_declared_slots_else_the_initial_guess() -> None:
    assert ConcurrencyLimit(declared=3).slots == 3
    assert ConcurrencyLimit(CapacityOptions(initial=5)).slots == 5
    assert ConcurrencyLimit(CapacityOptions(maximum=4), declared=50).slots == 4


def test_an_engine_cap_replaces_the_guess_and_bounds_a_declaration() -> None:
    guessed = ConcurrencyLimit()
    guessed.set_cap(20)
    assert (guessed.slots, guessed.reason) == (20, "engine cap")  # the engine's word
    declared = ConcurrencyLimit(declared=40)
    declared.set_cap(16)
    assert declared.slots == 16  # never more than the engine runs at once
    small = ConcurrencyLimit(declared=4)
    small.set_cap(16)
    assert small.slots == 4  # a declaration below the cap is kept, and may grow to it


def test_slow_start_grows_by_one_per_reply_while_full_and_keeping_up() -> None:
    limit = ConcurrencyLimit(CapacityOptions(initial=2))
    for k in range(6):
        full = limit.slots - 1  # the reply ended with the rest of a full batch still running
        limit.on_reply(float(k), full, pace=0.01, latency=1.0)
    assert limit.slots == 8 and limit.growing
    limit.on_reply(7.0, 0, pace=0.01, latency=1.0)  # not full: nothing learned about more
    assert limit.slots == 8


def test_growth_stops_at_the_engine_cap() -> None:
    limit = ConcurrencyLimit(declared=2)
    limit.set_cap(3)
    for k in range(5):
        limit.on_reply(float(k), limit.slots - 1, pace=0.01, latency=1.0)
    assert limit.slots == 3


def test_engine_waiting_on_two_reads_sets_the_limit_to_what_runs() -> None:
    limit = ConcurrencyLimit(declared=10)
    limit.on_load(0.0, in_flight=10, waiting=3)
    assert limit.slots == 10  # one read may be a request between two scheduler steps
    limit.on_load(0.1, in_flight=10, waiting=3)
    assert (limit.slots, limit.growing) == (7, False)
    assert limit.reason == "engine queued 3"
    limit.on_load(0.2, in_flight=10, waiting=0)  # a read without a queue resets the count
    limit.on_load(0.3, in_flight=10, waiting=5)
    assert limit.slots == 7


TIGHT = CapacityOptions(tolerance=2.0)  # replies over twice their unloaded pace: overload


def test_slow_replies_under_load_back_off_once_per_round_trip() -> None:
    limit = ConcurrencyLimit(TIGHT, declared=20)
    limit.on_reply(0.0, 0, pace=0.010, latency=1.0)  # unloaded pace
    limit.on_reply(1.0, 19, pace=0.030, latency=2.0)  # 3x slower with 19 others running
    assert limit.slots == 18 and not limit.growing  # 0.9 x (19 + 1)
    assert "3.0x slower" in limit.reason
    limit.on_reply(2.0, 17, pace=0.030, latency=2.0)  # same round trip: same overload
    assert limit.slots == 18
    limit.on_reply(3.5, 17, pace=0.030, latency=2.0)
    assert limit.slots == 16


def test_a_slow_reply_must_lose_more_than_a_round_trip_to_count() -> None:
    limit = ConcurrencyLimit(TIGHT, declared=20)
    limit.on_reply(0.0, 0, pace=0.004, latency=0.07, units=16)
    # 2.5 times its unloaded pace, but 48 ms lost in all: round trip, not overload.
    limit.on_reply(1.0, 19, pace=0.010, latency=0.09, units=8)
    assert limit.slots == 21  # full and keeping up: it grew
    limit.on_reply(2.0, 20, pace=0.03, latency=0.5, units=16)  # 0.4 s lost: overload
    assert limit.slots == 18


def test_a_reply_too_quick_to_time_does_not_set_the_unloaded_pace() -> None:
    limit = ConcurrencyLimit(declared=8)
    limit.on_reply(0.0, 0, pace=0.003, latency=0.3, measure="token", units=63)
    # A stream whose 63 chunks came back together: 1e-5 s per token, 0.6 ms in all.
    limit.on_reply(1.0, 0, pace=1e-5, latency=0.2, measure="token", units=63)
    assert limit.base["token"] == 0.003
    limit.on_reply(2.0, 7, pace=0.005, latency=0.5, measure="token", units=63)
    assert limit.slots == 9  # 1.7x its real unloaded pace while full: keeps up, grows


def test_a_replica_slow_when_idle_moves_its_unloaded_pace_not_its_limit() -> None:
    limit = ConcurrencyLimit(TIGHT, declared=4)
    limit.on_reply(0.0, 0, pace=0.01, latency=1.0)
    for k in range(200):
        limit.on_reply(float(k), 0, pace=0.05, latency=1.0)  # alone, 5x slower: it slowed
    assert limit.slots == 4
    assert limit.base["work"] > 0.045


def test_measures_are_compared_with_their_own_unloaded_pace() -> None:
    limit = ConcurrencyLimit(TIGHT, declared=4)
    limit.on_reply(0.0, 0, pace=0.001, latency=1.0, measure="token")
    limit.on_reply(0.0, 3, pace=0.02, latency=1.0, measure="work")  # not 20x the token pace
    assert limit.slots == 5  # full and keeping up: it grew


def test_by_default_a_cpu_engine_grows_while_its_throughput_does() -> None:
    # Each step takes 2 ms + 0.6 ms per request in the batch, as a vLLM CPU replica's does:
    # at 16 requests a reply is 4.5x slower than alone, yet the replica does 3.5x the work.
    limit = ConcurrencyLimit(declared=2)
    limit.on_reply(0.0, 0, pace=0.0026, latency=0.2, measure="token", units=63)
    widest = 0
    for k in range(40):
        batch = limit.slots
        widest = max(widest, batch)
        pace = 0.002 + 0.0006 * batch
        limit.on_reply(1.0 + k, batch - 1, pace=pace, latency=pace * 64, measure="token", units=63)
    # Past 8x slower (32 requests), one more request adds under 2%: there it stops.
    assert widest == 32 and 28 <= limit.slots <= 30 and not limit.growing


def test_congestion_avoidance_grows_one_per_round_of_replies() -> None:
    limit = ConcurrencyLimit(declared=10)
    limit.on_load(0.0, 10, 1)
    limit.on_load(0.0, 10, 1)  # now 9, no longer growing fast
    for k in range(10):
        limit.on_load(1.0, 9, 0)
        limit.on_reply(1.0 + k, limit.slots - 1, pace=0.01, latency=0.5)
    assert limit.slots == 10


def test_nonsense_observations_teach_nothing() -> None:
    limit = ConcurrencyLimit(declared=4)
    for pace in (0.0, -1.0, float("nan"), float("inf")):
        limit.on_reply(0.0, 3, pace=pace, latency=1.0)
    limit.set_cap(0)
    assert limit.slots == 4 and limit.base == {} and limit.cap is None


# --- the dispatcher carries it out ------------------------------------------------------------


def test_more_slots_start_queued_work_at_once() -> None:
    d = Dispatcher(make_devices([1.0]), make_policy("round_robin"), ManualClock(), slots=[1])
    for k in range(3):
        d.submit(WorkItem(cost=1.0, id=k))
    out = d.set_slots("d0", 3)
    assert [i.item.id for i in out if isinstance(i, Run)] == [1, 2]
    assert d.view.slots[0] == 3 and d.view.parallel[0] == 3
    d.validate_state()


def test_fewer_slots_let_running_work_finish_and_start_nothing_until_below() -> None:
    d = Dispatcher(make_devices([1.0]), make_policy("round_robin"), ManualClock(), slots=[3])
    for k in range(4):
        d.submit(WorkItem(cost=1.0, id=k))  # 0-2 run, 3 waits
    assert d.set_slots("d0", 1) == []  # nothing is stopped
    d.validate_state()
    for k in (0, 1):  # still at or above one
        assert not [i for i in d.complete(k) if isinstance(i, Run)]
    out = d.complete(2)
    assert [i.item.id for i in out if isinstance(i, Run)] == [3]
    d.validate_state()


def test_slots_keep_each_items_speed() -> None:
    policy = make_policy("round_robin")
    d = Dispatcher(make_devices([1.0, 1.0]), policy, ManualClock(), slots=[2, 2])
    before = float(d.perf.speed()[0])
    d.set_slots("d0", 8)
    assert float(d.perf.speed()[0]) == pytest.approx(4 * before)  # 4x the slots, 4x throughput
    assert float(d.perf.speed("other")[0]) == pytest.approx(4 * float(d.perf.speed("other")[1]))


def test_bad_slots_are_refused_with_the_field() -> None:
    d = Dispatcher(make_devices([1.0]), make_policy("round_robin"), ManualClock())
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="slots: must be an integer >= 1"):
            d.set_slots("d0", bad)  # type: ignore[arg-type]
