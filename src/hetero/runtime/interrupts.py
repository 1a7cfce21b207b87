"""Ctrl-C said in one line: what was stopped and what had finished, not a traceback.

A ``Context`` or a map that Ctrl-C interrupts cancels what has not finished and gives the
``KeyboardInterrupt`` itself the summary (``interrupted: 12 of 40 items finished, 28
cancelled``); it goes on up, so code that catches it still can. Left uncaught, it ends the program
as any Ctrl-C does (killed by SIGINT: status 130 in a shell, since it stays a plain
``KeyboardInterrupt``), and the summary is all that is printed: a ``sys.excepthook``, installed the
first time one is summarised, prints it and hands every other exception to the hook it replaced.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["summarise", "summarised"]

_Hook = Callable[[type[BaseException], BaseException, TracebackType | None], Any]

_lock = threading.Lock()
_last: KeyboardInterrupt | None = None  # the one interrupt the hook prints as its summary
_previous: _Hook | None = None  # the hook replaced, once installed


def summarise(exc: KeyboardInterrupt, summary: str) -> None:
    """Make ``exc`` say ``summary``; if nothing catches it, that line is all that is printed."""
    global _last, _previous
    exc.args = (summary,)
    with _lock:
        _last = exc
        if _previous is None:
            _previous, sys.excepthook = sys.excepthook, _print_summary


def summarised(exc: BaseException) -> bool:
    """Whether ``exc`` already carries a summary (a map's, which a context leaves as it is)."""
    return exc is _last


def _print_summary(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if exc is _last:
        print(exc, file=sys.stderr, flush=True)
    else:
        assert _previous is not None  # installed together
        _previous(kind, exc, tb)
