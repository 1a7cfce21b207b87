"""Prometheus metrics of the router: counters and histograms updated per request, and gauges
read from the router's state at scrape time (so the request path does not pay for them)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from hetero.serve.router import Router

__all__ = ["ServeMetrics"]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120)
_CIRCUIT = {"closed": 0, "half_open": 1, "open": 2}


class _RouterState(Collector):
    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        router = self.router
        view = router.dispatcher.view
        speeds = router.learned_speeds()
        in_flight = GaugeMetricFamily(
            "hetero_serve_in_flight", "Requests running on a replica", labels=["replica"]
        )
        queued = GaugeMetricFamily(
            "hetero_serve_queued",
            "Requests waiting in the router for a replica",
            labels=["replica"],
        )
        speed = GaugeMetricFamily(
            "hetero_serve_learned_speed",
            "Learned per-request speed of a replica (V100 = 1.0, like the declared one)",
            labels=["replica"],
        )
        circuit = GaugeMetricFamily(
            "hetero_serve_circuit_state",
            "Circuit breaker of a replica: 0 closed, 1 half open, 2 open",
            labels=["replica"],
        )
        slots = GaugeMetricFamily(
            "hetero_serve_capacity",
            "Requests the router sends a replica at once, as learned (its slots)",
            labels=["replica"],
        )
        known = GaugeMetricFamily(
            "hetero_serve_load_known",
            "1 while the replica's published load is read, 0 while it is unknown",
            labels=["replica", "engine"],
        )
        engine_running = GaugeMetricFamily(
            "hetero_serve_engine_running",
            "Requests the replica's engine reports running (last good read)",
            labels=["replica"],
        )
        engine_waiting = GaugeMetricFamily(
            "hetero_serve_engine_waiting",
            "Requests the replica's engine reports waiting (last good read)",
            labels=["replica"],
        )
        kv_usage = GaugeMetricFamily(
            "hetero_serve_engine_kv_usage",
            "Fraction of the replica's KV cache in use, as its engine reports (last good read)",
            labels=["replica"],
        )
        now = router.clock.now()
        decisions = CounterMetricFamily(
            "hetero_serve_routing_decisions",
            "Requests placed on a replica by the routing policy",
            labels=["policy", "replica"],
        )
        for s in router.replicas:
            if s.removed:
                continue
            name, i = s.replica.name, s.index
            in_flight.add_metric([name], int(view.running[i]))
            queued.add_metric([name], int(view.in_flight[i]) - int(view.running[i]))
            speed.add_metric([name], float(speeds[i]))
            circuit.add_metric([name], _CIRCUIT[str(s.breaker.state)])
            decisions.add_metric([router.options.strategy, name], router.decisions.get(name, 0))
            slots.add_metric([name], int(view.slots[i]))
            known.add_metric([name, s.engine], 0 if router.load_stale(s, now) else 1)
            load = s.load
            if load is not None:
                if load.running is not None:
                    engine_running.add_metric([name], load.running)
                if load.waiting is not None:
                    engine_waiting.add_metric([name], load.waiting)
                if load.kv_usage is not None:
                    kv_usage.add_metric([name], load.kv_usage)
        pending = GaugeMetricFamily(
            "hetero_serve_pending", "Requests waiting in the router's central queue"
        )
        pending.add_metric([], router.dispatcher.waiting - router.dispatcher.queued_total)
        yield from (in_flight, queued, pending, speed, circuit, decisions, slots, known)
        yield from (engine_running, engine_waiting, kv_usage)


class ServeMetrics:
    """The router's metrics in their own registry (several routers may share a process)."""

    def __init__(self, router: Router) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hetero_serve_requests",
            "Requests answered, by replica and HTTP status",
            ["replica", "code"],
            registry=self.registry,
        )
        self.errors = Counter(
            "hetero_serve_replica_errors",
            "Failed attempts on a replica, by kind",
            ["replica", "kind"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "hetero_serve_output_tokens",
            "Output tokens generated by a replica",
            ["replica"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "hetero_serve_request_latency_seconds",
            "Request latency from arrival to the last byte",
            ["replica"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "hetero_serve_time_to_first_token_seconds",
            "Streaming requests: arrival to the first token",
            ["replica"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_RouterState(router))
        self._children: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}

    def answered(
        self, replica: str, code: int, latency: float, tokens: int | None, ttft: float | None
    ) -> None:
        # The labelled children, looked up once per (replica, code): labels() takes a lock and
        # builds a tuple, a third of this method's cost on the request path.
        children = self._children.get((replica, code))
        if children is None:
            children = self._children[(replica, code)] = (
                self.requests.labels(replica, str(code)),
                self.latency.labels(replica),
                self.tokens.labels(replica),
                self.ttft.labels(replica),
            )
        requests, latency_child, tokens_child, ttft_child = children
        requests.inc()
        latency_child.observe(latency)
        if tokens:
            tokens_child.inc(tokens)
        if ttft is not None:
            ttft_child.observe(ttft)

    def render(self) -> bytes:
        return generate_latest(self.registry)
