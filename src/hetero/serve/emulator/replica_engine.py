"""The one interface between an emulated replica's routes and the model that paces it:
:class:`ReplicaEngine` runs a request and reports its load, :class:`EngineRun` is one request
running. Two models implement it, each in a module of its own: slots (``slots``, each request
alone in a slot) and continuous batching (``continuous``, ``hetero.serve.engine_model`` on the
event loop). The routes and the state call this interface alone, never ask which model runs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import NamedTuple, Protocol

__all__ = ["CacheFigures", "EngineRun", "Load", "ReplicaEngine"]


class Load(NamedTuple):
    """An engine's load of the moment, as its load endpoints publish it."""

    running: int
    waiting: int
    kv_used: int  # tokens held in the KV cache
    gen_rate: float  # tokens generated per second now


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """A prefix cache (tokens looked up and found), preemptions and KV blocks, which the
    engines' pages publish as the real engine does."""

    queries: int
    hits: int
    preemptions: int
    block_size: int
    num_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class EngineRun(Protocol):
    """One request in an engine, as its handler sees it."""

    @property
    def first_token_at(self) -> float:
        """When its first token came or comes (on the loop's clock): read once it has one."""
        ...

    def tokens(self) -> AsyncIterator[int]:
        """How many new tokens each wake-up brings, paced as the engine makes them, until the
        last."""
        ...

    async def wait(self) -> None:
        """Until its last token."""
        ...


class ReplicaEngine(Protocol):
    """How an emulated replica serves requests: each request's pace, and the load it is under
    now. Requests read the replica's config of the moment they start."""

    @property
    def max_context(self) -> int | None:
        """The longest request (prompt and output) it serves; None: any."""
        ...

    def run(
        self, prompt_tokens: int, out_tokens: int, prompt: Callable[[], str]
    ) -> AbstractAsyncContextManager[EngineRun]:
        """The request in the engine for the body of the ``with`` (entered once it starts
        service; it leaves, its place freed, when the body ends). ``out_tokens`` 0 is a prompt
        alone (an embedding). ``prompt()`` is its text, which names its blocks for a prefix
        cache: called only by an engine that has one (a prompt of token ids costs
        milliseconds to write out)."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests being served."""
        ...

    @property
    def waiting(self) -> int:
        """Requests waiting to be served."""
        ...

    @property
    def waiting_tokens(self) -> int:
        """Prompt tokens the waiting requests have yet to prefill."""
        ...

    @property
    def must_wait(self) -> bool:
        """Whether a request arriving now would wait."""
        ...

    def load_now(self) -> Load:
        """The load of the moment, KV tokens and generation rate included."""
        ...

    def cache_figures(self) -> CacheFigures | None:
        """Its prefix cache and preemptions; None when it has no prefix cache."""
        ...

    async def close(self) -> None:
        """Stop (the replica stops); requests still running are cut by their handlers."""
        ...
