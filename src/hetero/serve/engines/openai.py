"""Any other OpenAI-compatible server: no load endpoint, so its load is learned from replies
alone (their latency, and the requests the router has there)."""

from __future__ import annotations

import aiohttp

from hetero.serve.engines.base import EngineAdapter, LoadError, LoadSample

__all__ = ["OpenAIServer"]


class OpenAIServer(EngineAdapter):
    name = "openai"

    def __init__(self, seen: str = "") -> None:
        self.seen = seen  # what detection found instead of a load page ("": nothing at all)

    async def detect(self, session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
        return True  # the fallback: anything that serves the OpenAI API

    async def read(self, session: aiohttp.ClientSession, url: str, timeout: float) -> LoadSample:
        raise LoadError(
            "the server publishes no load (not vLLM or SGLang"
            + (f": {self.seen})" if self.seen else ")")
            + "; learned from replies alone"
        )
