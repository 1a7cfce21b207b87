"""The slot model of an emulated replica (``engine_model="simple"``): ``slots`` requests served
at once, handed out first come, first served, each for ``prefill_time`` per prompt token and
``decode_time`` per output token whatever else runs, times ``slowdown / speed``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from hetero.serve.emulator.config import MockConfig
from hetero.serve.emulator.replica_engine import CacheFigures, Load

__all__ = ["SlotEngine", "SlotRun"]

# Below this pace, tokens share a chunk: a fast replica writes at most one chunk per millisecond
# per stream, which keeps a benchmark's CPU in the router instead of the mock.
_MIN_CHUNK_S = 0.001


class _Slots:
    """``size`` slots handed out first come, first served; a waiter that is cancelled leaves the
    line, and a slot granted to it just as it was cancelled goes to the next one."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free = size
        self._line: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._line)

    @property
    def must_wait(self) -> bool:
        return self.free == 0 or bool(self._line)

    async def acquire(self) -> None:
        if not self.must_wait:
            self.free -= 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if not turn.cancelled():  # release() handed it the slot before the cancellation landed
                self.release()
            elif turn in self._line:
                self._line.remove(turn)
            raise

    def release(self) -> None:
        while self._line:
            turn = self._line.popleft()
            if not turn.done():  # a cancelled waiter's turn stays in line until it runs again
                turn.set_result(None)
                return
        self.free += 1


async def _sleep_until(loop: asyncio.AbstractEventLoop, when: float) -> None:
    delay = when - loop.time()
    if delay > 0:  # an instant replica never sleeps, not even sleep(0)
        await asyncio.sleep(delay)


@dataclass(slots=True)
class SlotRun:
    """A request holding a slot, from the start of its service (on the loop's clock)."""

    prompt_tokens: int
    out_tokens: int
    start: float
    prefill_s: float
    token_s: float

    @property
    def first_token_at(self) -> float:
        return self.start + self.prefill_s + self.token_s

    def held(self, now: float) -> int:
        """Tokens it holds in the KV cache at ``now``: its prompt, then each token generated."""
        decoding = now - self.start - self.prefill_s
        if decoding <= 0:
            return self.prompt_tokens
        if self.token_s <= 0:
            return self.prompt_tokens + self.out_tokens
        return self.prompt_tokens + min(self.out_tokens, int(decoding / self.token_s))

    async def tokens(self) -> AsyncIterator[int]:
        """Its tokens, as many at a time as one chunk takes, each when its last token is due
        (paced from the start on the loop's clock, so the pace does not drift)."""
        loop = asyncio.get_running_loop()
        start, prefill_s, token_s = self.start, self.prefill_s, self.token_s
        out_tokens = self.out_tokens
        per_chunk = out_tokens if token_s == 0 else max(1, math.ceil(_MIN_CHUNK_S / token_s))
        sent = 0
        while sent < out_tokens:
            n = min(per_chunk, out_tokens - sent)
            await _sleep_until(loop, start + prefill_s + (sent + n) * token_s)
            yield n
            sent += n

    async def wait(self) -> None:
        """Until its last token is due."""
        delay = self.prefill_s + self.out_tokens * self.token_s
        if delay > 0:
            await asyncio.sleep(delay)


class SlotEngine:
    """``size`` slots; a request's pace is set by ``config()``, the replica's config of the
    moment its service starts."""

    def __init__(self, size: int, config: Callable[[], MockConfig]) -> None:
        self._slots = _Slots(size)
        self._config = config
        self._waiting_tokens = 0  # prompt tokens of the requests waiting for a slot
        self._running: dict[int, SlotRun] = {}
        self._keys = itertools.count()

    @property
    def max_context(self) -> None:
        return None

    @contextlib.asynccontextmanager
    async def run(
        self, prompt_tokens: int, out_tokens: int, prompt: Callable[[], str]
    ) -> AsyncIterator[SlotRun]:
        self._waiting_tokens += prompt_tokens
        try:
            await self._slots.acquire()
        finally:
            self._waiting_tokens -= prompt_tokens
        cfg = self._config()
        scale = cfg.time_scale
        run = SlotRun(
            prompt_tokens=prompt_tokens,
            out_tokens=out_tokens,
            start=asyncio.get_running_loop().time(),
            prefill_s=prompt_tokens * cfg.prefill_time * scale,
            token_s=cfg.decode_time * scale,
        )
        key = next(self._keys)
        self._running[key] = run
        try:
            yield run
        finally:
            del self._running[key]
            self._slots.release()

    @property
    def in_flight(self) -> int:
        return self._slots.size - self._slots.free

    @property
    def waiting(self) -> int:
        return self._slots.waiting

    @property
    def waiting_tokens(self) -> int:
        return self._waiting_tokens

    @property
    def must_wait(self) -> bool:
        return self._slots.must_wait

    def load_now(self) -> Load:
        """A pass over the requests holding a slot, none at idle."""
        now = asyncio.get_running_loop().time()
        used = 0
        rate = 0.0
        for run in self._running.values():
            used += run.held(now)
            if run.token_s > 0 and now >= run.start + run.prefill_s:
                rate += 1 / run.token_s
        return Load(len(self._running), self._slots.waiting, used, rate)

    def cache_figures(self) -> CacheFigures | None:
        return None  # no prefix cache

    async def close(self) -> None:
        pass  # nothing runs but the handlers, which the server cuts
