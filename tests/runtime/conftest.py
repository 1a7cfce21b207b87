"""Fixtures of the engine's tests: none of them leaves a worker process behind."""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest


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
