"""Engine adapters: what the router reads of a replica's load, per inference engine.

``detect`` asks a replica which engine it runs (SGLang first: its ``/get_server_info`` is one
small JSON; then vLLM's ``/metrics``; anything else is an OpenAI-compatible server whose load
is learned from replies alone). The router detects at start and again after a read fails (a
replica restarted on another engine reads as a failure first).
"""

from __future__ import annotations

import aiohttp

from hetero.serve.engines.base import EngineAdapter, LoadError, LoadSample
from hetero.serve.engines.openai import OpenAIServer
from hetero.serve.engines.sglang import SGLang
from hetero.serve.engines.vllm import VLLM

__all__ = [
    "ENGINES",
    "VLLM",
    "EngineAdapter",
    "LoadError",
    "LoadSample",
    "OpenAIServer",
    "SGLang",
    "detect",
]

#: Engine names, in the order ``detect`` tries them.
ENGINES = ("sglang", "vllm", "openai")


async def detect(session: aiohttp.ClientSession, url: str, timeout: float) -> EngineAdapter:
    """The engine behind ``url`` (``LoadError`` when the server cannot be reached at all)."""
    if await (sglang := SGLang()).detect(session, url, timeout):
        return sglang
    if await (vllm := VLLM()).detect(session, url, timeout):
        return vllm
    return OpenAIServer(vllm.seen)
