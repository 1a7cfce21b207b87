from __future__ import annotations

import itertools

import numpy as np
import pytest

from hetero.errors import HeteroError, InvalidItem, InvalidTransition
from hetero.sched.item import TERMINAL, TRANSITIONS, CostModel, ItemRecord, ItemState, WorkItem


@pytest.mark.parametrize(("start", "finish"), list(itertools.product(ItemState, ItemState)))
def test_move_follows_exactly_the_transition_table(start: ItemState, finish: ItemState) -> None:
    rec = ItemRecord(WorkItem(id="x"), submitted=0.0, state=start, history=[start])
    if (start, finish) in TRANSITIONS:
        rec.move(finish)
        assert rec.state is finish and rec.history == [start, finish]
    else:
        with pytest.raises(InvalidTransition, match=f"{start.value} -> {finish.value}"):
            rec.move(finish)
        assert rec.state is start


def test_terminal_states_have_no_way_out() -> None:
    assert {s for s, _ in TRANSITIONS}.isdisjoint(TERMINAL)
    assert {ItemState.DONE, ItemState.FAILED, ItemState.CANCELLED} == TERMINAL


def test_llm_cost_model() -> None:
    assert WorkItem.llm(1000, 200).cost == pytest.approx(1000 * 0.5 + 200 * 1.0)
    weighted = WorkItem.llm(1000, 200, CostModel(prefill=0.1, decode=2.0), priority=3)
    assert weighted.cost == pytest.approx(100 + 400) and weighted.priority == 3
    with pytest.raises(ValueError, match="prompt_tokens=-1"):
        WorkItem.llm(-1, 5)
    with pytest.raises(ValueError, match=r"CostModel\.decode must be >= 0, got -1"):
        CostModel(decode=-1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cost": -2}, r"WorkItem\.cost must be a number from 0 to 1e\+30 work units, got -2"),
        ({"cost": float("nan")}, r"cost .* got nan"),
        ({"cost": float("inf")}, r"cost .* got inf"),
        ({"cost": 1e31}, r"cost .* got 1e\+31"),
        ({"cost": "3"}, r"cost .* got '3'"),
        ({"memory": -1}, r"memory must be an integer >= 0 bytes, got -1"),
        ({"memory": 1.5}, r"memory .* got 1\.5"),
        ({"priority": float("inf")}, r"priority must be an integer \(higher runs first\), got inf"),
        ({"priority": 1.5}, r"priority .* got 1\.5"),
        ({"deadline": float("inf")}, r"deadline must be a finite number or None, got inf"),
        ({"deadline": float("nan")}, r"deadline .* got nan"),
        ({"complexity": float("-inf")}, r"complexity .* got -inf"),
    ],
)
def test_bad_items_are_refused_when_built(fields: dict[str, object], message: str) -> None:
    # An item with an infinite cost or deadline used to be admitted and stay pending forever.
    with pytest.raises(InvalidItem, match=message) as info:
        WorkItem(**fields)  # type: ignore[arg-type]
    assert isinstance(info.value, HeteroError) and isinstance(info.value, ValueError)


def test_numpy_numbers_are_accepted() -> None:
    item = WorkItem(cost=np.float64(2.0), memory=np.int64(5), priority=np.int32(3), deadline=4)
    assert (item.cost, item.memory, item.priority) == (2.0, 5, 3)


def test_ids_are_unique_by_default_and_tier_key() -> None:
    a, b = WorkItem(), WorkItem()
    assert a.id != b.id
    assert WorkItem(cost=3.0).tier_key == 3.0
    assert WorkItem(cost=3.0, complexity=0.2).tier_key == 0.2
