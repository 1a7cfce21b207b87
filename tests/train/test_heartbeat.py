"""Hang detection's rule (``hetero.train.heartbeat``) on a manual clock: a silent rank is hung, a
rank without progress outside any collective is hung once a peer has waited on it for the
timeout, and a rank waiting for a slow peer never is; the rank's side (``Tracker``) turns looks
at the main thread into those beats; the heartbeat thread writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.sched.clock import ManualClock
from hetero.train.heartbeat import Beat, Tracker, find_hung, waits_on_peers
from hetero.train.heartbeat_sender import Sender, mark_progress
from tests.processes import wait_for

T = 10.0  # the timeout


def working(at: float, progress: float, where: str = "job.py:7 (main)") -> Beat:
    """A beat sent ``at``, of a rank outside any collective that last progressed at
    ``progress``."""
    return Beat(at, progress, None, where)


def waiting(at: float, since: float) -> Beat:
    """A beat sent ``at``, of a rank waiting in a collective ``since``."""
    return Beat(at, at, since, "distributed_c10d.py:2 (all_reduce)")


def test_a_rank_silent_for_the_timeout_is_hung_and_named_with_where_it_was_last() -> None:
    beats = {0: waiting(20.0, 5.0), 1: working(9.0, 9.0, "job.py:12 (main)")}
    assert find_hung(beats, 19.0, T) is None  # its last beat is 10 s old: not more yet
    hung = find_hung(beats, 19.5, T)
    assert hung is not None and hung.rank == 1
    assert hung.reason == (
        "sent no heartbeat for 10.5 s (stopped, or stuck in C holding the GIL); last seen at "
        "job.py:12 (main)"
    )


def test_the_rank_silent_longest_is_blamed_before_a_stalled_one() -> None:
    beats = {
        0: working(30.0, 1.0),
        1: working(12.0, 12.0),
        2: working(15.0, 15.0),
        3: waiting(30.0, 2.0),
    }
    hung = find_hung(beats, 30.0, T)
    assert hung is not None and hung.rank == 1


def test_a_stalled_rank_is_hung_once_a_peer_has_waited_on_it_for_the_timeout() -> None:
    clock = ManualClock(100.0)
    # Rank 1 stopped progressing at 100; rank 0 entered the collective at 101.
    clock.set(110.5)  # rank 1 stalled for 10.5 s, but rank 0 has waited 9.5 s only
    beats = {0: waiting(clock.now(), 101.0), 1: working(clock.now(), 100.0)}
    assert find_hung(beats, clock.now(), T) is None
    clock.set(111.5)
    beats = {0: waiting(clock.now(), 101.0), 1: working(clock.now(), 100.0, "job.py:12 (f)")}
    hung = find_hung(beats, clock.now(), T)
    assert hung is not None and hung.rank == 1
    assert hung.reason == (
        "made no progress for 11.5 s outside any collective, at job.py:12 (f), while local "
        "rank 0 waited 10.5 s in one"
    )


def test_a_rank_waiting_for_a_slow_peer_is_never_blamed() -> None:
    # Both wait for long (mismatched collectives): nobody is blamed, the collective times out.
    assert find_hung({0: waiting(50.0, 1.0), 1: waiting(50.0, 2.0)}, 50.0, T) is None
    # One computes long and nobody waits for it: not a hang that blocks anyone.
    assert find_hung({0: working(50.0, 1.0), 1: working(50.0, 2.0)}, 50.0, T) is None
    # One still progresses while the other waits: a slow peer, not a hung one.
    assert find_hung({0: waiting(50.0, 1.0), 1: working(50.0, 45.0)}, 50.0, T) is None


def test_of_two_stalled_ranks_the_one_without_progress_longest_is_blamed() -> None:
    beats = {0: working(50.0, 30.0), 1: working(50.0, 20.0), 2: waiting(50.0, 25.0)}
    hung = find_hung(beats, 50.0, T)
    assert hung is not None and hung.rank == 1


def test_a_rank_that_sent_no_beat_yet_is_not_judged() -> None:
    assert find_hung({}, 1000.0, T) is None
    assert find_hung({0: waiting(1000.0, 1.0)}, 1000.0, T) is None


def test_the_tracker_tells_waits_and_progress_from_looks_at_the_main_thread() -> None:
    clock = ManualClock(0.0)
    tracker = Tracker(clock.now, 0)
    clock.set(1.0)  # setting up: no progress yet, so not judged by it
    assert tracker.look("__main__", "job.py:3 (main)", 0) == Beat(
        1.0, None, None, "job.py:3 (main)"
    )
    clock.set(2.0)  # waiting in the rendezvous is not progress yet either
    assert tracker.look("torch.distributed.rendezvous", "w", 0) == Beat(2.0, None, 2.0, "w")
    clock.set(3.0)  # its first collective completed: progress
    assert tracker.look("__main__", "w", 1) == Beat(3.0, 3.0, None, "w")
    clock.set(4.0)  # the same count of calls: no progress since
    assert tracker.look("__main__", "w", 1) == Beat(4.0, 3.0, None, "w")
    clock.set(5.0)  # waiting in a collective: progress, and the wait starts
    assert tracker.look("torch.distributed.distributed_c10d", "w", 1) == Beat(5.0, 5.0, 5.0, "w")
    clock.set(6.0)  # still in it
    assert tracker.look("torch.distributed.distributed_c10d", "w", 1) == Beat(6.0, 6.0, 5.0, "w")
    clock.set(7.0)  # that call completed and the next began: a new wait
    assert tracker.look("hetero.comm._base", "w", 2) == Beat(7.0, 7.0, 7.0, "w")
    clock.set(8.0)  # back in the script, having progressed: a mark or a completed call
    assert tracker.look("__main__", "w", 3) == Beat(8.0, 8.0, None, "w")
    clock.set(20.0)
    assert tracker.look("__main__", "w", 3) == Beat(20.0, 8.0, None, "w")


def test_a_rank_still_setting_up_is_judged_by_its_silence_only() -> None:
    setting_up = Beat(50.0, None, None, "torch/__init__.py:1 (<module>)")
    assert find_hung({0: waiting(50.0, 1.0), 1: setting_up}, 50.0, T) is None
    hung = find_hung({0: waiting(80.0, 1.0), 1: setting_up}, 80.0, T)
    assert hung is not None and hung.rank == 1 and "sent no heartbeat" in hung.reason


def test_time_the_judge_was_not_watching_counts_against_nobody() -> None:
    # The launcher was suspended from 12 to 40: every beat looks old, none is.
    beats = {0: waiting(12.0, 5.0), 1: working(12.0, 4.0)}
    assert find_hung(beats, 40.0, T, watched_since=40.0) is None
    assert find_hung(beats, 49.0, T, watched_since=40.0) is None
    hung = find_hung(beats, 50.5, T, watched_since=40.0)
    assert hung is not None and hung.rank == 0 and "sent no heartbeat for 38.5 s" in hung.reason


@pytest.mark.parametrize(
    ("module", "waits"),
    [
        ("torch.distributed", True),
        ("torch.distributed.distributed_c10d", True),
        ("torch.autograd.graph", True),
        ("torch.nn.parallel.distributed", True),
        ("torch.cuda", True),
        ("hetero.comm._base", True),
        ("torch.nn.modules.linear", False),
        ("torch.distributedx", False),
        ("hetero.train.trainer", False),
        ("__main__", False),
        ("", False),
    ],
)
def test_which_modules_a_main_thread_waits_on_its_peers_in(module: str, waits: bool) -> None:
    assert waits_on_peers(module) is waits


def test_a_beat_goes_through_its_json_line() -> None:
    for beat in (
        Beat(1.5, 1.0, None, "a.py:1 (f)"),
        Beat(2.0, 2.0, 1.25, "b.py:2 (g)"),
        Beat(3.0, None, None, "c.py:3 (h)"),
    ):
        assert Beat.from_json(beat.to_json()) == beat
    with pytest.raises(KeyError):
        Beat.from_json('{"sent": 1}')


def test_the_thread_writes_beats_of_the_main_thread_and_counts_progress_marks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "beat.json"
    sender = Sender(path, 0.01)
    sender.start()
    try:
        wait_for(path.exists)
        first = Beat.from_json(path.read_text())
        assert first.waiting is None and first.progress is None  # no collective, no mark yet
        mark_progress()
        wait_for(lambda: Beat.from_json(path.read_text()).progress is not None)
    finally:
        sender.stop()
    assert not path.with_name("beat.json.tmp").exists()  # each beat replaced the last whole


def test_the_thread_stops_when_the_launchers_folder_is_gone(tmp_path: Path) -> None:
    sender = Sender(tmp_path / "gone" / "beat.json", 0.01)
    sender.start()
    sender.join(timeout=30)
    assert not sender.is_alive()
