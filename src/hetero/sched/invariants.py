"""The dispatcher's invariants, as free functions of its state (as dask's scheduler's
``validate_*``): what the item records say against the queues, the counters and the view.

``Dispatcher.validate_state`` runs them all (tests call it in their teardown); each raises
``AssertionError`` naming what disagrees. They read the dispatcher's private state: they are its
checks, kept apart so that the state machine holds only what runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hetero.sched.item import TERMINAL, ItemRecord, ItemState, SharedRun

if TYPE_CHECKING:
    from hetero.sched.dispatcher import Dispatcher

__all__ = ["validate_state"]

PENDING, QUEUED, RUNNING = ItemState.PENDING, ItemState.QUEUED, ItemState.RUNNING


@dataclass(slots=True)
class _Tally:
    """What the active records hold, per device (``_validate_record`` adds each)."""

    n: int
    running: npt.NDArray[np.int64] = field(init=False)
    queued: npt.NDArray[np.int64] = field(init=False)
    outstanding: npt.NDArray[np.float64] = field(init=False)
    queued_work: npt.NDArray[np.float64] = field(init=False)
    since: npt.NDArray[np.float64] = field(init=False)  # the running slots' start times, summed
    mem: npt.NDArray[np.int64] = field(init=False)
    pending: int = 0
    active: int = 0
    members: dict[SharedRun, int] = field(default_factory=dict)  # items seen in each run

    def __post_init__(self) -> None:
        n = self.n
        self.running = np.zeros(n, dtype=np.int64)
        self.queued = np.zeros(n, dtype=np.int64)
        self.outstanding = np.zeros(n)
        self.queued_work = np.zeros(n)
        self.since = np.zeros(n)
        self.mem = np.zeros(n, dtype=np.int64)


def validate_state(d: Dispatcher) -> None:
    """Check every invariant between records, queues and the view (``AssertionError``)."""
    tally = _Tally(d.view.n)
    for rec in d.records.values():
        _validate_record(d, rec, tally)
    for run, n in tally.members.items():
        assert run.members == n, f"a shared run counts {run.members} members, {n} are in it"
    if d.keep_finished:  # else the records of finished items are gone: no totals to check
        _validate_counters(d, tally)
    _validate_devices(d)


def _validate_record(d: Dispatcher, rec: ItemRecord, tally: _Tally) -> None:
    """One record: its history ends in its state, an active item is pending, queued or running,
    and a placed one is where its device's queue or running set says, on a device it may use;
    adds what it holds to ``tally``."""
    state = rec.state
    assert rec.history[-1] is state, f"{rec.item.id}: history does not end in {state}"
    if state in TERMINAL:
        return
    tally.active += 1
    assert state in (PENDING, QUEUED, RUNNING), f"{rec.item.id}: stuck in {state}"
    if state is PENDING:
        tally.pending += 1
        return
    i = rec.device
    if rec.only is not None:
        assert rec.only[i], f"{rec.item.id}: placed outside its only= devices"
    tally.outstanding[i] += rec.item.cost
    tally.mem[i] += rec.item.memory
    if state is QUEUED:
        tally.queued[i] += 1
        tally.queued_work[i] += rec.item.cost
        assert any(e[3] is rec and e[2] == rec.seq for e in d._queues.devices[i]), (
            f"{rec.item.id}: queued on {i} but not in its queue"
        )
        return
    run = rec.run
    if run is None:
        tally.running[i] += 1
        tally.since[i] += rec.started
    else:
        if run not in tally.members:  # a shared run holds one slot
            tally.members[run] = 0
            tally.running[i] += 1
            tally.since[i] += run.started
        tally.members[run] += 1
    assert rec in d._running[i], f"{rec.item.id}: running but not tracked on {i}"


def _validate_counters(d: Dispatcher, tally: _Tally) -> None:
    """The dispatcher's counters and the view's per-device sums against the records'."""
    view = d.view
    assert tally.active == d.active, f"active {tally.active} != counter {d.active}"
    assert tally.pending + int(tally.queued.sum()) == d.waiting, "waiting counter drifted"
    assert np.array_equal(tally.running, view.running), "running counts drifted"
    assert np.array_equal(tally.running + tally.queued, view.in_flight), "in_flight drifted"
    assert np.allclose(tally.outstanding, view.outstanding, atol=1e-6), "outstanding drifted"
    assert np.allclose(tally.queued_work, np.array(view.queued_work), atol=1e-6), (
        "queued_work drifted"
    )
    assert np.array_equal(tally.mem, view.mem_used), "mem_used drifted"
    assert np.allclose(tally.outstanding - tally.queued_work, view.running_work, atol=1e-6), (
        "running_work drifted"
    )
    assert np.allclose(tally.since, view.running_since, atol=1e-6), "running_since drifted"
    class_totals = d._queues.class_totals()
    if class_totals is not None:
        work_by_class, count_by_class = class_totals
        assert np.allclose(tally.queued_work, work_by_class, atol=1e-6), "queued_below drifted"
        assert np.array_equal(tally.queued, count_by_class), "queued_from drifted"
    assert int(tally.queued.sum()) == d.queued_total, "queued_total drifted"


def _validate_devices(d: Dispatcher) -> None:
    """Free slots, memory, and health: a device is usable exactly when nothing keeps it out."""
    view = d.view
    # A device may run more than its slots only after set_slots lowered them.
    free = int(np.maximum(view.slots - view.running, 0)[view.usable].sum())
    assert free == d._free_slots, f"free slots {d._free_slots} != {free}"
    assert (view.mem_used <= view.mem_total).all(), "a device holds more memory than it has"
    # A down or removed device runs nothing; a held one finishes what it runs.
    idle = np.zeros(view.n, dtype=bool)
    idle[list(d._down | d._removed)] = True
    assert (view.running[idle] == 0).all(), "an unhealthy device is running items"
    for i in range(view.n):
        takes = i not in d._down and i not in d._removed and not d._holds[i]
        assert bool(view.usable[i]) == takes, f"device {i}: usable disagrees with its holds"
