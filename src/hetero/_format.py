"""Numbers as hetero's reports print them (the simulator's tables, the HTML reports): three
significant figures, a unit that keeps them short, ``-`` where a value is undefined; and
docstrings as plain text for the terminal."""

from __future__ import annotations

import math
import re

__all__ = ["count", "number", "percent", "plain_text", "ratio", "seconds"]


def number(value: float | None, digits: int = 3) -> str:
    """``digits`` significant figures with thousands separators (``2.63``, ``1,234``);
    scientific notation far from 1 (``1.2e+07``, ``3.4e-05``)."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 10 ** -(digits - 1)):
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"


def seconds(value: float | None) -> str:
    """A duration in µs, ms or s, three significant figures (``250 ms``, ``1.5 s``)."""
    if value is None or math.isnan(value):
        return "-"
    if math.isinf(value):
        return "∞"
    if value == 0:
        return "0 s"
    if abs(value) < 1e-3:
        return f"{value * 1e6:.3g} µs"
    if abs(value) < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.3g} s" if abs(value) < 1000 else f"{value:,.0f} s"


def percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal (``0.535`` → ``53.5%``)."""
    return "-" if value is None or math.isnan(value) else f"{value * 100:.1f}%"


def ratio(value: float | None) -> str:
    """A ratio with two decimals (``0.98``)."""
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in agreement: ``1 device``, ``5 devices``, ``2 policies`` (give
    ``plural`` where adding an "s" is wrong)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


# reStructuredText inline markup found in docstrings. A role, :class:`Policy` or
# :meth:`~hetero.sched.Policy.pick` (a ``~`` shows the last name only), or ``title <target>``.
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)\s*(?:<[^>`]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")
_INTERPRETED = re.compile(r"(?<![\w`])`([^`<]+?)\s*(?:<[^>`]*>)?`_{0,2}(?![\w`])")
_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
_EMPHASIS = re.compile(r"(?<![\w*])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")


def _role(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    return target.rsplit(".", 1)[-1] if tilde else target


def plain_text(text: str) -> str:
    """``text`` (a docstring's reStructuredText) as it reads on a terminal: ``code``,
    :class:`Name`, `interpreted`, *emphasis* and **strong** lose their markup, and every run of
    whitespace (the source's line breaks among them) becomes one space."""
    text = _ROLE.sub(_role, text)
    text = _LITERAL.sub(r"\1", text)
    text = _INTERPRETED.sub(r"\1", text)
    text = _STRONG.sub(r"\1", text)
    text = _EMPHASIS.sub(r"\1", text)
    return " ".join(text.split())
