"""The C kernel (``hetero.sched._kernel``) against what it replaces: FleetView's numpy
expressions (the same scores bit for bit, the same pick, the same size-class sums, and whole
simulations that place every item alike) and the engine fit's update in Python (the same
coefficients bit for bit)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetero.sched.engine_fit as engine_fit
import hetero.sched.policies.slo as slo_module
import hetero.sched.view as view_module
from hetero.sched.clock import ManualClock
from hetero.sched.engine_fit import MAX_SECONDS, EnginePrior, LinearFit
from hetero.sched.item import Tokens, WorkItem
from hetero.sched.perf import PerfModel
from hetero.sched.policies.slo import SloRouting
from hetero.sched.prefix import Prefix
from hetero.sched.registry import make_policy
from hetero.sched.view import SIZE_CLASSES, FleetView
from hetero.sim.engine import Simulator
from tests.fleets import make_devices

kernel = pytest.importorskip("hetero.sched._kernel", reason="the C kernel is not built here")

finite = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)


def two_views(
    speeds: list[float], slots: list[int], parallel: list[int]
) -> tuple[FleetView, FleetView]:
    """The same fleet twice: one view with the kernel, one without."""
    views = []
    for built in (kernel, None):
        devices = make_devices(speeds)
        view = FleetView(devices, PerfModel(devices), ManualClock(5.0), slots, parallel)
        view.kernel = built
        view.note_queued = view._note_queued_numpy if built is None else view.note_queued
        view.size_order = True
        views.append(view)
    return views[0], views[1]


@st.composite
def fleets(draw: Any) -> tuple[FleetView, FleetView, list[tuple[int, int, float]]]:
    """Two identical views in a random state (queues joined and left by random items), and
    the items queued at the end: (device, size class, cost)."""
    n = draw(st.integers(1, 9))
    speeds = draw(st.lists(st.floats(0.25, 8.0), min_size=n, max_size=n))
    slots = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    parallel = [draw(st.integers(1, s)) for s in slots]
    fast, slow = two_views(speeds, slots, parallel)
    costs = draw(st.lists(st.floats(0.0, 50.0), max_size=12))
    queued: list[tuple[int, int, float]] = []
    for cost in costs:
        device = draw(st.integers(0, n - 1))
        size_class = fast.size_class(cost)
        assert slow.size_class(cost) == size_class
        if queued and draw(st.booleans()):  # one that joined before leaves
            leaving = queued.pop(draw(st.integers(0, len(queued) - 1)))
            for view in (fast, slow):
                view.note_queued(*leaving, -1)
        queued.append((device, size_class, cost))
        for view in (fast, slow):
            view.note_queued(device, size_class, cost, 1)
    for view in (fast, slow):
        view.queued = len(queued)
    for name in ("running_work", "outstanding", "running_since"):
        values = draw(st.lists(finite, min_size=n, max_size=n))
        for view in (fast, slow):
            getattr(view, name)[:] = values
    running = np.array(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    waiting = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    for view in (fast, slow):
        view.running[:] = running
        view.in_flight[:] = running + waiting
    return fast, slow, queued


@settings(max_examples=300, deadline=None)
@given(
    fleet=fleets(),
    cost=st.one_of(st.just(0.0), st.floats(0.0, 60.0), st.sampled_from([1.0, 2.5, 7.0])),
    weight=st.sampled_from([0.0, 1.0, 2.0, 3.5]),
    remaining=st.booleans(),
    unusable=st.lists(st.booleans(), max_size=9),
    size_order=st.booleans(),
)
def test_scores_and_picks_match_numpy_bit_for_bit(
    fleet: tuple[FleetView, FleetView, list[tuple[int, int, float]]],
    cost: float,
    weight: float,
    remaining: bool,
    unusable: list[bool],
    size_order: bool,
) -> None:
    fast, slow, _ = fleet
    inv = 1.0 / fast.speed()
    for i, off in enumerate(unusable[: fast.n]):
        if off:
            inv[i] = np.inf
    fast.size_order = slow.size_order = size_order
    expected = slow.delay_score(cost, inv, weight, remaining)
    got = fast.delay_score(cost, inv, weight, remaining)
    np.testing.assert_array_equal(got, expected)  # NaN matches NaN, and nothing else differs
    assert fast.soonest(cost, inv, weight) == slow.soonest(cost, inv, weight)


@settings(max_examples=100, deadline=None)
@given(fleet=fleets(), later=st.lists(st.floats(0.0, 1e4), max_size=4))
def test_size_class_sums_match_numpy_and_what_is_queued(
    fleet: tuple[FleetView, FleetView, list[tuple[int, int, float]]], later: list[float]
) -> None:
    fast, slow, queued = fleet
    np.testing.assert_array_equal(fast.queued_below, slow.queued_below)
    np.testing.assert_array_equal(fast.queued_from, slow.queued_from)
    # Every row kept sums what is queued, those of classes first met later included: row k of
    # queued_below the work of classes below k, row k of queued_from the items of k and up.
    for cost in [0.0, *later]:
        fast.size_class(cost)
        lo, hi = fast.class_rows.tolist()
        for k in range(lo, hi + 1):
            below, count = np.zeros(fast.n), np.zeros(fast.n)
            for device, size_class, item_cost in queued:
                if size_class < k:
                    below[device] += item_cost
                if size_class >= k:
                    count[device] += 1
            np.testing.assert_allclose(fast.queued_below[k], below, atol=1e-9)
            np.testing.assert_array_equal(fast.queued_from[k], count)


def test_soonest_is_none_when_no_device_is_usable() -> None:
    fast, slow = two_views([1.0, 2.0], [1, 1], [1, 1])
    inv = np.full(2, np.inf)
    assert fast.soonest(1.0, inv, 2.0) is None
    assert slow.soonest(1.0, inv, 2.0) is None


def test_the_kernel_refuses_arrays_it_cannot_read() -> None:
    n = 3
    out, base, inv = np.empty(n), np.zeros(n), np.ones(n)
    sums = np.zeros((SIZE_CLASSES + 1, n, 2))
    flight = np.zeros(n, dtype=np.int64)
    with pytest.raises(
        ValueError, match=r"in_flight: expected .* int64 array of at least 3 values, got 2 "
    ):
        kernel.delay(out, base, inv, None, 0, None, None, flight[:2], 1.0, 1.0)
    with pytest.raises(ValueError, match=r"inv: expected .* float64 array .* of numpy.float32"):
        kernel.delay(out, base, inv.astype(np.float32), None, 0, None, None, flight, 1.0, 1.0)
    with pytest.raises(ValueError, match="out: expected a numpy float64 array, got bytes"):
        kernel.delay(b"abc", base, inv, None, 0, None, None, flight, 1.0, 1.0)
    with pytest.raises(ValueError, match=r"sums: expected .* of at least 396 values"):
        kernel.delay(out, base, inv, sums[:3], 65, None, None, flight, 1.0, 1.0)
    rows = np.array([1, SIZE_CLASSES], dtype=np.int64)
    with pytest.raises(ValueError, match="size_class 64 out of range: 3 devices, rows 1 to 64"):
        kernel.note_queued(sums, rows, 0, 64, 1.0, 1)
    with pytest.raises(ValueError, match=r"sums: expected an array of shape \(rows, devices, 2\)"):
        kernel.note_queued(sums[:, :, 0].copy(), rows, 0, 1, 1.0, 1)
    with pytest.raises(TypeError, match="takes 6 arguments"):
        kernel.note_queued(sums, rows)  # type: ignore[call-arg]


def _placements(
    monkeypatch: pytest.MonkeyPatch, built: Any, policy: str, order: str
) -> list[tuple[float, str, int | str, str]]:
    monkeypatch.setattr(view_module, "KERNEL", built)
    devices = make_devices([4.0, 2.0, 2.0, 1.0, 0.5])
    sim = Simulator(
        devices,
        make_policy(policy),
        slots=[3, 1, 1, 2, 1],
        dispatcher_options={"queue_order": order},
    )
    rng = np.random.default_rng(7)
    times = np.cumsum(rng.exponential(0.12, 600))
    costs = rng.lognormal(0.0, 1.0, 600)
    arrivals = [
        (float(t), WorkItem(cost=float(c), id=k))
        for k, (t, c) in enumerate(zip(times, costs, strict=True))
    ]
    log: list[tuple[float, str, int | str, str]] = []
    sim.run(iter(arrivals), log=log)
    return log


@pytest.mark.parametrize("policy", ["shortest_expected_delay", "tail_budget"])
@pytest.mark.parametrize("order", ["size", "fifo"])
def test_a_simulation_places_every_item_alike_with_and_without_the_kernel(
    monkeypatch: pytest.MonkeyPatch, policy: str, order: str
) -> None:
    with_kernel = _placements(monkeypatch, kernel, policy, order)
    assert any(what == "run" for _, what, _, _ in with_kernel)
    assert with_kernel == _placements(monkeypatch, None, policy, order)


# --- the engine fit's update (engine_fit.LinearFit) -------------------------------------------

replies = st.lists(
    st.tuples(
        st.lists(st.floats(0.0, 1e9), min_size=3, max_size=3),  # token_feature's range
        st.floats(1e-6, MAX_SECONDS),  # what EngineFit lets through to an update
    ),
    min_size=1,
    max_size=120,
)


def _fitted(step: Any, window: int, observed: list[Any], n: int) -> list[tuple[Any, ...]]:
    """The fit's state after each reply, its update done by ``step``."""
    fit = LinearFit((0.01, 0.002, 0.003, 0.001)[:n], (0.02, 0.004, 0.01, 0.002)[:n], window)
    states = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_fit, "_STEP", step)
        for features, measured in observed:
            fit.update([1.0, *features][:n], measured)
            states.append((fit.coef, fit._a, fit._b, fit._support, fit.updates))
    return states


@settings(max_examples=150, deadline=None)
@given(observed=replies, window=st.integers(1, 12), n=st.sampled_from([3, 4]))
def test_the_fit_updates_alike_bit_for_bit_with_and_without_the_kernel(
    observed: list[Any], window: int, n: int
) -> None:
    """The C update and engine_fit._step: the same coefficients, sums and supports after every
    reply, the window turning over many times, over the whole range of features and
    measurements that EngineFit lets through (extreme ones lose the numbers: both refuse the
    same updates)."""
    with_kernel = _fitted(kernel.fit_step, window, observed, n)
    without = _fitted(engine_fit._step, window, observed, n)
    assert repr(with_kernel) == repr(without)  # repr: NaN equal to NaN, -0.0 apart from 0.0


def test_the_fit_update_refuses_what_it_cannot_read() -> None:
    a, b = [[1.0, 0.0], [0.0, 1.0]], [0.5, 0.5]
    reply = ([1.0, 2.0], 0.1, 1.0)
    assert kernel.fit_step(a, b, None, None, None)[2] == [0.5, 0.5]
    with pytest.raises(ValueError, match="b: expected 1 to 4 values, got 5"):
        kernel.fit_step(a, [0.0] * 5, None, None, None)
    with pytest.raises(ValueError, match="a: expected 2 values, got 3"):
        kernel.fit_step([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], b, None, None, None)
    with pytest.raises(ValueError, match="add and drop: both a reply, or both None"):
        kernel.fit_step(a, b, reply, None, None)
    with pytest.raises(ValueError, match=r"drop: expected \(features, measured, weight\)"):
        kernel.fit_step(a, b, reply, ([1.0, 2.0], 0.1), None)
    with pytest.raises(ValueError, match="add: expected 2 values, got 1"):
        kernel.fit_step(a, b, ([1.0], 0.1, 1.0), reply, None)
    with pytest.raises(ValueError, match="first: expected increasing indices below 2, or None"):
        kernel.fit_step(a, b, None, None, (1, 0))
    with pytest.raises(ValueError, match="first: expected increasing indices below 2"):
        kernel.fit_step(a, b, None, None, (0, 1, 2, 3, 4))
    with pytest.raises(TypeError, match="must be real number, not str"):
        kernel.fit_step(a, ["x", 0.5], None, None, None)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        kernel.fit_step(a, b)  # type: ignore[call-arg]


# --- the slo strategy's pick (policies/slo.py) --------------------------------------------------


def _slo_run(
    kernel_on: bool, events: list[tuple[int, int, float]], prefixes: bool, derived: bool = False
) -> list[tuple[Any, ...]]:
    """A random run of sends, first tokens, paces, ends and KV sizes on a fleet of mixed
    speeds (some generic, some in their slow start), the pick and the targets derived from the
    fleet (where ``derived``) made by the kernel or by numpy; what each pick chose and
    predicted."""
    devices = make_devices([1.0] * 5)
    view = FleetView(devices, PerfModel(devices), ManualClock())
    policy = SloRouting() if derived else SloRouting(ttft=1.0, tpot=0.05)
    policy.bind(view)
    for i, speed in enumerate((4.0, 1.0, 0.3)):
        policy.set_prior(i, EnginePrior.generic(speed))
    log: list[tuple[Any, ...]] = []
    sent: list[int | str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slo_module, "_PICK", kernel.slo_pick if kernel_on else None)
        patch.setattr(slo_module, "_TARGETS", kernel.slo_targets if kernel_on else None)
        for k, (kind, size, dt) in enumerate(events):
            view.clock.advance(dt)  # type: ignore[attr-defined]
            now = view.clock.now()
            if kind <= 2 or not sent:
                blocks = tuple(range(size % 7)) if prefixes else ()
                prefix = Prefix(blocks=blocks, block_work=1.0) if blocks else None
                item = WorkItem(cost=1.0, id=k, tokens=Tokens(size, size / 8), prefix=prefix)
                i = policy.pick(item, view, None)
                flight = policy._flights.get(k)
                log.append(
                    (
                        k,
                        i,
                        None if flight is None else flight.predicted_ttft,
                        None if flight is None else flight.predicted_tpot,
                    )
                )
                if i is not None:
                    sent.append(k)
            elif kind == 3:
                policy.first_token(sent[0], now)
            elif kind == 4:
                policy.finished(sent.pop(0), now, max(2, size // 10))
            else:
                policy.set_kv_tokens(size % 5, size * 4)
    return log


@settings(max_examples=80, deadline=None)
@given(
    events=st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 6000), st.floats(0.0, 0.3)), max_size=150
    ),
    prefixes=st.booleans(),
    derived=st.booleans(),
)
def test_the_slo_pick_is_numpy_s_to_the_last_bit(
    events: list[tuple[int, int, float]], prefixes: bool, derived: bool
) -> None:
    """The kernel's pick and numpy's: the same replica, the same predicted TTFT and TPOT, the
    same requests held back, through fits that learn, KV caches that fill, prefixes matched,
    with the SLO given or derived from the fleet."""
    with_kernel = _slo_run(True, events, prefixes, derived)
    assert with_kernel == _slo_run(False, events, prefixes, derived)


_ODD = st.sampled_from([0.0, -1.0, 1e-300, 1e300, math.inf, -math.inf, math.nan])


_REFERENCE_COLUMNS = ("ref_ttft", "ref_per_token", "ref_base", "ref_per_request", "ref_per_kv")


@settings(max_examples=300, deadline=None)
@given(
    columns=st.lists(
        st.tuples(*(st.floats(0.0, 10.0) | _ODD for _ in _REFERENCE_COLUMNS)),
        min_size=0,
        max_size=9,
    ),
    size=st.tuples(st.floats(0.0, 1e12) | _ODD, st.floats(0.0, 1e12) | _ODD),
    data=st.data(),
)
def test_the_slo_targets_are_numpy_s_to_the_last_bit(
    columns: list[tuple[float, ...]], size: tuple[float, float], data: st.DataObject
) -> None:
    """The targets derived from the fleet (``SloRouting.slo``) in C and in numpy, on any
    columns and request sizes, hostile ones included, from any order the kernel kept: the
    same two numbers, within bounds."""
    n = len(columns)
    policy = SloRouting()
    policy._table = slo_module._Table(n)
    for k, name in enumerate(_REFERENCE_COLUMNS):
        setattr(policy._table, name, np.array([c[k] for c in columns], dtype=np.float64))
    kept = data.draw(st.permutations(range(n)))
    policy._table.ref_order = np.array(kept, dtype=np.int64)
    policy.fits = [None] * n  # type: ignore[list-item]  # only their count is read
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(slo_module, "_TARGETS", kernel.slo_targets)
        got = policy.slo(*size)
        patch.setattr(slo_module, "_TARGETS", None)
        with np.errstate(all="ignore"):  # inf × 0 among the hostile columns
            assert policy.slo(*size) == got
    ttft, tpot = got
    assert 1.0 <= ttft <= 10 * MAX_SECONDS and 0.02 <= tpot <= MAX_SECONDS


def test_the_slo_pick_refuses_what_it_cannot_read() -> None:
    n = 3
    cols = [np.zeros(n) for _ in range(9)]
    usable = np.ones(n, dtype=bool)
    assert kernel.slo_pick(*cols, usable, 10.0, 1.0, 0.05, 0.0, 0.0) == (0, 1e-4, 1e-4)
    with pytest.raises(ValueError, match="usable: expected a C-contiguous numpy bool array"):
        kernel.slo_pick(*cols, usable.astype(np.int64), 10.0, 1.0, 0.05, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"kv_room: expected .* at least 3 values, got 2"):
        kernel.slo_pick(*cols[:8], cols[8][:2], usable, 10.0, 1.0, 0.05, 0.0, 0.0)
    with pytest.raises(ValueError, match=r"uncached: expected .* at least 3 values"):
        kernel.slo_pick(*cols, usable, np.ones(1), 1.0, 0.05, 0.0, 0.0)
    with pytest.raises(TypeError, match="takes 15 arguments"):
        kernel.slo_pick(*cols)  # type: ignore[call-arg]


def test_the_slo_targets_refuse_what_they_cannot_read() -> None:
    cols = [np.ones(3) for _ in range(5)]
    # three replicas alike (step 1 + 2·batch s): 80% of their throughput at a step of 5 s
    assert kernel.slo_targets(*cols, np.arange(3), 3, 2.0, 1.0, 0.8) == pytest.approx((3.0, 5.0))
    assert kernel.slo_targets(*cols, np.arange(3), 0, 2.0, 1.0, 0.8) == (MAX_SECONDS, MAX_SECONDS)
    with pytest.raises(ValueError, match=r"per_kv: expected .* at least 3 values, got 2"):
        kernel.slo_targets(*cols[:4], np.ones(2), np.arange(3), 3, 2.0, 1.0, 0.8)
    with pytest.raises(ValueError, match="n: expected a count of replicas >= 0, got -1"):
        kernel.slo_targets(*cols, np.arange(3), -1, 2.0, 1.0, 0.8)
    with pytest.raises(TypeError, match="must be real number, not str"):
        kernel.slo_targets(*cols, np.arange(3), 3, "2", 1.0, 0.8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="order: expected a C-contiguous writable int64"):
        kernel.slo_targets(*cols, np.arange(3.0), 3, 2.0, 1.0, 0.8)
    with pytest.raises(TypeError, match="takes 10 arguments"):
        kernel.slo_targets(*cols)  # type: ignore[call-arg]


def test_the_slo_targets_keep_the_replicas_order_and_mend_it() -> None:
    """The replicas' order by lone step is kept between requests and sorted again where it is
    not (a request's KV tokens or a reference reordered them, or it is not theirs at all)."""
    base = np.array([0.03, 0.01, 0.02, np.nan])
    ones = np.ones(4) * 1e-3
    for order in ([0, 1, 2, 3], [3, 2, 1, 0], [1, 2, 0, 3], [7, 7, 7, 7], [1, 1, 2, 0]):
        kept = np.array(order, dtype=np.int64)
        got = kernel.slo_targets(base, ones, base, ones, ones * 0, kept, 4, 1.0, 1.0, 0.8)
        assert got == kernel.slo_targets(
            base, ones, base, ones, ones * 0, np.arange(4), 4, 1.0, 1.0, 0.8
        )
        assert kept.tolist() == [1, 2, 0, 3]  # by lone step, the one that does not count last
