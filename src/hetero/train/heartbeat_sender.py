"""A rank's side of ``hetero launch``'s hang detection: a daemon thread that looks at the main
thread every interval and writes its :class:`~hetero.train.heartbeat.Beat` to the file the
launcher names in ``HEARTBEAT_FILE_ENV``; and :func:`mark_progress`, for work that runs longer
than the launcher's ``--heartbeat-timeout`` outside any collective while the other ranks wait.

Progress needs no call in the training loop: every ``hetero.comm`` call that completes counts
(the Trainer makes one each step), and so does a main thread seen waiting in a collective.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from hetero.telemetry.collectives import RECORDER
from hetero.train.heartbeat import Tracker

__all__ = [
    "HEARTBEAT_FILE_ENV",
    "HEARTBEAT_INTERVAL_ENV",
    "Sender",
    "mark_progress",
    "start_from_env",
]

#: The file a rank writes its heartbeat to (set by ``hetero launch``).
HEARTBEAT_FILE_ENV = "HETERO_HEARTBEAT_FILE"
#: Seconds between two heartbeats.
HEARTBEAT_INTERVAL_ENV = "HETERO_HEARTBEAT_INTERVAL"


class _Marks:
    """The calls of ``mark_progress`` in this process (one int, bumped under the GIL)."""

    count = 0


def mark_progress() -> None:
    """Say that this rank is making progress: under ``hetero launch``, a rank that works for
    longer than ``--heartbeat-timeout`` outside any collective while its peers wait for it
    (rank 0 alone evaluating, say) calls it now and then, or it is taken for hung. Elsewhere
    it does nothing that matters."""
    _Marks.count += 1


class Sender(threading.Thread):
    """Writes this process's heartbeat to ``path`` every ``interval`` seconds, as one JSON
    line that replaces the last (a reader never sees half of one). Stops when the file cannot
    be written: the launcher that reads it is gone."""

    def __init__(self, path: Path, interval: float) -> None:
        super().__init__(name="hetero-heartbeat", daemon=True)
        self.path = path
        self.interval = interval
        self._main = threading.main_thread().ident
        self._tracker = Tracker(time.monotonic, self._done())
        self._stopping = threading.Event()

    def run(self) -> None:
        temporary = self.path.with_name(f"{self.path.name}.tmp")
        while True:
            beat = self._tracker.look(*self._main_frame(), self._done())
            try:
                temporary.write_text(beat.to_json())
                os.replace(temporary, self.path)
            except OSError:
                return
            if self._stopping.wait(self.interval):
                return

    def stop(self) -> None:
        self._stopping.set()
        self.join()

    def _main_frame(self) -> tuple[str, str]:
        """The module and place ("file:line (function)") of the main thread's innermost
        Python frame."""
        frame = sys._current_frames().get(self._main) if self._main is not None else None
        if frame is None:  # the main thread has ended: the interpreter is shutting down
            return "", "the interpreter's shutdown"
        code = frame.f_code
        module = str(frame.f_globals.get("__name__", ""))
        return module, f"{code.co_filename}:{frame.f_lineno} ({code.co_name})"

    @staticmethod
    def _done() -> tuple[int, float, int]:
        """What changes when the rank progresses: its collectives' calls and the seconds spent
        in them (an async call's ``wait()`` adds only seconds), and its ``mark_progress``."""
        snapshot = RECORDER.snapshot()
        return snapshot.calls, snapshot.seconds, _Marks.count


def start_from_env() -> Sender | None:
    """Start this rank's heartbeat when ``hetero launch`` asked for one (None otherwise)."""
    path = os.environ.get(HEARTBEAT_FILE_ENV)
    if not path:
        return None
    interval = float(os.environ.get(HEARTBEAT_INTERVAL_ENV, "1"))
    sender = Sender(Path(path), interval)
    sender.start()
    return sender
