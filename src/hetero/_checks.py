"""Tests of values read from users, configs and engines, shared by the modules that check them:
``bool`` is an ``int`` to Python, and never a number or a count here."""

from __future__ import annotations

import math

__all__ = ["is_integer", "is_number", "is_positive"]


def is_integer(value: object) -> bool:
    """An ``int`` and not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite ``int`` or ``float``, not a ``bool``."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_positive(value: object) -> bool:
    """A finite number above 0."""
    return is_number(value) and value > 0  # type: ignore[operator]
