"""The few samples the adapters need from a Prometheus text page, without parsing all of it.

A full parser (``prometheus_client.parser``) builds every family and sample of vLLM's page
(hundreds of histogram buckets) for each read; the poller reads a handful of gauges many times
a second, so it looks only at the lines that start with a wanted name.
"""

from __future__ import annotations

from collections.abc import Iterable

from hetero.serve.engines.base import LoadError

__all__ = ["samples"]


def samples(body: bytes, names: Iterable[str], path: str = "/metrics") -> dict[str, list[float]]:
    """Values of each wanted metric, one per label set (engines, data-parallel ranks), in page
    order; a name that is absent maps to an empty list. A wanted line whose value is not a
    number raises ``LoadError``; NaN and infinities are returned for the caller to refuse."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise LoadError(f"{path} is not text: {body[:60]!r}") from None
    wanted = tuple(names)
    found: dict[str, list[float]] = {name: [] for name in wanted}
    for name in wanted:
        start = 0
        while True:
            at = text.find(name, start)
            if at < 0:
                break
            start = at + len(name)
            if at and text[at - 1] != "\n":
                continue  # inside a comment (# HELP name ...) or another line
            end = text.find("\n", start)
            rest = text[start : end if end >= 0 else len(text)]
            if not rest or rest[0] not in "{ ":
                continue  # a longer name that starts with this one
            if rest[0] == "{":
                close = rest.rfind("}")  # a label value may hold a brace itself
                if close < 0:
                    raise LoadError(f"{path}: a {name} line has no closing brace: {rest[:60]!r}")
                rest = rest[close + 1 :]
            fields = rest.split()
            try:
                value = float(fields[0])
            except (IndexError, ValueError):
                raise LoadError(f"{path}: {name} has no numeric value: {rest[:60]!r}") from None
            found[name].append(value)
    return found
