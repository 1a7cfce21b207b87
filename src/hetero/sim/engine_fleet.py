"""An engine-faithful fleet simulator: the router's ``Dispatcher`` placing LLM requests on
replicas that are each a continuous-batching ``EngineModel``, in virtual time.

Where ``sim.engine`` paces a device by its speed, here every replica runs its engine model step
by step (batching, chunked prefill, KV cache, preemption), so a request's TTFT and TPOT are the
engine's. Routing is the router's (``serve.router``), mirrored call for call: the same policy
(``RouterOptions.strategy``), the same ``Dispatcher`` settings, each request's cost from its
prompt and the expected output (``OutputLengths``), each replica a device of its declared
speed (its GPU's memory bandwidth) and its capacity as slots, completions reported with their
real work, and under ``slo`` the first token, the stream's progress and the end told to the
policy. Capacity is ``"learned"``, as the router learns it from a vLLM replica
(``ConcurrencyLimit`` fed by each reply and by a read of the engine's queue every
``load_interval``), ``"engine"``: fixed at the engine's ``max_num_seqs``, or ``"none"``: the
router holds nothing back and the engine queues what it cannot run, as sglang-router and
vllm-router do (up to ``CapacityOptions.maximum`` requests a replica).

The fleet may change while it runs (an autoscaled day): a replica asked for at ``t`` joins
the dispatcher at ``t + warm_after``; a drained one takes nothing new, finishes what it holds,
then leaves. ``on_tick`` is called every ``interval`` of virtual time with what it saw
(``FleetSnapshot``) and returns ``Add``/``Drain`` actions. Every request ends exactly once:
done, or failed with a reason (rejected, timed out, no replica able to hold it, none left).

Under ``slo`` a replica known by its URL alone (``priors="generic"``) is measured as it joins,
as the router measures it (``hetero.serve.engine_probe``): one probe request alone on its
engine (a copy of it: the probe's prompt stays out of its cache), whose time to first token
and per token bring the generic guess to it.

Requests may carry their prompts (``Prompt``: the text the router reads and the blocks the
engine caches): the policy then sees each prompt's prefix blocks and conversation, as
``hetero serve``'s router gives them to a policy that weighs prefix caches, the engines share
cached blocks, and a ``PrefixAffinity`` policy is told each engine's cache size and prefix-cache
counters at every load read, as the router tells it from vLLM's ``/metrics``.

Events are ``(time, seq, kind, payload)`` in a heap (ties resolve in scheduling order, so a
run is deterministic for its input); arrivals are pulled one at a time and never enter it, and
only a replica with work has a step in it. Requests that have arrived by the time a step ends
join the next step, as a real engine's do.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hetero.errors import ConfigError, DuplicateMember, QueueFull, UnknownMember
from hetero.sched.capacity import ConcurrencyLimit
from hetero.sched.clock import ManualClock
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.driver import Driver
from hetero.sched.instructions import Finish, Instruction, Run, Stop
from hetero.sched.item import CostModel, ItemState, Tokens, WorkItem
from hetero.sched.perf import REFERENCE_BANDWIDTH_GBS, PerfModel
from hetero.sched.policies.prefix import PrefixAffinity
from hetero.sched.policies.slo import FIRST_PACE_REPORT, SloRouting
from hetero.sched.registry import make_policy
from hetero.serve.cost import OutputLengths, block_work, cache_blocks, prompt_prefix
from hetero.serve.engine_model import EngineModel, EngineRequest, EngineSpec, Step
from hetero.serve.engine_probe import OUTPUT_TOKENS as PROBE_OUTPUT
from hetero.serve.engine_probe import PROMPT_TOKENS as PROBE_PROMPT
from hetero.serve.records import RouterOptions
from hetero.serve.replicas import Replica

__all__ = [
    "Action",
    "Add",
    "Capacity",
    "Controller",
    "Drain",
    "EngineFleetSimulator",
    "FleetResult",
    "FleetSeries",
    "FleetSnapshot",
    "Prompt",
    "ReplicaLoad",
    "ReplicaReport",
    "replica_kind",
]

Capacity = Literal["learned", "engine", "none"]
Priors = Literal["generic", "engine"]
_MODEL = "model"  # the one model the fleet serves (OutputLengths keys its estimates by model)
_STEP, _EXPIRE, _ASK, _WARM, _DRAIN, _LOAD, _TICK = range(7)
_OPEN, _DONE, _FAILED = 0, 1, 2
_WARMING, _SERVING, _DRAINING, _GONE = "warming", "serving", "draining", "gone"
_STALL_TICKS = 1000  # ticks in a row without progress, traffic over, before giving up


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request's prompt beyond its length: ``text`` as the router reads it (``hetero.serve.
    cost.prompt_text``: the policy sees its prefix blocks), the ``session`` it belongs to (a
    conversation), and ``blocks``, the chained hashes of its full ``BLOCK_SIZE``-token blocks
    as its engine caches them (``EngineRequest.blocks``)."""

    text: str = ""
    session: str | None = None
    blocks: tuple[int, ...] = ()


def replica_kind(spec: EngineSpec) -> str:
    """What a replica is billed and plotted as: its GPU, times its tensor-parallel degree."""
    tp = spec.tensor_parallel
    return spec.device.model if tp == 1 else f"{spec.device.model}x{tp}"


@dataclass(frozen=True, slots=True)
class Add:
    """Ask for a replica ``name`` running ``spec``; it takes requests ``warm_after`` seconds
    later (its engine loading). Billed from the ask."""

    name: str
    spec: EngineSpec
    warm_after: float = 0.0


@dataclass(frozen=True, slots=True)
class Drain:
    """Replica ``name`` takes no new request, finishes those it holds, then leaves (a replica
    still warming leaves at once)."""

    name: str


Action = Add | Drain


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """One replica as a controller sees it at a tick."""

    name: str
    kind: str
    state: str  # "warming", "serving" or "draining"
    running: int  # requests the router has placed there and not seen end
    waiting: int  # of those, in its engine's queue (not started, or preempted)
    kv_usage: float  # share of its KV blocks held
    utilisation: float  # share of the last interval it ran steps


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """What the last ``interval`` of traffic looked like, and the fleet now."""

    now: float
    interval: float
    arrivals: int
    prompt_tokens: int
    output_tokens: int
    finished: int  # requests that ended in the interval, done or failed
    met: int  # of those, done within the run's SLO (0 without one)
    queued: int  # waiting in the router's queue for a replica
    replicas: tuple[ReplicaLoad, ...]

    @property
    def arrival_rate(self) -> float:
        return self.arrivals / self.interval


Controller = Callable[[float, FleetSnapshot], Iterable[Action]]


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica over the run. ``left_at`` is the run's end for one still there."""

    name: str
    kind: str
    asked_at: float
    joined_at: float | None  # None: drained before it was warm
    left_at: float
    served: int
    steps: int
    busy_seconds: float  # virtual seconds it ran steps
    preemptions: int
    prefix_queries: int = 0  # prompt tokens its engine looked up in its prefix cache
    prefix_hits: int = 0  # ... and found there

    @property
    def billed_seconds(self) -> float:
        """From the ask to the leave: what the replica costs."""
        return self.left_at - self.asked_at

    @property
    def utilisation(self) -> float:
        """The share of its time in the fleet (joined to left) it ran steps."""
        if self.joined_at is None or self.left_at <= self.joined_at:
            return 0.0
        return self.busy_seconds / (self.left_at - self.joined_at)


@dataclass(frozen=True, slots=True, eq=False)
class FleetSeries:
    """Per ``interval`` of virtual time from 0 (``t``: each interval's start): the arrival
    rate, the mean number of replicas in the fleet of each kind (warm, not yet gone), and the
    SLO attainment of the requests that arrived in it (NaN: none did)."""

    t: np.ndarray
    interval: float
    arrivals_per_s: np.ndarray
    replicas: dict[str, np.ndarray]
    attainment: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class FleetResult:
    """Every request's outcome and every replica's record. Per request (by arrival order):
    ``arrival``, tokens, ``started`` (its last attempt sent to a replica), ``first_token`` and
    ``finished`` (NaN for a failed one), ``replica`` (its position in ``replicas``, -1 for a
    failed one) and ``status`` (1 done, 2 failed; the reasons in ``failures``)."""

    arrival: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    started: np.ndarray  # when its last attempt was sent to a replica (NaN: never)
    first_token: np.ndarray
    finished: np.ndarray
    replica: np.ndarray
    status: np.ndarray
    failures: dict[int, str]
    replicas: tuple[ReplicaReport, ...]
    end: float  # virtual time the run ended
    interval: float
    events: int
    wall_seconds: float

    @property
    def requests(self) -> int:
        return int(self.arrival.size)

    @property
    def done(self) -> np.ndarray:
        done: np.ndarray = self.status == _DONE
        return done

    @property
    def ttft(self) -> np.ndarray:
        """First token − arrival (the router's queue, prefill, the engine's queue)."""
        ttft: np.ndarray = self.first_token - self.arrival
        return ttft

    @property
    def tpot(self) -> np.ndarray:
        """(finish − first token) / (output − 1); 0 for a one-token output."""
        gaps = np.maximum(self.output_tokens - 1, 1)
        tpot: np.ndarray = (self.finished - self.first_token) / gaps
        return tpot

    @property
    def latency(self) -> np.ndarray:
        latency: np.ndarray = self.finished - self.arrival
        return latency

    @property
    def requests_per_wall_second(self) -> float:
        return self.requests / self.wall_seconds if self.wall_seconds > 0 else math.inf

    def met(self, ttft: float, tpot: float) -> np.ndarray:
        """Which requests met the SLO: done, TTFT ≤ ``ttft`` and TPOT ≤ ``tpot``."""
        with np.errstate(invalid="ignore"):
            return self.done & (self.ttft <= ttft) & (self.tpot <= tpot)

    def attainment(self, ttft: float, tpot: float) -> float:
        """The share of all requests (a failed one misses) that met the SLO."""
        return float(self.met(ttft, tpot).mean()) if self.requests else math.nan

    def percentiles(
        self, metric: Literal["ttft", "tpot", "latency"], qs: Sequence[float] = (50, 90, 99)
    ) -> dict[float, float]:
        """Percentiles of ``metric`` over the requests done."""
        values = getattr(self, metric)[self.done]
        if not values.size:
            return {q: math.nan for q in qs}
        return dict(zip(qs, np.percentile(values, list(qs)).tolist(), strict=True))

    def failure_reasons(self) -> Counter[str]:
        return Counter(self.failures.values())

    def replica_seconds(self) -> dict[str, float]:
        """Billed replica-seconds per kind (``replica_kind``): multiply by a price per hour."""
        out: dict[str, float] = {}
        for r in self.replicas:
            out[r.kind] = out.get(r.kind, 0.0) + r.billed_seconds
        return out

    def series(self, slo: tuple[float, float] | None = None) -> FleetSeries:
        """The run per ``interval``, for plotting a day (attainment NaN without ``slo``)."""
        step = self.interval
        n = max(1, math.ceil(self.end / step))
        edges = np.arange(n + 1) * step
        counts = np.histogram(self.arrival, bins=edges)[0] if self.requests else np.zeros(n)
        attainment = np.full(n, math.nan)
        if slo is not None and self.requests:
            met = np.histogram(self.arrival, bins=edges, weights=self.met(*slo).astype(np.float64))[
                0
            ]
            with np.errstate(invalid="ignore", divide="ignore"):
                attainment = np.where(counts > 0, met / np.maximum(counts, 1), math.nan)
        kinds: dict[str, np.ndarray] = {}
        for r in self.replicas:
            if r.joined_at is None:
                continue
            overlap = np.clip(
                np.minimum(edges[1:], r.left_at) - np.maximum(edges[:-1], r.joined_at), 0, None
            )
            kinds[r.kind] = kinds.get(r.kind, np.zeros(n)) + overlap / step
        return FleetSeries(edges[:-1], step, counts / step, kinds, attainment)


class _Replica:
    """One replica's engine and books."""

    __slots__ = (
        "asked_at",
        "busy",
        "busy_mark",
        "capacity",
        "index",
        "items",
        "joined_at",
        "kind",
        "left_at",
        "load_armed",
        "model",
        "name",
        "pos",
        "replica",
        "served",
        "spec",
        "state",
        "step",
    )

    def __init__(
        self,
        name: str,
        spec: EngineSpec,
        clock: Callable[[], float],
        declared: int | None,
        pos: int,
        engine_prior: bool,
    ) -> None:
        self.name = name
        self.pos = pos  # in the order asked for (the result's replicas)
        self.spec = spec
        self.kind = replica_kind(spec)
        self.model = EngineModel(spec, clock)
        self.state = _WARMING
        self.asked_at = self.joined_at = self.left_at = math.nan
        self.index = -1  # its position in the dispatcher, once joined
        speed = spec.device.memory_bandwidth_gbs * spec.tensor_parallel / REFERENCE_BANDWIDTH_GBS
        self.replica = Replica(
            name,
            f"sim://{name}",
            speed,
            declared,
            {_MODEL},
            True,
            spec.device.model,
            spec.prior() if engine_prior else None,
        )
        self.capacity: ConcurrencyLimit | None = None
        self.items: dict[EngineRequest, int] = {}  # in its engine -> request id
        self.step: Step | None = None  # the step under way
        self.busy = self.busy_mark = 0.0
        self.served = 0
        self.load_armed = False

    def report(self, end: float) -> ReplicaReport:
        joined = None if math.isnan(self.joined_at) else self.joined_at
        left = end if math.isnan(self.left_at) else self.left_at
        return ReplicaReport(
            self.name,
            self.kind,
            self.asked_at,
            joined,
            left,
            self.served,
            self.model.steps,
            self.busy,
            self.model.preemptions,
            self.model.prefix_queries,
            self.model.prefix_hits,
        )


class EngineFleetSimulator(Driver):
    """A fleet of engine replicas behind the router's dispatcher, in virtual time.

    Args:
        replicas: ``(name, spec)`` of the replicas in service at time 0 (one at least: the
            dispatcher needs a fleet).
        options: the router's options (strategy, queue size, timeout, retries, cost weights,
            capacity learning, SLO); default ``RouterOptions()``, as ``hetero serve``.
        capacity: ``"learned"`` (the router's ``ConcurrencyLimit``: from one request at a time,
            grown by replies that keep up, cut when the engine queues), ``"engine"`` (fixed
            at the engine's ``max_num_seqs``) or ``"none"`` (every request forwarded as it
            comes, up to ``options.capacity.maximum`` a replica: a router without a cap).
        load_interval: seconds between reads of a busy replica's engine queue (the poller's
            ``load_interval``); ``None``: capacity is learned from replies alone.
        priors: where the ``slo`` strategy's fit of each replica starts: ``"generic"`` (a
            guess scaled by its speed: a replica known by its URL) or ``"engine"`` (its engine
            spec's own, as for a replica declared with its GPU and model shape).

    Schedule membership with :meth:`add` and :meth:`drain`, then :meth:`run` once.
    """

    def __init__(
        self,
        replicas: Sequence[tuple[str, EngineSpec]],
        *,
        options: RouterOptions | None = None,
        capacity: Capacity = "learned",
        load_interval: float | None = 0.1,
        priors: Priors = "generic",
    ) -> None:
        problems = []
        if not replicas:
            problems.append(("replicas", "one replica at least to start with (add more later)"))
        if capacity not in ("learned", "engine", "none"):
            problems.append(
                ("capacity", f"must be 'learned', 'engine' or 'none', got {capacity!r}")
            )
        if priors not in ("generic", "engine"):
            problems.append(("priors", f"must be 'generic' or 'engine', got {priors!r}"))
        if load_interval is not None and not 0 < load_interval < math.inf:
            problems.append(
                ("load_interval", f"must be seconds > 0 or None, got {load_interval!r}")
            )
        if problems:
            raise ConfigError(problems)
        self.options = options = options or RouterOptions()
        self.capacity_mode = capacity
        self.priors = priors
        self.load_interval = load_interval if capacity == "learned" else None
        self.clock = ManualClock()
        self._set_time = self.clock.setter()
        self.policy = make_policy(options.strategy, options.strategy_options)
        self.slo = self.policy if isinstance(self.policy, SloRouting) else None
        # As the router's: the policy that follows the engines' prefix caches, if it does.
        self.prefix_policy = self.policy if isinstance(self.policy, PrefixAffinity) else None
        if self.slo is not None:
            self.slo.ttft_slo = options.slo_ttft or self.slo.ttft_slo
            self.slo.tpot_slo = options.slo_tpot or self.slo.tpot_slo
        self.outputs = OutputLengths(
            CostModel(prefill=options.prefill_weight, decode=1.0), options.default_max_tokens
        )
        self._block_work = block_work(options.prefill_weight)
        self._prompts: Sequence[Prompt] = ()  # run's, by request id
        self._replicas: list[_Replica] = []  # every replica asked for, in order
        self._by_name: dict[str, _Replica] = {}
        self._scheduled: dict[str, float] = {}  # asked for by add(), not yet come: when
        self._at: list[_Replica] = []  # by dispatcher position
        self._serving = self._warming = 0  # replicas in each state
        first = []
        for name, spec in replicas:
            self._check_add(name, 0.0)
            r = self._new(name, spec, 0.0)
            self._capacity(r)
            first.append(r)
        slots = [self._slots_of(r) for r in first]
        devices = [r.replica.device(n) for r, n in zip(first, slots, strict=True)]
        self.dispatcher = Dispatcher(
            devices,
            self.policy,
            self.clock,
            perf=PerfModel(devices, unit_rate=options.unit_rate),
            slots=slots,
            max_queue_size=options.queue_size,
            timeout=options.timeout,
            max_retries=options.max_retries,
            keep_finished=False,
            # As the router: under an SLO, a request that waited past its TTFT goes behind.
            late_after=(options.slo_ttft or self.slo.ttft_slo or 1.0) if self.slo else None,
        )
        super().__init__(self.dispatcher)
        for r in first:
            self._joined(r)
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._steps = 0  # steps under way (in the heap)
        self._others = 0  # membership events and the dispatcher's timer, in the heap
        self._kicks: list[_Replica] = []  # replicas to start a step on, or to let go
        self._parked: list[_Replica] = []  # gone, kept in the dispatcher until one is warm
        self._expire_token = -1
        self._ran = False
        # Requests, by id (arrival order).
        self._arrival: list[float] = []
        self._prompt: list[int] = []
        self._output: list[int] = []
        self._started: list[float] = []
        self._first: list[float] = []
        self._finish: list[float] = []
        self._where: list[int] = []
        self._status = bytearray()
        self._failures: dict[int, str] = {}
        self._live: dict[int, tuple[_Replica, EngineRequest]] = {}
        self._marks: dict[int, int] = {}  # under slo: the next progress mark of each stream
        self._open = 0
        self._min_context = 0
        self._contexts()
        # The current tick's counters.
        self._tick_arrivals = self._tick_prompt = self._tick_output = 0
        self._tick_finished = self._tick_met = 0
        self._slo_target: tuple[float, float] | None = None

    # --- membership -------------------------------------------------------------------------

    def add(self, time: float, name: str, spec: EngineSpec, warm_after: float = 0.0) -> None:
        """Ask for replica ``name`` at ``time``; it takes requests from ``time + warm_after``."""
        if not 0 <= time < math.inf:
            raise ConfigError([("time", f"must be seconds >= 0, got {time!r}")])
        self._check_add(name, warm_after)
        self._scheduled[name] = float(time)
        self._push(float(time), _ASK, Add(name, spec, float(warm_after)))

    def drain(self, time: float, name: str) -> None:
        """Drain replica ``name`` at ``time``: it finishes what it holds, then leaves."""
        asked = 0.0 if name in self._by_name else self._scheduled.get(name)
        if asked is None:
            raise UnknownMember([("name", f"no replica {name!r} is in the fleet or asked for")])
        if not asked <= time < math.inf:
            raise UnknownMember([("time", f"{name!r} is asked for at {asked}: drain it later")])
        self._push(float(time), _DRAIN, Drain(name))

    def _check_add(self, name: str, warm_after: float) -> None:
        if name in self._by_name or name in self._scheduled:
            raise DuplicateMember(
                [("name", f"replica {name!r} was asked for already; names are unique in a run")]
            )
        if not 0 <= warm_after < math.inf:
            raise ConfigError([("warm_after", f"must be seconds >= 0, got {warm_after!r}")])

    def _new(self, name: str, spec: EngineSpec, now: float) -> _Replica:
        declared = spec.max_num_seqs if self.capacity_mode == "engine" else None
        r = _Replica(
            name, spec, self.clock.now, declared, len(self._replicas), self.priors == "engine"
        )
        r.asked_at = now
        self._replicas.append(r)
        self._by_name[name] = r
        self._warming += 1
        return r

    def _set_state(self, r: _Replica, state: str) -> None:
        for old, new in ((r.state, -1), (state, 1)):
            if old is _SERVING:
                self._serving += new
            elif old is _WARMING:
                self._warming += new
        r.state = state

    def _capacity(self, r: _Replica) -> int:
        """A fresh capacity for ``r`` (the router's, as it joins); its slots."""
        capacity = ConcurrencyLimit(self.options.capacity, r.replica.slots)
        if self.capacity_mode == "engine":
            capacity.set_cap(r.spec.max_num_seqs)  # it publishes its cap, as SGLang does
        elif self.capacity_mode == "none":
            capacity.set_cap(self.options.capacity.maximum)
        r.capacity = capacity
        return self._slots_of(r)

    def _slots_of(self, r: _Replica) -> int:
        """The router's ``_slots_of``: the learned limit; under ``slo``, the engine's cap."""
        capacity = r.capacity
        assert capacity is not None
        if self.slo is None:
            return capacity.slots
        return capacity.cap or r.replica.slots or self.options.capacity.maximum

    def _joined(self, r: _Replica) -> None:
        """``r`` is in the dispatcher now (the router's ``add``, after ``add_device``)."""
        self._set_state(r, _SERVING)
        r.joined_at = self.clock.now()
        r.index = self.dispatcher.view.index[r.name]
        self._at.append(r)
        if self.slo is not None:
            self.slo.set_prior(r.index, r.replica.engine_prior())
            self.slo.set_kv_tokens(r.index, r.spec.kv_tokens)  # its first load read
            if self.priors == "generic":
                self._probe(r)

    def _probe(self, r: _Replica) -> None:
        """The router's probe of ``r`` (``hetero.serve.engine_probe``), on a copy of its
        engine: one short request alone."""
        clock = ManualClock(self.clock.now())
        model = EngineModel(r.spec, clock.now)
        probe = model.submit(EngineRequest(PROBE_PROMPT, PROBE_OUTPUT))
        while (step := model.step()) is not None:
            clock.set(step.end)
        first, end = probe.first_token_at, probe.finished_at
        assert self.slo is not None and first is not None and end is not None
        tpot = (end - first) / (PROBE_OUTPUT - 1)
        self.slo.measured(r.index, PROBE_PROMPT, first - probe.arrival, tpot, self.clock.now())

    def _ask(self, add: Add) -> None:
        now = self.clock.now()
        self._check_add(add.name, add.warm_after)
        r = self._new(add.name, add.spec, now)
        self._push(now + add.warm_after, _WARM, r)

    def _warm(self, r: _Replica) -> None:
        if r.state is not _WARMING:
            return  # drained before it was warm
        slots = self._capacity(r)
        out = self.dispatcher.add_device(r.replica.device(slots), slots)
        self._joined(r)
        self.apply(out)
        self._contexts()
        self._unpark()

    def _drain(self, name: str) -> None:
        r = self._by_name.get(name)
        if r is None:
            raise UnknownMember([("name", f"no replica {name!r} is in the fleet or asked for")])
        if r.state is _WARMING:
            self._set_state(r, _GONE)
            r.left_at = self.clock.now()
            self._unpark()
        elif r.state is _SERVING:
            self._set_state(r, _DRAINING)
            self.apply(self.dispatcher.drain_device(name))
            self._kicks.append(r)

    def _leave(self, r: _Replica) -> None:
        """A drained replica holds nothing more: its engine stops. It leaves the dispatcher
        too, unless it is the last there while another warms (the dispatcher would end the
        requests waiting for that one)."""
        self._set_state(r, _GONE)
        r.left_at = self.clock.now()
        if self._warming and not self._serving:
            self._parked.append(r)
        else:
            self._remove(r)

    def _remove(self, r: _Replica) -> None:
        self.apply(self.dispatcher.remove_device(r.name, "replica removed"))
        if self.prefix_policy is not None:
            self.prefix_policy.forget(r.index)
        self._contexts()

    def _unpark(self) -> None:
        if self._parked and (self._serving or not self._warming):
            parked, self._parked = self._parked, []
            for r in parked:
                self._remove(r)

    def _contexts(self) -> None:
        members = [r.spec.max_context for r in self._at if r.state in (_SERVING, _DRAINING)]
        self._min_context = min(members, default=0)

    # --- the dispatcher's instructions ------------------------------------------------------

    def on_run(self, ins: Run) -> list[Instruction] | None:
        rid = ins.item.id
        assert isinstance(rid, int)
        r = self._at[ins.device]
        try:
            blocks = self._prompts[rid].blocks if rid < len(self._prompts) else ()
            request = r.model.submit(EngineRequest(self._prompt[rid], self._output[rid], blocks))
        except ValueError as exc:  # longer than its engine holds: the replica refuses it
            return self.dispatcher.fail(rid, f"{r.name}: {exc}", retryable=True)
        r.items[request] = rid
        self._live[rid] = (r, request)
        self._started[rid] = request.arrival
        if self.slo is not None:
            self._marks[rid] = FIRST_PACE_REPORT
        if r.step is None:
            self._kicks.append(r)
        if self.load_interval is not None and not r.load_armed:
            r.load_armed = True
            # The poller reads every load_interval from the replica's joining.
            now, every = self.clock.now(), self.load_interval
            phase = r.joined_at + math.ceil((now - r.joined_at) / every) * every
            self._push(max(now, phase), _LOAD, r)
        return None

    def on_stop(self, ins: Stop) -> list[Instruction] | None:
        rid = ins.item.id
        assert isinstance(rid, int)
        r, request = self._live.pop(rid)
        del r.items[request]
        r.model.abort(request)
        if self.slo is not None:
            self.slo.dropped(rid, self.clock.now())
            self._marks.pop(rid, None)
        self._kicks.append(r)
        return None

    def on_finish(self, ins: Finish) -> list[Instruction] | None:
        rid = ins.item.id
        assert isinstance(rid, int)
        if ins.state is ItemState.DONE:
            self._end(rid, _DONE)
        else:
            if self.slo is not None:
                self.slo.dropped(rid, self.clock.now())
            self._end(rid, _FAILED, ins.reason or str(ins.cause))
        return None

    def arm_timer(self, at: float) -> None:
        self._expire_token = self._push(at, _EXPIRE, None)

    # --- requests ---------------------------------------------------------------------------

    def _end(self, rid: int, status: int, reason: str = "") -> None:
        if self._status[rid] != _OPEN:
            raise RuntimeError(f"request {rid} ended twice")  # a bug of this simulator
        self._status[rid] = status
        self._open -= 1
        self._tick_finished += 1
        if status == _FAILED:
            self._failures[rid] = reason
        elif self._slo_target is not None:
            ttft, tpot = self._slo_target
            first, end, arrival = self._first[rid], self._finish[rid], self._arrival[rid]
            gaps = max(self._output[rid] - 1, 1)
            self._tick_met += first - arrival <= ttft and (end - first) / gaps <= tpot

    def _arrive(self, now: float, prompt: int, output: int) -> None:
        rid = len(self._arrival)
        self._arrival.append(now)
        self._prompt.append(prompt)
        self._output.append(output)
        self._started.append(math.nan)
        self._first.append(math.nan)
        self._finish.append(math.nan)
        self._where.append(-1)
        self._status.append(_OPEN)
        self._open += 1
        self._tick_arrivals += 1
        self._tick_prompt += prompt
        self._tick_output += output
        # The router refuses a request no replica in service serves (a 503); one warming
        # here is taken to be known to it, so requests wait for it.
        if not self._serving and not self._warming:
            self._end(rid, _FAILED, "no replica in service")
            return
        only: tuple[str, ...] | None = None
        total = prompt + output
        if total > self._min_context:
            only = tuple(
                r.name
                for r in self._at
                if r.state in (_SERVING, _DRAINING) and r.spec.max_context >= total
            )
            if not only:
                self._end(rid, _FAILED, f"{total} tokens: longer than any replica holds")
                return
        # The expected output once, as the router's admission works it out.
        expected = self.outputs.expected(_MODEL, None)
        tokens = Tokens(prompt, expected) if self.slo is not None else None
        prefix = None
        if rid < len(self._prompts):
            p = self._prompts[rid]
            if p.text or p.session:
                prefix = prompt_prefix(p.text, p.session, self._block_work)
        item = WorkItem(
            cost=self.outputs.cost_model.cost(prompt, expected),
            id=rid,
            tokens=tokens,
            prefix=prefix,
        )
        try:
            out = self.dispatcher.submit(item, only=only)
        except QueueFull:
            self._end(rid, _FAILED, "rejected: the router's queue is full")
            return
        self.apply(out)

    def _done(self, r: _Replica, rid: int, request: EngineRequest, now: float) -> None:
        """The router's ``complete`` for a request its engine finished at ``now``."""
        del self._live[rid]
        first = request.first_token_at
        assert first is not None
        self._first[rid] = first
        self._finish[rid] = now
        self._where[rid] = r.pos
        r.served += 1
        output = request.output_tokens
        if self.slo is not None:
            self.slo.finished(rid, now, output)
            self._marks.pop(rid, None)
        work = self.outputs.cost_model.cost(self._prompt[rid], output)
        self.outputs.observe(_MODEL, output)
        capacity = r.capacity
        assert capacity is not None
        if self.slo is None and self.capacity_mode == "learned" and output >= 2:
            latency, ttft = now - request.arrival, first - request.arrival
            units = float(output - 1)
            in_flight = int(self.dispatcher.view.running[r.index]) - 1
            capacity.on_reply(now, in_flight, (latency - ttft) / units, latency, "token", units)
            self._sync(r)
        self.apply(self.dispatcher.complete(rid, work=work))

    def _sync(self, r: _Replica) -> None:
        slots = self._slots_of(r)
        if slots != self.dispatcher.view.slots[r.index] and r.state is not _GONE:
            self.apply(self.dispatcher.set_slots(r.name, slots))

    # --- the loop ---------------------------------------------------------------------------

    def _push(self, at: float, kind: int, payload: object) -> int:
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, kind, payload))
        if kind == _STEP:
            self._steps += 1
        elif kind != _TICK and kind != _LOAD:
            self._others += 1
        return self._seq

    def _start(self, r: _Replica) -> None:
        step = r.model.step()
        if step is not None:
            r.step = step
            self._push(step.end, _STEP, r)

    def _flush(self) -> None:
        """Start a step on each replica told of new work while idle; let go of drained ones
        that hold nothing more."""
        kicks = self._kicks
        while kicks:
            r = kicks.pop()
            if r.step is None:
                if r.model.busy:
                    self._start(r)
                elif r.state is _DRAINING and not r.items:
                    self._leave(r)

    def _step_end(self, r: _Replica, now: float) -> None:
        step = r.step
        assert step is not None
        r.step = None
        r.busy += step.end - step.start
        items = r.items
        slo = self.slo
        if slo is not None:
            marks = self._marks
            for request in step.progressed:
                rid = items.get(request)
                if rid is None:
                    continue
                if request.generated == 1:
                    slo.first_token(rid, now)
                elif request.generated >= marks[rid]:
                    slo.progress(rid, now, request.generated)
                    marks[rid] *= 2
        for request in step.finished:
            rid = items.pop(request, None)
            if rid is not None:  # else stopped while the step ran
                self._done(r, rid, request, now)
        self._kicks.append(r)

    def _load(self, r: _Replica) -> None:
        """A read of ``r``'s engine queue (the router's ``load_read``); reads go on while it
        holds requests."""
        capacity = r.capacity
        assert capacity is not None and self.load_interval is not None
        if r.state is _GONE:
            r.load_armed = False
            return
        in_flight = int(self.dispatcher.view.running[r.index])
        capacity.on_load(self.clock.now(), in_flight, len(r.model.waiting))
        if self._prompts and self.prefix_policy is not None:
            model = r.model
            self.prefix_policy.engine_cache(
                r.index,
                blocks=cache_blocks(r.spec.kv_tokens),
                queries=model.prefix_queries,
                hits=model.prefix_hits,
            )
        self._sync(r)
        if r.items:
            self._push(self.clock.now() + self.load_interval, _LOAD, r)
        else:
            r.load_armed = False

    def _tick(self, now: float, interval: float, on_tick: Controller | None) -> None:
        if on_tick is not None:
            loads = []
            running = self.dispatcher.view.running
            for r in self._replicas:
                if r.state is _GONE:
                    continue
                joined = r.state is not _WARMING
                loads.append(
                    ReplicaLoad(
                        r.name,
                        r.kind,
                        r.state,
                        int(running[r.index]) if joined else 0,
                        len(r.model.waiting),
                        r.model.kv_usage,
                        (r.busy - r.busy_mark) / interval,
                    )
                )
            snapshot = FleetSnapshot(
                now,
                interval,
                self._tick_arrivals,
                self._tick_prompt,
                self._tick_output,
                self._tick_finished,
                self._tick_met,
                self.dispatcher.waiting,
                tuple(loads),
            )
            for action in on_tick(now, snapshot):
                if isinstance(action, Add):
                    self._ask(action)
                elif isinstance(action, Drain):
                    self._drain(action.name)
                else:
                    raise ConfigError([("on_tick", f"returned {action!r}; expected Add or Drain")])
        for r in self._replicas:
            r.busy_mark = r.busy
        self._tick_arrivals = self._tick_prompt = self._tick_output = 0
        self._tick_finished = self._tick_met = 0

    def run(
        self,
        arrivals: Iterable[tuple[float, int, int]],
        *,
        until: float | None = None,
        interval: float = 60.0,
        on_tick: Controller | None = None,
        slo: tuple[float, float] | None = None,
        prompts: Sequence[Prompt] = (),
    ) -> FleetResult:
        """Serve ``arrivals`` (``(time, prompt tokens, output tokens)`` in time order) until
        every request has ended and, with ``until``, at least to that time. ``on_tick`` is
        called every ``interval``; ``slo`` ``(ttft, tpot)`` only feeds its ``met`` counts.
        ``prompts[i]`` is the ``i``-th arrival's prompt (none past its end)."""
        if self._ran:
            raise RuntimeError("an EngineFleetSimulator runs once; build a new one")
        self._ran = True
        if not 0 < interval < math.inf:
            raise ConfigError([("interval", f"must be seconds > 0, got {interval!r}")])
        self._slo_target = slo
        wrong = next((p for p in prompts if not isinstance(p, Prompt)), None)
        if wrong is not None:
            raise ConfigError([("prompts", f"must be Prompt objects, got {wrong!r}")])
        self._prompts = prompts
        horizon = -math.inf if until is None else float(until)
        it: Iterator[tuple[float, int, int]] = iter(arrivals)
        heap = self._heap
        pop = heapq.heappop
        set_time = self._set_time
        self._push(interval, _TICK, None)
        next_arrival = next(it, None)
        now = 0.0
        events = stalled = 0
        gc_was_enabled = gc.isenabled()
        gc.disable()  # many short-lived objects, no cycles
        wall = time.perf_counter()
        try:
            while True:
                if next_arrival is not None and (not heap or next_arrival[0] <= heap[0][0]):
                    at, prompt, output = next_arrival
                    next_arrival = next(it, None)
                    if not at >= now:
                        raise ConfigError(
                            [("arrivals", f"must come in time order: {at!r} after {now!r}")]
                        )
                    if prompt < 1 or output < 1:
                        problem = (
                            f"a request needs a prompt and an output token, got {prompt}, {output}"
                        )
                        raise ConfigError([("arrivals", problem)])
                    now = at
                    set_time(now)
                    self._arrive(now, int(prompt), int(output))
                elif heap and (
                    next_arrival is not None
                    or self._steps
                    or heap[0][0] <= horizon
                    or (
                        self._open
                        and (self._others or (on_tick is not None and stalled < _STALL_TICKS))
                    )
                ):
                    now, token, kind, payload = pop(heap)
                    set_time(now)
                    if kind == _STEP:
                        self._steps -= 1
                        self._step_end(payload, now)  # type: ignore[arg-type]
                    elif kind == _TICK:
                        stalled = stalled + 1 if next_arrival is None and not self._steps else 0
                        self._tick(now, interval, on_tick)
                        self._push(now + interval, _TICK, None)
                    elif kind == _LOAD:
                        self._load(payload)  # type: ignore[arg-type]
                    elif kind == _EXPIRE:
                        self._others -= 1
                        if token == self._expire_token:
                            self._expire_token = -1
                            self.expire()
                    else:
                        self._others -= 1
                        if kind == _ASK:
                            del self._scheduled[payload.name]  # type: ignore[attr-defined]
                            self._ask(payload)  # type: ignore[arg-type]
                        elif kind == _WARM:
                            self._warm(payload)  # type: ignore[arg-type]
                        else:
                            self._drain(payload.name)  # type: ignore[attr-defined]
                else:
                    break
                events += 1
                self._flush()
        finally:
            wall = time.perf_counter() - wall
            if gc_was_enabled:
                gc.enable()
        end = max(now, horizon)
        if self._open:  # nothing left could run them: end them, never lose them
            for rid in [i for i, status in enumerate(self._status) if status == _OPEN]:
                self.apply(self.dispatcher.abandon(rid, "no replica served it before the end"))
        return FleetResult(
            arrival=np.array(self._arrival, dtype=np.float64),
            prompt_tokens=np.array(self._prompt, dtype=np.int64),
            started=np.array(self._started, dtype=np.float64),
            output_tokens=np.array(self._output, dtype=np.int64),
            first_token=np.array(self._first, dtype=np.float64),
            finished=np.array(self._finish, dtype=np.float64),
            replica=np.array(self._where, dtype=np.int64),
            status=np.frombuffer(bytes(self._status), dtype=np.uint8).copy(),
            failures=dict(self._failures),
            replicas=tuple(r.report(end) for r in self._replicas),
            end=end,
            interval=interval,
            events=events,
            wall_seconds=wall,
        )
