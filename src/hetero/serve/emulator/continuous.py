"""The continuous model of an emulated replica (``engine_model="continuous"``): the engine
model the router fits and the planner sizes by (``hetero.serve.engine_model``), run on the
event loop: steps back to back while there is work, each slept for its modelled time, and each
request's handler woken when a step gives it a token."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Final

from hetero.sched.prefix import prefix_blocks
from hetero.serve.emulator.replica_engine import CacheFigures, Load
from hetero.serve.engine_model import BLOCK_SIZE, EngineModel, EngineRequest, EngineSpec, Step

__all__ = ["ContinuousEngine", "ContinuousRun"]

log = logging.getLogger(__name__)

# The characters of one KV block: four to a token.
_BLOCK_CHARS: Final = 4 * BLOCK_SIZE


class ContinuousRun:
    """One request in the engine as its handler sees it: ``available`` tokens, as of the last
    step that ended (the model applies a step as it starts; a handler sees it at its end)."""

    __slots__ = ("_changed", "available", "done", "error", "request")

    def __init__(self, request: EngineRequest) -> None:
        self.request = request
        self.available = 0
        self.done = False
        self.error: BaseException | None = None
        self._changed = asyncio.Event()

    @property
    def first_token_at(self) -> float:
        """When its first token came (on the loop's clock); once it has one."""
        assert self.request.first_token_at is not None
        return self.request.first_token_at

    def deliver(self) -> None:
        self.available = self.request.generated
        self.done = self.request.finished
        self._changed.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._changed.set()

    async def tokens(self) -> AsyncIterator[int]:
        """How many new tokens each wake-up brings, until the last."""
        seen = 0
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.error is not None:
                raise RuntimeError("the engine model failed") from self.error
            if self.available > seen:
                yield self.available - seen
                seen = self.available
            if self.done:
                return

    async def wait(self) -> None:
        """Until its last token."""
        async for _ in self.tokens():
            pass


class ContinuousEngine:
    """Runs an :class:`EngineModel` on the running loop's clock; step times are stretched by
    ``scale()`` of the moment (the replica's slowdown over its speed)."""

    def __init__(self, spec: EngineSpec, scale: Callable[[], float]) -> None:
        self.model = EngineModel(spec, self._now)
        self._scale = scale
        self._runs: dict[EngineRequest, ContinuousRun] = {}
        self._task: asyncio.Task[None] | None = None
        self.last_step: Step | None = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    @property
    def max_context(self) -> int:
        return self.model.spec.max_context

    @contextlib.asynccontextmanager
    async def run(
        self, prompt_tokens: int, out_tokens: int, prompt: Callable[[], str]
    ) -> AsyncIterator[ContinuousRun]:
        """Submit a request for the body of the ``with``, its prompt's 64-character blocks (16
        tokens) named for the prefix cache; it is aborted (its KV freed) if the body ends before
        its last token."""
        blocks = prefix_blocks(prompt(), _BLOCK_CHARS, limit=prompt_tokens // BLOCK_SIZE)
        # A prompt alone (an embedding) is its prefill and the step that ends it.
        request = self.model.submit(EngineRequest(prompt_tokens, max(1, out_tokens), blocks))
        run = self._runs[request] = ContinuousRun(request)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drive())
        try:
            yield run
        finally:
            del self._runs[request]
            if not request.finished:
                self.model.abort(request)

    async def _drive(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (step := self.model.step(self._scale())) is not None:
                self.last_step = step
                if step.end > loop.time():
                    await asyncio.sleep(step.end - loop.time())
                for request in step.progressed:
                    run = self._runs.get(request)
                    if run is not None:
                        run.deliver()
        except Exception as exc:  # a bug of the model: fail the requests, never hang them
            log.exception("the engine model failed")
            for run in self._runs.values():
                run.fail(exc)

    async def close(self) -> None:
        """Stop stepping (the replica stops)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def in_flight(self) -> int:
        return len(self.model.running)

    @property
    def waiting(self) -> int:
        return len(self.model.waiting)

    @property
    def waiting_tokens(self) -> int:
        return sum(r.num_tokens - r.computed for r in self.model.waiting)

    @property
    def must_wait(self) -> bool:
        model = self.model
        return bool(model.waiting) or len(model.running) >= model.spec.max_num_seqs

    def load_now(self) -> Load:
        model = self.model
        used = model.used_blocks * BLOCK_SIZE
        return Load(len(model.running), len(model.waiting), used, self._gen_rate())

    def _gen_rate(self) -> float:
        """Tokens generated per second by the last step, 0 once idle."""
        step = self.last_step
        if step is None or not self.model.busy or step.duration <= 0:
            return 0.0
        return len(step.progressed) / step.duration

    def cache_figures(self) -> CacheFigures:
        model = self.model
        return CacheFigures(
            queries=model.prefix_queries,
            hits=model.prefix_hits,
            preemptions=model.preemptions,
            block_size=BLOCK_SIZE,
            num_blocks=model.spec.num_blocks,
        )
