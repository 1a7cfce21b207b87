"""The few samples the adapters need from a Prometheus text page, without parsing all of it.

A full parser (``prometheus_client.parser``) builds every family and sample of vLLM's page
(hundreds of histogram buckets) for each read; the poller reads a handful of gauges many times
a second. The text format keeps a family's samples on consecutive lines, so each wanted name is
found with one byte search and read line by line until its family ends.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hetero.serve.engines.base import LoadError

__all__ = ["MAX_LABELS_LINE", "labels", "samples"]

_LABEL = re.compile(rb'(\w+)="((?:[^"\\]|\\.)*)"')
#: The longest sample line whose labels are read (vLLM's cache_config_info is under 1 KB): a
#: line of megabytes would hold the router's event loop for as many tenths of a second.
MAX_LABELS_LINE = 16 * 1024


def _first_line(body: bytes, name: bytes) -> int:
    """Where the first sample line of ``name`` starts (-1 if none): at a line start, followed
    by its labels or its value, so neither a comment nor a longer name matches."""
    if body.startswith(name) and body[len(name) : len(name) + 1] in (b"{", b" "):
        return 0
    key = b"\n" + name
    at = body.find(key)
    while at >= 0:
        follow = body[at + len(key) : at + len(key) + 1]
        if follow in (b"{", b" "):
            return at + 1
        at = body.find(key, at + len(key))  # a longer name that starts with this one
    return -1


def samples(body: bytes, names: Iterable[str], path: str = "/metrics") -> dict[str, list[float]]:
    """Values of each wanted metric, one per label set (engines, data-parallel ranks), in page
    order; a name that is absent maps to an empty list. A wanted line whose value is not a
    number raises ``LoadError``; NaN and infinities are returned for the caller to refuse."""
    if b"\x00" in body[:1024] or not body[:1024].isascii():
        raise LoadError(f"{path} is not text: {body[:60]!r}")
    found: dict[str, list[float]] = {}
    for name in names:
        values: list[float] = []
        found[name] = values
        raw = name.encode()
        at = _first_line(body, raw)
        while (
            at >= 0
            and body.startswith(raw, at)
            and body[at + len(raw) : at + len(raw) + 1]
            in (
                b"{",
                b" ",
            )
        ):
            end = body.find(b"\n", at)
            line = body[at + len(raw) : end if end >= 0 else len(body)]
            if line[:1] == b"{":
                close = line.rfind(b"}")  # a label value may hold a brace itself
                if close < 0:
                    raise LoadError(f"{path}: a {name} line has no closing brace: {line[:60]!r}")
                line = line[close + 1 :]
            fields = line.split()
            try:
                values.append(float(fields[0]))
            except (IndexError, ValueError):
                raise LoadError(f"{path}: {name} has no numeric value: {line[:60]!r}") from None
            at = end + 1 if end >= 0 else -1
    return found


def labels(body: bytes, name: str) -> list[dict[str, str]]:
    """The label sets of ``name``'s sample lines (an info metric's payload), in page order; a
    line over ``MAX_LABELS_LINE`` bytes gives an empty set (its labels absent)."""
    raw = name.encode()
    found: list[dict[str, str]] = []
    at = _first_line(body, raw)
    while at >= 0 and body.startswith(raw + b"{", at):
        end = body.find(b"\n", at)
        line = body[at + len(raw) : end if end >= 0 else len(body)]
        close = line.rfind(b"}") if len(line) <= MAX_LABELS_LINE else 0
        found.append(
            {k.decode(): v.decode(errors="replace") for k, v in _LABEL.findall(line[:close])}
        )
        at = end + 1 if end >= 0 else -1
    return found
