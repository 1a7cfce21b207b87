"""``StealIndex``: what an idle device may steal, found in O(log n) at each idle moment.

An idle device takes the item that would start last on the device whose queue takes longest to
drain, if it would finish it sooner itself. Scanning the fleet and that queue at every idle
moment would cost a pass over both, so the index keeps:

- per device, its queue's entries last-to-start first (its *tail*), so that the item to steal
  is the top of a heap;
- over the fleet, a heap of each device's drain time (queued work over its speed) as of when
  its queue last grew, whose keys never understate a queue: the top is checked against the
  queue as it is now and pushed back down when it shrank since;
- the *miss shortcut*: queues only shrink between enqueues, so once a device found nothing
  worth taking, none at most as fast finds anything until the next enqueue.

The index decides what to take; the dispatcher moves it (``Dispatcher._steal``).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace

import numpy as np
import numpy.typing as npt

from hetero.sched.item import ItemRecord, ItemState
from hetero.sched.perf import PerfModel
from hetero.sched.policy import Policy
from hetero.sched.queues import Queues, head
from hetero.sched.view import Cells, FleetView

__all__ = ["StealIndex"]

QUEUED = ItemState.QUEUED


def _cells(array: npt.NDArray[np.float64]) -> Cells[float]:
    return memoryview(array)  # type: ignore[arg-type,return-value,unused-ignore]


# (priority, -key, -seq, seq, record): a queue's entry, last to start first; (seq, record) at 3
# for ``head``.
_Tail = tuple[int, float, int, int, ItemRecord]


class StealIndex:
    """The tails, the drain heap and the miss shortcut of a dispatcher's device queues."""

    def __init__(self, view: FleetView, perf: PerfModel, policy: Policy, queues: Queues) -> None:
        self.view = view
        self.perf = perf
        self.policy = policy
        self._queues = queues.devices
        self._tails: list[list[_Tail]] = [[] for _ in range(view.n)]
        self._drain_heap: list[tuple[float, int]] = []  # (-seconds to drain, device)
        # The model's arrays are live (updated in place) until a device joins; read one entry at
        # a time through memoryviews, at half the cost of numpy's scalars.
        self._speed: Cells[float] = _cells(perf.speed())
        self._inv: dict[str, Cells[float]] = {}  # 1/speed by kind, as read so far
        # Speeds as floats for the drain times, as of when each device joined or was rescaled:
        # following each learned speed would move every key.
        self._drain_speed: list[float] = perf.speed().tolist()
        self._enqueues = 0  # items queued so far
        self._miss_at = -1  # _enqueues when a steal last found nothing worth taking
        self._miss_speed = 0.0  # the fastest thief that found nothing since then

    def add_device(self, i: int) -> None:
        """Device ``i`` joined the fleet: a new thief may find what the others did not."""
        self._tails.append([])
        self._speed = _cells(self.perf.speed())  # new arrays: one more device
        self._inv.clear()
        self._drain_speed.append(self._speed[i])
        self.forget_misses()

    def rescaled(self, i: int) -> None:
        """Device ``i``'s speed was rescaled (its slots changed)."""
        self._drain_speed[i] = self._speed[i]

    def forget_misses(self) -> None:
        """A thief may find work worth stealing now where none was (more room somewhere)."""
        self._miss_at = -1

    def queued(self, rec: ItemRecord, key: float, i: int) -> None:
        """``rec`` joined device ``i``'s queue with ``key`` (the view counts its work already)."""
        tail = self._tails[i]
        seq = rec.seq
        heappush(tail, (rec.item.priority, -key, -seq, seq, rec))
        queue = self._queues[i]
        if len(tail) > 64 + 2 * len(queue):
            # Items that started normally leave stale tail entries: drop them now and then, in
            # one pass over the queue's live entries (as ``head`` checks them) and a heapify.
            self._tails[i] = tail = [
                (-p, -k, -q, q, r) for p, k, q, r in queue if r.seq == q and r.state is QUEUED
            ]
            heapify(tail)
        self._enqueues += 1
        # Its drain time grew. Shrinks are not recorded: a key is then an upper bound that
        # _most_queued corrects.
        heap = self._drain_heap
        heappush(heap, (-self.view.queued_work[i] / self._drain_speed[i], i))
        if len(heap) > 64 + 4 * self.view.n:  # mostly outdated entries: rebuild
            self._drain_heap = [
                (-q / sp, j)
                for j, (q, sp) in enumerate(
                    zip(self.view.queued_work, self._drain_speed, strict=True)
                )
                if q > 1e-9
            ]
            heapify(self._drain_heap)

    def clear(self, i: int) -> None:
        """Device ``i``'s queue is empty."""
        self._tails[i].clear()

    def take(self, thief: int) -> ItemRecord | None:
        """The item idle device ``thief`` should steal: the one to start last on the device
        whose queue takes longest to drain, if it may run on ``thief`` and would finish there
        sooner; ``None`` when there is none to take."""
        view = self.view
        thief_speed = self._speed[thief]
        if self._miss_at == self._enqueues and thief_speed <= self._miss_speed:
            return None  # one at least as fast found nothing since the last enqueue
        victim = self._most_queued()
        entry = head(self._tails[victim], QUEUED, at=3) if victim >= 0 and victim != thief else None
        if entry is None:
            self._miss(thief_speed)
            return None
        rec = entry[4]
        item = rec.item
        if (rec.only is not None and not rec.only[thief]) or (
            item.memory  # numpy's scalars are slow: read them only for an item that needs to
            and item.memory
            > view.mem_total[thief] - view.mem_used_at[thief] - view.mem_external[thief]
        ):
            return None
        inv = self._inv.get(item.kind)
        if inv is None:
            inv = self._inv[item.kind] = _cells(self.perf.inv_speed(item.kind))
        here = (view.outstanding_at[thief] + item.cost) * inv[thief]
        there = view.outstanding_at[victim] * inv[victim]
        if not here < there:
            self._miss(thief_speed)
            return None
        if not self.policy.admits(item, view, thief):
            return None
        return rec

    def _most_queued(self) -> int:
        """The device whose queue takes longest to drain (-1 if no device has a queue).

        The top of the drain heap is checked against the current queue and pushed back down
        when it shrank since: O(log n) amortised, where a scan would cost a pass over every
        device at each idle moment."""
        heap = self._drain_heap
        queued = self.view.queued_work
        speed = self._drain_speed
        while heap:
            key, i = heap[0]
            current = queued[i] / speed[i]
            if current <= 1e-9:
                heappop(heap)
            elif -key <= current * (1 + 1e-9):
                return i
            else:
                heapreplace(heap, (-current, i))
        return -1

    def _miss(self, thief_speed: float) -> None:
        if self._miss_at != self._enqueues or thief_speed > self._miss_speed:
            self._miss_at = self._enqueues
            self._miss_speed = thief_speed
