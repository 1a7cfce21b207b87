"""Dynamic batching (``@hetero.task(batch=BatchOptions(...))``): the pure parts (options, sizes,
arguments combined and results split, the dispatcher's shared runs, the batcher's coalescing)
with a manual clock, then batches run by real worker processes."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hetero
from hetero.errors import ConfigError, ItemNotRunning, TaskFailed
from hetero.runtime.batching import (
    Batch,
    Batcher,
    BatchOptions,
    BatchResultError,
    batch_size,
    combine,
    split,
)
from hetero.sched import Dispatcher, FleetView, ItemState, ManualClock, Policy, Run, Stop, WorkItem
from hetero.sched.policy import BoolArray
from hetero.testing import emulated_fleet
from tests.fleets import make_devices

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------------------------------ options


@pytest.mark.parametrize(
    ("kwargs", "field", "shown"),
    [
        ({"max_size": 0}, "batch.max_size", "got 0"),
        ({"max_size": -3}, "batch.max_size", "got -3"),
        ({"max_size": 2.5}, "batch.max_size", "got 2.5"),
        ({"max_size": True}, "batch.max_size", "got True"),
        ({"max_wait": -0.1}, "batch.max_wait", "got -0.1"),
        ({"max_wait": float("inf")}, "batch.max_wait", "got inf"),
        ({"max_wait": "10ms"}, "batch.max_wait", "got '10ms'"),
    ],
)
def test_bad_batch_options_name_the_field_and_the_value(
    kwargs: dict[str, Any], field: str, shown: str
) -> None:
    with pytest.raises(ConfigError, match=f"{field}: must be .*{shown}"):
        BatchOptions(**kwargs)


def test_a_task_refuses_a_batch_that_is_not_batch_options() -> None:
    with pytest.raises(ConfigError, match=r"batch: must be a hetero.BatchOptions .* got 8"):
        hetero.task(batch=8)  # type: ignore[call-overload]
    assert hetero.BatchOptions is BatchOptions
    assert BatchOptions() == BatchOptions(max_size=10, max_wait=0.01)


def test_a_batched_task_called_here_is_a_batch_of_one() -> None:
    @hetero.task(batch=BatchOptions(max_size=4))
    def scale(xs: list[int], by: list[int]) -> list[int]:
        return [x * b for x, b in zip(xs, by, strict=True)]

    assert scale(3, by=5) == 15
    assert scale.with_options(priority=2).options.batch == BatchOptions(max_size=4)


# ------------------------------------------------------------------ sizes, args, results


def test_the_fastest_device_takes_max_size_and_slower_ones_their_share() -> None:
    options = BatchOptions(max_size=8)
    assert batch_size(options, 4.0, 4.0, 10**9, 0) == 8
    assert batch_size(options, 2.0, 4.0, 10**9, 0) == 4
    assert batch_size(options, 1.0, 4.0, 10**9, 0) == 2
    assert batch_size(options, 0.1, 4.0, 10**9, 0) == 1  # never less than one call
    assert batch_size(options, 0.0, 4.0, 10**9, 0) == 1  # a device with no speed figure
    # Memory declared per call bounds the batch where the device holds fewer calls.
    assert batch_size(options, 4.0, 4.0, 3 * 2**30, 2**30) == 3
    assert batch_size(options, 4.0, 4.0, 2**29, 2**30) == 1


def test_calls_combine_into_one_call_with_a_list_per_argument() -> None:
    args, kwargs = combine([((1, "a"), {"k": 10}), ((2, "b"), {"k": 20}), ((3, "c"), {"k": 30})])
    assert args == ([1, 2, 3], ["a", "b", "c"])
    assert kwargs == {"k": [10, 20, 30]}


def test_results_split_one_per_call_and_a_wrong_count_says_what_came_back() -> None:
    assert split("embed", [1, 2, 3], 3) == [1, 2, 3]
    rows = split("embed", np.arange(6).reshape(3, 2), 3)
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(BatchResultError, match="embed returned 2 results for a batch of 3 calls"):
        split("embed", [1, 2], 3)
    with pytest.raises(BatchResultError, match="embed returned int for a batch of 3 calls"):
        split("embed", 7, 3)
    with pytest.raises(BatchResultError, match="embed returned str for a batch of 2 calls"):
        split("embed", "ab", 2)


# -------------------------------------------------------------- the dispatcher's shared runs


class First(Policy):
    """Every item to the first device it may use."""

    name = "test_first"

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        usable = np.flatnonzero(view.usable if allowed is None else allowed)
        return int(usable[0]) if usable.size else None


def _dispatcher(slots: int = 1, devices: int = 1) -> tuple[Dispatcher, ManualClock]:
    clock = ManualClock()
    dispatcher = Dispatcher(
        make_devices([1.0] * devices),
        First(),
        clock,
        slots=[slots] * devices,
        keep_finished=True,
        stealing=False,
    )
    return dispatcher, clock


def test_joined_items_share_one_slot_which_frees_with_the_last() -> None:
    d, _ = _dispatcher(slots=1)
    out = d.submit(WorkItem(id="a"))
    assert [type(i) for i in out] == [Run]
    for name in "bcd":
        assert d.submit(WorkItem(id=name)) == []  # queued behind a
    d.join("b", "a")
    d.join("c", "b")  # any member of the run will do
    d.validate_state()
    assert [d.state_of(x) for x in "abcd"] == [ItemState.RUNNING] * 3 + [ItemState.QUEUED]
    assert int(d.view.running[0]) == 1 and float(d.view.running_work[0]) == 3.0
    for x in "ab":  # the run goes on: nothing new starts
        assert [type(i) for i in d.complete(x) if type(i) is Run] == []
    d.validate_state()
    out = d.complete("c")  # the last of the run: its slot frees and d starts
    assert [(type(i), i.item.id) for i in out if type(i) is Run] == [(Run, "d")]
    d.validate_state()


def test_an_item_started_alone_gives_its_slot_back_when_it_joins() -> None:
    d, _ = _dispatcher(slots=2)
    d.submit(WorkItem(id="a"))
    d.submit(WorkItem(id="b"))  # the second slot
    d.submit(WorkItem(id="c"))  # queued
    out = d.join("b", "a")
    assert [(type(i), i.item.id) for i in out] == [(Run, "c")]  # the freed slot takes c
    assert int(d.view.running[0]) == 2
    d.validate_state()


def test_join_refuses_what_is_not_queued_or_started_alone_on_the_runs_device() -> None:
    d, _ = _dispatcher(slots=1, devices=2)
    d.submit(WorkItem(id="a"))
    d.submit(WorkItem(id="b"))
    d.join("b", "a")
    with pytest.raises(ItemNotRunning, match="cannot join work item 'b' to 'a'"):
        d.join("b", "a")  # already in the run
    with pytest.raises(ItemNotRunning, match="cannot join work item 'a' to 'a'"):
        d.join("a", "a")
    d.submit(WorkItem(id="c"))
    d.complete("a")
    d.complete("b")
    with pytest.raises(ItemNotRunning, match="it is done"):
        d.join("a", "c")


def test_the_queue_of_a_device_is_listed_in_start_order() -> None:
    d, _ = _dispatcher(slots=1)
    d.submit(WorkItem(id="a"))
    d.submit(WorkItem(id="low"))
    d.submit(WorkItem(id="high", priority=5))
    d.submit(WorkItem(id="gone"))
    d.cancel("gone")
    assert [i.id for i in d.queued_items("d0")] == ["high", "low"]


def test_a_lost_device_stops_every_item_of_a_run() -> None:
    d, _ = _dispatcher(slots=1, devices=2)
    d.submit(WorkItem(id="a"))
    d.submit(WorkItem(id="b"))
    d.join("b", "a")
    out = d.device_down("d0")
    assert sorted(i.item.id for i in out if type(i) is Stop) == ["a", "b"]
    d.validate_state()
    assert int(d.view.running[0]) == 0


# ------------------------------------------------------------------------ the batcher


@dataclass(eq=False)
class FakeCall:
    id: int
    batch_key: str = "k"
    in_batch: Batch[Any] | None = None


class _Fixture:
    """A dispatcher of one device and a batcher over it, with calls 1… by id."""

    def __init__(self, slots: int = 1) -> None:
        self.dispatcher, self.clock = _dispatcher(slots=slots)
        ids = iter(range(1000, 2000))
        self.calls: dict[int, FakeCall] = {}
        self.batcher: Batcher[FakeCall] = Batcher(self.dispatcher, self.calls, lambda: next(ids))

    def submit(self, n: int, key: str = "k") -> list[Any]:
        """Submit call ``n``; queued, it joins the batch collecting on its device, if any."""
        self.calls[n] = FakeCall(n, key)
        out = self.dispatcher.submit(WorkItem(id=n))
        if self.dispatcher.state_of(n) is ItemState.QUEUED:
            self.batcher.queued(self.calls[n], 0, 0.5)
        return out


def test_a_batch_opens_at_a_run_and_takes_the_calls_queued_on_its_device() -> None:
    f = _Fixture()
    assert f.submit(1)  # runs at once
    for n in (2, 3, 4):
        f.submit(n)  # queued: no batch collects yet
    out, batch, joined = f.batcher.started(f.calls[1], 0, lambda: 3, max_wait=0.5)
    assert out == [] and [c.id for c in batch.calls] == [1, 2, 3] == [c.id for c in joined]
    assert f.dispatcher.state_of(4) is ItemState.QUEUED
    assert batch.due == 0.5 and f.batcher.ready(batch, 0.0)  # full
    f.dispatcher.validate_state()
    assert f.batcher.take(batch) == batch.calls
    # The call left behind opens the next batch once this one's slot frees.
    for c in (1, 2):
        f.dispatcher.complete(c)
    out = f.dispatcher.complete(3)
    assert [i.item.id for i in out if type(i) is Run] == [4]
    _, second, _ = f.batcher.started(f.calls[4], 0, lambda: 3, max_wait=0.5)
    assert [c.id for c in second.calls] == [4] and second.id != batch.id


def test_calls_that_arrive_while_a_batch_collects_join_it_until_it_is_full() -> None:
    f = _Fixture(slots=2)
    f.submit(1)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 3, max_wait=0.5)
    assert not f.batcher.ready(batch, 0.0)
    out = f.submit(2)  # starts alone in the second slot: it joins, the slot frees
    assert [i.item.id for i in out if type(i) is Run] == [2]
    f.batcher.started(f.calls[2], 0, lambda: 3, max_wait=0.5)
    f.clock.advance(0.1)
    f.submit(3)  # the second slot is free again: it starts and joins too
    f.batcher.started(f.calls[3], 0, lambda: 3, max_wait=0.5)
    assert [c.id for c in batch.calls] == [1, 2, 3] and f.batcher.ready(batch, 0.1)
    assert int(f.dispatcher.view.running[0]) == 1
    f.dispatcher.validate_state()


def test_a_batch_is_due_when_its_oldest_call_has_waited_max_wait() -> None:
    f = _Fixture(slots=2)
    f.submit(1)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 8, max_wait=0.5)
    f.clock.advance(0.3)
    f.submit(2)
    f.batcher.started(f.calls[2], 0, lambda: 8, max_wait=0.5)
    assert f.batcher.next_due() == 0.5  # from call 1's admission, not call 2's
    assert f.batcher.due(0.49) == [] and f.batcher.due(0.5) == [batch]


def test_a_call_cancelled_before_its_batch_is_sent_leaves_it() -> None:
    f = _Fixture(slots=2)
    f.submit(1)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 8, max_wait=0.5)
    f.submit(2)
    f.batcher.started(f.calls[2], 0, lambda: 8, max_wait=0.5)
    out = f.dispatcher.cancel(1)  # the first call, whose Run opened the batch
    assert [type(i).__name__ for i in out] == ["Stop", "Finish"]
    assert f.batcher.leave(f.calls[1]) is None
    assert [c.id for c in batch.calls] == [2]
    assert int(f.dispatcher.view.running[0]) == 1  # the run goes on with call 2
    f.dispatcher.cancel(2)
    assert f.batcher.leave(f.calls[2]) is None and f.batcher.collecting == {}
    assert int(f.dispatcher.view.running[0]) == 0
    f.dispatcher.validate_state()


def test_a_sent_batch_is_given_up_only_when_no_call_waits_on_it() -> None:
    f = _Fixture()
    f.submit(1)
    f.submit(2)
    f.submit(3)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 3, max_wait=0.5)
    f.batcher.take(batch)
    f.dispatcher.cancel(2)
    assert f.batcher.leave(f.calls[2]) is None  # the others still want its results
    got = f.batcher.finished(batch.id, 0)
    assert got is not None and [(k, c.id) for k, c in got[1]] == [(0, 1), (2, 3)]
    assert f.batcher.finished(batch.id, 0) is None  # answered once


def test_the_last_call_leaving_a_sent_batch_gives_it_back_to_be_stopped() -> None:
    f = _Fixture()
    f.submit(1)
    f.submit(2)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 2, max_wait=0.5)
    f.batcher.take(batch)
    assert f.batcher.leave(f.calls[1]) is None
    assert f.batcher.leave(f.calls[2]) is batch
    assert f.batcher.sent == {}


def test_a_lost_worker_ends_the_batches_sent_to_it() -> None:
    f = _Fixture()
    f.submit(1)
    f.submit(2)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 2, max_wait=0.5)
    f.batcher.take(batch)
    f.batcher.lost(0)
    assert f.batcher.sent == {} and all(c.in_batch is None for c in f.calls.values())


def test_calls_of_another_kind_do_not_join() -> None:
    f = _Fixture()
    f.submit(1)
    f.submit(2, key="other")
    f.submit(3)
    _, batch, _ = f.batcher.started(f.calls[1], 0, lambda: 4, max_wait=0.5)
    assert [c.id for c in batch.calls] == [1, 3]
    assert f.dispatcher.state_of(2) is ItemState.QUEUED


# ---------------------------------------------------------------- real worker processes


@hetero.task(batch=BatchOptions(max_size=4, max_wait=0.2))
def tag(xs: list[int]) -> list[tuple[int, int, str]]:
    """Each value with the size of the batch it ran in and the device."""
    device = hetero.get_current_device().id
    return [(x, len(xs), device) for x in xs]


def test_calls_coalesce_into_batches_of_at_most_max_size() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        futures = [ctx.submit(tag, i) for i in range(10)]
        results = [f.result(timeout=60) for f in futures]
        ctx.dispatcher.validate_state()
    assert [r[0] for r in results] == list(range(10))
    sizes = [r[1] for r in results]
    assert max(sizes) <= 4 and max(sizes) > 1  # coalesced, within the size
    assert ctx.stats["done"] == 10


@hetero.task(batch=BatchOptions(max_size=8, max_wait=0.2))
def sized(xs: list[int]) -> list[tuple[int, str]]:
    device = hetero.get_current_device().id
    return [(len(xs), device)] * len(xs)


def test_a_slower_device_runs_smaller_batches() -> None:
    with hetero.Context(devices=emulated_fleet([4.0, 1.0])) as ctx:
        results = [f.result(timeout=60) for f in [ctx.submit(sized, i) for i in range(60)]]
    by_device: dict[str, int] = {}
    for size, device in results:
        by_device[device] = max(by_device.get(device, 0), size)
    assert by_device.get("d0", 0) <= 8 and by_device.get("d1", 0) <= 2


@hetero.task(batch=BatchOptions(max_size=8, max_wait=0.2), memory="1GB")
def held(xs: list[int]) -> list[int]:
    return [len(xs)] * len(xs)


def test_a_batch_holds_no_more_calls_than_its_devices_memory() -> None:
    with hetero.Context(devices=emulated_fleet([1.0], memory="2GB")) as ctx:
        sizes = [f.result(timeout=60) for f in [ctx.submit(held, i) for i in range(6)]]
    assert max(sizes) <= 2


@hetero.task(batch=BatchOptions(max_size=4, max_wait=0.2))
def drops_one(xs: list[int]) -> list[int]:
    return xs[:-1]


def test_a_batch_returning_fewer_results_fails_every_caller_naming_the_task() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        futures = [ctx.submit(drops_one, i) for i in range(3)]
        errors = []
        for f in futures:
            with pytest.raises(TaskFailed) as err:
                f.result(timeout=60)
            errors.append(err.value)
    for error in errors:
        assert "(drops_one) failed: BatchResultError: drops_one returned" in error.message
        assert isinstance(error.__cause__, BatchResultError)
    counts = {e.message.split("returned ")[1].split(";")[0] for e in errors}
    assert all(c.endswith(" calls") or c.endswith(" call") for c in counts)
    assert ctx.stats["failed"] == 3 and ctx.stats["retried"] == 0


@hetero.task(batch=BatchOptions(max_size=4, max_wait=0.2))
def refuses(xs: list[int]) -> list[int]:
    if 2 in xs:
        raise ValueError(f"bad batch {sorted(xs)}")
    return xs


def test_a_failing_batch_fails_each_of_its_callers_with_the_reason() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        futures = [ctx.submit(refuses, i) for i in range(3)]
        for f in futures:
            with pytest.raises(TaskFailed, match=r"ValueError: bad batch \[") as err:
                f.result(timeout=60)
            assert isinstance(err.value.__cause__, ValueError)


@hetero.task(batch=BatchOptions(max_size=16, max_wait=1.0))
def values(xs: list[int]) -> list[tuple[int, list[int]]]:
    return [(x, sorted(xs)) for x in xs]


def test_a_call_cancelled_before_its_batch_runs_is_left_out_of_it() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])).start() as ctx:
        futures = [ctx.submit(values, i) for i in range(3)]
        assert futures[1].cancel()
        done = [futures[0].result(timeout=60), futures[2].result(timeout=60)]
        assert futures[1].cancelled()
        ctx.dispatcher.validate_state()
    assert done == [(0, [0, 2]), (2, [0, 2])]
    assert ctx.stats["cancelled"] == 1 and ctx.stats["done"] == 2


@hetero.task(batch=BatchOptions(max_size=8, max_wait=0.2), retries=2)
def dies_once(xs: list[str]) -> list[str]:
    marker = Path(xs[0]).parent / "died"
    if not marker.exists():
        marker.touch()
        os._exit(9)  # the worker dies with the whole batch
    return [Path(x).name for x in xs]


def test_calls_of_a_batch_whose_worker_died_are_retried_and_complete(tmp_path: Path) -> None:
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])).start() as ctx:
        futures = [ctx.submit(dies_once, str(tmp_path / f"x{i}")) for i in range(4)]
        assert [f.result(timeout=60) for f in futures] == ["x0", "x1", "x2", "x3"]
        ctx.dispatcher.validate_state()
    assert ctx.stats["done"] == 4 and ctx.stats["retried"] >= 1


@hetero.task(batch=BatchOptions(max_size=4, max_wait=0.05))
def shaped(xs: list[int], scale: list[int] | None = None) -> list[int]:
    return [x * s for x, s in zip(xs, scale, strict=True)] if scale is not None else xs


def test_only_calls_of_one_shape_share_a_batch_and_map_passes_its_batches() -> None:
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        plain = [ctx.submit(shaped, i) for i in range(5)]
        scaled = [ctx.submit(shaped, i, scale=10) for i in range(5)]
        assert [f.result(timeout=60) for f in plain] == [0, 1, 2, 3, 4]
        assert [f.result(timeout=60) for f in scaled] == [0, 10, 20, 30, 40]
        assert list(ctx.map(shaped, range(11))) == list(range(11))


@hetero.task(batch=BatchOptions(max_size=2, max_wait=30.0))
def sleepy(xs: list[int]) -> list[tuple[int, int]]:
    time.sleep(3.0)
    return [(x, len(xs)) for x in xs]


def test_a_call_that_times_out_in_a_running_batch_leaves_the_others_their_results() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])).start() as ctx:
        hasty = ctx.submit(sleepy.with_options(timeout=1.0), 1)
        patient = ctx.submit(sleepy, 2)  # the batch is full: it runs, for 3 s
        with pytest.raises(TaskFailed, match="timed out after"):
            hasty.result(timeout=60)
        assert patient.result(timeout=60) == (2, 2)  # its worker was not stopped
        ctx.dispatcher.validate_state()
    assert ctx.stats["failed"] == 1 and ctx.stats["done"] == 1
