"""Per-API-key rate limits: one token bucket per key, refilled from an injected clock."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """``rate`` requests per second per key, in bursts of up to ``burst``."""

    def __init__(
        self, rate: float, burst: float | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate limit must be > 0 requests per second, got {rate!r}")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self._clock = clock or time.monotonic
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, last refill)

    def take(self, key: str) -> float:
        """0 when ``key`` may send a request now (one token taken), else the seconds until it
        may."""
        now = self._clock()
        tokens, last = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1 - tokens) / self.rate
