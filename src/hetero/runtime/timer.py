"""The engine's one timer: a thread that sleeps on a condition of the engine's lock until the
earliest time something is due (the dispatcher's next deadline, a batch's wait), then fires.

Waiting on the engine's own lock means a ``wake`` given with that lock held is never missed:
the thread is either waiting (and wakes) or about to read the due time again.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["TimerThread"]


class TimerThread:
    """Calls ``fire(now)`` with ``lock`` held whenever ``due()`` (a ``time.monotonic`` time,
    ``inf``: nothing pending) has come, then ``after()`` with the lock released (to send what
    firing led to and complete the futures it ended). Call ``wake``, with the lock held,
    whenever the due time moves earlier."""

    def __init__(
        self,
        lock: threading.RLock,
        due: Callable[[], float],
        fire: Callable[[float], None],
        after: Callable[[], None],
    ) -> None:
        self._lock = lock
        self._cond = threading.Condition(lock)
        self._due = due
        self._fire = fire
        self._after = after
        self._stopped = False

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True, name="hetero-timer").start()

    def wake(self) -> None:
        """Read the due time again (called with the lock held)."""
        self._cond.notify()

    def stop(self) -> None:
        """End the thread (called with the lock held); it fires no more."""
        self._stopped = True
        self._cond.notify_all()

    def _loop(self) -> None:
        with self._lock:
            while not self._stopped:
                now = time.monotonic()
                delay = self._due() - now
                if delay > 0:
                    self._cond.wait(None if delay == math.inf else delay)
                    continue
                self._fire(now)
                self._lock.release()
                try:
                    self._after()
                finally:
                    self._lock.acquire()
