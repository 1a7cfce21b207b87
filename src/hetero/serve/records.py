"""The router's records: its options, one request's ``Ticket`` and one replica's state."""

from __future__ import annotations

import asyncio
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from hetero.config import DEFAULT_MAX_QUEUE_SIZE
from hetero.errors import ConfigError
from hetero.sched import Cause, Finish
from hetero.sched.capacity import CapacityOptions, ConcurrencyLimit
from hetero.sched.health import Breaker, Hold
from hetero.sched.policies.slo import check_slo
from hetero.serve.engines import LoadSample
from hetero.serve.replicas import Replica

__all__ = ["DEFAULT_STRATEGY", "ReplicaState", "RouterOptions", "Ticket"]


#: The strategy ``hetero serve`` routes with unless told otherwise: each replica predicted as
#: the continuous-batching engine it is (``SloRouting``), against an SLO derived from the fleet
#: where none is given. On real vLLM replicas at the fleet's capacity it kept more requests
#: within the SLO than the slot-counting ``shortest_expected_delay`` (the default before it) in
#: every run (``bench/bench_serve_real_prefix.py``; 75.5% against 24.1% with the SLO derived);
#: on the emulated slot-based fleet of ``bench/bench_serve.py`` as many (docs/serve.md).
DEFAULT_STRATEGY = "slo"


@dataclass(frozen=True, slots=True)
class RouterOptions:
    """How the router routes; every field has a ``hetero serve`` flag of the same name."""

    strategy: str = DEFAULT_STRATEGY
    strategy_options: dict[str, Any] = field(default_factory=dict)
    queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    timeout: float | None = 600.0
    max_retries: int = 2
    default_max_tokens: int = 256
    prefill_weight: float = 0.02  # work units per prompt token (an output token is 1)
    unit_rate: float = 50.0  # output tokens per second of one request on a speed-1.0 replica
    breaker_threshold: int = 3
    breaker_cooldown: float = 5.0
    gray_ratio: float = 0.35
    gray_min_done: int = 20
    gray_cooldown: float = 30.0  # seconds a gray replica is out of service before a new trial
    capacity: CapacityOptions = field(default_factory=CapacityOptions)
    slo_ttft: float | None = None  # seconds; None: derived from the fleet (strategy slo)
    slo_tpot: float | None = None

    def __post_init__(self) -> None:
        problems = check_slo("slo_ttft", self.slo_ttft) + check_slo("slo_tpot", self.slo_tpot)
        if self.queue_size < 1:
            problems.append(("queue_size", f"must be >= 1, got {self.queue_size}"))
        if self.timeout is not None and not self.timeout > 0:
            problems.append(("timeout", f"must be > 0 seconds, got {self.timeout!r}"))
        if self.default_max_tokens < 1:
            problems.append(("default_max_tokens", f"must be >= 1, got {self.default_max_tokens}"))
        if not self.prefill_weight >= 0:
            problems.append(("prefill_weight", f"must be >= 0, got {self.prefill_weight!r}"))
        if not self.unit_rate > 0:
            problems.append(("unit_rate", f"must be > 0, got {self.unit_rate!r}"))
        if not 0 < self.gray_ratio < 1:
            problems.append(("gray_ratio", f"must be between 0 and 1, got {self.gray_ratio!r}"))
        if not 0 < self.gray_cooldown < float("inf"):
            problems.append(
                ("gray_cooldown", f"must be a number of seconds > 0, got {self.gray_cooldown!r}")
            )
        if problems:
            raise ConfigError(problems)


@dataclass(slots=True, eq=False)
class Ticket:
    """One admitted request, from ``admit`` until the dispatcher finishes it.

    ``waiter`` resolves to the replica's position when the dispatcher runs the request there,
    or to the ``Finish`` that ended it (timed out, failed everywhere, cancelled).
    """

    id: int
    model: str
    prompt: int  # estimated prompt tokens
    waiter: asyncio.Future[int | Finish]
    submitted: float
    replica: int = -1
    attempts: int = 0
    stopped: str = ""  # why the dispatcher stopped the running attempt
    stop_cause: Cause | None = None  # the same, typed: what the client is told follows it
    task: asyncio.Task[Any] | None = None  # the handler, while it talks to a replica
    ended: bool = False
    answering: bool = False  # the replica's answer has begun reaching the client: it stays


@dataclass(slots=True, eq=False)
class ReplicaState:
    replica: Replica
    index: int
    breaker: Breaker
    capacity: ConcurrencyLimit
    engine: str = "unknown"  # the engine detected behind the URL (hetero.serve.engines)
    load: LoadSample | None = None  # its last good load read
    load_at: float = 0.0  # when (the router's clock)
    load_error: str = "not read yet"  # why the load is unknown ("" while reads succeed)
    models_read: bool = False  # its /v1/models has answered at least once
    completed: int = 0
    failed: int = 0
    output_tokens: int = 0
    latency_sum: float = 0.0
    gray_since: float = 0.0  # when it was last found gray (the router's clock)
    judged_from: int = 0  # its completions before its last return to service
    # Why it takes no new work: the dispatcher's own set for its device (live; read it only).
    holds: AbstractSet[Hold] = frozenset()

    @property
    def removed(self) -> bool:
        return Hold.REMOVED in self.holds

    @property
    def draining(self) -> bool:
        return Hold.DRAINING in self.holds

    @property
    def gray(self) -> bool:
        return Hold.GRAY in self.holds
