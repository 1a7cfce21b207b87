"""How functions, arguments and results travel between the driver and the workers.

cloudpickle with pickle protocol 5: buffers of at least ``SHM_THRESHOLD`` bytes that objects
export to pickle 5 (numpy arrays, ``PickleBuffer``s; not plain ``bytes``) go out of band
through shared-memory files, written once by the sender and mapped by the receiver without a
copy; smaller ones stay in the pickle stream. A segment is a file in ``/dev/shm`` whose name
starts with ``hetero-<driver pid>-``, so whatever a dead process left behind can be found and
removed.

A task's large results stay in their segments for as long as the driver holds them (the file is
removed when the array is garbage-collected). Passed on to another task, such a buffer is not
written again: the next worker maps the same segment. On one machine every device's worker
reaches shared memory alike, so a task graph's intermediate results are where every device can
use them.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import operator
import os
import pickle
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import cloudpickle

from hetero.runtime.procs import left_by_dead_process

__all__ = [
    "SHM_THRESHOLD",
    "Packed",
    "pack",
    "remove_segments",
    "remove_stale",
    "segment_dir",
    "unpack",
]

#: Buffers at least this large travel through shared memory instead of the pickle stream.
SHM_THRESHOLD = 256 * 1024

_counter = itertools.count()


def segment_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


_DIR = segment_dir()


#: ``(name, size, owned)``: ``owned`` segments were written for this message and are removed
#: with it; the others belong to a kept result that the message only refers to.
Segment = tuple[str, int, bool]


@dataclass(slots=True)
class Packed:
    """A pickled object: the stream, the shared-memory segments of its large buffers, its size
    in bytes, the seconds packing took and, once shipped, where a backend put it."""

    data: bytes
    segments: list[Segment] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0
    # Where a backend put these bytes for workers on other machines (Ray: an object store
    # reference), so that a retry ships a reference, not the bytes; it lives as long as this.
    handle: Any = None

    def __reduce__(self) -> tuple[type[Packed], tuple[Any, ...]]:
        # A plain tuple of fields: pickling a slotted dataclass field by field costs 5x more,
        # on a path every task takes twice.
        return (Packed, _fields_Packed(self))


_fields_Packed = operator.attrgetter(*(f.name for f in fields(Packed)))

# Kept results mapped in this process: start address -> (segment name, size). Read when packing
# (any thread), written when unpacking and by finalizers (when a result is collected).
_kept: dict[int, tuple[str, int]] = {}
_kept_names: set[str] = set()
_lent: set[str] = set()  # kept segments referred to by a message: mapped elsewhere too
_kept_lock = threading.Lock()


class SegmentPool:
    """Segment files this process wrote whose reader has let go of them, kept for the next
    buffers of their size class (powers of two): rewriting a file's pages costs about half of
    allocating and zeroing fresh ones. Holds at most ``cap`` bytes; the rest is removed."""

    def __init__(self, cap: int = 256 * 2**20) -> None:
        self.cap = cap
        self._free: dict[int, list[str]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> str | None:
        size = _size_class(nbytes)
        with self._lock:
            names = self._free.get(size)
            if not names:
                return None
            self._bytes -= size
            return names.pop()

    def give(self, name: str, nbytes: int) -> None:
        size = _size_class(nbytes)
        with self._lock:
            if self._bytes + size <= self.cap:
                self._free.setdefault(size, []).append(name)
                self._bytes += size
                return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_DIR / name)

    def clear(self) -> None:
        with self._lock:
            names = [n for group in self._free.values() for n in group]
            self._free.clear()
            self._bytes = 0
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_DIR / name)


def _size_class(nbytes: int) -> int:
    return 1 << max(nbytes - 1, 0).bit_length()


def pack(obj: Any, prefix: str, pool: SegmentPool | None = None, *, inline: bool = False) -> Packed:
    """Pickle ``obj``; large buffers are written to segments named ``<prefix>-<n>`` (or to free
    files of ``pool``), except those of kept results, which are referred to. ``inline``: every
    buffer stays in the stream (for a receiver that may not share this machine's memory).

    Raises whatever pickling raises (the caller names the argument that failed)."""
    t0 = time.perf_counter()
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if inline or raw.nbytes < SHM_THRESHOLD:
            return True  # in band: cheaper than a file for small buffers
        buffers.append(raw)
        return False

    dumps = pickle.dumps if _plain(obj, 0) else cloudpickle.dumps
    data = dumps(obj, protocol=5, buffer_callback=out_of_band)
    segments: list[Segment] = []
    nbytes = len(data)
    try:
        for raw in buffers:
            nbytes += raw.nbytes
            kept = _kept.get(_address(raw)) if _kept else None
            if kept is not None and kept[1] == raw.nbytes:
                segments.append((kept[0], raw.nbytes, False))
                with _kept_lock:
                    _lent.add(kept[0])  # another process maps it now: never rewrite it
                continue
            name = pool.take(raw.nbytes) if pool is not None else None
            if name is None:
                name = f"{prefix}-{next(_counter)}"
                _write_segment(name, raw, create=True)
            else:
                _write_segment(name, raw, create=False)
            segments.append((name, raw.nbytes, True))
    except BaseException:
        remove_segments(segments)
        raise
    return Packed(data, segments, nbytes, time.perf_counter() - t0)


def _address(raw: memoryview) -> int:
    import numpy as np

    return int(np.frombuffer(raw, dtype=np.uint8).ctypes.data)


_PLAIN_TYPES = frozenset({int, float, str, bytes, bool, type(None), complex})


def _plain(obj: Any, depth: int) -> bool:
    """Whether plain pickle is enough for ``obj`` (builtin values, numpy arrays, small
    containers of them): 5x cheaper than cloudpickle, which is only needed for code and for
    classes defined in ``__main__``."""
    t = type(obj)
    if t in _PLAIN_TYPES:
        return True
    if t is tuple or t is list:
        return depth < 3 and len(obj) <= 32 and all(_plain(x, depth + 1) for x in obj)
    if t is dict:
        return (
            depth < 3
            and len(obj) <= 32
            and all(type(k) is str and _plain(v, depth + 1) for k, v in obj.items())
        )
    return t.__module__ == "numpy" and t.__name__ == "ndarray" and not obj.dtype.hasobject


def _write_segment(name: str, raw: memoryview, create: bool) -> None:
    flags = os.O_CREAT | os.O_EXCL | os.O_WRONLY if create else os.O_WRONLY
    fd = os.open(_DIR / name, flags, 0o600)
    try:
        view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
        done = 0
        while done < len(view):  # a write may take less than asked for large buffers
            done += os.pwrite(fd, view[done:], done)
    finally:
        os.close(fd)


def _map_segment(
    name: str, size: int, keep: bool, on_release: Callable[[str, int], None] | None
) -> memoryview:
    if size == 0:
        return memoryview(bytearray())
    fd = os.open(_DIR / name, os.O_RDWR)
    try:
        # Kept results are mapped shared, so that what the driver writes into them is what a
        # later task reads; everything else privately (copy-on-write): a task may write to its
        # arguments without changing what a retry would read.
        mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED if keep else mmap.MAP_PRIVATE)
    finally:
        os.close(fd)
    if keep:
        address = _address(memoryview(mm))
        with _kept_lock:
            _kept[address] = (name, size)
            _kept_names.add(name)
        weakref.finalize(mm, _release_kept, address, name, size, on_release)
    elif on_release is not None:
        weakref.finalize(mm, on_release, name, size)
    return memoryview(mm)


def _release_kept(
    address: int, name: str, size: int, on_release: Callable[[str, int], None] | None
) -> None:
    with _kept_lock:
        if _kept.get(address, (None,))[0] == name:
            del _kept[address]
        _kept_names.discard(name)
        lent = name in _lent
        _lent.discard(name)
    if on_release is not None and not lent:
        on_release(name, size)  # its writer may use the file again
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_DIR / name)


def unpack(
    packed: Packed,
    *,
    keep: bool = False,
    on_release: Callable[[str, int], None] | None = None,
) -> tuple[Any, float]:
    """The object and the seconds unpacking took. Large buffers are mapped, not copied;
    ``keep`` (results reaching the driver) leaves their files in place until the object is
    collected, so that a task they are passed to maps them again instead of a copy.

    ``on_release(name, size)`` is called (from whichever thread collects it) once this
    process no longer maps a segment the sender owns, so that the sender may rewrite it; a kept
    segment that was passed on to another task is removed instead."""
    t0 = time.perf_counter()
    buffers = [
        _map_segment(name, size, keep and owned, on_release if owned else None)
        for name, size, owned in packed.segments
    ]
    obj = pickle.loads(packed.data, buffers=buffers)
    return obj, time.perf_counter() - t0


def remove_segments(segments: list[Segment]) -> None:
    """Remove the segments a message owns (not the kept results it refers to)."""
    for name, _, owned in segments:
        if owned:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_DIR / name)


def remove_prefix(prefix: str) -> int:
    """Remove every segment whose name starts with ``prefix`` (what a dead process left), except
    kept results still in use here."""
    removed = 0
    for path in _DIR.glob(f"{prefix}*"):
        if path.name in _kept_names:
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    return removed


def remove_stale() -> int:
    """Remove the segments of drivers that are no longer running (killed before they could
    clean up)."""
    removed = 0
    for path in _DIR.glob("hetero-*"):
        if left_by_dead_process(path.name):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed
