"""The engine-faithful fleet simulator (``hetero.sim.engine_fleet``): one replica is its engine
model, faster replicas take more, membership (warm-up, drain) and the autoscaling hook, every
request ending once, and the SLO arithmetic."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.serve.engine_model import EngineModel, EngineRequest, EngineSpec, engine_spec
from hetero.serve.records import RouterOptions
from hetero.sim import engine_fleet
from hetero.sim.engine_fleet import (
    Add,
    Drain,
    EngineFleetSimulator,
    FleetResult,
    FleetSnapshot,
    ReplicaReport,
)
from hetero.testing import ManualClock

L4 = engine_spec("llama-3-8b", "L4")
H100 = engine_spec("llama-3-8b", "H100-SXM-80GB")
Arrivals = list[tuple[float, int, int]]


def poisson(rate: float, n: int, seed: int = 0, prompt: int = 800, output: int = 200) -> Arrivals:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.randint(16, prompt), rng.randint(1, output)))
    return out


def engine_alone(spec: EngineSpec, arrivals: Arrivals) -> list[EngineRequest]:
    """The engine model driven by itself: each request submitted as it arrives, the next step
    scheduled as the last one ends (requests arrived by then join it)."""
    clock = ManualClock()
    model = EngineModel(spec, clock.now)
    requests, step, i = [], None, 0
    while i < len(arrivals) or step is not None:
        if i < len(arrivals) and (step is None or arrivals[i][0] <= step.end):
            at, prompt, output = arrivals[i]
            clock.set(at)
            i += 1
            requests.append(model.submit(EngineRequest(prompt, output)))
            if step is None:
                step = model.step()
        else:
            assert step is not None
            clock.set(step.end)
            step = model.step()
    return requests


def test_one_replica_gives_its_engine_models_ttft_and_tpot() -> None:
    arrivals = poisson(6.0, 400, seed=1)
    result = EngineFleetSimulator([("h100", H100)], capacity="engine").run(arrivals)
    alone = engine_alone(H100, arrivals)
    assert result.done.all()
    first = [r.first_token_at for r in alone]
    finished = [r.finished_at for r in alone]
    ttft = [f - r.arrival for f, r in zip(first, alone, strict=True) if f is not None]
    latency = [f - r.arrival for f, r in zip(finished, alone, strict=True) if f is not None]
    assert result.ttft.tolist() == ttft and len(ttft) == 400
    assert result.latency.tolist() == latency and len(latency) == 400
    tpot = [
        (e - f) / max(r.output_tokens - 1, 1)
        for f, e, r in zip(first, finished, alone, strict=True)
        if f is not None and e is not None
    ]
    assert result.tpot.tolist() == tpot
    # Batching happened: this is not one request at a time.
    in_flight = [
        sum(1 for r, e in zip(alone, latency, strict=True) if r.arrival <= t < r.arrival + e)
        for t, _, _ in arrivals
    ]
    assert max(in_flight) > 4
    (replica,) = result.replicas
    assert replica.served == 400 and replica.steps > 0
    assert 0 < replica.utilisation <= 1


def test_the_faster_replica_takes_more_requests() -> None:
    arrivals = poisson(8.0, 600, seed=2)
    result = EngineFleetSimulator([("l4", L4), ("h100", H100)]).run(arrivals)
    assert result.done.all()
    l4, h100 = result.replicas
    assert h100.served > l4.served
    assert l4.served + h100.served == 600
    assert np.bincount(result.replica, minlength=2).tolist() == [l4.served, h100.served]


def test_without_a_router_cap_every_request_goes_to_its_engine_as_it_arrives() -> None:
    """``capacity="none"``: as sglang-router and vllm-router, the router holds nothing back;
    the engine queues what it cannot run. With the engine's cap the router holds the rest."""
    small = engine_spec("llama-3-8b", "L4", max_num_seqs=4)
    burst = [(0.001 * k, 200, 50) for k in range(40)]
    options = RouterOptions(strategy="round_robin")
    free = EngineFleetSimulator([("a", small), ("b", small)], options=options, capacity="none")
    result = free.run(burst)
    assert result.done.all()
    assert result.started.tolist() == result.arrival.tolist()
    assert result.replica.tolist() == [k % 2 for k in range(40)]
    capped = EngineFleetSimulator([("a", small), ("b", small)], options=options, capacity="engine")
    held = capped.run(burst)
    assert held.done.all() and (held.started > held.arrival).sum() > 20


def test_prompts_give_the_policy_their_prefixes_and_the_engines_their_cached_blocks() -> None:
    """Four conversations, each turn its history again plus a new message: with their
    prompts a prefix-aware router keeps each conversation where its prefix is cached and the
    engines find it there; without them nothing is shared."""
    from hetero.sched.prefix import prefix_blocks
    from hetero.sim.engine_fleet import Prompt

    rng = random.Random(3)
    history = {c: "".join(rng.choice("abcdefgh ") for _ in range(3000)) for c in range(4)}
    arrivals, prompts = [], []
    for k in range(80):
        c = k % 4
        history[c] += "".join(rng.choice("abcdefgh ") for _ in range(200))
        text = history[c]
        tokens = len(text) // 4
        arrivals.append((0.5 * k, tokens, 20))
        prompts.append(Prompt(text, f"chat{c}", prefix_blocks(text, 64, limit=tokens // 16)))
    options = RouterOptions(strategy="prefix_affinity")
    fleet = [("a", L4), ("b", L4)]
    sim = EngineFleetSimulator(fleet, options=options)
    result = sim.run(arrivals, prompts=prompts)
    assert result.done.all()
    for c in range(4):  # each conversation stays where its prefix is cached
        turns = result.replica[c::4].tolist()
        assert max(turns.count(0), turns.count(1)) >= 0.8 * len(turns)
    hits = sum(r.prefix_hits for r in result.replicas)
    assert hits / sum(r.prefix_queries for r in result.replicas) > 0.7
    bare = EngineFleetSimulator(fleet, options=options).run(arrivals)
    assert sum(r.prefix_hits for r in bare.replicas) == 0


def test_a_replica_added_takes_requests_once_warm_and_is_billed_from_the_ask() -> None:
    sim = EngineFleetSimulator([("l4", L4)])
    sim.add(10.0, "h100", H100, warm_after=30.0)
    result = sim.run(poisson(4.0, 400, seed=3))
    h100 = result.replicas[1]
    assert (h100.asked_at, h100.joined_at) == (10.0, 40.0)
    assert h100.served > 0
    on_h100 = result.replica == 1
    assert (result.started[on_h100] >= 40.0).all()
    assert (result.started[result.arrival >= 40.0 + 5] >= 40.0).all()
    assert h100.billed_seconds == pytest.approx(result.end - 10.0)
    assert result.replica_seconds() == {
        "L4": pytest.approx(result.end),
        "H100-SXM-80GB": pytest.approx(result.end - 10.0),
    }


def test_a_drained_replica_finishes_what_it_holds_then_leaves() -> None:
    options = RouterOptions(strategy="round_robin")  # so that both are busy
    sim = EngineFleetSimulator([("a", H100), ("b", H100)], options=options, capacity="engine")
    sim.drain(20.0, "b")
    result = sim.run(poisson(6.0, 300, seed=4))
    assert result.done.all()
    on_b = result.replica == 1
    assert on_b.any()
    assert (result.started[on_b] <= 20.0).all()
    assert (result.finished[on_b] > 20.0).any()  # it held some when drained
    b = result.replicas[1]
    assert b.left_at == result.finished[on_b].max()
    assert result.replicas[0].left_at == result.end
    assert result.replica_seconds()["H100-SXM-80GB"] == pytest.approx(result.end + b.left_at)


def test_a_replica_drained_while_warming_never_joins() -> None:
    sim = EngineFleetSimulator([("a", H100)])
    sim.add(1.0, "b", H100, warm_after=60.0)
    sim.drain(5.0, "b")
    result = sim.run(poisson(2.0, 50, seed=5))
    b = result.replicas[1]
    assert b.joined_at is None and b.served == 0
    assert (b.asked_at, b.left_at, b.billed_seconds) == (1.0, 5.0, 4.0)


def test_requests_wait_for_a_warming_replica_when_the_last_one_is_drained() -> None:
    sim = EngineFleetSimulator([("a", L4)])
    sim.add(5.0, "b", H100, warm_after=20.0)
    sim.drain(5.0, "a")
    result = sim.run(poisson(2.0, 60, seed=6))
    assert result.done.all()
    after = result.arrival > 5.0
    assert (result.replica[after] == 1).all()
    assert (result.started[after] >= 25.0).all()


def test_a_request_no_replica_holds_fails_with_its_reason() -> None:
    sim = EngineFleetSimulator([("l4", L4)])
    result = sim.run([(0.0, 100, 10), (1.0, L4.max_context, 10), (2.0, 100, 10)])
    assert result.status.tolist() == [1, 2, 1]
    assert "longer than any replica holds" in result.failures[1]


def test_with_every_replica_gone_requests_fail_with_a_reason() -> None:
    sim = EngineFleetSimulator([("a", H100)])
    sim.drain(1.0, "a")
    result = sim.run([(0.5, 100, 50), (2.0, 100, 10)])
    assert result.status.tolist() == [1, 2]
    assert result.failures == {1: "no replica in service"}


def test_requests_past_the_routers_timeout_or_queue_end_failed_and_leave_their_engine() -> None:
    options = RouterOptions(timeout=3.0, queue_size=20)
    sim = EngineFleetSimulator([("l4", L4)], options=options)
    result = sim.run(poisson(20.0, 300, seed=11, output=30))
    reasons = result.failure_reasons()
    assert result.done.any()
    assert reasons["rejected: the router's queue is full"] > 0
    assert any(reason.startswith("timed out after 3s") for reason in reasons)
    assert int(result.done.sum()) + sum(reasons.values()) == 300
    assert (result.latency[result.done] <= 3.0 + 1e-9).all()
    (l4,) = result.replicas
    assert l4.served == int(result.done.sum())


def test_a_controller_is_called_each_interval_and_scales_the_fleet() -> None:
    seen: list[FleetSnapshot] = []

    def controller(now: float, view: FleetSnapshot) -> list[Add | Drain]:
        seen.append(view)
        names = {r.name for r in view.replicas}
        if view.arrival_rate > 3 and "h100" not in names:
            return [Add("h100", H100, warm_after=5.0)]
        return []

    calm = poisson(1.0, 30, seed=7)
    busy = [(30.0 + t / 4, p, o) for t, p, o in poisson(1.0, 400, seed=8)]
    sim = EngineFleetSimulator([("l4", L4)])
    result = sim.run(calm + busy, interval=10.0, on_tick=controller, slo=(2.0, 0.2))
    assert [v.now for v in seen[:4]] == [10.0, 20.0, 30.0, 40.0]
    assert sum(v.arrivals for v in seen) <= len(calm + busy)
    first_busy = next(v for v in seen if v.arrival_rate > 3)
    h100 = result.replicas[1]
    assert h100.asked_at == first_busy.now and h100.joined_at == first_busy.now + 5.0
    assert all(v.met <= v.finished for v in seen)
    assert sum(v.finished for v in seen) <= len(calm + busy)
    series = result.series(slo=(2.0, 0.2))
    assert series.t[:3].tolist() == [0.0, 10.0, 20.0]
    assert series.replicas["L4"][0] == 1.0
    assert series.replicas["H100-SXM-80GB"][0] == 0.0
    k = int(h100.joined_at // 10) + 1  # the first interval it was there throughout
    assert series.replicas["H100-SXM-80GB"][k] == 1.0
    assert series.arrivals_per_s.sum() * 10.0 == len(calm + busy)


def test_a_run_is_deterministic() -> None:
    def once() -> FleetResult:
        sim = EngineFleetSimulator([("l4", L4), ("h100", H100)])
        sim.add(5.0, "l4b", L4, warm_after=2.0)
        sim.drain(20.0, "l4")
        return sim.run(poisson(5.0, 200, seed=9))

    a, b = once(), once()
    for name in ("arrival", "started", "first_token", "finished", "replica", "status"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert a.replicas == b.replicas


def test_the_slo_strategy_is_told_what_the_router_tells_it() -> None:
    options = RouterOptions(strategy="slo", slo_ttft=1.0, slo_tpot=0.05)
    sim = EngineFleetSimulator([("l4", L4), ("h100", H100)], options=options)
    result = sim.run(poisson(4.0, 150, seed=10))
    assert result.done.all()
    assert sim.slo is not None and sim.slo.in_flight() == 0
    assert sim.slo.fits[1].ttft.updates > 0


def test_under_slo_a_replica_known_by_its_url_alone_is_probed_as_it_joins() -> None:
    """As the router (``engine_probe``): one short request alone, whose times the fit starts
    from; a replica declared with its engine starts from that instead."""
    from hetero.serve.engine_probe import OUTPUT_TOKENS, PROMPT_TOKENS

    (probe,) = engine_alone(L4, [(0.0, PROMPT_TOKENS, OUTPUT_TOKENS)])
    assert probe.first_token_at is not None
    ttft = probe.first_token_at - probe.arrival
    options = RouterOptions(strategy="slo", slo_ttft=1.0, slo_tpot=0.1)
    probed = EngineFleetSimulator([("l4", L4)], options=options)
    assert probed.slo is not None
    assert probed.slo.fits[0].predict_ttft(PROMPT_TOKENS, 0) == pytest.approx(ttft, rel=1e-9)
    declared = EngineFleetSimulator([("l4", L4)], options=options, priors="engine")
    assert declared.slo is not None
    assert declared.slo.fits[0].predict_ttft(PROMPT_TOKENS, 0) != pytest.approx(ttft, rel=0.01)


def test_bad_arguments_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="one replica at least"):
        EngineFleetSimulator([])
    with pytest.raises(ConfigError, match="capacity"):
        EngineFleetSimulator([("a", L4)], capacity="guess")  # type: ignore[arg-type]
    sim = EngineFleetSimulator([("a", L4)])
    with pytest.raises(ConfigError, match="unique"):
        sim.add(1.0, "a", L4)
    with pytest.raises(ConfigError, match="no replica 'z'"):
        sim.drain(1.0, "z")
    sim.add(5.0, "b", L4)
    with pytest.raises(ConfigError, match="drain it later"):
        sim.drain(1.0, "b")
    with pytest.raises(ConfigError, match="time order"):
        sim.run([(2.0, 10, 10), (1.0, 10, 10)])
    with pytest.raises(ConfigError, match=r"prompts.*Prompt objects, got 'hello'"):
        EngineFleetSimulator([("a", L4)]).run([(0.0, 10, 10)], prompts=["hello"])  # type: ignore[list-item]


def result_of(
    arrival: list[float], first: list[float], finished: list[float], output: list[int]
) -> FleetResult:
    n = len(arrival)
    status = [2 if math.isnan(f) else 1 for f in finished]
    return FleetResult(
        arrival=np.array(arrival),
        prompt_tokens=np.full(n, 10),
        output_tokens=np.array(output),
        started=np.array(arrival),
        first_token=np.array(first),
        finished=np.array(finished),
        replica=np.array([-1 if s == 2 else 0 for s in status]),
        status=np.array(status, dtype=np.uint8),
        failures={i: "x" for i, s in enumerate(status) if s == 2},
        replicas=(ReplicaReport("a", "L4", 0.0, 0.0, 4.0, 4, 10, 2.0, 0),),
        end=4.0,
        interval=2.0,
        events=0,
        wall_seconds=1.0,
    )


def test_attainment_counts_a_request_met_when_both_ttft_and_tpot_hold() -> None:
    nan = math.nan
    result = result_of(
        arrival=[0.0, 1.0, 2.0, 2.5, 3.0],
        first=[0.5, 3.0, 2.2, nan, 3.1],
        finished=[1.5, 3.5, 4.2, nan, 3.1],
        output=[11, 6, 5, 100, 1],
    )
    # ttft 0.5, 2.0, 0.2, -, 0.1; tpot 0.1, 0.1, 0.5, -, 0 (one token).
    assert result.ttft[[0, 1, 2, 4]].tolist() == pytest.approx([0.5, 2.0, 0.2, 0.1])
    assert result.tpot[[0, 1, 2, 4]].tolist() == pytest.approx([0.1, 0.1, 0.5, 0.0])
    assert result.met(1.0, 0.2).tolist() == [True, False, False, False, True]
    assert result.attainment(1.0, 0.2) == pytest.approx(2 / 5)  # the failed one misses
    assert result.attainment(2.0, 0.5) == pytest.approx(4 / 5)
    assert result.percentiles("ttft", (50,)) == {50: pytest.approx(0.35)}
    series = result.series(slo=(1.0, 0.2))
    assert series.t.tolist() == [0.0, 2.0]
    assert series.arrivals_per_s.tolist() == [1.0, 1.5]
    assert series.attainment.tolist() == pytest.approx([1 / 2, 1 / 3])
    assert series.replicas == {"L4": pytest.approx(np.array([1.0, 1.0]))}
    assert result.replicas[0].utilisation == 0.5
    assert result.failure_reasons() == {"x": 1}


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Arrivals, list[tuple[float, str, float]], dict[str, float]]:
    gaps = draw(st.lists(st.floats(0.0, 2.0), min_size=1, max_size=40))
    times = np.cumsum(gaps).tolist()
    sizes = draw(
        st.lists(
            st.tuples(st.integers(1, 300), st.integers(1, 40)),
            min_size=len(times),
            max_size=len(times),
        )
    )
    arrivals = [(t, p, o) for t, (p, o) in zip(times, sizes, strict=True)]
    horizon = times[-1] + 5.0
    adds = [
        (draw(st.floats(0.0, horizon)), f"r{i}", draw(st.floats(0.0, 5.0)))
        for i in range(draw(st.integers(0, 3)))
    ]
    asked = {"a": 0.0, "b": 0.0} | {name: at for at, name, _ in adds}
    drains = {
        name: draw(st.floats(at, at + horizon)) for name, at in asked.items() if draw(st.booleans())
    }
    return arrivals, adds, drains


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    scenarios(),
    st.sampled_from(["learned", "engine"]),
    st.sampled_from([600.0, 1.5]),
    st.sampled_from([1000, 3]),
)
def test_every_request_ends_exactly_once_whatever_joins_and_leaves(
    scenario: tuple[Arrivals, list[tuple[float, str, float]], dict[str, float]],
    capacity: str,
    timeout: float,
    queue_size: int,
) -> None:
    arrivals, adds, drains = scenario
    options = RouterOptions(timeout=timeout, queue_size=queue_size)
    sim = EngineFleetSimulator(
        [("a", L4), ("b", H100)],
        options=options,
        capacity=capacity,  # type: ignore[arg-type]
    )
    for at, name, warm in adds:
        sim.add(at, name, H100 if name.endswith("0") else L4, warm_after=warm)
    for name, at in drains.items():
        sim.drain(at, name)
    result = sim.run(arrivals)  # a request ending twice raises
    n = len(arrivals)
    assert result.requests == n
    assert set(result.status.tolist()) <= {1, 2}
    failed = set(np.flatnonzero(result.status == 2).tolist())
    assert set(result.failures) == failed
    done = result.done
    assert int(done.sum()) + len(failed) == n
    assert sum(r.served for r in result.replicas) == int(done.sum())
    assert (result.replica[done] >= 0).all() and (result.replica[~done] == -1).all()
    assert (result.started[done] <= result.first_token[done]).all()
    assert (result.first_token[done] <= result.finished[done]).all()
    for i, replica in enumerate(result.replicas):
        on = result.replica == i
        if replica.joined_at is None:
            assert not on.any()
            continue
        assert (result.started[on] >= replica.joined_at).all()
        assert (result.finished[on] <= replica.left_at).all()
        if replica.name in drains:
            assert (result.started[on] <= drains[replica.name]).all()
            # It leaves once drained and done, or (the last one in service) when another
            # replica comes warm to take the waiting requests. A request that timed out while
            # it ran there (not counted on it) holds it until that step ends: well under 0.5 s.
            joins = [r.joined_at for r in result.replicas if r.joined_at is not None]
            timed_out = [arrivals[k][0] + timeout + 0.5 for k in failed]
            ends = [drains[replica.name], result.finished[on].max(initial=0), *timed_out]
            assert replica.left_at <= max(ends) or replica.left_at in joins


def test_the_public_names_are_exported() -> None:
    for name in engine_fleet.__all__:
        assert hasattr(engine_fleet, name), name
