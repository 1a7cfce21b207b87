"""Prefix-cache affinity as pure code: chained block hashes, the per-device index with its LRU
bound, and the ``prefix_affinity`` policy's trade of cache against queueing, on a manual clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.sched import Dispatcher, ManualClock, WorkItem, make_policy
from hetero.sched.prefix import BLOCK_CHARS, MAX_BLOCKS, Prefix, PrefixIndex, prefix_blocks
from tests.fleets import make_devices

SYSTEM = "You are a helpful assistant. " * 40  # about 1,100 characters: 4 full blocks


def test_blocks_are_chained_so_a_hash_stands_for_the_whole_prefix() -> None:
    a = prefix_blocks(SYSTEM + "first question " * 30, block_chars=256)
    b = prefix_blocks(SYSTEM + "second question " * 30, block_chars=256)
    shared = len(SYSTEM) // 256
    assert a[:shared] == b[:shared] and a[shared] != b[shared]
    # A different first block changes every block after it, though the text there is equal.
    c = prefix_blocks("x" + SYSTEM[1:] + "first question " * 30, block_chars=256)
    assert not set(a) & set(c)


def test_only_full_blocks_count_and_long_prompts_are_cut_at_the_limit() -> None:
    assert prefix_blocks("a" * 255, block_chars=256) == ()
    assert len(prefix_blocks("a" * 513, block_chars=256)) == 2
    assert len(prefix_blocks("ab" * 10**6, block_chars=256, limit=8)) == 8
    assert prefix_blocks("a" * 5000, limit=-1) == ()


def test_the_default_blocks_hash_as_any_other_size_does() -> None:
    # Past MAX_BLOCKS the default size takes the general path: both must name blocks alike.
    text = "".join(f"{i:07d} " for i in range((MAX_BLOCKS + 3) * BLOCK_CHARS // 8))
    longer = prefix_blocks(text, limit=MAX_BLOCKS + 3)
    assert len(longer) == MAX_BLOCKS + 3 and longer[:MAX_BLOCKS] == prefix_blocks(text)


def test_match_counts_the_leading_blocks_each_device_holds() -> None:
    index = PrefixIndex([100, 100, 100])
    index.insert(0, [1, 2, 3, 4])
    index.insert(1, [1, 2])
    index.insert(2, [9, 2, 3])  # block 2 without block 1 is not a match
    assert index.match([1, 2, 3, 4, 5]).tolist() == [4, 2, 0]
    assert index.match([]).tolist() == [0, 0, 0]
    assert index.match([7]).tolist() == [0, 0, 0]


def test_a_device_evicts_its_least_recently_used_blocks_at_its_capacity() -> None:
    index = PrefixIndex([3])
    index.insert(0, [1, 2, 3])
    index.insert(0, [1])  # used again: now the most recent
    index.insert(0, [4])
    assert index.held(0) == 3
    assert index.match([1]).tolist() == [1]
    assert index.match([2]).tolist() == [0]  # the least recently used went
    index.set_capacity(0, 1)
    assert index.held(0) == 1 and index.match([4]).tolist() == [1]
    index.forget(0)
    assert index.held(0) == 0 and index.match([4]).tolist() == [0]


def test_bad_capacities_are_refused() -> None:
    with pytest.raises(ValueError, match="blocks >= 0"):
        PrefixIndex([-1])
    with pytest.raises(ConfigError, match="capacity_blocks"):
        make_policy("prefix_affinity", {"capacity_blocks": 0})
    with pytest.raises(ConfigError, match="sessions"):
        make_policy("prefix_affinity", {"sessions": "many"})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 6), max_size=6)), max_size=30),
    st.lists(st.integers(0, 6), max_size=8),
    st.integers(1, 8),
)
def test_match_and_eviction_agree_with_a_plain_model(
    inserts: list[tuple[int, list[int]]], query: list[int], capacity: int
) -> None:
    index = PrefixIndex([capacity] * 3)
    model: list[list[int]] = [[], [], []]  # each device's blocks, least recently used first
    for device, blocks in inserts:
        index.insert(device, blocks)
        for h in blocks:
            if h in model[device]:
                model[device].remove(h)
            model[device].append(h)
        del model[device][: max(0, len(model[device]) - capacity)]
    for device in range(3):
        assert index.held(device) == len(model[device])
        expected = 0
        while expected < len(query) and query[expected] in model[device]:
            expected += 1
        assert index.match(query)[device] == expected


def test_match_counts_many_holders_at_once() -> None:
    index = PrefixIndex([10] * 70)
    for device in range(70):
        index.insert(device, [1, 2, 3, 4][: 2 + device % 3])  # 2, 3 or 4 blocks
    assert index.match([1, 2, 3, 4, 5]).tolist() == [2 + d % 3 for d in range(70)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["insert", "capacity", "forget"]),
            st.integers(0, 39),
            st.lists(st.integers(0, 6), max_size=6),
            st.integers(0, 8),
        ),
        max_size=80,
    ),
    st.lists(st.integers(0, 6), max_size=8),
)
def test_a_fleet_of_devices_agrees_with_a_plain_model(
    ops: list[tuple[str, int, list[int], int]], query: list[int]
) -> None:
    n = 40  # enough for a block to have more holders than match sets one by one
    index = PrefixIndex([4] * n)
    model: list[list[int]] = [[] for _ in range(n)]  # least recently used first
    capacity = [4] * n
    for op, device, blocks, blocks_held in ops:
        if op == "insert":
            index.insert(device, blocks)
            for h in blocks:
                if h in model[device]:
                    model[device].remove(h)
                model[device].append(h)
        elif op == "capacity":
            index.set_capacity(device, blocks_held)
            capacity[device] = blocks_held
        else:
            index.forget(device)
            model[device].clear()
        del model[device][: max(0, len(model[device]) - capacity[device])]
    expected = []
    for held in model:
        depth = 0
        while depth < len(query) and query[depth] in held:
            depth += 1
        expected.append(depth)
    assert index.match(query).tolist() == expected
    assert [index.held(d) for d in range(n)] == [len(held) for held in model]


def dispatcher(speeds: tuple[float, ...]) -> Dispatcher:
    return Dispatcher(make_devices(speeds), make_policy("prefix_affinity"), ManualClock())


def request(name: str, text: str, cost: float = 100.0, session: str | None = None) -> WorkItem:
    # Each 256-character block is worth 20 work units of prefill here.
    return WorkItem(cost=cost, id=name, prefix=Prefix(prefix_blocks(text), 20.0, session))


def test_a_request_goes_where_its_prefix_is_cached_while_that_is_no_slower() -> None:
    d = dispatcher((1.0, 1.0))
    d.submit(request("a", SYSTEM + "question a"), only=["d1"])  # d1 now holds the prompt
    d.complete("a")
    d.submit(request("b", SYSTEM + "question b"))
    assert d.records["b"].device == 1  # equal devices, equal load: the cache decides


def test_a_hot_prefix_spreads_once_its_holder_queues_up() -> None:
    d = dispatcher((1.0, 1.0))
    for k in range(4):
        d.submit(request(f"r{k}", SYSTEM + f"question {k}"))
    placed = [d.records[f"r{k}"].device for k in range(4)]
    # The first goes to d0 and caches the prefix; the saving (80 units) is less than the wait
    # behind a running 100-unit request, so the next ones do not pile up there.
    assert sorted(placed) == [0, 0, 1, 1]


def test_a_faster_device_without_the_prefix_wins_when_it_finishes_sooner() -> None:
    d = dispatcher((1.0, 10.0))
    d.submit(request("a", SYSTEM), only=["d0"])
    d.complete("a")
    d.submit(request("b", SYSTEM + "more"))
    assert d.records["b"].device == 1  # 100/10 beats (100 - 80)/1


def test_a_session_returns_to_the_device_of_its_last_turn() -> None:
    d = dispatcher((1.0, 1.0, 1.0))
    d.submit(request("t1", "A" * 600, session="chat-7"), only=["d2"])
    d.complete("t1")
    # Rendered differently this turn: no block matches, but the session knows where it ran.
    d.submit(request("t2", "B" * 600 + " and a second question", session="chat-7"))
    assert d.records["t2"].device == 2
    d.submit(request("other", "C" * 600 + " from someone else"))
    assert d.records["other"].device == 0  # no session, nothing cached: by delay


def test_items_without_a_prefix_are_placed_by_expected_delay() -> None:
    d = dispatcher((1.0, 3.0))
    d.submit(WorkItem(cost=10.0, id="x"))
    assert d.records["x"].device == 1
    d.validate_state()
