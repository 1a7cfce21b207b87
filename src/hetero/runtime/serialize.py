"""How functions, arguments and results travel between the driver and the workers.

cloudpickle with pickle protocol 5: buffers of at least ``SHM_THRESHOLD`` bytes (numpy arrays,
bytes-like data) go out of band through shared-memory files, written once by the sender and
mapped by the receiver without a copy; smaller ones stay in the pickle stream. A segment is a
file in ``/dev/shm`` named ``hetero-<driver pid>-<sender pid>-<n>``, so the driver can remove
whatever a dead worker left behind.
"""

from __future__ import annotations

import contextlib
import itertools
import mmap
import operator
import os
import pickle
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import cloudpickle

__all__ = [
    "SHM_THRESHOLD",
    "Packed",
    "pack",
    "remove_segments",
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


@dataclass(slots=True)
class Packed:
    """A pickled object: the stream, the shared-memory segments of its large buffers
    (``(name, size)``), its size in bytes and the seconds packing took."""

    data: bytes
    segments: list[tuple[str, int]] = field(default_factory=list)
    nbytes: int = 0
    seconds: float = 0.0

    def __reduce__(self) -> tuple[type[Packed], tuple[Any, ...]]:
        # A plain tuple of fields: pickling a slotted dataclass field by field costs 5x more,
        # on a path every task takes twice.
        return (Packed, _fields_Packed(self))


_fields_Packed = operator.attrgetter(*(f.name for f in fields(Packed)))


def pack(obj: Any, prefix: str) -> Packed:
    """Pickle ``obj``; large buffers are written to segments named ``<prefix>-<n>``.

    Raises whatever pickling raises (the caller names the argument that failed)."""
    t0 = time.perf_counter()
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        if buf.raw().nbytes < SHM_THRESHOLD:
            return True  # in band: cheaper than a file for small buffers
        buffers.append(buf)
        return False

    dumps = pickle.dumps if _plain(obj, 0) else cloudpickle.dumps
    data = dumps(obj, protocol=5, buffer_callback=out_of_band)
    segments: list[tuple[str, int]] = []
    nbytes = len(data)
    try:
        for buf in buffers:
            raw = buf.raw()
            name = f"{prefix}-{next(_counter)}"
            _write_segment(name, raw)
            segments.append((name, raw.nbytes))
            nbytes += raw.nbytes
    except BaseException:
        remove_segments(segments)
        raise
    return Packed(data, segments, nbytes, time.perf_counter() - t0)


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


def _write_segment(name: str, raw: memoryview) -> None:
    fd = os.open(_DIR / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
        done = 0
        while done < len(view):  # os.write may write less than asked for large buffers
            done += os.write(fd, view[done:])
    finally:
        os.close(fd)


def _map_segment(name: str, size: int) -> memoryview:
    if size == 0:
        return memoryview(bytearray())
    fd = os.open(_DIR / name, os.O_RDWR)
    try:
        # A private (copy-on-write) mapping: the receiver may write to its arrays without
        # changing what the sender wrote, which a retry may read again.
        mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE)
    finally:
        os.close(fd)
    return memoryview(mm)


def unpack(packed: Packed, *, consume: bool = False) -> tuple[Any, float]:
    """The object and the seconds unpacking took. Large buffers are mapped, not copied;
    ``consume`` removes their files once mapped (the mapping lives on)."""
    t0 = time.perf_counter()
    buffers = [_map_segment(name, size) for name, size in packed.segments]
    if consume:
        remove_segments(packed.segments)
    obj = pickle.loads(packed.data, buffers=buffers)
    return obj, time.perf_counter() - t0


def remove_segments(segments: list[tuple[str, int]]) -> None:
    for name, _ in segments:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_DIR / name)


def remove_prefix(prefix: str) -> int:
    """Remove every segment whose name starts with ``prefix`` (what dead processes left)."""
    removed = 0
    for path in _DIR.glob(f"{prefix}*"):
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
