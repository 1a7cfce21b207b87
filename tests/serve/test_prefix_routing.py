"""``prefix_affinity`` behind the real router: mock replicas and clients on 127.0.0.1.

Placements are read from the router's decisions, never from timings.
"""

from __future__ import annotations

import pytest

from hetero.serve.engines import LoadSample
from hetero.serve.router import RouterOptions
from tests.serve.harness import Serve, Spec, chat, wait_for

SYSTEM = "You answer questions about the fleet, briefly and exactly. " * 40


def conversation(*turns: str) -> dict[str, object]:
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in turns:
        messages.append({"role": "user", "content": turn})
    return {"model": "m", "messages": messages, "max_tokens": 4}


async def test_requests_sharing_a_long_system_prompt_go_where_it_is_cached(
    serve: Serve, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = await serve(Spec(), Spec(), Spec(), options=RouterOptions(strategy="prefix_affinity"))
    # Only the cache decides here, so what the machine's timing teaches the router is held
    # still: every replica's published load is read first (its slots go from the 4 declared
    # to the 16 it publishes as each read comes, which between two reads makes replicas alike
    # look unalike), and replies teach no speed (once, on a loaded machine, three requests went
    # to the holder and three to another).
    await wait_for(
        lambda: all(s.load is not None for s in fleet.router.replicas), "every load read"
    )
    monkeypatch.setattr(fleet.router.dispatcher.perf, "observe", lambda *args: None)
    for k in range(6):
        status, _ = await fleet.post(conversation(f"question {k}"))
        assert status == 200
    # One at a time, nothing queued anywhere: each goes where the shared prompt is cached.
    assert sorted(fleet.router.decisions.values()) == [6]
    index = fleet.router.policy.index  # type: ignore[attr-defined]
    holder = next(i for i, s in enumerate(fleet.router.replicas) if index.held(i))
    assert fleet.router.decisions[fleet.router.replicas[holder].replica.name] == 6


async def test_the_session_header_and_the_user_field_reach_the_policy(serve: Serve) -> None:
    fleet = await serve(Spec(), Spec(), options=RouterOptions(strategy="prefix_affinity"))
    status, _ = await fleet.post(
        chat("hello " * 100, max_tokens=4), headers={"x-session-id": "c-1"}
    )
    assert status == 200
    status, _ = await fleet.post({**chat("hi " * 200, max_tokens=4), "user": "c-2"})
    assert status == 200
    sessions = fleet.router.policy._sessions  # type: ignore[attr-defined]
    assert set(sessions) == {"c-1", "c-2"}


async def test_a_bad_session_is_refused_naming_the_field(serve: Serve) -> None:
    fleet = await serve(Spec(), options=RouterOptions(strategy="prefix_affinity"))
    status, answer = await fleet.post({**chat(), "user": 12})
    assert status == 400 and "field user" in answer["error"]["message"]
    status, answer = await fleet.post(chat(), headers={"x-session-id": "s" * 300})
    assert status == 400 and "x-session-id" in answer["error"]["message"]
    assert fleet.router.tickets == {}


async def test_the_index_evicts_at_the_kv_capacity_the_engine_publishes(serve: Serve) -> None:
    fleet = await serve(Spec(), options=RouterOptions(strategy="prefix_affinity"))
    state = fleet.router.replicas[0]
    index = fleet.router.policy.index  # type: ignore[attr-defined]
    for k in range(4):
        status, _ = await fleet.post(conversation(f"question {k} " * 200))
        assert status == 200
    assert index.held(0) > 8
    fleet.router.load_read(state, "vllm", LoadSample(running=0, waiting=0, kv_tokens=1024))
    assert index.held(0) == 8  # 1,024 tokens: eight 128-token blocks


async def test_bad_and_huge_prompts_are_answered_and_the_index_stays_bounded(
    serve: Serve,
) -> None:
    options = RouterOptions(
        strategy="prefix_affinity", strategy_options={"capacity_blocks": 64, "sessions": 20}
    )
    fleet = await serve(Spec(), Spec(), options=options)
    policy = fleet.router.policy
    # A 1 MB prompt: hashed up to MAX_BLOCKS, placed, answered.
    status, _ = await fleet.post(chat("z" * 1_000_000, max_tokens=2))
    assert status == 200
    # An empty message: no blocks, placed by delay alone. No messages at all: the replica's
    # own 400, passed on.
    status, _ = await fleet.post(chat("", max_tokens=2))
    assert status == 200
    status, answer = await fleet.post({"model": "m", "messages": [], "max_tokens": 2})
    assert status == 400 and "messages" in answer["error"]["message"]
    # Not JSON (binary): a 400 naming the problem, and nothing admitted.
    async with fleet.session.post(fleet.url + "/v1/chat/completions", data=b"\xff\xfe\x00") as r:
        assert r.status == 400 and "JSON" in (await r.json())["error"]["message"]
    # Many sessions: the policy keeps the most recent ones only.
    for k in range(30):
        status, _ = await fleet.post(
            chat("s" * 600, max_tokens=1), headers={"x-session-id": f"u{k}"}
        )
        assert status == 200
    assert len(policy._sessions) == 20  # type: ignore[attr-defined]
    index = policy.index  # type: ignore[attr-defined]
    # At most the capacity set, or what the engine publishes once its load is read.
    assert all(index.held(i) <= index.capacity(i) for i in range(2))


async def test_the_index_shrinks_where_the_engine_counters_find_fewer_hits(serve: Serve) -> None:
    # One replica: with two, where the prompts go depends on the speeds learned from reply
    # times (on a loaded host the holder can look slower than an idle one never timed).
    fleet = await serve(Spec(), options=RouterOptions(strategy="prefix_affinity"))
    router = fleet.router
    index = router.policy.index  # type: ignore[attr-defined]
    (holder,) = router.replicas
    router.load_read(  # the engine's counters at start
        holder, "vllm", LoadSample(running=0, waiting=0, prefix_queries=0, prefix_hits=0)
    )
    for k in range(8):
        status, _ = await fleet.post(conversation(f"question {k} " * 100))
        assert status == 200
    assert router.decisions[holder.replica.name] == 8
    assert index.held(holder.index) > 16  # the shrink below is not met by an index this small
    # Its engine (8,192 tokens: 64 blocks) looked up every prompt token and found none cached
    # (caching off): the index keeps a quarter of its size there.
    router.load_read(
        holder,
        "vllm",
        LoadSample(running=0, waiting=0, kv_tokens=8192, prefix_queries=20_000, prefix_hits=0),
    )
    assert index.capacity(holder.index) == 16
    assert index.held(holder.index) <= 16
