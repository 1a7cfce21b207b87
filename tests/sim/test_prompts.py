"""Workloads whose prompts share prefixes: chats, single turns and hot prefixes."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise
from typing import Any

import pytest

from hetero.sched.item import WorkItem
from hetero.sim import arrivals as arrivals_module
from hetero.sim.workload import (
    ChatPrompts,
    arrival_rate,
    generate,
    mean_cost,
    parse_workload,
)

CHAT: dict[str, Any] = {
    "kind": "chat",
    "systems": 3,
    "system_blocks": 5,
    "turn_blocks": 2,
    "turns": 4,
}


def items(prompts: Any, requests: int = 3000, seed: int = 0, **fields: Any) -> list[WorkItem]:
    spec = parse_workload({"requests": requests, "prompts": prompts, "seed": seed, **fields})
    return [item for _, item in generate(spec, 100.0)]


def blocks(item: WorkItem) -> tuple[int, ...]:
    assert item.prefix is not None
    return item.prefix.blocks


def test_chat_turns_extend_their_conversation_after_a_shared_system_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(arrivals_module, "CHUNK", 256)  # conversations go on across chunks
    made = items({**CHAT, "sessions": 10, "block_work": 8}, size=1)
    by_session: dict[str, list[WorkItem]] = defaultdict(list)
    for item in made:
        assert item.prefix is not None and item.prefix.session is not None
        assert item.prefix.block_work == 8
        assert item.cost == len(blocks(item)) * 8 + 1  # its prefill, then its output
        by_session[item.prefix.session].append(item)
    heads = {blocks(item)[:5] for item in made}
    assert len(heads) == 3  # every prompt starts with one of the system prompts
    for turns in by_session.values():
        assert len(turns) <= 4
        for k, item in enumerate(turns):
            assert len(blocks(item)) == 5 + 2 * (k + 1)
            if k:
                before = blocks(turns[k - 1])
                assert blocks(item)[: len(before)] == before  # this turn extends the last
    # Conversations interleave: consecutive items mostly belong to different ones.
    sessions = [item.prefix.session for item in made if item.prefix is not None]
    assert sum(a != b for a, b in pairwise(sessions)) > len(made) // 2
    # Only the system prompts are shared: each conversation's turns are its own.
    owners: dict[int, str] = {}
    for session, turns in by_session.items():
        for b in blocks(turns[-1])[5:]:
            assert owners.setdefault(b, session) == session


def test_chat_mean_prompt_is_the_long_run_mean() -> None:
    made = items({**CHAT, "sessions": 20}, requests=20_000)
    mean_blocks = sum(len(blocks(item)) for item in made) / len(made)
    assert mean_blocks == pytest.approx(ChatPrompts.model_validate(CHAT).mean_blocks, rel=0.02)
    assert ChatPrompts.model_validate(CHAT).mean_blocks == 5 + 2 * 2.5


def test_single_turn_prompts_share_nothing() -> None:
    made = items({"kind": "single", "blocks": 7, "block_work": 3}, size=2)
    every = [b for item in made for b in blocks(item)]
    assert len(every) == 7 * len(made) == len(set(every))
    assert all(item.prefix is not None and item.prefix.session is None for item in made)
    assert {item.cost for item in made} == {7 * 3 + 2}


def test_hot_prefixes_start_most_prompts() -> None:
    made = items({"kind": "hot", "systems": 2, "system_blocks": 6, "turn_blocks": 3}, 10_000)
    heads = Counter(blocks(item)[:6] for item in made)
    (_, first), (_, second), (_, third) = heads.most_common(3)
    assert (first + second) / len(made) == pytest.approx(0.9, abs=0.02)
    assert first / len(made) == pytest.approx(0.45, abs=0.03)
    assert third == 1  # every other prompt has a head of its own
    tails = [blocks(item)[6:] for item in made]
    assert all(len(t) == 3 for t in tails) and len(set(tails)) == len(made)


@pytest.mark.parametrize(
    "prompts", [CHAT, {"kind": "single"}, {"kind": "hot", "systems": 2, "share": 0.5}]
)
def test_prompts_are_the_same_for_a_seed(prompts: dict[str, Any]) -> None:
    def drawn(seed: int) -> list[tuple[Any, ...]]:
        size = {"dist": "lognormal", "mean": 4}
        made = items(prompts, requests=500, seed=seed, size=size)
        return [(item.prefix, item.cost) for item in made]

    assert drawn(5) == drawn(5)
    assert drawn(5) != drawn(6)


def test_prompts_leave_arrival_times_and_outputs_alone() -> None:
    fields = {"requests": 2000, "arrivals": {"process": "poisson", "rate": 3}, "seed": 2}
    fields["size"] = {"dist": "lognormal", "mean": 4}
    plain = list(generate(parse_workload(fields), 1.0))
    chat = list(generate(parse_workload({**fields, "prompts": CHAT}), 1.0))
    assert [t for t, _ in plain] == [t for t, _ in chat]
    for (_, a), (_, b) in zip(plain, chat, strict=True):
        assert b.cost == pytest.approx(a.cost + len(blocks(b)) * 64)


def test_load_counts_the_whole_prefill() -> None:
    spec = parse_workload(
        {"arrivals": {"process": "poisson", "load": 0.5}, "size": 4, "prompts": CHAT}
    )
    assert mean_cost(spec) == 4 + 10 * 64
    assert arrival_rate(spec, 200.0) == pytest.approx(0.5 * 200 / (4 + 10 * 64))


def test_a_bare_kind_takes_the_defaults() -> None:
    spec = parse_workload({"prompts": "chat"})
    assert spec.prompts == ChatPrompts(kind="chat")
    assert (spec.prompts.systems, spec.prompts.turns, spec.prompts.block_work) == (20, 6, 64.0)
