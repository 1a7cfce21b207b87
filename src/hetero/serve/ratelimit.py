"""Per-client rate limits: token buckets refilled from an injected clock, bounded in number."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["RateLimiter"]


class RateLimiter:
    """``rate`` requests per second per client, in bursts of up to ``burst``.

    A client is the address an API key was first seen from: the router cannot tell a real key
    from an invented one, so a key new to it is bound to its client address (once a request
    with it goes through), and every request carrying it is charged to that address's bucket,
    wherever it comes from; a request without a key is charged to its own address's. Inventing
    keys thus never adds to an address's rate (a bucket per key would add a full bucket, and
    its refill, per key invented), and a key shared by several addresses shares one rate. At
    most ``max_entries`` keys and as many addresses are held, the least recently used
    forgotten first; keys are held by their hash, so a long key costs no more than a short one.
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
        # key hash -> the address it was first seen from; most recently used last
        self._keys: OrderedDict[int, str] = OrderedDict()
        # address -> (tokens, last refill); most recently used last
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        """The entries held (keys and addresses)."""
        return len(self._keys) + len(self._buckets)

    def take(self, key: str, address: str = "") -> float:
        """0 when a request with ``key`` ("" for none) from ``address`` may go now (a token
        taken), else the seconds until it may."""
        keys = self._keys
        tag = hash(key)
        owner = keys.get(tag, address) if key else address
        wait = self._take(owner, self._clock())
        if key and not wait:  # a key is held once a request with it went through
            keys[tag] = owner
            keys.move_to_end(tag)
            if len(keys) > self.max_entries:
                keys.popitem(last=False)
        return wait

    def _take(self, address: str, now: float) -> float:
        buckets = self._buckets
        tokens, last = buckets.pop(address, (self.burst, now))
        tokens = min(self.burst, tokens + (now - last) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        buckets[address] = (tokens - 1 if not wait else tokens, now)
        if len(buckets) > self.max_entries:
            buckets.popitem(last=False)
        return wait
