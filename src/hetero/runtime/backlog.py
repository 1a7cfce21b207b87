"""``Backlog``: the tasks a Context holds past the dispatcher's ``max_queue_size``.

Past that bound the dispatcher refuses new items (``QueueFull``); a Context keeps them instead,
and hands them on as room appears: the highest priority first (as the dispatcher's own queues
do), then in arrival order.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["Backlog"]

T = TypeVar("T")


class Backlog(Generic[T]):
    """Items waiting for room, highest ``priority`` first, then first come."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def push(self, item: T, priority: int) -> None:
        heapq.heappush(self._heap, (-priority, next(self._seq), item))

    def pop(self) -> T:
        return heapq.heappop(self._heap)[2]

    def remove(self, item: T) -> bool:
        """Take ``item`` out (a task cancelled while it waits); whether it was here."""
        for k, entry in enumerate(self._heap):
            if entry[2] is item:
                self._heap[k] = self._heap[-1]
                self._heap.pop()
                heapq.heapify(self._heap)
                return True
        return False

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[T]:
        return (entry[2] for entry in self._heap)
