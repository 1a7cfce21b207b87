"""Profiles of a running ``Context``: each open session records every task attempt as a
``TaskTrace``, and this process's time in ``hetero.comm`` collectives over its window; a
finished one is written as a Chrome trace and an HTML report (``hetero.telemetry.Profile``)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero.devices.spec import Device
from hetero.runtime.worker import TaskReply
from hetero.telemetry.collectives import RECORDER, RankCollectives
from hetero.telemetry.trace import DeviceInfo, TaskTrace

if TYPE_CHECKING:
    from hetero.runtime.task_record import Task

__all__ = ["ProfileBlock", "ProfileSession", "Profiler"]

log = logging.getLogger("hetero.runtime")


@dataclass
class ProfileSession:
    """One profile being recorded: written as ``<directory>/<name>.*`` when it ends.
    ``collectives`` is this process's collective record as it began (``hetero.comm`` calls made
    while it is open count by difference, whichever thread makes them)."""

    name: str
    directory: Path
    started: float
    traces: list[TaskTrace] = field(default_factory=list)
    collectives: RankCollectives = field(default_factory=RECORDER.snapshot)


class Profiler:
    """The open sessions, each fed every attempt's trace. ``lock`` is the engine's: traces are
    recorded with it held; ``devices`` is the engine's fleet (it grows as devices join)."""

    def __init__(self, lock: threading.RLock, devices: Sequence[Device]) -> None:
        self._lock = lock
        self._devices = devices
        self._sessions: list[ProfileSession] = []

    def trace(self, task: Task, reply: TaskReply | None, status: str, error: str = "") -> None:
        """Record an attempt of ``task`` that ended with ``status`` (with the lock held)."""
        if not self._sessions:
            return
        now = time.monotonic()
        record = TaskTrace(
            task_id=task.id,
            name=task.name,
            device=self._devices[task.device].id if task.device >= 0 else "",
            attempt=task.attempt,
            cost=task.cost,
            submitted=task.submitted,
            sent=task.sent,
            started=reply.started if reply is not None else task.sent,
            ended=reply.ended if reply is not None else now,
            transfer_in=(task.packed.seconds if task.packed else 0.0)
            + (reply.unpack_seconds if reply is not None else 0.0),
            transfer_out=reply.pack_seconds if reply is not None else 0.0,
            bytes_in=task.packed.nbytes if task.packed else 0,
            bytes_out=reply.bytes_out if reply is not None else 0,
            status=status,
            error=error,
        )
        for session in self._sessions:
            session.traces.append(record)

    def start(self, name: str, directory: Path) -> ProfileSession:
        session = ProfileSession(name, directory, time.monotonic())
        with self._lock:
            self._sessions.append(session)
        return session

    def finish(self, session: ProfileSession, devices: Callable[[], list[DeviceInfo]]) -> Any:
        """End ``session`` and write its files, with the fleet's speeds that ``devices`` gives
        now; returns ``(Profile, paths)``."""
        from hetero.telemetry import Profile

        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)
        comm = RECORDER.snapshot().since(session.collectives)
        profile = Profile(
            session.traces,
            devices(),
            session.started,
            time.monotonic(),
            collectives=[comm] if comm.ops else [],
        )
        paths = profile.save(session.directory, unique_name(session.directory, session.name))
        log.info("profile written: %s", ", ".join(str(p) for p in paths))
        return profile, paths


class ProfileBlock:
    """What ``Context.profile`` returns: a context manager; after the block, ``profile`` holds
    the ``Profile`` and ``paths`` the files written. ``devices`` gives the fleet's speeds as
    the block ends."""

    def __init__(
        self,
        profiler: Profiler,
        devices: Callable[[], list[DeviceInfo]],
        name: str,
        directory: Path,
    ) -> None:
        self._profiler = profiler
        self._devices = devices
        self._name = name
        self._directory = directory
        self._session: ProfileSession | None = None
        self.profile: Any = None
        self.paths: tuple[Path, ...] = ()

    def __enter__(self) -> ProfileBlock:
        self._session = self._profiler.start(self._name, self._directory)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._session is not None
        self.profile, paths = self._profiler.finish(self._session, self._devices)
        self.paths = tuple(paths)


def unique_name(directory: Path, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``… when a report of that name exists already."""
    if not (directory / f"{name}.html").exists():
        return name
    for k in itertools.count(2):
        if not (directory / f"{name}-{k}.html").exists():
            return f"{name}-{k}"
    raise AssertionError("unreachable")
