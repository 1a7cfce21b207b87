"""This rank's time in collectives: :func:`stats`, :func:`reset_stats`, :func:`gather_stats`;
and, for a process that ``hetero profile`` runs (``HETERO_PROFILE_DIR`` set), the file each
rank leaves there for the command to merge into one report."""

from __future__ import annotations

import atexit
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hetero.comm._base import boundary
from hetero.comm._groups import Group, scope
from hetero.telemetry.collectives import RECORDER, RankCollectives
from hetero.telemetry.profile import PROFILE_DIR_ENV, PROFILE_NAME_ENV

__all__ = ["gather_stats", "reset_stats", "stats"]

log = logging.getLogger("hetero.comm")


@dataclass(slots=True)
class _Since:
    """Where ``stats()`` counts from: the process's start, or the last ``reset_stats()``."""

    baseline: RankCollectives | None = None


_since = _Since()


def stats() -> RankCollectives:
    """This rank's collectives since the process started or ``reset_stats()``: per op name,
    the calls, the seconds this rank was blocked in them and the bytes of the tensors passed.
    Works without a process group (all zero)."""
    now = RECORDER.snapshot()
    start = _since.baseline or RankCollectives(
        now.rank, now.world_size, {}, now.started, now.started
    )
    return now.since(start)


def reset_stats() -> None:
    """Count ``stats()`` from now on (the profiler's own windows are not affected)."""
    _since.baseline = RECORDER.snapshot()


def gather_stats(*, group: Group | None = None) -> list[RankCollectives]:
    """Every rank's ``stats()``, in rank order (of ``group``; on a rank outside it, ``[]``).
    A collective like the others, but not counted in them."""
    where = scope(group)
    if where.index is None:
        return []
    out: list[Any] = [None] * where.size
    with boundary("gather_stats"):
        dist.all_gather_object(out, stats().to_dict(), group=where.pg)
    return [RankCollectives.from_dict(data) for data in out]


@dataclass(slots=True)
class _RankFile:
    """Where this process's collectives go when ``hetero profile`` runs it, counted from its
    first ``init``; ``joined`` while it is in a process group."""

    path: Path
    start: RankCollectives
    joined: bool = True


@dataclass(slots=True)
class _Profiled:
    file: _RankFile | None = None
    at_exit: bool = False


_profiled = _Profiled()


def joined() -> None:
    """``init`` has joined a process group: under ``hetero profile``, start (or go on)
    counting this process's collectives for its rank file."""
    directory = os.environ.get(PROFILE_DIR_ENV)
    if _profiled.file is not None:
        _profiled.file.joined = True
    elif directory:
        name = os.environ.get(PROFILE_NAME_ENV) or "run"
        path = Path(directory) / f"{name}.collectives.{os.getpid()}.json"
        _profiled.file = _RankFile(path, RECORDER.snapshot())
    if _profiled.file is not None and not _profiled.at_exit:
        # For a script that never calls destroy(); multiprocessing's children skip atexit,
        # so they are covered by destroy() alone.
        atexit.register(_write_if_joined)
        _profiled.at_exit = True


def leaving() -> None:
    """``destroy`` is about to leave the process group: write the rank file as it stands."""
    if _profiled.file is not None and _profiled.file.joined:
        _write(_profiled.file)
        _profiled.file.joined = False


def _write_if_joined() -> None:
    if _profiled.file is not None and _profiled.file.joined:
        _write(_profiled.file)


def _write(file: _RankFile) -> None:
    record = RECORDER.snapshot().since(file.start)
    try:
        file.path.parent.mkdir(parents=True, exist_ok=True)
        file.path.write_text(json.dumps(record.to_dict()), "utf-8")
    except OSError as exc:  # in teardown: say so, never fail the rank for it
        log.warning("could not write this rank's collective times to %s: %s", file.path, exc)
