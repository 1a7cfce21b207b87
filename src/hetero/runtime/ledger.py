"""The driver's data ledger: the shared-memory files that carry task arguments to workers, the
results kept from workers' files, and what ended tasks leave behind (argument files, checkpoint
directories), removed off the latency path.

An argument file may be mapped by several workers (a task retried elsewhere, or stolen); it is
rewritten for a later task only once no worker maps it (``SegmentPool``). The engine calls
every method but ``collect`` with its lock held.
"""

from __future__ import annotations

import shutil
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from hetero.runtime.serialize import (
    Packed,
    Segment,
    SegmentPool,
    pack,
    remove_prefix,
    unpack,
)

__all__ = ["Ledger"]


class Ledger:
    """Argument files by the devices that may still map them, and the garbage to remove.

    ``prefix`` names this driver's files; ``recycle(name, size)`` is called (from a finalizer,
    in any thread) once a kept result's file is no longer mapped here.
    """

    def __init__(self, prefix: str, recycle: Callable[[str, int], None]) -> None:
        self.prefix = prefix
        self._recycle = recycle
        self._pool = SegmentPool()
        self._readers: dict[str, set[int]] = {}  # file -> devices that may still map it
        self._retired: dict[str, int] = {}  # files of ended tasks still mapped: name -> size
        self._garbage: deque[list[Segment] | str] = deque()  # segments, checkpoint dirs

    def pack_arguments(self, task_id: int, value: Any, *, inline: bool) -> Packed:
        """``value`` packed, its large buffers in files of this driver (``inline``: in the
        message, for workers on other machines)."""
        return pack(value, f"{self.prefix}-a{task_id}", self._pool, inline=inline)

    def sent(self, packed: Packed, device: int) -> None:
        """``device``'s worker was sent ``packed``: it may map its files until it lets go."""
        for name, _, owned in packed.segments:
            if owned:
                self._readers.setdefault(name, set()).add(device)

    def release(self, packed: Packed) -> None:
        """The task ``packed`` belongs to has ended: its files are removed (in ``collect``, after
        the futures are set: unlinking 100 MB of shared memory takes longer than the rest of a
        round trip) or, while a worker still maps them, once it lets go."""
        free: list[Segment] = []
        for segment in packed.segments:
            name, size, owned = segment
            if not owned:
                continue  # a kept result's: it is the result's to remove
            if self._readers.get(name):
                self._retired[name] = size  # recycled once every worker lets go
            else:
                self._readers.pop(name, None)
                free.append(segment)
        if free:
            self._garbage.append(free)

    def discard(self, directory: str) -> None:
        """Remove ``directory`` (an ended task's checkpoints) at the next ``collect``."""
        self._garbage.append(directory)

    def let_go(self, device: int, names: Iterable[str]) -> None:
        """``device``'s worker no longer maps these argument files."""
        free: list[Segment] = []
        for name in names:
            readers = self._readers.get(name)
            if readers is None:
                continue
            readers.discard(device)
            if not readers:
                del self._readers[name]
                size = self._retired.pop(name, None)
                if size is not None:
                    free.append((name, size, True))
        if free:
            self._garbage.append(free)

    def worker_gone(self, device: int) -> None:
        """``device``'s worker is gone: it maps nothing any more."""
        self.let_go(device, [n for n, d in self._readers.items() if device in d])

    def open_result(self, packed: Packed) -> tuple[Any, float]:
        """A worker's result and the seconds unpacking took; its files stay mapped while the
        result is alive (kept), then go back through ``recycle``."""
        return unpack(packed, keep=True, on_release=self._recycle)

    def collect(self) -> None:
        """Remove what ended tasks left behind (called outside the lock, by any thread)."""
        garbage = self._garbage
        while garbage:
            try:
                item = garbage.popleft()
            except IndexError:  # another thread took the last one
                break
            if isinstance(item, str):
                shutil.rmtree(item, ignore_errors=True)
            else:
                for name, size, _ in item:
                    self._pool.give(name, size)

    def close(self) -> None:
        """Remove every file of this driver, those still mapped at the end included."""
        self._pool.clear()
        remove_prefix(self.prefix)
