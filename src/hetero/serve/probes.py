"""The router's health checks: each replica's ``/health`` (``/v1/models`` where it has none)
every interval, and now and then what it serves; a failed check is the replica's fault unless
the router itself ran out of descriptors or memory."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from hetero.serve.bounded import read_at_most
from hetero.serve.metrics import ServeMetrics
from hetero.serve.proxy import describe_failure, exhausted
from hetero.serve.records import ReplicaState
from hetero.serve.router import Router

__all__ = ["MAX_MODELS", "MAX_MODELS_BODY", "HealthChecks", "model_names"]

#: Every this many rounds, what the replicas serve is asked again (a replica may load a model).
_LEARN_EVERY = 15
#: A replica's model list is read up to this size and adopted up to this many models (a
#: server with LoRA adapters lists some hundreds): a longer one is refused, a failed check.
#: Every request for a model no one serves, and every ``/v1/models``, goes over the lists.
MAX_MODELS_BODY = 2**20
MAX_MODELS = 1024


def model_names(body: bytes) -> set[str]:
    """The model ids of a ``/v1/models`` answer; ``ValueError`` naming what is wrong with it
    (an entry without a string id is left out)."""
    if len(body) > MAX_MODELS_BODY:
        raise ValueError(f"/v1/models is over {MAX_MODELS_BODY} bytes; at most that is read")
    try:
        data = json.loads(body)  # a ValueError of its own when not JSON
    except RecursionError:
        raise ValueError("/v1/models is nested too deeply") from None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"/v1/models has no list of models (data): {body[:60]!r}")
    if len(entries) > MAX_MODELS:
        raise ValueError(f"/v1/models lists {len(entries)} models; at most {MAX_MODELS} are read")
    return {m["id"] for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str)}


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
                    if r.status != 200:
                        raise ValueError(f"/v1/models answered HTTP {r.status}")
                    body = await read_at_most(r.content, MAX_MODELS_BODY)
                self.router.set_models(state, model_names(body))
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
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            if exhausted(exc) is None:  # else the router's own fault: no replica is blamed
                self.metrics.errors.labels(replica.name, "health").inc()
                self.router.replica_failed(state, f"health check: {describe_failure(exc)}")
            return
        self.router.probe_ok(state)
