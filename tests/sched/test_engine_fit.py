"""The engine model the router fits, and the ``slo`` policy that routes by it: pure code, a
manual clock, replies made up or run forward by the emulator's engine."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.sched import FleetView, ManualClock, PerfModel, Tokens, WorkItem
from hetero.sched.engine_fit import FLOOR, MAX_SECONDS, EngineFit, EngineLoad, EnginePrior
from hetero.sched.policies import slo as slo_module
from hetero.sched.policies.slo import CACHE_WAIT_TTFT, PROBE_AFTER, SloRouting
from hetero.sched.prefix import Prefix
from hetero.serve.engine_model import EngineModel, EngineRequest, engine_spec
from tests.fleets import make_devices


def prior(step: float, per_request: float, prefill_s: float = 1e-4) -> EnginePrior:
    ttft = (0.01, prefill_s, per_request)
    tpot = (step, per_request, 0.0)
    return EnginePrior(*ttft, *tpot, ttft_sd=(1e-3, 1e-5, 1e-4), tpot_sd=(1e-3, 1e-4, 1e-6))


def true_tpot(running: float, kv: float) -> float:
    return 0.01 + 0.002 * running + 0.001 * kv / 1000


def test_the_fit_learns_step_time_from_replies() -> None:
    fit = EngineFit(EnginePrior.generic())
    rng = random.Random(0)
    for _ in range(300):
        running, kv = rng.uniform(1, 40), rng.uniform(0, 40_000)
        x = fit.tpot_features(running, kv)
        measured = true_tpot(running, kv) * rng.uniform(0.95, 1.05)
        assert fit.observe_tpot(x, measured, fit.tpot.predict(x))
    for running, kv in ((1, 500), (10, 10_000), (30, 30_000)):
        predicted = fit.tpot.predict(fit.tpot_features(running, kv))
        assert predicted == pytest.approx(true_tpot(running, kv), rel=0.1)
    assert fit.explain()["error_tpot"]["p50"] < 0.1  # type: ignore[index]
    assert not fit.distrusted


def test_the_fit_follows_a_replica_that_slows_down() -> None:
    fit = EngineFit(EnginePrior.generic())
    x = fit.tpot_features(4, 4000)
    for _ in range(100):
        fit.observe_tpot(x, 0.02, fit.tpot.predict(x))
    for _ in range(100):
        fit.observe_tpot(x, 0.06, fit.tpot.predict(x))
    assert fit.tpot.predict(x) == pytest.approx(0.06, rel=0.1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0.0, 1e300, -math.inf])
def test_hostile_measurements_are_refused(bad: float) -> None:
    fit = EngineFit(EnginePrior.generic())
    x = fit.tpot_features(2, 1000)
    before = fit.tpot.theta.copy()
    assert not fit.observe_tpot(x, bad, 0.02)
    assert not fit.observe_ttft(fit.ttft_features(100, 1), bad, 0.1)
    assert np.array_equal(fit.tpot.theta, before)
    assert fit.tpot.updates == fit.ttft.updates == 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -5.0, 1e300])
def test_hostile_features_give_finite_predictions(bad: float) -> None:
    fit = EngineFit(EnginePrior.generic())
    for x in (fit.tpot_features(bad, bad), fit.tpot_features(3, bad)):
        assert fit.observe_tpot(x, 0.03, 0.02)
        assert math.isfinite(fit.tpot.predict(x))
    x = fit.ttft_features(bad, bad)
    assert fit.observe_ttft(x, 0.5, 0.1)
    assert math.isfinite(fit.ttft.predict(x))
    assert np.all(np.isfinite(fit.tpot.theta)) and np.all(fit.tpot.theta >= 0)
    fit.set_kv_tokens(-3)
    fit.set_kv_tokens(10**30)
    assert fit.kv_tokens is None


def test_a_replica_that_contradicts_the_model_is_distrusted_and_widened() -> None:
    """Replies that swing between 30x and 1/30 of the prediction: no fit absorbs them."""
    fit = EngineFit(EnginePrior.generic())
    x = fit.ttft_features(500, 1)
    for k in range(24):  # its first 8 replies teach the fit; the next are judged
        predicted = fit.ttft.predict(x)
        fit.observe_ttft(x, predicted * (30 if k % 2 else 1 / 30), predicted)
    assert fit.distrusted
    assert fit.explain()["distrusted"] is True
    assert fit.ttft_errors.factor > 5  # a busy moment's predictions are widened
    assert math.isfinite(fit.ttft.predict(x) * fit.ttft_errors.factor)


def test_a_distrusted_replica_is_widened_only_while_its_replies_miss_the_slo() -> None:
    """Its replies far from the fit (14x), yet each within the SLO: it keeps taking requests
    while busy. Widened then, it ran one request at a time on real vLLM while the router held
    28 (a replica slowed threefold for some seconds by the CPU it shared). Once a reply misses
    its SLO, a busy moment's predictions are widened again and the request waits."""
    policy, view, clock = replica_measured_over_predicted(0.005, 14.0)
    fit = policy.fits[0]
    assert fit.distrusted and fit.tpot_errors.factor > 10
    first, second = request(), request()
    assert policy.pick(first, view, None) == 0
    assert policy.pick(second, view, None) == 0  # busy and distrusted, yet meeting the SLO
    assert policy.explain(0, view)["widened"] is False
    miss(policy, clock, first)
    assert policy.explain(0, view)["recent_misses"] == 1
    assert policy.pick(request(), view, None) is None  # widened: it waits
    assert policy.explain(0, view)["widened"] is True


def test_a_busy_replica_predicted_too_fast_is_corrected_while_its_replies_miss() -> None:
    """Its replies 1.25x slower than predicted, never far enough to be distrusted: while they
    meet the SLO nothing changes; once one misses, a busy moment's predictions are stretched
    by that median, and a request it would take just within the SLO waits. On real vLLM past
    the fleet's capacity, slow replicas predicted 10-20% too fast were sent requests just
    within 50 ms and ran them at 51-62 ms."""
    policy, view, clock = replica_measured_over_predicted(0.02, 1.25)
    fit = policy.fits[0]
    assert not fit.distrusted
    assert fit.tpot_errors.stretch() == pytest.approx(1.25)
    sent = [request() for _ in range(11)]
    for item in sent:  # the 11th predicted at 0.042 s a token: within 0.05
        assert policy.pick(item, view, None) == 0
    assert policy.explain(0, view)["widened"] is False
    miss(policy, clock, sent[0])
    # 10 running: the next one predicted at 0.042 s a token again, 0.053 once stretched
    assert policy.pick(request(), view, None) is None
    assert policy.explain(0, view)["widened"] is True


def replica_measured_over_predicted(
    step: float, ratio: float
) -> tuple[SloRouting, FleetView, ManualClock]:
    """One replica (SLO 1 s and 50 ms) whose last 16 replies' TPOTs came ``ratio`` times
    what was predicted."""
    policy, view = make_policy([prior(step, 0.002)], ttft=1.0, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    for _ in range(16):
        policy.fits[0].tpot_errors.add(0.01, 0.01 * ratio)
    policy._mirror(0)
    return policy, view, clock


def miss(policy: SloRouting, clock: ManualClock, item: WorkItem) -> None:
    """``item`` answers in 0.1 s, then 0.1 s a token against the 0.05 allowed: a miss."""
    clock.advance(0.1)
    policy.first_token(item.id, clock.now())
    clock.advance(1.0)
    policy.finished(item.id, clock.now(), 11)


def make_policy(priors: list[EnginePrior], **options: float) -> tuple[SloRouting, FleetView]:
    devices = make_devices([1.0] * len(priors))
    view = FleetView(devices, PerfModel(devices), ManualClock())
    policy = SloRouting(**options)  # type: ignore[arg-type]
    policy.bind(view)
    for i, p in enumerate(priors):
        policy.set_prior(i, p)
    return policy, view


def request(prompt: int = 200, output: float = 50, prefix: Prefix | None = None) -> WorkItem:
    return WorkItem(cost=1.0, tokens=Tokens(prompt, output), prefix=prefix)


def test_requests_fill_the_fast_replica_then_the_slow_ones_help_then_wait() -> None:
    fast, slow = prior(0.005, 0.002), prior(0.025, 0.005)
    policy, view = make_policy([fast, slow, slow], ttft=1.0, tpot=0.05)
    picks = [policy.pick(request(), view, None) for _ in range(40)]
    placed = [p for p in picks if p is not None]
    counts = np.bincount(placed, minlength=3)
    # The fast replica meets a 50 ms TPOT up to about 20 at once, a slow one about 5.
    assert 15 <= counts[0] <= 22
    assert 3 <= counts[1] <= 6 and 3 <= counts[2] <= 6
    assert picks[:5] == [0] * 5  # most headroom first
    assert picks[-1] is None  # every replica busy and past its TPOT: the request waits
    assert policy.in_flight() == len(placed)


def test_a_fleet_that_cannot_meet_the_slo_still_serves_every_request() -> None:
    """Waiting gains nothing where no replica could meet the SLO even idle."""
    policy, view = make_policy([prior(0.2, 0.01)], ttft=1.0, tpot=0.05)
    assert [policy.pick(request(), view, None) for _ in range(3)] == [0, 0, 0]


def test_a_request_waits_for_a_busy_replica_rather_than_miss_its_ttft_far_elsewhere() -> None:
    """A replica that meets the TPOT but misses the TTFT by more than ``TTFT_SLACK`` times is
    tried once (it never answered) and then not sent more: the fast replica, past its TPOT
    now, frees a place sooner than the slow one would prefill."""
    fast, slow_prefill = prior(0.005, 0.002, prefill_s=1e-5), prior(0.01, 0.001, prefill_s=3e-3)
    policy, view = make_policy([fast, slow_prefill], ttft=1.0, tpot=0.05)
    picks = [policy.pick(request(prompt=1000), view, None) for _ in range(32)]
    first_overflow = picks.index(1)
    assert 15 <= first_overflow <= 22 and picks[:first_overflow] == [0] * first_overflow
    assert picks[first_overflow + 1 :] == [None] * (31 - first_overflow)  # they wait
    # Within twice the target it is the request's best chance: sent at once. This one
    # prefills 1,000 tokens in 0.75 s: the second sent there is predicted at 1.51 s, the third
    # at 2.26 s.
    near = prior(0.01, 0.001, prefill_s=0.75e-3)
    policy, view = make_policy([fast, near], ttft=1.0, tpot=0.05)
    picks = [policy.pick(request(prompt=1000), view, None) for _ in range(32)]
    assert picks.count(1) == 2
    assert picks[picks.index(None) :] == [None] * (32 - picks.index(None))


def test_a_replica_that_misses_the_slo_even_idle_is_not_used_while_another_can_meet_it() -> None:
    fast, hopeless = prior(0.005, 0.002), prior(0.08, 0.01)
    policy, view = make_policy([fast, hopeless], ttft=1.0, tpot=0.05)
    picks = [policy.pick(request(), view, None) for _ in range(30)]
    # The fast one fills up; the other, never heard from, is tried once (its fit may be
    # wrong), then requests wait for the fast one.
    assert picks.count(1) == 1 and picks.index(1) > 10
    assert picks[-1] is None
    # Once it has answered and is known to miss even alone, it is not tried again soon (the
    # fast one may take one more as the burst's prefill falls behind it).
    clock = view.clock
    assert isinstance(clock, ManualClock)

    def next_pick() -> int | None:
        while (i := policy.pick(request(), view, None)) == 0:
            pass
        return i

    probe = next(f for f in policy._flights if policy._flights[f].device == 1)
    clock.advance(0.5)
    policy.first_token(probe, clock.now())
    clock.advance(0.8)
    policy.finished(probe, clock.now(), 9)
    assert next_pick() is None
    # Each try doubles the wait before the next: 2x PROBE_AFTER idle after the first ...
    clock.advance(PROBE_AFTER + 1)
    assert next_pick() is None
    clock.advance(PROBE_AFTER)
    assert next_pick() == 1
    probe = next(f for f in policy._flights if policy._flights[f].device == 1)
    clock.advance(0.5)
    policy.first_token(probe, clock.now())
    policy.finished(probe, clock.now() + 0.8, 9)
    # ... then 4x.
    clock.advance(3 * PROBE_AFTER)
    assert next_pick() is None
    clock.advance(PROBE_AFTER + 1)
    assert next_pick() == 1


def test_the_slow_replicas_tpot_is_learned_from_the_first_tokens_of_a_stream() -> None:
    policy, view = make_policy([EnginePrior.generic(), EnginePrior.generic()], ttft=1, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    item = request(100, 400)
    i = policy.pick(item, view, None)
    assert i is not None
    clock.advance(0.1)
    policy.first_token(item.id, clock.now())
    clock.advance(0.3 * 7)  # seven more tokens at 0.3 s each
    policy.progress(item.id, clock.now(), 8)
    fit = policy.fits[i]
    assert fit.tpot.updates == 1
    assert fit.tpot.predict(fit.tpot_features(1, 500)) > 0.05
    policy.finished(item.id, clock.now() + 1.0, 9)
    assert fit.tpot.updates == 2 and policy.in_flight() == 0


def test_chunks_that_come_in_a_burst_do_not_teach_a_step_time_of_nothing() -> None:
    """A server that falls behind sends the tokens it held back at once: the stretch between
    two reports can be a millisecond for eight tokens. A stream's pace teaches the fit once,
    over the decode from its start, and its end teaches the whole decode, so the fit stays at
    the replica's true 10 ms step (seen on real vLLM: a fit pulled to its floor by such bursts
    sent every request to a replica it thought 60x faster than it was)."""
    policy, view = make_policy([EnginePrior.generic()], ttft=1, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    for k in range(20):
        item = request(100, 64)
        assert policy.pick(item, view, None) == 0
        clock.advance(0.1)
        policy.first_token(item.id, clock.now())
        clock.advance(0.01 * 7)  # 7 more tokens at 10 ms
        policy.progress(item.id, clock.now(), 8)
        clock.advance(0.01 * 8)  # 8 more, held back ...
        policy.progress(item.id, clock.now(), 9)
        clock.advance(0.001)
        policy.progress(item.id, clock.now(), 16)  # ... and come at once
        clock.advance(0.01 * 48)
        policy.finished(item.id, clock.now(), 64)
        assert policy.fits[0].tpot.updates == 2 * (k + 1)  # the first report and the end
    fit = policy.fits[0]
    assert fit.tpot.predict(fit.tpot_features(1, 132)) == pytest.approx(0.01, rel=0.25)


def test_a_reply_that_came_whole_in_one_burst_teaches_no_step_time() -> None:
    """A streaming server starved of CPU holds a whole reply back, its first token too, and
    sends it at once: 60 chunks within a millisecond. Such replies among paced ones leave the
    fit at the paced replies' 5 ms step (on real vLLM they fitted it at nothing)."""
    policy, view = make_policy([EnginePrior.generic()], ttft=1, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    for k in range(40):
        item = request(100, 64)
        assert policy.pick(item, view, None) == 0
        if k % 2:  # held back: everything comes at once after 0.35 s
            clock.advance(0.35)
            policy.first_token(item.id, clock.now())
            for chunks in (8, 16, 32, 61):
                clock.advance(0.00003 * chunks / 2)
                policy.progress(item.id, clock.now(), chunks)
            policy.finished(item.id, clock.now(), 61)
        else:
            clock.advance(0.05)
            policy.first_token(item.id, clock.now())
            clock.advance(0.005 * 60)
            policy.finished(item.id, clock.now(), 61)
        clock.advance(0.5)
    fit = policy.fits[0]
    assert fit.tpot.predict(fit.tpot_features(1, 132)) == pytest.approx(0.005, rel=0.25)
    assert not fit.distrusted


def test_a_lone_request_measured_brings_a_guessed_replica_to_its_times() -> None:
    policy, _ = make_policy([EnginePrior.generic(), prior(0.005, 0.002)], ttft=1, tpot=0.05)
    policy.measured(0, 300, 0.9, 0.08, now=0.0)
    fit = policy.fits[0]
    assert fit.predict_ttft(300, 0) == pytest.approx(0.9)
    assert fit.predict_step(1, 0) == pytest.approx(0.08)
    assert policy.fits[0].prior.guess  # still ramped up as a replica known by its URL
    declared = policy.fits[1].tpot.coef
    policy.measured(1, 300, 0.9, 0.08, now=0.0)  # a declared prior is not a guess: kept
    assert policy.fits[1].tpot.coef == declared


@pytest.mark.parametrize(
    "ttft, tpot", [(math.nan, 0.1), (-1.0, 0.1), (math.inf, 0.1), (1e300, 0.1), (0.5, math.nan)]
)
def test_an_absurd_measurement_leaves_the_guess_or_the_step(ttft: float, tpot: float) -> None:
    policy, _ = make_policy([EnginePrior.generic()], ttft=1, tpot=0.05)
    before = policy.fits[0].tpot.coef, policy.fits[0].ttft.coef
    policy.measured(0, 300, ttft, tpot, now=0.0)
    fit = policy.fits[0]
    if math.isfinite(ttft) and 0 < ttft < 3600:  # the TTFT is taken, the step scaled alike
        assert fit.predict_ttft(300, 0) == pytest.approx(ttft)
        assert all(math.isfinite(c) for c in fit.tpot.coef)
    else:
        assert (fit.tpot.coef, fit.ttft.coef) == before


def test_unstreamed_answers_open_a_guessed_replica_s_slow_start() -> None:
    """A replica known by its URL alone runs 1, 2, 4... requests at once as it answers. An
    unstreamed reply teaches no TTFT: it still is an answer (counted by the fit's TTFT
    updates, such a replica ran one request at a time for good: 840 requests/s behind an
    instant mock where the default strategy served 2,300)."""
    policy, view = make_policy([EnginePrior.generic()])
    clock = view.clock
    assert isinstance(clock, ManualClock)
    running: list[WorkItem] = []
    for answered in range(4):
        while (item := request(20, 64)) and policy.pick(item, view, None) == 0:
            running.append(item)
        assert len(running) == 2**answered  # the slow start's cap, then it waits
        clock.advance(0.001)
        policy.finished(running.pop(0).id, clock.now(), 64)  # whole, in a millisecond
    fit = policy.fits[0]
    assert fit.answers == 4 and fit.ttft.updates == 0


def test_past_its_slow_start_a_replica_runs_more_while_its_replies_meet_the_slo() -> None:
    """The slow start ends at 64 at once; past it, a full replica whose replies meet the SLO is
    sent more (held at 64, the fast vLLM engine ran at 0.8 of its core while 105 requests
    waited in the router); a reply that misses halves that, never below 64."""
    policy, view = make_policy([EnginePrior.generic()], ttft=1.0, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    running: list[WorkItem] = []
    started: set[int | str] = set()

    def fill() -> int:
        while (item := request(20, 64)) and policy.pick(item, view, None) == 0:
            running.append(item)
        return len(running)

    def answer(ttft: float) -> None:
        """First tokens for those sent since, ``ttft`` on; the oldest ends."""
        clock.advance(ttft)
        for item in running:
            if item.id not in started:
                started.add(item.id)
                policy.first_token(item.id, clock.now())
        clock.advance(0.001)
        policy.finished(running.pop(0).id, clock.now(), 64)

    most = [fill()]
    for _ in range(400):
        answer(0.001)
        most.append(fill())
    assert most[:2] == [1, 2] and 64 in most  # the slow start, then its end
    assert most[-1] > 64 and policy.limit[0] > 64  # every reply met the SLO at its limit
    answer(0.001)
    running.append(late := request(20, 64))
    assert policy.pick(late, view, None) == 0
    before = policy.limit[0]
    answer(2.0)  # its first token past the TTFT target; the oldest's end met the SLO
    assert 64 <= policy.limit[0] < 0.6 * before
    assert policy.pick(request(20, 64), view, None) is None  # it runs more than that
    assert policy.explain(0, view)["most_running"] == round(policy.limit[0], 1)


def test_every_unstreamed_reply_teaches_the_step_not_only_the_slow_ones() -> None:
    """Unstreamed replies of 64 tokens, four in five back whole in 2 ms, one in 40 ms. Such a
    reply has no chunks to come in a burst: read as bursts, the fast ones were dropped, the
    slow ones alone taught the fit, and it predicted every reply at their pace (behind an
    instant replica the fit then missed fourfold, was distrusted, and the router ran one
    request at a time while 63 waited)."""
    policy, view = make_policy([EnginePrior.generic()], ttft=1, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    for k in range(200):
        item = request(16, 64)
        assert policy.pick(item, view, None) == 0
        clock.advance(0.04 if k % 5 == 0 else 0.002)
        policy.finished(item.id, clock.now(), 64)
    fit = policy.fits[0]
    assert fit.tpot.updates == 200
    # A decode's share of a 2 ms reply (half of it, the fit's TTFT being far off) over 63
    # tokens: 16 µs a token; the slow ones' is 20 times that.
    assert fit.predict_step(1, 48) < 2 * FLOOR


def test_a_measurement_after_replies_changes_nothing() -> None:
    policy, view = make_policy([EnginePrior.generic()], ttft=1, tpot=0.05)
    item = request(300, 20)
    assert policy.pick(item, view, None) == 0
    policy.first_token(item.id, 0.2)
    before = policy.fits[0].ttft.coef
    policy.measured(0, 300, 5.0, 0.5, now=1.0)
    assert policy.fits[0].ttft.coef == before


def test_a_reply_that_was_not_streamed_teaches_the_step_time_too() -> None:
    policy, view = make_policy([EnginePrior.generic()], ttft=1, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    item = request(100, 50)
    policy.pick(item, view, None)
    clock.advance(5.0)
    policy.finished(item.id, clock.now(), 50)
    fit = policy.fits[0]
    assert fit.tpot.updates == 1 and fit.ttft.updates == 0
    assert policy.loads[0].running == 0 and policy.loads[0].prefill_queue == 0


def test_a_cached_prefix_pulls_a_request_to_its_replica() -> None:
    same = prior(0.01, 0.002, prefill_s=1e-3)
    policy, view = make_policy([same, same], ttft=2.0, tpot=0.05)
    blocks = tuple(range(8))
    first = policy.pick(request(1024, prefix=Prefix(blocks, 1.0)), view, None)
    assert first is not None
    policy.dropped(next(iter(policy._flights)), 0.0)  # it ended: both replicas idle again
    again = policy.pick(request(1100, prefix=Prefix(blocks, 1.0)), view, None)
    assert again == first


def test_a_turn_waits_a_little_for_the_busy_replica_holding_its_history() -> None:
    """A conversation's next turn waits for the replica that holds its history, at most
    ``CACHE_WAIT_TTFT`` of its TTFT target, where a slower replica would meet the SLO now;
    a new conversation, whose prompt no replica holds, goes to the slower one at once."""
    fast, slow = prior(0.005, 0.002), prior(0.025, 0.005)
    policy, view = make_policy([fast, slow], ttft=1.0, tpot=0.05)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    history = tuple(range(100, 108))  # 8 blocks, about 1,000 tokens
    earlier = request(1024, prefix=Prefix(history, 1.0))
    assert policy.pick(earlier, view, None) == 0
    only_fast = np.array([True, False])
    while policy.pick(request(), view, only_fast) == 0:  # the fast replica fills to its TPOT
        pass
    turn = request(1100, prefix=Prefix((*history, 108), 1.0))
    fresh = request(1100, prefix=Prefix(tuple(range(200, 209)), 1.0))
    assert policy.pick(turn, view, None) is None  # it waits for its history
    assert policy.pick(fresh, view, None) == 1  # nothing of it held anywhere: sent now
    clock.advance(CACHE_WAIT_TTFT * 1.0 / 2)
    assert policy.pick(turn, view, None) is None
    clock.advance(CACHE_WAIT_TTFT * 1.0 / 2)
    assert policy.pick(turn, view, None) == 1  # waited its share of the TTFT: sent on
    # Where the holder becomes the pick in time (it finishes what it ran), the turn goes there.
    policy, view = make_policy([fast, slow], ttft=1.0, tpot=0.05)
    assert policy.pick(request(1024, prefix=Prefix(history, 1.0)), view, None) == 0
    filler = []
    while policy.pick(item := request(), view, only_fast) == 0:
        filler.append(item)
    assert policy.pick(turn, view, None) is None
    for item in filler:
        policy.dropped(item.id, view.clock.now())
    assert policy.pick(turn, view, None) == 0


def test_the_slo_is_checked() -> None:
    for bad in (0, -1.0, math.nan, math.inf, 1e9, True, "1"):
        with pytest.raises(ConfigError, match="ttft"):
            SloRouting(ttft=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="tpot"):
            SloRouting(tpot=bad)  # type: ignore[arg-type]


def test_a_derived_slo_follows_the_fleet() -> None:
    # One replica: its step at 80% of its top throughput, five times its step's fixed part
    alone, _ = make_policy([prior(0.008, 0.002)])
    assert alone.slo(200, 50) == (1.0, pytest.approx(5 * 0.008))
    # Beside a replica ten times slower, which the fast one outruns: the fast one's own knee
    # (5 ms + 1 ms a request: 80% of the pair's 1,100 requests a step-second at 41.7 ms)
    policy, _ = make_policy([prior(0.005, 0.001), prior(0.05, 0.01)])
    ttft, tpot = policy.slo(200, 50)
    assert ttft == 1.0
    assert tpot == pytest.approx((0.005 / 0.001) / (1000 - 0.8 * 1100))
    fast, _ = make_policy([prior(0.001, 0.0001), prior(0.05, 0.01)])
    assert fast.slo(200, 50) == (1.0, 0.02)  # the floors: a person reads no faster


def test_a_derived_tpot_takes_in_the_slow_replicas_a_fleet_needs() -> None:
    # One model at speeds 1 : 0.4 : 0.2: the fast one alone is 62% of the fleet's top
    # throughput, so the target is loose enough for both slow ones to batch a few requests
    speeds = (1.0, 0.4, 0.2)
    policy, _ = make_policy([prior(0.004 / v, 0.0004 / v) for v in speeds])
    tpot = policy.slo(200, 50)[1]
    assert tpot == pytest.approx(3 * (0.004 / 0.0004) / (0.2 * sum(speeds) / 0.0004))
    assert tpot > 5 * 0.004 and tpot > 0.0044 / 0.2  # past five fixed steps, past the slowest alone
    # A CPU beside two GPUs adds almost nothing: the target stays the GPUs'
    gpus, _ = make_policy([prior(0.004, 0.0004), prior(0.004, 0.0004)])
    with_cpu, _ = make_policy([prior(0.004, 0.0004), prior(0.004, 0.0004), prior(0.2, 0.05)])
    assert gpus.slo(200, 50)[1] == pytest.approx(5 * 0.004)
    assert with_cpu.slo(200, 50)[1] == pytest.approx(5 * 0.004, rel=0.02)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 0.5), st.floats(1e-6, 0.05), st.floats(0.0, 1e-4)),
        min_size=1,
        max_size=8,
    ),
    st.floats(0.0, 1e5),
)
def test_the_derived_tpot_is_the_least_step_reaching_the_share(
    replicas: list[tuple[float, float, float]], kv: float
) -> None:
    """At the target the replicas whose lone step it reaches, each batching what it allows,
    run at 80% of the fleet's top throughput; a little below it they do not (unless the
    target is a replica's lone step, where one joins at once)."""
    base, per_request, per_kv = (np.array(column) for column in zip(*replicas, strict=True))
    s = slo_module._knee_step(base, per_request, per_kv, kv)
    cost = per_request + per_kv * kv
    lone = base + cost

    def share(step: float) -> float:
        counted = lone <= step
        return float(np.sum(np.where(counted, (1 - base / step) / cost, 0.0)) / np.sum(1 / cost))

    assert share(s) >= 0.8 - 1e-9
    below = s * (1 - 1e-6)
    assert share(below) < 0.8 or np.isclose(lone, s, rtol=1e-9).any() or s == FLOOR


def serve_alone(policy: SloRouting, view: FleetView, ttft: float, tpot: float) -> None:
    """One request to replica 0, answered alone in ``ttft`` then ``tpot`` seconds a token."""
    clock = view.clock
    assert isinstance(clock, ManualClock)
    item = request(200, 50)
    only = np.arange(view.n) == 0
    if policy.pick(item, view, only) is None:
        return  # held back (a derived target it misses): nothing to answer
    clock.advance(ttft)
    policy.first_token(item.id, clock.now())
    clock.advance(tpot * 49)
    policy.finished(item.id, clock.now(), 50)
    clock.advance(1.0)


def test_a_derived_slo_holds_still_while_the_fit_learns() -> None:
    # A catalog prior: the target is taken from it, whatever the replies then teach the fit.
    policy, view = make_policy([prior(0.008, 0.002)])
    before = policy.slo(200, 50)
    assert before[1] == pytest.approx(5 * 0.008)
    for tpot in (0.03, 0.002, 0.03, 0.002) * 10:
        serve_alone(policy, view, 0.05, tpot)
    assert policy.fits[0].taught
    assert policy.slo(200, 50) == before
    assert policy.explain(0, view)["slo_from"] == "catalog"


def test_a_derived_slo_is_taken_from_a_guessed_replicas_probe_then_holds() -> None:
    policy, view = make_policy([EnginePrior.generic()])
    policy.measured(0, 300, 0.2, 0.012, now=0.0)  # the timing probe: 12 ms a token alone
    timed = policy.slo(200, 50)
    # the guess's shape (20 of its 21 ms lone step fixed) brought to the probe's 12 ms
    assert timed[1] == pytest.approx(5 * 0.012 * 20 / 21)
    assert policy.explain(0, view)["slo_from"] == "probe"
    for _ in range(20):  # its replies say 3 ms: the fit follows them, the target does not
        serve_alone(policy, view, 0.05, 0.003)
    assert policy.fits[0].predict_step(1, 0) < 0.006
    assert policy.slo(200, 50) == timed
    # Joined again with a new guess: not timed any more, the fit lends its times
    policy.set_prior(0, EnginePrior.generic(2.0))
    policy.forget(0)
    assert policy.explain(0, view)["slo_from"] == "fit"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["prior", "guess", "probe", "forget", "serve", "join"]),
            st.integers(0, 3),
            st.floats(0.5, 4.0),
        ),
        max_size=30,
    )
)
def test_the_derived_targets_follow_every_replicas_reference(
    ops: list[tuple[str, int, float]],
) -> None:
    devices = make_devices([1.0] * 4)
    view = FleetView(devices[:2], PerfModel(devices[:2]), ManualClock())
    policy = SloRouting()
    policy.bind(view)
    for op, k, x in ops:
        i = k % view.n
        if op == "prior":
            policy.set_prior(i, prior(0.01 * x, 0.002 * x))
        elif op == "guess":
            policy.set_prior(i, EnginePrior.generic(x))
        elif op == "probe":
            policy.measured(i, 300, 0.1 * x, 0.01 * x, now=view.clock.now())
        elif op == "forget":
            policy.forget(i)
        elif op == "serve":
            serve_alone(policy, view, 0.05 * x, 0.01 * x)
        elif op == "join" and view.n < 4:
            view = FleetView(devices[: view.n + 1], PerfModel(devices[: view.n + 1]), view.clock)
            policy.bind(view)
        lone = [policy.reference(d) for d in range(view.n)]
        best_ttft = min(r[0] + r[1] * 200 for r in lone)
        columns = [np.array(column) for column in zip(*lone, strict=True)]
        knee = slo_module._knee_step(*columns[2:], 225)
        ttft, tpot = policy.slo(200, 50)
        assert ttft == pytest.approx(max(1.0, 10 * best_ttft))
        assert tpot == pytest.approx(max(0.02, knee))


def test_a_guess_never_timed_lends_the_target_its_fit() -> None:
    policy, view = make_policy([EnginePrior.generic()])
    guessed = policy.slo(200, 50)
    for _ in range(30):
        serve_alone(policy, view, 0.05, 0.03)  # 30 ms a token alone
    assert policy.slo(200, 50)[1] > guessed[1]
    assert policy.slo(200, 50)[1] == pytest.approx(5 * 0.03, rel=0.3)  # mostly its fixed part
    given, given_view = make_policy([EnginePrior.generic()], ttft=1.0, tpot=0.05)
    assert given.explain(0, given_view)["slo_from"] is None


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["pick", "first", "finish", "drop"]), st.integers(0, 7)),
        max_size=80,
    )
)
def test_what_a_replica_holds_is_given_back(ops: list[tuple[str, int]]) -> None:
    policy, view = make_policy([prior(0.005, 0.001), prior(0.02, 0.004)], ttft=5.0, tpot=1.0)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    items = [request(100 + 50 * k) for k in range(8)]
    for op, k in ops:
        clock.advance(0.01)
        item, now = items[k], clock.now()
        if op == "pick":
            policy.pick(item, view, None)
        elif op == "first":
            policy.first_token(item.id, now)
        elif op == "finish":
            policy.finished(item.id, now, 20)
        else:
            policy.dropped(item.id, now)
    for item in items:
        policy.dropped(item.id, clock.now())
    assert policy.in_flight() == 0
    for load in policy.loads:
        assert load.running == 0 and load.kv == 0 and load.prefill_queue == 0


def test_the_fit_learns_the_emulators_engine() -> None:
    """The emulator runs the engine forward; replies fed to the fit predict the next ones'
    TPOT within 25% at the median (the same equations, one linearised)."""
    spec = engine_spec("llama-3-8b", "A100-80GB", max_num_seqs=64)
    clock = ManualClock()
    engine = EngineModel(spec, clock.now)
    fit = EngineFit(EnginePrior.generic())
    rng = random.Random(1)
    running: dict[int, tuple[EngineRequest, float, float]] = {}  # id -> req, batch·t, kv·t
    errors = []
    t_next = 0.0
    done = 0
    while done < 400:
        while t_next <= clock.now():
            req = EngineRequest(rng.randint(100, 1500), rng.randint(2, 200))
            engine.submit(req)
            running[id(req)] = (req, 0.0, 0.0)
            t_next += rng.expovariate(12.0)
        step = engine.step()
        if step is None:
            clock.set(t_next)
            continue
        clock.set(step.end)
        batch = len(engine.running) + len(step.finished)
        kv = sum(r.num_tokens for r in engine.running)
        for key, (req, b, k) in list(running.items()):
            if req.first_token_at is not None and req.first_token_at < step.end:
                running[key] = (req, b + batch * step.duration, k + kv * step.duration)
        for req in step.finished:
            _, b, k = running.pop(id(req))
            assert req.first_token_at is not None and req.finished_at is not None
            span = req.finished_at - req.first_token_at
            if span <= 0:
                continue
            x = fit.tpot_features(b / span, k / span)
            measured = span / (req.generated - 1)
            predicted = fit.tpot.predict(x)
            if done > 100:
                errors.append(abs(predicted / measured - 1))
            fit.observe_tpot(x, measured, predicted)
            done += 1
    assert float(np.median(errors)) < 0.25


def test_replies_that_fall_with_the_batch_fit_no_falling_slope() -> None:
    """Noisy replies at small batches can suggest a step time that falls with the batch;
    fitted so, it would predict a busy replica at no time at all and draw every request to it.
    No coefficient goes below zero: the prediction never falls with the batch and stays within
    what the replies showed."""
    fit = EngineFit(EnginePrior.generic())
    for _ in range(20):
        for running, y in ((1, 0.30), (2, 0.25), (3, 0.20)):
            x = fit.tpot_features(running, 500 * running)
            fit.observe_tpot(x, y, fit.tpot.predict(x))
    assert fit.tpot.theta.min() >= 0
    predictions = [fit.tpot.predict(fit.tpot_features(r, 500 * r)) for r in (1, 3, 5, 30, 300)]
    assert predictions == sorted(predictions)
    assert 0.2 * 0.9 <= predictions[0] <= 0.3


def test_a_throttled_replica_seen_only_busy_is_not_predicted_at_nothing_alone() -> None:
    """A replica under a CPU quota answers at batches of 5 to 15 with steps that grow faster
    than the batch (its quota runs out), noisily: extrapolated to a lone request, an unbounded
    fit gives a negative base and 0.1 ms a token (seen on real vLLM: measured 100 ms)."""
    fit = EngineFit(EnginePrior.generic())
    rng = random.Random(3)
    for _ in range(60):
        running = rng.uniform(5, 15)
        x = fit.tpot_features(running, 1300 * running)
        measured = max(0.01, (0.03 * running - 0.12) * rng.uniform(0.7, 1.4))
        fit.observe_tpot(x, measured, fit.tpot.predict(x))
    assert fit.tpot.theta.min() >= 0
    assert fit.tpot.predict(fit.tpot_features(1, 1300)) >= 0.01


def test_a_replica_known_by_its_url_alone_starts_slowly() -> None:
    """Before its first reply a replica known by URL alone runs one request: its predictions
    are a guess. Each reply doubles what it may run while it is learned."""
    policy, view = make_policy([EnginePrior.generic()], ttft=5.0, tpot=0.5)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    items = [request() for _ in range(10)]
    assert [policy.pick(item, view, None) for item in items[:3]] == [0, None, None]
    clock.advance(0.2)
    policy.first_token(items[0].id, clock.now())
    assert [policy.pick(item, view, None) for item in items[1:4]] == [0, None, None]
    clock.advance(0.2)
    policy.first_token(items[1].id, clock.now())
    assert [policy.pick(item, view, None) for item in items[2:6]] == [0, 0, None, None]


def test_a_burst_predicted_by_the_prior_does_not_get_a_replica_distrusted() -> None:
    """Requests sent before the first reply carry the prior's guess: their replies are not the
    fit's error, and a replica the fit then predicts well is trusted."""
    fit = EngineFit(EnginePrior.generic())
    x = fit.ttft_features(1000, 4)
    guess, fitted = fit.ttft.predict(x), fit.ttft.updates
    for _ in range(40):  # the burst: sent at once, answered at 20x the guess
        fit.observe_ttft(x, 20 * guess, guess, fitted)
    for _ in range(10):  # later requests, predicted by the fit as it then stood
        fit.observe_ttft(x, 20 * guess, fit.ttft.predict(x))
    assert not fit.distrusted
    assert fit.ttft.predict(x) == pytest.approx(20 * guess, rel=0.1)


def test_prompts_prefilled_during_a_decode_stretch_its_tpot() -> None:
    """A continuous batcher runs the prompts sent to it in the steps its decodes run in: a
    decode that shared its steps with many prompt tokens is slower, and the fit learns by how
    much per prompt token a second; a replica sent prompts faster is predicted slower."""
    fit = EngineFit(EnginePrior.generic())
    rng = random.Random(5)
    for _ in range(200):
        running, rate = rng.uniform(1, 8), rng.uniform(0, 4000)
        measured = (0.01 + 0.001 * running + 0.002 * rate / 1000) * rng.uniform(0.95, 1.05)
        x = fit.tpot_features(running, 1000 * running, rate)
        fit.observe_tpot(x, measured, fit.tpot.predict(x))
    assert fit.tpot.theta[3] == pytest.approx(0.002, rel=0.15)
    idle = fit.predict_tpot(4, 4000, 0.0)
    assert idle == pytest.approx(0.014, rel=0.15)
    # 3,000 prompt tokens a second add 6 ms to every token.
    assert fit.predict_tpot(4, 4000, 3000) == pytest.approx(idle + 0.006, rel=0.05)
    hostile = fit.predict_tpot(4, 4000, math.inf)
    assert math.isfinite(hostile) and hostile <= MAX_SECONDS + idle  # bounded on hostile rates


def test_a_fit_that_gives_the_step_to_the_prefill_still_predicts_the_tpot() -> None:
    """Replies that all came with the same prefill rate cannot tell the step from the
    prefill's term: whatever split the fit takes, a decode beside the same rate is predicted
    at what was measured (a factor of the step collapsed with it: on real vLLM a fit with a
    step of 0.05 ms predicted 0.1 ms a token where it took 20 ms)."""
    fit = EngineFit(EnginePrior.generic())
    fit.tpot.coef = (0.0, 0.0, 0.0, 0.02 / 6)  # the whole step taken for the prefill
    assert fit.predict_tpot(8, 8000, 6000) == pytest.approx(0.02, rel=0.01)
    learned = EngineFit(EnginePrior.generic())
    for _ in range(60):
        x = learned.tpot_features(8, 8000, 6000)
        learned.observe_tpot(x, 0.02, learned.tpot.predict(x))
    assert learned.predict_tpot(9, 9000, 6000) == pytest.approx(0.02, rel=0.1)


def test_the_prompt_tokens_a_replica_is_sent_are_a_rate_that_fades() -> None:
    load = EngineLoad()
    load.add(0.0, 5000, 6000)
    assert load.prefill_rate(0.0) == pytest.approx(500)  # averaged over 10 s
    assert load.prefill_rate(10.0) == pytest.approx(500 / math.e)
    load.prefilled(1.0, 5000)
    assert load.prefilled_total == 5000 and load.prefill_queue == 0
    assert load.prefill_rate(-5.0) == pytest.approx(500 * math.exp(-0.1))  # a clock set back


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 4000), st.floats(0.0, 0.5)), max_size=60)
)
def test_the_pick_s_columns_predict_as_each_replica_s_own_fit_and_load(
    events: list[tuple[int, int, float]],
) -> None:
    """A pick predicts every replica at once from columns the policy keeps beside the fits
    and the loads: after any sequence of sends, first tokens, progress, ends, drops and KV
    sizes, they give each replica's own ``predict_ttft`` and ``predict_tpot``."""
    policy, view = make_policy([EnginePrior.generic(s) for s in (1.0, 3.0, 0.5)], ttft=2, tpot=0.1)
    clock = view.clock
    assert isinstance(clock, ManualClock)
    sent: list[int | str] = []
    for kind, size, dt in events:
        clock.advance(dt)
        now = clock.now()
        if kind <= 1 or not sent:
            item = request(size, size / 4)
            if policy.pick(item, view, None) is not None:
                sent.append(item.id)
        elif kind == 2:
            policy.first_token(sent[0], now)
        elif kind == 3:
            policy.progress(sent[0], now, 8)
        elif kind == 4:
            policy.finished(sent.pop(0), now, max(2, size // 10))
        else:
            policy.set_kv_tokens(size % 3, size * 10)
            policy.dropped(sent.pop(), now)
        now = clock.now()
        table = policy._columns()
        for i, (fit, load) in enumerate(zip(policy.fits, policy.loads, strict=True)):
            ttft = max(1e-4, table.ttft_base[i] + table.per_token[i] * size)
            assert ttft == pytest.approx(fit.predict_ttft(load.prefill_queue + size, load.running))
            kv = load.kv + size
            decay = min(1.0, math.exp((table.at[i] - now) / 10.0))
            step = max(1e-4, table.step_base[i] + table.per_kv[i] * size)
            tpot = step + min(MAX_SECONDS, table.prefill[i] * decay)
            rate = load.prefill_rate(now)
            assert tpot == pytest.approx(fit.predict_tpot(load.running + 1, kv, rate))
            busy = load.running > 0
            widen = busy and policy.missed[i] != 0
            most = 2**fit.answers if fit.answers < 6 else policy.limit[i]
            full = fit.prior.guess and load.running >= most
            assert table.full[i] == full
            for errors, column in (
                (fit.ttft_errors, table.ttft_gate),
                (fit.tpot_errors, table.tpot_gate),
            ):
                stretch = errors.stretch() if widen else 1.0
                assert column[i] == (math.inf if full else stretch)
            cap = fit.kv_tokens
            assert table.kv_room[i] == (math.inf if cap is None or not busy else cap - load.kv)
