"""HeteroSampler: every sample exactly once per epoch across ranks whatever the shares, also when
they change mid-epoch or the run resumes from a state dict; deterministic per seed and epoch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import pairwise

import pytest

pytest.importorskip("torch")

from hypothesis import given
from hypothesis import strategies as st

from hetero.errors import ConfigError
from hetero.train import HeteroSampler


@st.composite
def shares_of(draw: st.DrawFn, total: int, ranks: int) -> list[int]:
    """``ranks`` non-negative integers summing to ``total`` (zeros allowed)."""
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=ranks - 1, max_size=ranks - 1)))
    bounds = [0, *cuts, total]
    return [b - a for a, b in pairwise(bounds)]


@st.composite
def setups(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    """(dataset_size, global_batch, shares)."""
    size = draw(st.integers(1, 300))
    batch = draw(st.integers(1, 64))
    ranks = draw(st.integers(1, 6))
    return size, batch, draw(shares_of(batch, ranks))


def samplers(
    size: int,
    batch: int,
    shares: Sequence[int],
    *,
    seed: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
) -> list[HeteroSampler]:
    """One sampler per rank, as the ranks of one job build them."""
    return [
        HeteroSampler(size, batch, shares, r, seed=seed, shuffle=shuffle, drop_last=drop_last)
        for r in range(len(shares))
    ]


def shares_of_first(total: int, ranks: int) -> list[int]:
    """Everything on rank 0: different from most drawn shares."""
    return [total] + [0] * (ranks - 1)


def lockstep(group: Sequence[HeteroSampler]) -> list[list[list[int]]]:
    """Each global batch as the list of every rank's piece."""
    return [list(pieces) for pieces in zip(*(s.batches() for s in group), strict=True)]


def flat(batches: list[list[list[int]]]) -> list[int]:
    return [i for pieces in batches for piece in pieces for i in piece]


@given(setups(), st.booleans(), st.booleans(), st.integers(0, 2**16), st.integers(0, 5))
def test_one_epoch_reads_every_sample_exactly_once(
    setup: tuple[int, int, list[int]], drop_last: bool, shuffle: bool, seed: int, epoch: int
) -> None:
    size, batch, shares = setup
    group = samplers(size, batch, shares, seed=seed, shuffle=shuffle, drop_last=drop_last)
    for s in group:
        s.set_epoch(epoch)
    batches = lockstep(group)
    assert len(batches) == group[0].num_batches
    seen = Counter(flat(batches))
    kept = (size // batch) * batch if drop_last else size
    assert sum(seen.values()) == kept and set(seen.values()) <= {1}
    # Global batch k is exactly the slice k of the epoch's order, in rank order.
    order = HeteroSampler.global_order(size, seed, epoch, shuffle)
    for k, pieces in enumerate(batches):
        assert [i for piece in pieces for i in piece] == order[k * batch : (k + 1) * batch]
        if len(order[k * batch : (k + 1) * batch]) == batch:
            assert [len(p) for p in pieces] == shares
    for s in group:
        assert len(s) == len(list(s))


def test_shares_pick_contiguous_pieces_and_the_last_batch_splits_by_largest_remainder() -> None:
    # 10 samples, global batch 4 split 1:3; the last 2 split 0.5:1.5 → the tie goes to rank 0.
    r0, r1 = samplers(10, 4, [1, 3], shuffle=False)
    assert list(r0.batches()) == [[0], [4], [8]]
    assert list(r1.batches()) == [[1, 2, 3], [5, 6, 7], [9]]
    assert (len(r0), len(r1)) == (3, 7)
    r0, r1 = samplers(10, 4, [1, 3], shuffle=False, drop_last=True)
    assert list(r1) == [1, 2, 3, 5, 6, 7]


def test_a_rank_with_share_zero_still_steps_with_the_others() -> None:
    # A global batch smaller than the number of ranks is fine when the shares say who idles.
    group = samplers(5, 2, [1, 0, 1], shuffle=False)
    assert [list(s.batches()) for s in group] == [
        [[0], [2], [4]],
        [[], [], []],
        [[1], [3], []],
    ]


@given(setups(), st.integers(0, 2**16), st.integers(0, 5))
def test_the_order_is_deterministic_per_seed_and_epoch(
    setup: tuple[int, int, list[int]], seed: int, epoch: int
) -> None:
    size, batch, shares = setup
    first, second = (
        samplers(size, batch, shares, seed=seed),
        samplers(size, batch, shares, seed=seed),
    )
    for s in first + second:
        s.set_epoch(epoch)
    assert lockstep(first) == lockstep(second)
    assert HeteroSampler.global_order(size, seed, epoch, False) == list(range(size))


@given(st.integers(20, 300), st.integers(0, 2**16), st.integers(0, 5))
def test_shuffled_epochs_and_seeds_differ(size: int, seed: int, epoch: int) -> None:
    order = HeteroSampler.global_order(size, seed, epoch, True)
    assert sorted(order) == list(range(size))
    assert order != HeteroSampler.global_order(size, seed, epoch + 1, True)
    assert order != HeteroSampler.global_order(size, seed + 1000, epoch, True)


@given(st.data(), setups(), st.booleans())
def test_rebalancing_mid_epoch_keeps_every_sample_exactly_once(
    data: st.DataObject, setup: tuple[int, int, list[int]], drop_last: bool
) -> None:
    size, batch, shares = setup
    group = samplers(size, batch, shares, seed=7, drop_last=drop_last)
    iterators = [s.batches() for s in group]
    seen: Counter[int] = Counter()
    for _ in range(group[0].num_batches):
        if data.draw(st.booleans(), label="rebalance"):
            new = data.draw(shares_of(batch, len(shares)), label="shares")
            for s in group:
                s.set_shares(new)
        pieces = [next(it) for it in iterators]
        assert [len(p) for p in pieces] == list(group[0].shares) or len(flat([pieces])) < batch
        seen.update(flat([pieces]))
        for s in group:
            s.advance()
    assert all(next(it, None) is None for it in iterators)
    assert sum(seen.values()) == ((size // batch) * batch if drop_last else size)
    assert set(seen.values()) <= {1}


@given(st.data(), setups(), st.integers(0, 3))
def test_a_restored_state_continues_exactly_where_it_stopped(
    data: st.DataObject, setup: tuple[int, int, list[int]], epoch: int
) -> None:
    size, batch, shares = setup
    group = samplers(size, batch, shares, seed=11)
    for s in group:
        s.set_epoch(epoch)
    done = data.draw(st.integers(0, group[0].num_batches), label="consumed")
    rebalanced = data.draw(shares_of(batch, len(shares)), label="shares")
    for s in group:
        s.advance(done)
        s.set_shares(rebalanced)
    states = [s.state_dict() for s in group]
    expected = lockstep(group)

    # Fresh samplers built with another seed and shares take everything from the state.
    fresh = samplers(size, batch, shares_of_first(batch, len(shares)), seed=99)
    for s, state in zip(fresh, states, strict=True):
        s.load_state_dict(state)
        s.set_epoch(epoch)  # what a resumed training loop calls: the position stays
    assert lockstep(fresh) == expected
    assert [s.state_dict() for s in fresh] == states


@given(st.data(), setups(), st.integers(1, 4))
def test_a_restart_with_another_world_size_still_reads_each_sample_once(
    data: st.DataObject, setup: tuple[int, int, list[int]], new_ranks: int
) -> None:
    size, batch, shares = setup
    group = samplers(size, batch, shares, seed=3)
    done = data.draw(st.integers(0, group[0].num_batches), label="consumed")
    before = lockstep(group)[:done]
    for s in group:
        s.advance(done)
    state = group[0].state_dict()
    new_shares = data.draw(shares_of(batch, new_ranks), label="new shares")
    restarted = samplers(size, batch, new_shares, seed=3)
    for s in restarted:
        s.load_state_dict(state)
    after = lockstep(restarted)
    if new_ranks != len(shares):  # another world: the new shares stay
        assert all(s.shares == tuple(new_shares) for s in restarted)
    seen = Counter(flat(before) + flat(after))
    assert sum(seen.values()) == size and set(seen.values()) <= {1}


def test_set_epoch_resets_the_position_only_for_another_epoch() -> None:
    s = HeteroSampler(10, 2, [1, 1], 0, seed=1)
    s.advance(3)
    s.set_epoch(0)
    assert s.position == 3 and len(s) == 2
    s.set_epoch(1)
    assert (s.epoch, s.position, len(s)) == (1, 0, 5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dataset_size": 0}, r"dataset_size: must be at least 1, got 0"),
        ({"global_batch": 0, "shares": [0]}, r"global_batch: must be at least 1, got 0"),
        ({"shares": [3, 3]}, r"shares: must sum to global_batch=4, got \[3, 3\] \(sum 6\)"),
        ({"shares": [5, -1]}, r"shares\[1\]: must be at least 0, got -1"),
        ({"shares": [2.5, 1.5]}, r"shares\[0\]: must be an integer, got 2.5"),
        ({"shares": "22"}, r"shares: must be a list of integers, got '22'"),
        ({"rank": 2}, r"rank: must be below 2 \(one rank per share\), got 2"),
        ({"rank": -1}, r"rank: must be at least 0, got -1"),
        ({"rank": True}, r"rank: must be an integer, got True"),
        ({"seed": -3}, r"seed: must be at least 0, got -3"),
    ],
)
def test_bad_arguments_are_named_with_the_value_and_what_is_allowed(
    kwargs: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {"dataset_size": 10, "global_batch": 4, "shares": [1, 3], "rank": 0}
    with pytest.raises(ConfigError, match=match):
        HeteroSampler(**(args | kwargs))  # type: ignore[arg-type]


def test_bad_calls_after_construction_are_clear() -> None:
    s = HeteroSampler(10, 4, [1, 3], 1)
    with pytest.raises(ConfigError, match=r"shares: has 1 entries, too few for rank 1"):
        s.set_shares([4])
    with pytest.raises(ConfigError, match=r"shares: must sum to global_batch=4"):
        s.set_shares([1, 1])
    with pytest.raises(
        ConfigError, match=r"batches: advancing by 4 from position 0 passes the end"
    ):
        s.advance(4)
    with pytest.raises(ConfigError, match=r"epoch: must be at least 0, got -1"):
        s.set_epoch(-1)
    with pytest.raises(
        ConfigError, match=r"dataset_size: the state was saved with dataset_size=12"
    ):
        s.load_state_dict(HeteroSampler(12, 4, [1, 3], 1).state_dict())
    with pytest.raises(ConfigError, match=r"state: lacks position"):
        s.load_state_dict({"epoch": 0, "seed": 0})
