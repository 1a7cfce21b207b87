"""The rules of an elastic launch (``hetero.train.elastic.Membership``), on a fake clock: when a
failing rank is retried, lost or the launch gives up, and when a lost one may rejoin."""

from __future__ import annotations

import pytest

from hetero.commands.launch import parse_nproc
from hetero.train.elastic import MAX_REJOIN_WAIT_S, Membership, Next


def membership(
    minimum: int = 2,
    maximum: int = 3,
    *,
    max_restarts: int = 3,
    rank_restarts: int = 1,
    rejoin_after: float = 60.0,
) -> Membership:
    return Membership(
        minimum,
        maximum,
        max_restarts=max_restarts,
        rank_restarts=rank_restarts,
        rejoin_after=rejoin_after,
    )


def test_a_rank_is_retried_then_lost_and_the_others_go_on() -> None:
    m = membership()
    first = m.failed(1, now=10.0)
    assert first.next is Next.RETRY
    assert first.reason == "starting all 3 ranks again (2 restarts left)"
    assert m.live == (0, 1, 2) and m.restarts_left == 2
    second = m.failed(1, now=20.0)
    assert second.next is Next.SHRINK
    assert second.reason == (
        "it is lost: it failed 2 times, more than --rank-restarts 1; going on with 2 ranks "
        "(local ranks 0, 2) from the last checkpoint; it may rejoin at a checkpoint after 60 s"
    )
    assert m.live == (0, 2) and m.lost == (1,)
    assert m.restarts_left == 2  # a loss is no restart of the same ranks


def test_below_the_minimum_the_launch_gives_up() -> None:
    m = membership(rank_restarts=0)
    assert m.failed(1, now=0.0).next is Next.SHRINK
    stop = m.failed(2, now=1.0)
    assert stop.next is Next.STOP
    assert stop.reason == (
        "local rank 2 failed once; giving up: it failed once, more than --rank-restarts 0, and "
        "without it 1 rank would be left, fewer than the 2 --nproc 2:3 needs"
    )
    assert m.live == (0, 2)  # the launch ends as it was


def test_a_fixed_size_retries_until_the_restarts_run_out() -> None:
    m = membership(3, 3, max_restarts=2, rank_restarts=2)
    assert [m.failed(0, now=t).next for t in (0.0, 1.0)] == [Next.RETRY, Next.RETRY]
    stop = m.failed(2, now=2.0)
    assert stop.next is Next.STOP
    assert stop.reason == (
        "local rank 2 failed once; giving up: no restarts left: the ranks were restarted 2 times "
        "(--max-restarts 2) and failed 3 times (local rank 0 2 times, local rank 2 once)"
    )
    # The launcher's default --rank-restarts for a fixed size is --max-restarts.
    m = membership(3, 3, max_restarts=1, rank_restarts=1)
    assert m.failed(1, now=0.0).next is Next.RETRY
    stop = m.failed(1, now=1.0)
    assert stop.reason == (
        "local rank 1 failed 2 times; giving up: no restarts left: the ranks were restarted once "
        "(--max-restarts 1) and failed 2 times"
    )
    assert m.spec == "3"
    # Given fewer, a rank that fails more is lost, which a fixed size cannot go on without.
    m = membership(3, 3, max_restarts=3, rank_restarts=0)
    assert m.failed(1, now=0.0).reason == (
        "local rank 1 failed once; giving up: it failed once, more than --rank-restarts 0, and "
        "without it 2 ranks would be left, fewer than the 3 --nproc 3 needs"
    )


def test_giving_up_counts_every_failure_of_the_launch_not_only_the_last_ranks() -> None:
    # Three ranks that fail alike, whichever ends first charged each time: four failures, three
    # restarts, and the last rank to be charged has failed twice.
    m = membership(3, 3, max_restarts=3, rank_restarts=3)
    assert [m.failed(slot, now=0.0).next for slot in (1, 0, 2)] == [Next.RETRY] * 3
    stop = m.failed(0, now=1.0)
    assert stop.next is Next.STOP
    assert stop.reason == (
        "local rank 0 failed 2 times; giving up: no restarts left: the ranks were restarted 3 "
        "times (--max-restarts 3) and failed 4 times (local rank 0 2 times, local rank 1 once, "
        "local rank 2 once)"
    )


def test_the_same_error_twice_loses_a_rank_at_once() -> None:
    m = membership(rank_restarts=3)
    assert m.failed(1, now=0.0, error="ValueError: bad config").next is Next.RETRY
    assert m.failed(1, now=1.0, error="OSError: disk full").next is Next.RETRY
    again = m.failed(1, now=2.0, error="OSError: disk full")
    assert again.next is Next.SHRINK
    assert again.reason.startswith(
        "it is lost: it raised the same error as at its previous failure; going on with 2 ranks"
    )
    fixed = membership(2, 2, max_restarts=3, rank_restarts=3)
    assert fixed.failed(0, now=0.0, error="ValueError: bad config").next is Next.RETRY
    stop = fixed.failed(0, now=1.0, error="ValueError: bad config")
    assert stop.next is Next.STOP
    assert stop.reason == (
        "local rank 0 failed 2 times; giving up: it raised the same error as at its previous "
        "failure, and without it 1 rank would be left, fewer than the 2 --nproc 2 needs"
    )
    # Failures whose error is unknown (a signal, os._exit) are only counted.
    unknown = membership(rank_restarts=3)
    assert [unknown.failed(2, now=t).next for t in (0.0, 1.0)] == [Next.RETRY, Next.RETRY]


def test_a_lost_rank_may_rejoin_after_its_wait_which_doubles_at_each_loss() -> None:
    m = membership(rank_restarts=0, rejoin_after=60.0)
    m.failed(1, now=100.0)
    assert m.rejoins_at(1) == 160.0
    assert m.due(159.9) == () and m.due(160.0) == (1,)
    assert m.rejoin(170.0) == (1,)
    assert m.live == (0, 1, 2) and m.lost == ()
    # Its failures still count: failing again, it is lost at once, for twice as long.
    again = m.failed(1, now=200.0)
    assert again.next is Next.SHRINK and "at a checkpoint after 120 s" in again.reason
    assert m.rejoins_at(1) == 320.0
    m.rejoin(320.0)
    m.failed(1, now=1000.0)
    assert m.rejoins_at(1) == 1240.0
    for _ in range(10):
        m.rejoin(m.rejoins_at(1))
        m.failed(1, now=0.0)
    assert m.rejoins_at(1) == MAX_REJOIN_WAIT_S


def test_a_wait_of_zero_rejoins_at_the_next_checkpoint() -> None:
    m = membership(rank_restarts=0, rejoin_after=0.0)
    lost = m.failed(0, now=5.0)
    assert lost.reason.endswith("it may rejoin at the next checkpoint")
    assert m.live == (1, 2) and m.due(5.0) == (0,)
    assert m.rejoin(5.0) == (0,) and m.live == (0, 1, 2)


def test_only_what_runs_can_fail_and_only_what_is_lost_rejoins() -> None:
    m = membership(rank_restarts=0)
    m.failed(1, now=0.0)
    with pytest.raises(ValueError, match="slot 1 is lost"):
        m.failed(1, now=1.0)
    with pytest.raises(ValueError, match="slot 0 is not lost"):
        m.rejoins_at(0)
    with pytest.raises(ValueError, match="1 <= minimum <= maximum"):
        membership(3, 2)


@pytest.mark.parametrize(
    ("text", "expected"), [("3", (3, 3)), ("2:3", (2, 3)), ("1:1", (1, 1)), ("2:8", (2, 8))]
)
def test_nproc_is_n_or_min_max(text: str, expected: tuple[int, int]) -> None:
    assert parse_nproc(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("3:2", "--nproc '3:2': MIN must be <= MAX, got MIN 3 above MAX 2"),
        ("0:2", "--nproc '0:2': MIN must be >= 1 (a run needs a rank), got 0"),
        (
            "a:b",
            "--nproc must be a number of ranks N or a range MIN:MAX of whole numbers, got 'a:b'",
        ),
        ("1:2:3", "got '1:2:3'"),
        ("2:", "got '2:'"),
        ("", "got ''"),
        ("0", "--nproc must be >= 1, got 0"),
    ],
)
def test_a_bad_nproc_names_the_option_and_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_nproc(text)
    assert message in str(raised.value)
