"""Per-API-key rate limits: token buckets refilled from an injected clock, bounded in number."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

__all__ = ["RateLimiter"]


class RateLimiter:
    """``rate`` requests per second per API key, in bursts of up to ``burst``.

    A key the limiter does not hold (new, or forgotten) is charged to its client address's
    bucket, as a request without a key is: a client that invents a key per request gets no
    more than one key's rate. At most ``max_entries`` keys and as many addresses are held, the
    least recently used forgotten first; keys are held by their hash, so a long key costs no
    more than a short one.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        clock: Callable[[], float] | None = None,
        max_entries: int = 10_000,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate limit must be > 0 requests per second, got {rate!r}")
        if max_entries < 1:
            raise ValueError(f"rate limit max_entries must be >= 1, got {max_entries!r}")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.max_entries = max_entries
        self._clock = clock or time.monotonic
        # (tokens, last refill), most recently used last
        self._keys: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()
        self._addresses: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        """The buckets held (keys and addresses)."""
        return len(self._keys) + len(self._addresses)

    def take(self, key: str, address: str = "") -> float:
        """0 when a request with ``key`` ("" for none) from ``address`` may go now (a token
        taken), else the seconds until it may."""
        now = self._clock()
        tag = hash(key)
        if key and tag in self._keys:
            return self._take(self._keys, tag, now)
        wait = self._take(self._addresses, address, now)
        if key and not wait:  # a new key, paid for by its address: a full bucket of its own
            self._take(self._keys, tag, now)
        return wait

    def _take(
        self, buckets: OrderedDict[Hashable, tuple[float, float]], k: Hashable, now: float
    ) -> float:
        tokens, last = buckets.pop(k, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        buckets[k] = (tokens - 1 if not wait else tokens, now)
        if len(buckets) > self.max_entries:
            buckets.popitem(last=False)
        return wait
