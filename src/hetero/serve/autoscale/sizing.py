"""How many replicas of each type a traffic needs: the serving planner (``hetero plan`` with a
model) asked again for the rate and the lengths the router observes.

Each autoscaler type is one planner option: a GPU at a tensor-parallel degree, at the GPU's
price, within its ``max_count``. The planner's capacities depend on the request lengths only,
so they are worked out once and again when the observed lengths have been sampled enough and
the last refit is older than ``refit_every`` calls; every call re-solves the program for the
observed rate (a few tens of ms). The answer sticks to the GPUs of the last one while a plan of
them costs at most ``stickiness`` more than the cheapest. Where the replies miss the SLO the
plan is asked for more than the observed rate, until they meet it (``_correct``): the planner's
model of a replica is corrected by what the replicas deliver.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hetero.errors import ConfigError, InfeasiblePlan
from hetero.plan.serving import ServingPlan, ServingPlanner
from hetero.plan.serving_spec import ServingPlanSpec
from hetero.serve.autoscale.policy import Traffic

__all__ = [
    "BOOST_DOWN",
    "BOOST_UP",
    "MAX_BOOST",
    "MIN_SAMPLES",
    "MISS_SIGNIFICANCE",
    "STICKINESS",
    "PlanSizer",
    "TypeOption",
    "beyond_chance",
    "with_lengths",
]

#: Observed requests needed before their lengths replace the spec's distributions.
MIN_SAMPLES = 200
#: How much dearer a plan of the GPUs already in use may be than the cheapest before the
#: fleet moves to other GPUs.
STICKINESS = 0.25
#: The correction of the plan's capacities by the SLO the replies meet (``PlanSizer._correct``).
#: Easing back slower (0.995 a decision) held more replicas (1.16x the static peak plan's cost
#: against 0.92x for the simulated day) for no fewer scale actions.
BOOST_UP, BOOST_DOWN, MAX_BOOST = 1.25, 0.97, 8.0
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
    last warm replica and each type's ``min_count``)."""

    def __init__(
        self,
        spec: ServingPlanSpec,
        types: Mapping[str, TypeOption],
        refit_every: int = 10,
        stickiness: float = STICKINESS,
    ) -> None:
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
        self._kept: set[tuple[str, int]] = set()  # the options of the last answer
        self.target = spec.slo.percentile / 100.0
        self.boost = 1.0  # the observed rate is planned for at this multiple

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
        rate = traffic.rate * self.boost
        try:
            plan = self.planner.plan(rate, explain=False)
        except InfeasiblePlan:
            return dict.fromkeys(self.types, 1_000_000)
        plan = self._sticky(plan, rate)
        counts = {(o.option.gpu, o.option.tensor_parallel): o.replicas for o in plan.options}
        self._kept = set(counts)
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
                self.boost = min(self.boost * BOOST_UP, MAX_BOOST)
        else:
            self.boost = max(1.0, self.boost * BOOST_DOWN)

    def _sticky(self, best: ServingPlan, rate: float) -> ServingPlan:
        """The plan of the types the last answer used, unless the cheapest costs less than it
        by more than ``stickiness``: a fleet is not rebuilt from other GPUs for a few per cent
        (each switch starts replicas and drains others)."""
        if not self._kept or {(o.option.gpu, o.option.tensor_parallel) for o in best.options} <= (
            self._kept
        ):
            return best
        try:
            kept = self.planner.plan(rate, explain=False, only=self._kept)
        except InfeasiblePlan:
            return best
        if kept.price_per_hour <= best.price_per_hour * (1 + self.stickiness):
            return kept
        return best
