"""The router's health checks: each replica's ``/health`` (``/v1/models`` where it has none)
every interval, and now and then what it serves; a failed check is the replica's fault unless
the router itself ran out of descriptors or memory."""

from __future__ import annotations

import asyncio

import aiohttp

from hetero.serve.metrics import ServeMetrics
from hetero.serve.proxy import exhausted
from hetero.serve.records import ReplicaState
from hetero.serve.router import Router

__all__ = ["HealthChecks"]

#: Every this many rounds, what the replicas serve is asked again (a replica may load a model).
_LEARN_EVERY = 15


class HealthChecks:
    """Probes of ``router``'s replicas over ``session``, every ``interval`` seconds (``run``)."""

    def __init__(
        self,
        router: Router,
        session: aiohttp.ClientSession,
        metrics: ServeMetrics,
        interval: float,
    ) -> None:
        self.router = router
        self.session = session
        self.metrics = metrics
        self.interval = interval

    async def run(self) -> None:
        """Probe every replica not removed, every ``interval``, until cancelled."""
        rounds = 0
        while True:
            await asyncio.sleep(self.interval)
            rounds += 1
            learn = rounds % _LEARN_EVERY == 0
            await asyncio.gather(
                *(self.probe(s, models=learn) for s in self.router.replicas if not s.removed)
            )

    async def probe(self, state: ReplicaState, models: bool) -> None:
        """Check one replica and tell the router; with ``models``, learn what it serves (unless
        it was declared)."""
        replica = state.replica
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.interval))
        try:
            if models and not replica.declared_models:
                async with self.session.get(replica.url + "/v1/models", timeout=timeout) as r:
                    data = await r.json(content_type=None)
                    if r.status != 200 or not isinstance(data, dict):
                        raise ValueError(f"/v1/models answered HTTP {r.status}")
                    names = {m["id"] for m in data.get("data", []) if isinstance(m, dict)}
                    self.router.set_models(state, names)
            else:
                async with self.session.get(replica.url + "/health", timeout=timeout) as r:
                    if r.status == 404:  # no /health: any answer from /v1/models will do
                        async with self.session.get(
                            replica.url + "/v1/models", timeout=timeout
                        ) as r2:
                            status = r2.status
                    else:
                        status = r.status
                    if status != 200:
                        raise ValueError(f"health check answered HTTP {status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError) as exc:
            if exhausted(exc) is None:  # else the router's own fault: no replica is blamed
                self.metrics.errors.labels(replica.name, "health").inc()
                self.router.replica_failed(state, f"health check: {type(exc).__name__}: {exc}")
            return
        self.router.probe_ok(state)
