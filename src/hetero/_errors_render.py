"""Helpers that turn pydantic validation errors into ``(field path, message)`` problems, shared
by the fleet config and the workload spec."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["lookup", "render_path", "show"]


def show(value: Any) -> str:
    """A short ``repr`` of a bad value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def render_path(loc: Sequence[int | str]) -> str:
    """``("devices", 2, "model")`` → ``devices[2].model``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def lookup(data: Any, loc: Sequence[int | str]) -> Any:
    """The value at ``loc`` in nested dicts/lists, or ``None`` if there is none."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data
