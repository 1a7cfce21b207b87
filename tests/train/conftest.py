"""Fixtures the training tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def group() -> Iterator[None]:
    """A process group of this one rank, left as it was found."""
    from hetero import comm  # here, not at the top: a test module skips itself without torch
    from hetero.commands.launch import free_port

    comm.init(0, 1, backend="gloo", master_port=free_port(), timeout=30)
    yield
    comm.destroy()
