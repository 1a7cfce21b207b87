"""How many replicas of each type a traffic needs: the serving planner (``hetero plan`` with a
model) asked again for the rate and the lengths the router observes.

Each autoscaler type is one planner option: a GPU at a tensor-parallel degree, at the GPU's
price, within its ``max_count``. The planner's capacities depend on the request lengths only,
so they are worked out once and again when the observed lengths have been sampled enough and
the last refit is older than ``refit_every`` calls; every call re-solves the program for the
observed rate (a few tens of ms), for a demand held within a band (``RATE_BAND``). Of the plans
that cost at most ``stickiness`` more than the cheapest, the answer is the one nearest the last
(``_sticky``). Where the replies miss the SLO the
plan is asked for more than the observed rate, until they meet it (``_correct``): the planner's
model of a replica is corrected by what the replicas deliver.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hetero._checks import is_number, is_positive
from hetero.errors import ConfigError, InfeasiblePlan
from hetero.plan.serving import ServingPlan, ServingPlanner
from hetero.plan.serving_spec import ServingPlanSpec
from hetero.serve.autoscale.policy import Traffic

__all__ = [
    "BOOST_DOWN",
    "BOOST_PERIOD",
    "BOOST_UP",
    "MAX_BOOST",
    "MIN_SAMPLES",
    "MISS_SIGNIFICANCE",
    "RATE_BAND",
    "STICKINESS",
    "PlanSizer",
    "TypeOption",
    "beyond_chance",
    "with_lengths",
]

#: Observed requests needed before their lengths replace the spec's distributions.
MIN_SAMPLES = 200
#: How much dearer than the cheapest a plan nearer the last answer may be (``_sticky``): at
#: 0.25 the simulated day's mix held more replicas of the dearer GPU for hours (0.754x the
#: static peak plan's cost against 0.725x at 0.15, the rest alike).
STICKINESS = 0.15
#: The demand (the observed rate times the boost) is planned for with this much headroom and
#: planned again only once it leaves ``[planned / (1 + 2 × band), planned]``: the program's
#: optimum jumps between mixes at nearby rates, and a plan for every wobble of the rate moved
#: the targets at every decision.
RATE_BAND = 0.05
#: The correction of the plan's capacities by the SLO the replies meet (``PlanSizer._correct``).
#: Easing back slower (0.995 a decision) held more replicas (1.16x the static peak plan's cost
#: against 0.92x for the simulated day) for no fewer scale actions; easing back faster (0.95)
#: cost more too (0.855x against 0.811x), and rising by 1.25 rather than 1.15 a decision
#: overshot bursts (0.811x against 0.733x, both within the SLO).
BOOST_UP, BOOST_DOWN, MAX_BOOST = 1.15, 0.97, 8.0
#: Seconds of decisions over which the boost moves by ``BOOST_UP`` or ``BOOST_DOWN`` (the
#: simulated day's decision interval, at which they were tuned): a decision every ``interval``
#: seconds moves it by their power ``interval / BOOST_PERIOD``. Moved by a whole step at each
#: decision, the real engines' autoscaler (a decision every 2 s, each judging the same minute
#: of replies) took one cold start's misses for a fleet 8x too small.
BOOST_PERIOD = 30.0
#: A window's misses raise the boost only when a fleet meeting the SLO's percentile would miss
#: that often with a chance under this.
MISS_SIGNIFICANCE = 0.05


def beyond_chance(attainment: float, judged: int | None, target: float) -> bool:
    """Whether ``judged`` requests of which a share ``attainment`` met the SLO missed more
    often than chance explains for a fleet that meets ``target``: the chance of at least
    that many misses, each request missing with probability ``1 - target``, is under
    ``MISS_SIGNIFICANCE``. Unknown ``judged``: every shortfall counts."""
    from scipy.stats import binom  # slow to import: only once a window misses

    if judged is None:
        return True
    misses = round((1.0 - attainment) * judged)
    return float(binom.sf(misses - 1, judged, 1.0 - target)) < MISS_SIGNIFICANCE


@dataclass(frozen=True, slots=True)
class TypeOption:
    """An autoscaler type as the planner knows it: a menu GPU at one tensor-parallel degree."""

    gpu: str
    tensor_parallel: int = 1


def with_lengths(spec: ServingPlanSpec, prompt: np.ndarray, output: np.ndarray) -> ServingPlanSpec:
    """``spec`` planning for requests of these lengths instead of its own."""
    copy = spec.model_copy()
    copy.__dict__["lengths"] = (prompt.astype(float), output.astype(float))
    return copy


class PlanSizer:
    """``sizer(traffic) -> {type: replicas}`` for :class:`ScalePolicy`, from ``spec``'s model,
    SLO and menu; ``types`` names each type's option (its GPU must be on the menu).

    A rate no fleet within the caps carries asks every type for as many as it may have (the
    policy clamps to ``max_count``); a rate of nothing asks for none (the policy keeps the
    last warm replica and each type's ``min_count``). ``interval``: the seconds between its
    calls (the correction moves at a pace per second, ``BOOST_PERIOD``). ``hold`` (the
    policy's ``down_after``): where the plan for the demand now uses other GPUs than the plan
    for the highest demand of the last ``hold`` seconds, the answer is the latter. A demand
    wobbling across the rate where the cheapest mix changes GPUs asked for each mix in turn,
    and the policy, judging a drain by each type's highest target over its wait, kept both
    (on the simulated day's peak an A100 pair and two H100 pairs, $15.54/h, where two H100
    pairs, $11.96/h, carry the top). A fall that keeps the GPUs is followed at once: holding
    the count too held a burst's boosted demand, and its replicas, for the whole wait."""

    def __init__(
        self,
        spec: ServingPlanSpec,
        types: Mapping[str, TypeOption],
        refit_every: int = 10,
        stickiness: float = STICKINESS,
        interval: float = BOOST_PERIOD,
        hold: float = 0.0,
    ) -> None:
        if not is_positive(interval):
            raise ConfigError([("interval", f"must be seconds > 0, got {interval!r}")])
        if not (is_number(hold) and hold >= 0):
            raise ConfigError([("hold", f"must be seconds >= 0, got {hold!r}")])
        menu = {d.model: d for d in spec.devices}
        problems = []
        for name, option in types.items():
            if option.gpu not in menu:
                problems.append(
                    (f"types.{name}.gpu", f"{option.gpu!r} is not on the menu: {', '.join(menu)}")
                )
        if problems:
            raise ConfigError(problems)
        degrees: dict[str, set[int]] = {}
        for option in types.values():
            degrees.setdefault(option.gpu, set()).add(option.tensor_parallel)
        devices = [
            menu[gpu].model_copy(update={"tensor_parallel": tuple(sorted(k))})
            for gpu, k in degrees.items()
        ]
        self.spec = spec.model_copy(update={"devices": devices})
        self.types = dict(types)
        self.refit_every = refit_every
        self.stickiness = stickiness
        self.planner = ServingPlanner(self.spec)
        self._calls = 0
        self._kept: dict[tuple[str, int], int] = {}  # the last answer: replicas by option
        self.target = spec.slo.percentile / 100.0
        self.boost = 1.0  # the observed rate is planned for at this multiple
        self._up = BOOST_UP ** (interval / BOOST_PERIOD)  # a call's share of the pace
        self._down = BOOST_DOWN ** (interval / BOOST_PERIOD)
        self.planned = 0.0  # the demand the last answer was planned for (RATE_BAND)
        # The demands of the calls within ``hold`` (this one included).
        self._demands: deque[float] = deque(maxlen=max(1, math.ceil(hold / interval) + 1))

    def __call__(self, traffic: Traffic) -> dict[str, int]:
        self._calls += 1
        if (
            len(traffic.prompt_samples) >= MIN_SAMPLES
            and len(traffic.output_samples) == len(traffic.prompt_samples)
            and self._calls % self.refit_every == 0
        ):
            lengths = with_lengths(
                self.spec, np.array(traffic.prompt_samples), np.array(traffic.output_samples)
            )
            self.planner = ServingPlanner(lengths)
        if not traffic.rate > 0 or not math.isfinite(traffic.rate):
            return dict.fromkeys(self.types, 0)
        self._correct(traffic.attainment, traffic.judged, traffic.settled)
        demand = traffic.rate * self.boost
        self._demands.append(demand)
        if demand > self.planned or demand < self.planned / (1 + 2 * RATE_BAND):
            self.planned = demand * (1 + RATE_BAND)
        try:
            plan = self._sticky(self.planner.plan(self.planned, explain=False), self.planned)
        except InfeasiblePlan:
            return dict.fromkeys(self.types, 1_000_000)
        top = max(self._demands) * (1 + RATE_BAND)
        if top > self.planned:
            with contextlib.suppress(InfeasiblePlan):  # a top beyond the caps: none held
                held = self._sticky(self.planner.plan(top, explain=False), top)
                if _mix(held) != _mix(plan):  # a change of GPUs: the top's mix, held
                    plan = held
        counts = _counts(plan)
        self._kept = counts
        return {
            name: counts.get((option.gpu, option.tensor_parallel), 0)
            for name, option in self.types.items()
        }

    def _correct(self, attainment: float | None, judged: int | None, settled: bool) -> None:
        """Learn how far the plan's capacities are off from what the fleet delivers: while the
        requests of the last window miss the SLO's percentile on a ``settled`` fleet (the one
        the last answer asked for, serving the whole window) by more than chance explains
        (``beyond_chance``), the plan is asked for a higher rate (× 1.25 a call, up to × 8),
        and while they meet it the boost eases back (× 0.97 a call, down to 1). A miss while
        replicas start, or just after, is held: it judges a fleet that is on its way, and
        compounding it grew a day's fleet to 1.35× the static peak plan's cost. So is a miss
        that chance explains: at night one request in a minute's 18 that misses read as a
        fleet too small, and each boost held replicas for hours. The plan is the roofline of a
        model; the replies are the truth."""
        if attainment is None:
            return
        if attainment < self.target:
            if settled and beyond_chance(attainment, judged, self.target):
                self.boost = min(self.boost * self._up, MAX_BOOST)
        else:
            self.boost = max(1.0, self.boost * self._down)

    def _sticky(self, best: ServingPlan, rate: float) -> ServingPlan:
        """Of the plans that cost at most ``stickiness`` more than the cheapest, the one nearest
        the last answer: the fewest replicas started and drained, then the cheapest. The
        candidates are the cheapest and the cheapest of the GPUs the last answer used: all of
        them, each less one, and each alone. A fleet is not rebuilt from other GPUs for a few
        per cent, nor its mix swung with the rate (each swing starts replicas of one GPU and
        drains the other's)."""
        if not self._kept:
            return best
        kept = sorted(self._kept)
        # Every set of them for two GPUs; for more, a solve per set would grow as 2^n: the
        # whole set, each less one GPU, and each alone (2n + 1 solves).
        subsets = {frozenset(kept)}
        subsets.update(frozenset(kept) - {option} for option in kept)
        subsets.update(frozenset([option]) for option in kept)
        candidates = [best]
        for subset in sorted(subsets - {frozenset()}, key=sorted):
            try:
                candidates.append(self.planner.plan(rate, explain=False, only=subset))
            except InfeasiblePlan:
                continue
        limit = best.price_per_hour * (1 + self.stickiness)
        last = self._kept

        def moves(plan: ServingPlan) -> int:
            counts = _counts(plan)
            return sum(abs(counts.get(k, 0) - last.get(k, 0)) for k in counts.keys() | last)

        return min(
            (p for p in candidates if p.price_per_hour <= limit),
            key=lambda p: (moves(p), p.price_per_hour),
        )


def _mix(plan: ServingPlan) -> frozenset[tuple[str, int]]:
    """The (GPU, tensor-parallel degree) options ``plan`` uses."""
    return frozenset(k for k, n in _counts(plan).items() if n > 0)


def _counts(plan: ServingPlan) -> dict[tuple[str, int], int]:
    """Replicas per (GPU, tensor-parallel degree) of ``plan``."""
    return {(o.option.gpu, o.option.tensor_parallel): o.replicas for o in plan.options}
