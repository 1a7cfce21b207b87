"""``tail_budget``: where it sends the smaller and the larger items, its budget, and its options.

A fast device d0 (speed 2) and a slow one d1 (speed 1), warmed up with 50 items of cost 0.5 and
50 of cost 1: the split is then the median cost 0.75, the tail cost the 99th percentile, 1, and
with ``budget_factor`` 2.5 the budget is 2.5 × 1 / 2 = 1.25 s.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.config import SchedulerConfig
from hetero.errors import ConfigError
from hetero.sched import Dispatcher, ManualClock, WorkItem
from hetero.sched.policies.budget import TailBudget
from hetero.sched.registry import make_policy
from tests.fleets import make_devices


def warmed(**options: object) -> tuple[Dispatcher, TailBudget, ManualClock]:
    clock = ManualClock()
    policy = TailBudget(budget_factor=2.5, **options)  # type: ignore[arg-type]
    d = Dispatcher(make_devices([2.0, 1.0]), policy, clock, stealing=False)
    for k in range(100):
        d.submit(WorkItem(cost=0.5 if k % 2 else 1.0, id=f"warm{k}"))
        d.complete(f"warm{k}")
    return d, policy, clock


def device_of(d: Dispatcher, item_id: str) -> str:
    return d.view.ids[d.records[item_id].device]


def test_split_and_budget_come_from_recent_costs() -> None:
    d, policy, _ = warmed()
    assert policy.split_cost == pytest.approx(0.75)
    assert policy.tail_cost == pytest.approx(1.0)
    assert policy.budget_for(WorkItem(cost=1), d.view) == pytest.approx(1.25)
    explicit = TailBudget(budget=3.0)
    assert explicit.budget_for(WorkItem(cost=1), d.view) == 3.0


def test_a_larger_item_takes_the_slowest_device_that_finishes_it_within_the_budget() -> None:
    d, _, _ = warmed()
    d.submit(WorkItem(cost=0.2, id="running"))  # on d0 for 0.1 s
    d.submit(WorkItem(cost=1, id="larger"))  # d0 would finish it in 0.6 s, d1 in 1 s <= 1.25 s
    assert device_of(d, "larger") == "d1"
    # shortest_expected_delay, on the same fleet and load, takes the sooner d0
    sed = Dispatcher(
        make_devices([2.0, 1.0]), make_policy("shortest_expected_delay"), ManualClock()
    )
    sed.submit(WorkItem(cost=0.2, id="running"))
    sed.submit(WorkItem(cost=1, id="larger"))
    assert device_of(sed, "larger") == "d0"
    d.validate_state()


def test_a_smaller_item_goes_where_it_finishes_soonest() -> None:
    d, _, _ = warmed()
    d.submit(WorkItem(cost=0.2, id="running"))
    d.submit(WorkItem(cost=0.5, id="smaller"))  # below the split: d0 (0.35 s) beats d1 (0.5 s)
    assert device_of(d, "smaller") == "d0"


def test_an_item_of_a_batch_goes_where_it_finishes_soonest_whatever_its_size() -> None:
    """A map's or a graph's item counts for the batch's makespan: sparing d0 for it would leave
    d0 idle at the batch's end."""
    d, _, _ = warmed()
    d.submit(WorkItem(cost=0.2, id="running"))
    d.submit(WorkItem(cost=1, id="larger", batch=True))  # d0 0.6 s beats d1 1 s
    assert device_of(d, "larger") == "d0"
    d.validate_state()


def test_a_larger_item_takes_its_soonest_device_when_that_one_is_idle() -> None:
    d, _, _ = warmed()
    d.submit(WorkItem(cost=1, id="larger"))  # d0 idle: it starts there at once
    assert device_of(d, "larger") == "d0"


def test_an_item_no_device_finishes_within_the_budget_goes_where_it_finishes_soonest() -> None:
    d, _, _ = warmed()
    d.submit(WorkItem(cost=0.2, id="running"))
    d.submit(WorkItem(cost=4, id="huge"))  # d0 2.1 s, d1 4 s: neither within 1.25 s
    assert device_of(d, "huge") == "d0"


def test_it_counts_what_is_left_of_the_running_items() -> None:
    d, _, clock = warmed()
    d.submit(WorkItem(cost=3, id="running"))  # 1.5 s on d0
    clock.advance(1.0)  # 1 unit of it is left
    d.submit(WorkItem(cost=2, id="larger"))
    # d0: (1 + 2) / 2 = 1.5 s; d1: 2 s. Neither is within the budget, so the sooner one; counting
    # the running item whole, d0 would have looked like (3 + 2) / 2 = 2.5 s and lost to d1.
    assert device_of(d, "larger") == "d0"


@settings(max_examples=100, deadline=None)
@given(
    speeds=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=12),
    costs=st.lists(st.floats(0.0, 100.0), min_size=65, max_size=120),
    data=st.data(),
)
def test_every_item_ends_on_an_allowed_device_once_warmed_up(
    speeds: list[float], costs: list[float], data: st.DataObject
) -> None:
    """Whatever the fleet and the costs (zeros too), past the warm-up: no item is left pending,
    every one ends done, and the dispatcher's books balance at every step."""
    clock = ManualClock()
    d = Dispatcher(make_devices(speeds), TailBudget(), clock, max_queue_size=1000)
    for k, cost in enumerate(costs):
        d.submit(WorkItem(cost=cost, id=k))
        if data.draw(st.booleans()):
            clock.advance(data.draw(st.floats(0.0, 5.0)))
            running = [r.item.id for rs in d._running for r in rs]
            if running:
                d.complete(data.draw(st.sampled_from(running)))
        d.validate_state()
    for _ in costs:  # each round ends at least one item, or nothing is left
        clock.advance(1.0)
        for rec in [r for rs in d._running for r in rs]:
            d.complete(rec.item.id)
    assert d.active == 0
    assert all(d.state_of(k).value == "done" for k in range(len(costs)))
    d.validate_state()


def test_until_warmed_up_it_places_as_shortest_expected_delay() -> None:
    clock = ManualClock()
    policy = TailBudget(budget_factor=2.5)
    d = Dispatcher(make_devices([2.0, 1.0]), policy, clock, stealing=False)
    d.submit(WorkItem(cost=0.2, id="running"))
    d.submit(WorkItem(cost=1, id="larger"))
    assert policy.split_cost == float("inf")
    assert device_of(d, "larger") == "d0"


def test_it_is_the_default_strategy() -> None:
    assert SchedulerConfig().strategy == "tail_budget"
    assert isinstance(make_policy(SchedulerConfig().strategy), TailBudget)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overtake_weight": -1}, "option overtake_weight=-1; allowed: a number >= 0"),
        ({"budget": 0}, "option budget=0; allowed: seconds > 0, or None"),
        ({"budget": float("inf")}, "option budget=inf; allowed: seconds > 0, or None"),
        ({"budget_factor": 0}, "option budget_factor=0; allowed: a number > 0"),
        ({"tail_quantile": 1.0}, "option tail_quantile=1.0; allowed: a number between 0 and 1"),
        ({"split_quantile": 0}, "option split_quantile=0; allowed: a number between 0 and 1"),
        ({"window": 10}, "option window=10; allowed: an integer >= 64"),
    ],
)
def test_bad_options_name_the_option_and_what_is_allowed(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TailBudget(**options)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message.split(";")[0]):
        make_policy("tail_budget", options)
