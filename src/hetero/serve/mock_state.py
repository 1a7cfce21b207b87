"""What an emulated replica's routes share: its config of the moment, its slots (handed out
first come, first served), the requests holding them and how fast they go, and its counters;
under the continuous model, its engine instead of the slots."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from hetero.serve.engine_model import BLOCK_SIZE
from hetero.serve.mock_config import MockConfig
from hetero.serve.mock_engine import EngineDriver, EngineRun
from hetero.serve.mock_metrics import CacheFigures, EngineMetrics
from hetero.serve.mock_requests import Generation

__all__ = ["ReplicaState", "Service"]


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


@dataclass(slots=True)
class Service:
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


class ReplicaState:
    """The state of one replica: ``config`` is replaced as a whole when it is reconfigured, so a
    request reads the config of the moment it starts service."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.slots = _Slots(config.slots)
        self.created = time.time()
        self._waiting_tokens = 0  # prompt tokens of the requests waiting for a slot
        self.running: dict[int, Service] = {}
        self._keys = itertools.count()
        self.metrics = EngineMetrics(config.models[0], self.created)
        spec = config.engine_spec
        self.engine = None if spec is None else EngineDriver(spec, self._scale)
        self.requests = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.tokens_out = 0

    @contextlib.asynccontextmanager
    async def slot(self, prompt_tokens: int, out_tokens: int) -> AsyncIterator[Service]:
        """Hold a slot for the body of the ``with``; yields the service as it starts, paced by
        the config of that moment."""
        try:
            self._waiting_tokens += prompt_tokens
            try:
                await self.slots.acquire()
            finally:
                self._waiting_tokens -= prompt_tokens
            cfg = self.config
            scale = cfg.slowdown / cfg.speed
            service = Service(
                prompt_tokens=prompt_tokens,
                out_tokens=out_tokens,
                start=asyncio.get_running_loop().time(),
                prefill_s=prompt_tokens * cfg.prefill_time * scale,
                token_s=cfg.decode_time * scale,
            )
            key = next(self._keys)
            self.running[key] = service
            try:
                yield service
            finally:
                del self.running[key]
                self.slots.release()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    def _scale(self) -> float:
        return self.config.slowdown / self.config.speed

    @contextlib.asynccontextmanager
    async def engine_run(
        self, prompt_tokens: int, out_tokens: int, blocks: tuple[int, ...]
    ) -> AsyncIterator[EngineRun]:
        """The continuous model's :meth:`slot`: the request in the engine for the body of the
        ``with``."""
        assert self.engine is not None
        try:
            async with self.engine.run(prompt_tokens, out_tokens, blocks) as run:
                yield run
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    @property
    def in_flight(self) -> int:
        """Requests being served: holding a slot, or running in the engine."""
        if self.engine is not None:
            return len(self.engine.model.running)
        return self.slots.size - self.slots.free

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot, or in the engine's queue."""
        if self.engine is not None:
            return len(self.engine.model.waiting)
        return self.slots.waiting

    @property
    def waiting_tokens(self) -> int:
        """Tokens the waiting requests have yet to prefill."""
        if self.engine is not None:
            return sum(r.num_tokens - r.computed for r in self.engine.model.waiting)
        return self._waiting_tokens

    @property
    def must_wait(self) -> bool:
        """Whether a request arriving now would wait."""
        if self.engine is not None:
            model = self.engine.model
            return bool(model.waiting) or len(model.running) >= model.spec.max_num_seqs
        return self.slots.must_wait

    def cache_figures(self) -> CacheFigures | None:
        """The continuous model's prefix cache and preemptions, for the engines' pages."""
        if self.engine is None:
            return None
        model = self.engine.model
        return CacheFigures(
            queries=model.prefix_queries,
            hits=model.prefix_hits,
            preemptions=model.preemptions,
            block_size=BLOCK_SIZE,
            num_blocks=model.spec.num_blocks,
        )

    async def close(self) -> None:
        if self.engine is not None:
            await self.engine.close()

    def finish(self, job: Generation, first_token_at: float, arrival: float) -> None:
        """Count a completed generation in the engine's counters and histograms."""
        now = asyncio.get_running_loop().time()
        first_token = max(0.0, first_token_at - arrival)
        self.metrics.observe(self.config.engine, job, first_token, max(0.0, now - arrival))

    def load_now(self) -> tuple[int, int, int, float]:
        """``(running, waiting, KV tokens held, tokens generated per second now)``: a pass over
        the requests holding a slot, none at idle."""
        if self.engine is not None:
            model = self.engine.model
            used = model.used_blocks * BLOCK_SIZE
            return len(model.running), len(model.waiting), used, self.engine.gen_rate
        now = asyncio.get_running_loop().time()
        used = 0
        rate = 0.0
        for service in self.running.values():
            used += service.held(now)
            if service.token_s > 0 and now >= service.start + service.prefill_s:
                rate += 1 / service.token_s
        return len(self.running), self.slots.waiting, used, rate

    def gauge(self, value: float) -> float:
        """A gauge as load_fault has it read: NaN, negative (even at 0), or itself."""
        fault = self.config.load_fault
        if fault == "nan":
            return math.nan
        if fault == "negative":
            return -(abs(value) + 1.0)
        return value

    def settings(self) -> dict[str, Any]:
        settings = dataclasses.asdict(self.config)
        settings["models"] = list(self.config.models)
        return settings
