"""Helpers of tests that start processes (workers, drivers, launched ranks): wait for what they
do, let Ctrl-C reach them, and tell when one has ended."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import psutil


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with Ctrl-C (SIGINT): a shell that runs the
    suite in the background (``make test &``) starts it with SIGINT ignored, the child would
    inherit that, and Python then never raises ``KeyboardInterrupt``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def gone(pid: int) -> bool:
    """The process has ended (or is a zombie nobody has reaped yet)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
