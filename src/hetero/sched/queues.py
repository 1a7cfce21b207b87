"""The dispatcher's queues, in one order within a priority: size (the default) or FIFO.

A central heap holds the items no device was chosen for yet (``pending``; those waiting past
``late_after`` move to a second heap, ``late``, behind every other), and each device has a heap
of the items placed on it (``devices[i]``). Two orders, two classes (as vLLM's
``RequestQueue``): ``Queues`` keeps arrival order; ``SizeOrderedQueues`` runs the item with the
earliest aged size key first and keeps the view's per-class sums of each device queue, which
``FleetView.delay_score`` reads. ``make_queues`` picks one, so that nothing else asks which
order it has.

Entries are ``(-priority, key, seq, record)``. An item that leaves a heap other than from its
top (it moved, started elsewhere or ended) leaves its entry behind, stale: finding it would cost
a search. Each push gives the item a new ``seq``, so an entry is live while it holds the item's
``seq`` and the item is in the state its heap holds; ``head`` is that check, for every heap of
records the dispatcher keeps.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from hetero.sched.item import ItemRecord, ItemState
from hetero.sched.options import QueueOrder
from hetero.sched.perf import PerfModel
from hetero.sched.view import FleetView

__all__ = ["Entry", "Queues", "SizeOrderedQueues", "head", "make_queues"]

PENDING, QUEUED = ItemState.PENDING, ItemState.QUEUED

# (-priority, order key, seq, record): heap order is priority, then the key (the aged size key,
# or 0 for FIFO), then arrival.
Entry = tuple[int, float, int, ItemRecord]
# Any heap of records: its entries hold (seq, record) from some position on.
_E = TypeVar("_E", bound=tuple[Any, ...])
FloatArray = npt.NDArray[np.float64]


def head(heap: list[_E], state: ItemState, take: bool = False, at: int = 2) -> _E | None:
    """The first live entry of ``heap`` (``None``: none is left), left in it or, with ``take``,
    taken out; the stale ones above it are dropped. Live: the item's last push made it (its
    ``seq``, at position ``at`` of the entry, the record next) and it is still ``state``."""
    while heap:
        entry = heap[0]
        rec = entry[at + 1]  # not entry[-1]: a negative index costs twice as much
        if rec.seq == entry[at] and rec.state is state:
            if take:
                heappop(heap)
            return entry
        heappop(heap)
    return None


class Queues:
    """FIFO within a priority (``queue_order="fifo"``): every key is 0, so arrival decides."""

    def __init__(self, n: int) -> None:
        self.pending: list[Entry] = []
        self.late: list[Entry] = []  # pending items past late_after, in the same order
        self.devices: list[list[Entry]] = [[] for _ in range(n)]

    def add_device(self) -> None:
        self.devices.append([])

    def key(self, rec: ItemRecord) -> float:
        """The order of ``rec`` within its priority, the same in every queue."""
        return 0.0

    def wait(self, rec: ItemRecord) -> None:
        """``rec`` (pending, with a new ``seq``) waits in the central heap."""
        heappush(self.pending, (-rec.item.priority, self.key(rec), rec.seq, rec))

    def note_late(self, since: float) -> None:
        """Move the items at the head of the pending heap submitted at ``since`` or earlier to
        the late heap, behind every item that was not."""
        pending = self.pending
        while (entry := head(pending, PENDING)) is not None and entry[3].submitted <= since:
            heappush(self.late, heappop(pending))

    def push(self, rec: ItemRecord, i: int) -> float:
        """``rec`` (queued, with a new ``seq``) joins device ``i``'s queue; returns its key."""
        heappush(self.devices[i], (-rec.item.priority, 0.0, rec.seq, rec))
        return 0.0

    def pop(self, i: int) -> ItemRecord | None:
        """The item to start next on device ``i``, taken out of its queue (``None``: empty)."""
        entry = head(self.devices[i], QUEUED, take=True)
        return None if entry is None else entry[3]

    def left(self, rec: ItemRecord, i: int, emptied: bool) -> None:
        """``rec`` left device ``i``'s queue other than by ``pop`` (its entry is stale now);
        ``emptied``: nothing is queued there any more."""

    def ordered(self, i: int) -> list[ItemRecord]:
        """The items queued on device ``i``, in the order they would start."""
        # The live entries (as ``head`` checks them), sorted: the order ``pop`` takes them in,
        # as no two entries tie (each has its own seq).
        live = [e for e in self.devices[i] if e[3].seq == e[2] and e[3].state is QUEUED]
        return [entry[3] for entry in sorted(live)]

    def class_totals(self) -> tuple[FloatArray, FloatArray] | None:
        """Per device, the queued work and items as the view's size-class sums hold them
        (``None``: these queues keep none)."""
        return None


class SizeOrderedQueues(Queues):
    """Within a priority, the earliest *aged size key* first (``queue_order="size"``): arrival
    time plus ``aging`` times the item's service time on the fastest usable device, that window
    capped at ``max_bypass`` seconds. Small items pass large ones, but only those that arrive
    within that window after them. Keeps the view's per-class sums of every device queue."""

    def __init__(
        self, view: FleetView, perf: PerfModel, aging: float, max_bypass: float | None
    ) -> None:
        super().__init__(view.n)
        self.view = view
        self.perf = perf
        self.aging = aging
        self.max_bypass = max_bypass
        view.size_order = True

    def key(self, rec: ItemRecord) -> float:
        item = rec.item
        if not item.cost:
            return rec.submitted
        window = self.aging * item.cost * self.perf.fastest_inv(item.kind)
        if self.max_bypass is not None and not window <= self.max_bypass:
            window = self.max_bypass  # also when no device is usable (an infinite window)
        return rec.submitted + window

    def push(self, rec: ItemRecord, i: int) -> float:
        key = self.key(rec)
        item = rec.item
        heappush(self.devices[i], (-item.priority, key, rec.seq, rec))
        view = self.view
        cost = item.cost
        if rec.size_class < 0:  # classed by the policy just now, as a rule
            last_cost, last = view.last_class
            rec.size_class = last if last_cost == cost else view.size_class(cost)
        view.note_queued(i, rec.size_class, cost, 1)
        return key

    def pop(self, i: int) -> ItemRecord | None:
        entry = head(self.devices[i], QUEUED, take=True)
        if entry is None:
            return None
        rec = entry[3]
        self.view.note_queued(i, rec.size_class, rec.item.cost, -1)
        return rec

    def left(self, rec: ItemRecord, i: int, emptied: bool) -> None:
        view = self.view
        view.note_queued(i, rec.size_class, rec.item.cost, -1)
        if emptied:
            view.clear_queue(i)  # drop the float drift of its sums

    def class_totals(self) -> tuple[FloatArray, FloatArray]:
        return self.view.queued_totals()


def make_queues(
    order: QueueOrder, view: FleetView, perf: PerfModel, aging: float, max_bypass: float | None
) -> Queues:
    """The queues for ``order`` (``DispatchOptions.queue_order``)."""
    if order == "size":
        return SizeOrderedQueues(view, perf, aging, max_bypass)
    return Queues(view.n)
