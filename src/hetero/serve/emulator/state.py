"""What an emulated replica's routes share: its config of the moment, the engine that paces its
requests (:class:`~hetero.serve.emulator.replica_engine.ReplicaEngine`), its counters and its
metrics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from hetero.serve.emulator.config import MockConfig
from hetero.serve.emulator.continuous import ContinuousEngine
from hetero.serve.emulator.engine_metrics import EngineMetrics
from hetero.serve.emulator.replica_engine import EngineRun, ReplicaEngine
from hetero.serve.emulator.request_bodies import Generation
from hetero.serve.emulator.slots import SlotEngine

__all__ = ["EmulatorState"]


def _engine(config: MockConfig, current: Callable[[], MockConfig]) -> ReplicaEngine:
    """The engine ``config.engine_model`` names, pacing by ``current()``, the config of the
    moment: the one place the model is chosen."""
    spec = config.engine_spec
    if spec is None:
        return SlotEngine(config.slots, current)
    return ContinuousEngine(spec, lambda: current().time_scale)


class EmulatorState:
    """The state of one replica: ``config`` is replaced as a whole when it is reconfigured, so a
    request reads the config of the moment it starts service."""

    def __init__(self, config: MockConfig) -> None:
        self.config = config
        self.created = time.time()
        self.metrics = EngineMetrics(config.models[0], self.created)
        self.engine = _engine(config, lambda: self.config)
        self.requests = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.tokens_out = 0

    @contextlib.asynccontextmanager
    async def run(
        self, prompt_tokens: int, out_tokens: int, prompt: Callable[[], str]
    ) -> AsyncIterator[EngineRun]:
        """The request in the engine for the body of the ``with``, counted as cancelled if its
        handler is (the client left, or the replica stopped)."""
        try:
            async with self.engine.run(prompt_tokens, out_tokens, prompt) as run:
                yield run
        except asyncio.CancelledError:
            self.cancelled += 1
            raise

    async def close(self) -> None:
        await self.engine.close()

    def finish(self, job: Generation, first_token_at: float, arrival: float) -> None:
        """Count a completed generation in the engine's counters and histograms."""
        now = asyncio.get_running_loop().time()
        first_token = max(0.0, first_token_at - arrival)
        self.metrics.observe(self.config.engine, job, first_token, max(0.0, now - arrival))

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
