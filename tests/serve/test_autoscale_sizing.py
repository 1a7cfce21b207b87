"""The autoscaler's sizer (the serving planner asked per observed traffic), its traffic log, and
its policy driving the engine-fleet simulator: pure, virtual time."""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Any

import numpy as np
import pytest

from hetero.errors import ConfigError
from hetero.plan.serving_spec import parse_serving_plan
from hetero.serve.autoscale.policy import (
    Member,
    PolicyOptions,
    ReplicaType,
    ScalePolicy,
    Traffic,
    TypeFleet,
    observed_rate,
)
from hetero.serve.autoscale.simulated import SimulatedAutoscaler
from hetero.serve.autoscale.sizing import (
    MIN_SAMPLES,
    RATE_BAND,
    PlanSizer,
    TypeOption,
    beyond_chance,
)
from hetero.serve.autoscale.traffic import TrafficLog
from hetero.serve.engine_model import engine_spec
from hetero.serve.records import RouterOptions
from hetero.sim.engine_fleet import EngineFleetSimulator


def spec(**over: Any) -> Any:
    data: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "workload": {"rate": 1, "prompt_tokens": 300, "output_tokens": 100},
        "slo": {"ttft": 1.0, "tpot": 0.1},
        "devices": [{"model": "L4", "max_count": 4}, {"model": "A100-80GB", "max_count": 2}],
    }
    data.update(over)
    return parse_serving_plan(data)


TYPES = {"l4": TypeOption("L4"), "a100": TypeOption("A100-80GB")}


def test_the_sizer_asks_more_as_the_rate_grows_and_none_for_nothing() -> None:
    sizer = PlanSizer(spec(), TYPES)
    assert sizer(Traffic(rate=0.0)) == {"l4": 0, "a100": 0}
    counts = [sum(sizer(Traffic(rate=r)).values()) for r in (0.5, 5, 20, 40)]
    assert counts == sorted(counts) and counts[0] >= 1 and counts[-1] > counts[0]
    # Beyond what the caps carry: every type as many as it may have (the policy clamps).
    assert sizer(Traffic(rate=10_000)) == {"l4": 1_000_000, "a100": 1_000_000}


def test_the_sizer_refits_to_the_lengths_it_observes() -> None:
    sizer = PlanSizer(spec(), TYPES, refit_every=1)
    short = sizer(Traffic(rate=20))
    long = Traffic(
        rate=20,
        prompt_samples=(3000,) * MIN_SAMPLES,
        output_samples=(100,) * MIN_SAMPLES,
    )
    assert sum(sizer(long).values()) > sum(short.values())  # longer prompts need more


def test_a_type_off_the_menu_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"types\.h100\.gpu: 'H100-SXM-80GB' is not on"):
        PlanSizer(spec(), {"h100": TypeOption("H100-SXM-80GB")})


def test_the_traffic_log_counts_the_last_window() -> None:
    log = TrafficLog(window=10.0)
    for t in np.arange(0.0, 30.0, 0.5):
        log.arrived(float(t))
    log.finished(100, 20)
    seen = log.traffic(30.0)
    assert seen.rate == pytest.approx(19 / 10.0)  # those in (20, 30]: the last 10 s
    assert seen.prompt_samples == (100,) and seen.output_tokens == 20
    assert TrafficLog().traffic(5.0).rate == 0.0


def poisson_log(rates: list[tuple[float, float]], seed: int) -> tuple[TrafficLog, list[float]]:
    """A traffic log fed Poisson arrivals at ``rate`` until each ``until``; and the times."""
    rng = random.Random(seed)
    log, times, t = TrafficLog(), [], 0.0
    for rate, until in rates:
        while (t := t + rng.expovariate(rate)) < until:
            times.append(t)
        t = until
    return log, times


def rate_seen(log: TrafficLog, times: list[float], at: float) -> float:
    for t in times:
        if t <= at and (not log._arrivals or t > log._arrivals[-1]):
            log.arrived(t)
    return log.traffic(at).rate


def test_a_step_up_in_traffic_is_seen_within_seconds_not_once_it_fills_the_window() -> None:
    # 3 requests/s for two minutes, then 8: the window's mean alone crosses 5.4 about 27 s in.
    for seed in range(20):
        log, times = poisson_log([(3.0, 120.0), (8.0, 240.0)], seed)
        seen = {at: rate_seen(log, times, float(at)) for at in range(100, 150)}
        assert all(seen[at] < 5.4 for at in range(100, 121)), seed  # before the step
        assert seen[135] > 5.4, seed  # 15 s after it


def test_steady_traffic_is_not_read_as_a_rise_and_a_fall_is_seen_by_the_whole_window() -> None:
    rises = decisions = 0  # a decision every 2 s, 20 runs of 10 minutes at 3 requests/s
    for seed in range(20):
        log, times = poisson_log([(3.0, 600.0)], seed)
        for at in range(60, 600, 2):
            seen = rate_seen(log, times, float(at))
            window = len(log._arrivals) / 60.0
            decisions += 1
            rises += seen != window
            assert seen < 1.5 * 3.0  # a chance rise, when read, is never a step's size
    assert rises < 0.01 * decisions  # and rare: the policy's up_after outwaits it
    log, times = poisson_log([(8.0, 120.0), (1.0, 240.0)], 0)
    assert rate_seen(log, times, 135.0) > 5.0  # 15 s after a fall: the minute's mean


def test_the_observed_rate_is_the_windows_unless_the_recent_part_is_beyond_chance() -> None:
    assert observed_rate(180, 60.0, 45, 15.0) == 3.0  # as expected
    assert observed_rate(180, 60.0, 60, 15.0) == 3.0  # +2 sd: chance
    assert observed_rate(200, 60.0, 90, 15.0) == 6.0  # well above: the recent part's
    assert observed_rate(0, 60.0, 0, 15.0) == 0.0
    assert observed_rate(3, 60.0, 3, 15.0) == 0.05  # a few arrivals: within chance of 1
    assert observed_rate(10, 0.0, 10, 0.0) == 0.0  # no time observed
    assert observed_rate(120, 60.0, 120, 60.0) == 2.0  # no part shorter than the window


def test_the_policy_grows_and_shrinks_a_simulated_fleet_and_loses_nothing() -> None:
    l4 = engine_spec("llama-3.1-8b", "L4")
    busy_until = 300.0

    def sizer(traffic: Traffic) -> dict[str, int]:
        return {"l4": 3 if traffic.rate > 2 else 1}

    policy = ScalePolicy(
        [ReplicaType("l4", startup_s=30, max_count=3)],
        sizer,
        PolicyOptions(up_after=10, down_after=60, cooldown=30),
    )
    scaler = SimulatedAutoscaler(policy, {"l4": l4}, slo_given=False)
    rng = np.random.default_rng(1)
    busy = np.cumsum(rng.exponential(1 / 4, 1200))  # 4 requests/s, then one every 2 s
    times = np.concatenate((busy[busy < busy_until], np.arange(busy_until, 600.0, 2.0)))
    arrivals = [(float(t), 200, 20) for t in times]
    sim = EngineFleetSimulator(
        [(scaler.initial("l4"), l4)],
        options=RouterOptions(strategy="slo", slo_ttft=1.0, slo_tpot=0.1),
        priors="engine",
    )
    result = sim.run(arrivals, until=700.0, interval=5.0, on_tick=scaler)
    kinds = [kind for _, kind, *_ in scaler.actions]
    assert "start" in kinds and "drain" in kinds
    assert kinds.index("start") < kinds.index("drain")
    assert int(result.done.sum()) == len(arrivals)  # nothing lost while it grew and shrank
    joined = [r for r in result.replicas if r.joined_at is not None]
    assert len(joined) == 3
    assert all(r.joined_at >= r.asked_at + 30 for r in joined[1:])  # warm after start-up


def test_the_sizer_keeps_its_gpus_while_they_cost_little_more() -> None:
    menu = [
        {"model": "A100-80GB", "max_count": 8, "tensor_parallel": [2]},
        {"model": "H100-SXM-80GB", "max_count": 8, "tensor_parallel": [2]},
    ]
    plan_spec = spec(model="llama-3.1-70b", devices=menu)
    types = {"a100": TypeOption("A100-80GB", 2), "h100": TypeOption("H100-SXM-80GB", 2)}
    sticky = PlanSizer(plan_spec, types, stickiness=0.25)
    loose = PlanSizer(plan_spec, types, stickiness=0.0)
    assert sticky(Traffic(rate=3.8)) == loose(Traffic(rate=3.8)) == {"a100": 1, "h100": 0}
    # At 6 requests/s one H100 pair is cheapest; two A100 pairs cost less than 25 % more.
    assert loose(Traffic(rate=6.0)) == {"a100": 0, "h100": 1}
    assert sticky(Traffic(rate=6.0)) == {"a100": 2, "h100": 0}
    # At 9 the A100s would cost more than that: it moves.
    assert sticky(Traffic(rate=9.0)) == {"a100": 0, "h100": 1}


def test_a_demand_wobbling_across_a_change_of_mix_asks_for_the_mix_of_its_top() -> None:
    """Without ``hold`` a demand either side of the rate where the cheapest mix changes GPUs
    asks for each mix in turn, and the policy, judging each type by its highest target over
    its wait, keeps both; with it, the mix for the top of the last ``hold`` seconds."""
    menu = [
        {"model": "A100-80GB", "max_count": 8, "tensor_parallel": [2]},
        {"model": "H100-SXM-80GB", "max_count": 8, "tensor_parallel": [2]},
    ]
    plan_spec = spec(model="llama-3.1-70b", devices=menu)
    types = {"a100": TypeOption("A100-80GB", 2), "h100": TypeOption("H100-SXM-80GB", 2)}
    low, high = 3.8, 6.0  # one A100 pair; one H100 pair (see the test above)
    wobble = [low, high, low, low, high, low, low, low, low, low]
    free = PlanSizer(plan_spec, types, stickiness=0.0, interval=30.0)
    held = PlanSizer(plan_spec, types, stickiness=0.0, interval=30.0, hold=60.0)
    asked = [free(Traffic(rate=r)) for r in wobble]
    assert {"a100": 1, "h100": 0} in asked and {"a100": 0, "h100": 1} in asked
    kept = [held(Traffic(rate=r)) for r in wobble]
    assert kept[0] == {"a100": 1, "h100": 0}  # nothing higher seen yet
    assert kept[1:7] == [{"a100": 0, "h100": 1}] * 6  # the top within the last 60 s
    assert kept[7:] == [{"a100": 1, "h100": 0}] * 3  # 90 s after it: the low demand's mix
    with pytest.raises(ConfigError, match=r"hold: must be seconds >= 0, got -1"):
        PlanSizer(plan_spec, types, hold=-1)


def test_a_fall_that_keeps_the_mix_is_followed_at_once_whatever_the_hold() -> None:
    """``hold`` keeps a mix of other GPUs, not a count: after a burst the same GPUs are asked
    for in the number the demand needs now (the policy's wait does the rest)."""
    menu = [{"model": "A100-80GB", "max_count": 8, "tensor_parallel": [2]}]
    plan_spec = spec(model="llama-3.1-70b", devices=menu)
    sizer = PlanSizer(plan_spec, {"a100": TypeOption("A100-80GB", 2)}, interval=30.0, hold=300.0)
    burst = sizer(Traffic(rate=8.0))["a100"]
    assert burst > sizer(Traffic(rate=2.0))["a100"] >= 1


def test_a_rate_that_wobbles_within_the_band_is_not_planned_again() -> None:
    """The demand is planned for with RATE_BAND's headroom and planned again only once it
    leaves the band: above what was planned at once, below it only by twice the band."""
    sizer = PlanSizer(spec(), TYPES)
    sizer(Traffic(rate=20.0))
    assert sizer.planned == pytest.approx(20.0 * (1 + RATE_BAND))
    for rate in (20.9, 19.5, 19.2, 20.5):  # within [21 / 1.1, 21]
        sizer(Traffic(rate=rate))
        assert sizer.planned == pytest.approx(21.0)
    sizer(Traffic(rate=21.5))  # above: planned again, with headroom
    assert sizer.planned == pytest.approx(21.5 * (1 + RATE_BAND))
    sizer(Traffic(rate=18.0))  # under 22.575 / 1.1: planned again
    assert sizer.planned == pytest.approx(18.0 * (1 + RATE_BAND))


def test_of_plans_about_as_cheap_the_sizer_takes_the_one_nearest_its_last_answer() -> None:
    """On a rate that wanders (a seeded random walk), the sizer moves fewer replicas than the
    cheapest plan at every step would, and is never dearer than it by more than
    ``stickiness``."""
    menu = [{"model": "L4", "max_count": 8}, {"model": "A100-80GB", "max_count": 8}]
    plan_spec = spec(model="llama-3.1-8b", devices=menu)
    types = {"L4": TypeOption("L4"), "A100-80GB": TypeOption("A100-80GB")}
    near = PlanSizer(plan_spec, types, stickiness=0.15)
    cheapest = PlanSizer(plan_spec, types, stickiness=0.0)
    price = {o.gpu: o.price for o in cheapest.planner.problem.options}
    rng, rate, rates = random.Random(0), 2.0, []
    for _ in range(80):
        rate = max(0.5, rate * rng.uniform(0.85, 1.18))
        rates.append(rate)
    answers = [(near(Traffic(rate=r)), cheapest(Traffic(rate=r))) for r in rates]

    def moves(seq: list[dict[str, int]]) -> int:
        return sum(abs(b[k] - a[k]) for a, b in pairwise(seq) for k in a)

    assert moves([a for a, _ in answers]) < moves([b for _, b in answers])
    for a, b in answers:
        dear = sum(price[k] * n for k, n in a.items())
        assert dear <= 1.15 * sum(price[k] * n for k, n in b.items()) + 1e-9


def test_replies_that_miss_the_slo_make_the_sizer_ask_for_more_until_they_meet_it() -> None:
    sizer = PlanSizer(spec(), TYPES)
    planned = sum(sizer(Traffic(rate=20, attainment=None)).values())
    demands = []
    for _ in range(6):
        sizer(Traffic(rate=20, attainment=0.5))
        demands.append(sizer.planned)
    assert demands == sorted(demands) and demands[-1] > 2 * demands[0]  # the plan was off
    assert sizer.boost > 1
    meeting = [sum(sizer(Traffic(rate=20, attainment=1.0)).values()) for _ in range(200)]
    assert meeting[-1] == planned  # eased back once the replies meet it
    assert sizer.boost == 1.0


def test_the_correction_moves_at_a_pace_per_second_whatever_the_decision_interval() -> None:
    # A minute of missing replies, judged every 2 s or every 30 s, raises the plan alike: each
    # decision judges the same window of replies again, and must not count it as new evidence.
    often, seldom = PlanSizer(spec(), TYPES, interval=2), PlanSizer(spec(), TYPES, interval=30)
    for sizer, calls in ((often, 30), (seldom, 2)):
        for _ in range(calls):
            sizer(Traffic(rate=20, attainment=0.5))
    assert often.boost == pytest.approx(seldom.boost) == pytest.approx(1.15**2)
    for sizer, calls in ((often, 15), (seldom, 1)):
        for _ in range(calls):
            sizer(Traffic(rate=20, attainment=1.0))
    assert often.boost == pytest.approx(seldom.boost) == pytest.approx(1.15**2 * 0.97)
    with pytest.raises(ConfigError, match="interval: must be seconds > 0, got 0"):
        PlanSizer(spec(), TYPES, interval=0)


def test_a_miss_while_the_fleet_is_on_its_way_does_not_compound_the_correction() -> None:
    sizer = PlanSizer(spec(), TYPES)
    sizer(Traffic(rate=20, attainment=0.5))
    raised = sizer.boost
    for _ in range(10):  # replicas are starting: the misses judge a fleet still to come
        sizer(Traffic(rate=20, attainment=0.5, settled=False))
    assert sizer.boost == raised > 1
    sizer(Traffic(rate=20, attainment=1.0, settled=False))  # meeting it eases back at once
    assert sizer.boost < raised


def test_a_miss_that_chance_explains_does_not_raise_the_plan() -> None:
    sizer = PlanSizer(spec(), TYPES)  # its SLO: 99 % of requests
    for _ in range(20):  # one miss in each quiet minute's 18 requests: 17 % likely by chance
        sizer(Traffic(rate=0.3, attainment=17 / 18, judged=18))
    assert sizer.boost == 1.0
    sizer(Traffic(rate=0.3, attainment=15 / 18, judged=18))  # three: 0.1 % likely
    assert sizer.boost > 1.0
    raised = sizer.boost
    sizer(Traffic(rate=20, attainment=0.985, judged=1200))  # 18 misses where 12 are expected
    assert sizer.boost == raised  # not beyond chance (7 %): held, neither raised nor eased
    sizer(Traffic(rate=20, attainment=0.975, judged=1200))  # 30: beyond chance
    assert sizer.boost > raised


@pytest.mark.parametrize(
    ("attainment", "judged", "expected"),
    [
        (1.0, 10, False),
        (0.9, 10, False),
        (0.8, 10, True),
        (0.99, 100, False),
        (0.95, 100, True),
        (0.5, None, True),
    ],
)
def test_beyond_chance(attainment: float, judged: int | None, expected: bool) -> None:
    assert beyond_chance(attainment, judged, 0.99) is expected


def test_the_policy_tells_the_sizer_whether_the_fleet_served_the_whole_window() -> None:
    seen: list[bool] = []

    def sizer(traffic: Traffic) -> dict[str, int]:
        seen.append(traffic.settled)
        return {"cpu": 1}

    cpu = ReplicaType("cpu", startup_s=60, max_count=4)
    policy = ScalePolicy([cpu], sizer)
    window = Traffic(rate=1.0, window=60.0)
    policy.decide(100.0, window, {"cpu": TypeFleet(warm=(Member("a", since=0.0),))})
    policy.decide(100.0, window, {"cpu": TypeFleet(warm=(Member("a", since=50.0),))})
    policy.decide(
        100.0,
        window,
        {"cpu": TypeFleet(warm=(Member("a", since=0.0),), starting=(Member("b", 90.0),))},
    )
    assert seen == [True, False, False]


def test_the_traffic_log_says_how_many_of_the_window_met_the_slo() -> None:
    log = TrafficLog(window=10.0)
    log.arrived(0.0)
    assert log.traffic(1.0).attainment is None  # none finished with an SLO known
    for t, met in ((1.0, True), (2.0, False), (15.0, True), (16.0, True)):
        log.finished(100, 10, (t, met))
    assert log.traffic(5.0).attainment == pytest.approx(0.75)
    assert log.traffic(17.0).attainment == 1.0  # the miss at 2 s is out of the window
