from __future__ import annotations

import itertools

import pytest

from hetero.errors import InvalidTransition
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


def test_bad_items_are_refused() -> None:
    with pytest.raises(ValueError, match=r"WorkItem\.cost must be >= 0, got -2"):
        WorkItem(cost=-2)
    with pytest.raises(ValueError, match=r"cost must be >= 0, got nan"):
        WorkItem(cost=float("nan"))
    with pytest.raises(ValueError, match=r"memory must be >= 0 bytes"):
        WorkItem(memory=-1)


def test_ids_are_unique_by_default_and_tier_key() -> None:
    a, b = WorkItem(), WorkItem()
    assert a.id != b.id
    assert WorkItem(cost=3.0).tier_key == 3.0
    assert WorkItem(cost=3.0, complexity=0.2).tier_key == 0.2
