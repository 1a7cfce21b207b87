"""``CacheCheck``: a prefix index held to the engines' own prefix-cache counters.

The index (``PrefixIndex``) believes a device holds the prompt blocks placed there, up to its
capacity. An engine may hold less: its KV cache also holds the running requests' tokens, so
under load it evicts sooner than its size says, and an engine with prefix caching off holds
nothing. Where an engine publishes prefix-cache counters (prompt tokens looked up and tokens
found in its cache, cumulative: vLLM's ``prefix_cache_queries`` and ``prefix_cache_hits``), each
read is compared with what the index predicted for the requests placed there since the last
verdict: the blocks it matched over the prompts' length in blocks, against hits over queries.

The verdict scales the device's index capacity by ``factor`` (from 1). Far fewer hits than
predicted (under ``SHORTFALL`` of them) multiply it by what was found over what was predicted
(at least ``STEP``, so one noisy interval cannot empty it); hits beyond the prediction (more
than ``SURPLUS`` above it) double it, back up to 1. A verdict waits for ``MIN_QUERIES`` tokens
looked up and ``MIN_BLOCKS`` blocks predicted, so that a few requests decide nothing. Counters
that went down mean the engine restarted: the comparison starts again from that read.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheCheck"]

#: Observed hit rate under this share of the predicted one shrinks the capacity.
SHORTFALL = 0.5
#: Observed hit rate this much (absolute) above the predicted one grows it back.
SURPLUS = 0.1
#: The most one verdict shrinks the capacity by (a factor).
STEP = 0.25
#: The least the factor goes to: a device always keeps a few blocks to be found holding more.
FLOOR = 1 / 64
#: Engine tokens looked up, and index blocks predicted, before a verdict.
MIN_QUERIES = 4096
MIN_BLOCKS = 8.0


@dataclass(slots=True)
class _Device:
    factor: float = 1.0
    queries: int = -1  # the engine's counters at the last verdict (-1: none read yet)
    hits: int = 0
    matched: float = 0.0  # blocks the index matched for requests placed here since
    span: float = 0.0  # ... over the length of their prompts in blocks


class CacheCheck:
    """Per device: the index's predicted prefix hits since the last verdict, the engine's
    counters at it, and the capacity ``factor`` the verdicts have reached."""

    def __init__(self) -> None:
        self._devices: list[_Device] = []

    def add_device(self) -> int:
        self._devices.append(_Device())
        return len(self._devices) - 1

    def factor(self, device: int) -> float:
        """The share of its capacity the device's index keeps."""
        return self._devices[device].factor

    def placed(self, device: int, matched: float, span: float) -> None:
        """A request whose prompt is ``span`` blocks long went to ``device``, where the index
        expects ``matched`` of its leading blocks cached."""
        d = self._devices[device]
        d.matched += matched
        d.span += span

    def read(self, device: int, queries: int, hits: int) -> float | None:
        """The engine's cumulative counters now: the new factor if the verdict changed it,
        else ``None``."""
        d = self._devices[device]
        if d.queries < 0 or queries < d.queries or hits < d.hits:
            self._restart(d, queries, hits)  # the first read, or the engine restarted
            return None
        looked_up = queries - d.queries
        if looked_up < MIN_QUERIES or d.span < MIN_BLOCKS:
            return None  # too little evidence yet: keep counting
        observed = (hits - d.hits) / looked_up
        predicted = d.matched / d.span
        self._restart(d, queries, hits)
        if observed < SHORTFALL * predicted:
            factor = max(d.factor * max(observed / predicted, STEP), FLOOR)
        elif observed > predicted + SURPLUS and d.factor < 1.0:
            factor = min(d.factor * 2.0, 1.0)
        else:
            return None
        d.factor = factor
        return factor

    def forget(self, device: int) -> None:
        """The device's engine starts again with an empty cache: predictions since no longer
        compare with its counters (the factor stays: it is the engine's way of caching)."""
        d = self._devices[device]
        d.queries, d.matched, d.span = -1, 0.0, 0.0

    @staticmethod
    def _restart(d: _Device, queries: int, hits: int) -> None:
        d.queries, d.hits = queries, hits
        d.matched = d.span = 0.0
