"""Byte sizes written the way people write them: ``8GB``, ``8GiB``, ``512MB``, ``1.5 TB`` or bytes.

Decimal suffixes (kB, MB, GB, TB, PB) are powers of 1000 and binary ones (KiB … PiB) powers of 1024,
as in the SI/IEC standards, so ``8GB`` is 8,000,000,000 bytes and ``8GiB`` is 8,589,934,592.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from hetero.errors import ConfigError

__all__ = ["MAX_SIZE", "format_size", "parse_size"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z]*)\s*$")
ALLOWED = "a byte count or a number with a unit: B, kB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB"
#: The largest size: what a signed 64-bit byte count holds (8 EiB, far past any machine).
MAX_SIZE = 2**63 - 1
# Longer text is no size a person wrote; capping it keeps the arithmetic below small.
_MAX_CHARS = 64
# With at most _MAX_CHARS digits, a non-zero number times 10**100 is above MAX_SIZE and times
# 10**-100 is below half a byte, so larger exponents change nothing and are clamped.
_MAX_EXPONENT = 100


def parse_size(value: str | int | float) -> int:
    """Return ``value`` in bytes, at most ``MAX_SIZE``. Raises ``ConfigError`` (also a
    ``ValueError``) naming the value and what is allowed."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ConfigError(f"invalid size {value!r}: expected {ALLOWED}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"invalid size {value!r}: expected {ALLOWED}")
    size = _parse_text(value) if isinstance(value, str) else round(value)
    if size > MAX_SIZE:
        raise ConfigError(
            f"invalid size {value!r}: allowed: at most 2**63 - 1 bytes "
            f"({format_size(MAX_SIZE)}), far past any machine's memory"
        )
    return size


def _parse_text(value: str) -> int:
    if len(value) > _MAX_CHARS:
        raise ConfigError(
            f"invalid size {value[:_MAX_CHARS]!r}...: longer than {_MAX_CHARS} characters; "
            f"expected {ALLOWED}"
        )
    match = _SIZE_RE.match(value)
    if match is None:
        raise ConfigError(f"invalid size {value!r}: expected {ALLOWED}")
    number, exponent, unit = match.groups()
    factor = _UNITS.get(unit.lower())
    if factor is None:
        raise ConfigError(f"invalid size {value!r}: unknown unit {unit!r}; expected {ALLOWED}")
    power = max(-_MAX_EXPONENT, min(_MAX_EXPONENT, int(exponent or 0)))
    # Exact arithmetic: a float would lose bytes past 2**53.
    return round(Fraction(number) * Fraction(10) ** power * factor)


def format_size(n_bytes: int | float, binary: bool = True) -> str:
    """Render bytes for people: ``format_size(8 * 1024**3) == "8 GiB"``."""
    base, units = (
        (1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"])
        if binary
        else (
            1000,
            ["B", "kB", "MB", "GB", "TB", "PB"],
        )
    )
    value = float(n_bytes)
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            text = f"{value:.2f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
        value /= base
    raise AssertionError("unreachable")
