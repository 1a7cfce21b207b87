"""Reads each replica's published load in the background, never on a request's path.

One task per replica: detect its engine (``hetero.serve.engines``), then read its load every
``interval`` seconds and hand each read to the router, which feeds the capacity model. The
reads have a budget of their own: at most ``max_reads`` per second over the whole fleet (each
costs the router about 0.3 ms of CPU, mostly aiohttp's request), so up to five replicas are
read every 0.1 s and a larger fleet less often per replica, never costing the router more than
about 1.5% of a core. A read
that fails makes the load *unknown* (shown in ``/status``, ``/metrics`` and ``hetero top
--serve``, logged once per new reason); the replica's engine is then detected again, with the
pause between tries doubling up to ``max_backoff``, so a replica that restarted on another
engine is read in its new language and a dead one costs little. A server that publishes no
load is asked again every ``redetect`` seconds in case it starts to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from hetero.serve.engines import EngineAdapter, LoadError, OpenAIServer, detect
from hetero.serve.records import ReplicaState
from hetero.serve.router import Router

__all__ = ["LoadPoller"]

log = logging.getLogger("hetero.serve")


class LoadPoller:
    """The background reads of every replica's load (``watch`` each, ``stop`` at the end)."""

    def __init__(
        self,
        router: Router,
        session: aiohttp.ClientSession,
        interval: float = 0.1,
        timeout: float = 1.0,
        max_backoff: float = 2.0,
        redetect: float = 10.0,
        max_reads: float = 50.0,
    ) -> None:
        self.router = router
        self.session = session
        self.interval = interval
        self.max_reads = max_reads
        self.timeout = timeout
        self.max_backoff = max(max_backoff, interval)
        self.redetect = redetect
        self.reads = 0  # successful reads, for the cost figure of bench_serve
        self._tasks: dict[str, asyncio.Task[None]] = {}
        # A read older than a few periods (or the timeout) is no longer the replica's load.
        router.load_stale_after = max(1.0, 5 * interval, timeout)

    @property
    def period(self) -> float:
        """Seconds between two reads of one replica: ``interval``, longer when the fleet is
        too large for the read budget."""
        reading = sum(not task.done() for task in self._tasks.values())
        return max(self.interval, reading / self.max_reads)

    def watch(self, state: ReplicaState) -> None:
        """Start reading ``state``'s load (again, if it joined again)."""
        name = state.replica.name
        old = self._tasks.get(name)
        if old is not None and not old.done():
            old.cancel()
        self._tasks[name] = asyncio.create_task(self._loop(state), name=f"load {name}")
        self.router.load_stale_after = max(self.router.load_stale_after, 5 * self.period)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _loop(self, state: ReplicaState) -> None:
        engine: EngineAdapter | None = None
        pause = self.interval
        loop = asyncio.get_running_loop()
        next_detect = 0.0
        while not state.removed:
            url = state.replica.url
            try:
                if engine is None or (
                    isinstance(engine, OpenAIServer) and loop.time() >= next_detect
                ):
                    engine = await detect(self.session, url, self.timeout)
                    next_detect = loop.time() + self.redetect
                sample = await engine.read(self.session, url, self.timeout)
                self.router.load_read(state, engine.name, sample)
            except LoadError as exc:
                name = engine.name if engine is not None else "unknown"
                plain = isinstance(engine, OpenAIServer) and not engine.seen
                self.router.load_failed(state, name, str(exc), expected=plain)
                if isinstance(engine, OpenAIServer):
                    pause = self.max_backoff  # nothing to read until it is detected again
                else:
                    engine = None  # detect again: it may have restarted as something else
                    pause = min(pause * 2, self.max_backoff)
            except Exception as exc:  # a bug must not end the replica's reads for good
                reason = f"read failed unexpectedly: {type(exc).__name__}: {exc}"
                self.router.load_failed(state, "unknown", reason, bug=exc)
                engine, pause = None, self.max_backoff
            else:
                self.reads += 1
                pause = self.period
            await asyncio.sleep(pause)
