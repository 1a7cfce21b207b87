"""Fixtures of the scheduler's tests (their fleet is tests/fleets.py's)."""

from __future__ import annotations

import pytest

from hetero.devices.spec import Device
from tests.fleets import make_devices


@pytest.fixture
def devices() -> list[Device]:
    return make_devices([2.5, 2.5, 1.0, 1.0])
