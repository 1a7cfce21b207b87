from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator, Sequence

import psutil
import pytest

from hetero.config import parse_config
from hetero.devices.fleet import build_fleet
from hetero.devices.spec import Device


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with Ctrl-C (SIGINT): a shell that runs the
    suite in the background (``make test &``) starts it with SIGINT ignored, the child would
    inherit that, and Python then never raises ``KeyboardInterrupt``."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def emulated(speeds: Sequence[float], **extra: object) -> list[Device]:
    """Emulated GPUs d0, d1, … of the given relative speeds."""
    config = parse_config(
        {
            "devices": [
                {"type": "gpu", "model": "A100-80GB", "emulate": True, "speed": s, "name": f"d{i}"}
                | extra
                for i, s in enumerate(speeds)
            ]
        }
    )
    return build_fleet(config)


@pytest.fixture(autouse=True)
def no_orphan_workers() -> Iterator[None]:
    """Every test ends with no worker process left behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    left = [
        p
        for p in psutil.Process().children(recursive=True)
        if p.pid not in before and p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    for p in left:
        p.kill()
    assert not left, f"worker processes left running: {[p.pid for p in left]}"


def wait_for(predicate: Callable[[], object], timeout: float = 30.0) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)
