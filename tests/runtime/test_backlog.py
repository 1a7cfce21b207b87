"""The Context's overflow backlog: past ``scheduler.max_queue_size`` tasks wait in the context
instead of being refused, and keep their priority and their timeout."""

from __future__ import annotations

import time

import pytest

import hetero
from hetero.config import HeteroConfig, parse_config
from hetero.errors import TaskFailed


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def one_slot_fleet() -> HeteroConfig:
    return parse_config({"devices": [{"type": "cpu"}], "scheduler": {"max_queue_size": 1}})


def test_a_task_that_waited_in_the_backlog_still_times_out() -> None:
    """No other deadline is pending when it leaves the backlog: the timer must still wake."""
    with hetero.Context(one_slot_fleet(), prefetch=0).start() as ctx:
        running = ctx.submit(nap, 0.3)
        queued = ctx.submit(nap, 2.0)  # waits in the dispatcher: the queue is full now
        late = ctx.submit(hetero.task(timeout=0.2)(nap), 0.0)  # in the backlog
        assert running.result() == 0.3
        with pytest.raises(TaskFailed, match="timed out"):
            late.result(timeout=1.5)  # 0.2 s after it left the backlog, not after 2 s
        assert queued.result() == 2.0


def started(_: str) -> float:
    return time.monotonic()


def test_the_backlog_hands_on_the_highest_priority_first() -> None:
    """Past max_queue_size, priority still decides (a plain FIFO ignored it)."""
    with hetero.Context(one_slot_fleet(), prefetch=0).start() as ctx:
        ctx.submit(nap, 0.3)
        ctx.submit(nap, 0.0)  # fills the dispatcher's queue
        low = [ctx.submit(started, f"low {i}") for i in range(3)]
        high = ctx.submit(hetero.task(priority=5)(started), "high")
        assert high.result() < min(f.result() for f in low)
        assert [f.result() for f in low] == sorted(f.result() for f in low)  # then first come
