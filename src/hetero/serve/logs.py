"""The router's logs under a flood: a message repeated many times is written once per interval.

A server that runs out of descriptors fails ``accept()`` thousands of times a second, and asyncio
logs each failure with its traceback; one line with a count says as much.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

__all__ = ["RepeatFilter"]

_Key = tuple[str, int, str, type[BaseException] | None]


class RepeatFilter(logging.Filter):
    """Passes a message at most once per ``interval`` seconds; the repeats meanwhile are
    counted, and the next one that passes says how many were left out. A message is its
    logger, level, first line of text and exception type (asyncio's further lines name the
    timer or socket of each repeat), so different errors each get their line."""

    def __init__(
        self,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        max_kept: int = 1024,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.max_kept = max_kept
        self._clock = clock
        self._seen: dict[_Key, tuple[float, int]] = {}  # -> (when it last passed, left out since)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        text = record.getMessage()
        first = text.partition("\n")[0]
        key = (record.name, record.levelno, first, type(exc) if exc is not None else None)
        now = self._clock()
        passed, left_out = self._seen.get(key, (-self.interval, 0))
        if now - passed < self.interval:
            self._seen[key] = (passed, left_out + 1)
            return False
        if left_out:
            record.msg = f"{text} ({left_out} more like it in the last {now - passed:.0f} s)"
            record.args = None
        if len(self._seen) >= self.max_kept:
            self._seen.clear()  # bounded: at worst, a repeat is written once more
        self._seen[key] = (now, 0)
        return True
