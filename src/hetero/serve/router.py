"""The router's brain: requests become work items of the core's ``Dispatcher``.

Nothing here balances load itself. A request is ``submit``-ted on arrival; the dispatcher's
``Run`` says which replica takes it (or it waits in the router's queue while every replica it
may use is full); ``complete``/``fail`` report how it ended, and the ``PerfModel`` learns each
replica's speed from the real output length and time. The HTTP side (``app.py``) awaits a
``Ticket`` and forwards the request; health, the circuit breakers and membership are here too,
all on the event loop's thread, so no lock is needed.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetero.errors import ConfigError, DuplicateMember, NoReplica, UnknownMember, UnknownModel
from hetero.sched import (
    Cause,
    CostModel,
    Dispatcher,
    Finish,
    ItemState,
    MonotonicClock,
    PerfModel,
    Run,
    Stop,
    Tokens,
    WorkItem,
    make_policy,
)
from hetero.sched.capacity import ConcurrencyLimit
from hetero.sched.driver import Driver
from hetero.sched.health import Breaker, Hold
from hetero.sched.policies.prefix import PrefixAffinity
from hetero.sched.policies.slo import SloRouting
from hetero.sched.prefix import Prefix
from hetero.serve.autoscale.traffic import TrafficLog
from hetero.serve.cost import OutputLengths, block_work, brief, cache_blocks, prompt_prefix
from hetero.serve.engine_probe import EngineSample
from hetero.serve.engines import LoadSample
from hetero.serve.health import gray_replicas
from hetero.serve.records import DEFAULT_STRATEGY, ReplicaState, RouterOptions, Ticket
from hetero.serve.replicas import Replica, same_engine
from hetero.serve.router_status import router_status, state_word

__all__ = [
    "DEFAULT_STRATEGY",
    "NoReplica",
    "Router",
    "RouterOptions",
    "Ticket",
    "UnknownModel",
    "request_item",
]

log = logging.getLogger("hetero.serve")

# A replica held only for these still counts as in service: a 429 ends with its retry-after.
_PASSING = frozenset({Hold.SATURATED})
#: Model names a 404 lists at most: its answer stays small however many are served.
_LISTED_MODELS = 10
#: A prompt length a replica's ``usage`` may report (more: a lie or a fault; the estimate
#: stands). Far beyond any context window served today.
MAX_PROMPT_TOKENS = 1 << 24


def request_item(
    ticket: Ticket,
    cost: float,
    priority: int = 0,
    prefix: Prefix | None = None,
    tokens: Tokens | None = None,
) -> WorkItem:
    """The work item of one request: its ``cost`` in work units, and its prompt tokens (the
    router's estimate, ``ticket.prompt``) as its complexity, so that the ``tiered`` strategy
    tiers requests by prompt length (long prompts to the big replicas) rather than by cost,
    which the expected output dominates."""
    return WorkItem(
        cost=cost,
        priority=priority,
        complexity=ticket.prompt,
        id=ticket.id,
        prefix=prefix,
        tokens=tokens,
    )


def _some(names: list[str]) -> str:
    """The first ``_LISTED_MODELS`` names, and how many more ``GET /v1/models`` lists."""
    shown = ", ".join(names[:_LISTED_MODELS]) or "none"
    more = len(names) - _LISTED_MODELS
    return shown if more <= 0 else f"{shown} and {more} more (GET /v1/models)"


class Router(Driver):
    """Admits requests, places them through the dispatcher, and tracks replica health."""

    def __init__(self, replicas: Sequence[Replica], options: RouterOptions | None = None) -> None:
        if not replicas:
            raise ConfigError([("replicas", "the router needs at least one replica")])
        names = [r.name for r in replicas]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ConfigError([("replicas", f"duplicate replica name {dup!r}; give each a name")])
        self.options = options = options or RouterOptions()
        self.clock = MonotonicClock()
        self.policy = make_policy(options.strategy, options.strategy_options)
        # A policy that predicts each replica as a continuous-batching engine: it decides how
        # much each takes, so no learned slot count stands in front of it.
        self.slo_policy: SloRouting | None = (
            self.policy if isinstance(self.policy, SloRouting) else None
        )
        if self.slo_policy is None and (options.slo_ttft or options.slo_tpot):
            flag = "slo_ttft" if options.slo_ttft else "slo_tpot"
            raise ConfigError(
                [(flag, f"an SLO is routed to by strategy 'slo', not {options.strategy!r}")]
            )
        limits = [ConcurrencyLimit(options.capacity, r.slots) for r in replicas]
        slots = [self._slots_of(r, c) for r, c in zip(replicas, limits, strict=True)]
        devices = [r.device(n) for r, n in zip(replicas, slots, strict=True)]
        self.perf = PerfModel(devices, unit_rate=options.unit_rate)
        # The index of a policy that weighs prefix caches: only then do requests carry their
        # prompt's blocks (hashing a long prompt is not free), and it follows the engines.
        self.prefix_policy: PrefixAffinity | None = (
            self.policy if isinstance(self.policy, PrefixAffinity) else None
        )
        self.prefix_aware = self.prefix_policy is not None
        # Work units one cached block saves: its tokens' prefill.
        self._block_work = block_work(options.prefill_weight)
        self.dispatcher = Dispatcher(
            devices,
            self.policy,
            self.clock,
            perf=self.perf,
            slots=slots,
            max_queue_size=options.queue_size,
            timeout=options.timeout,
            max_retries=options.max_retries,
            keep_finished=False,
            # Under an SLO, a request that waited past its TTFT goes behind those that can
            # still meet theirs.
            late_after=self._late_after(),
        )
        self.replicas: list[ReplicaState] = [
            ReplicaState(r, i, self._breaker(), c, holds=self.dispatcher.live_holds(i))
            for i, (r, c) in enumerate(zip(replicas, limits, strict=True))
        ]
        self.by_name = {s.replica.name: s for s in self.replicas}
        self.outputs = OutputLengths(
            CostModel(prefill=options.prefill_weight, decode=1.0), options.default_max_tokens
        )
        super().__init__(self.dispatcher)
        if self.slo_policy is not None:
            self.slo_policy.ttft_slo = options.slo_ttft or self.slo_policy.ttft_slo
            self.slo_policy.tpot_slo = options.slo_tpot or self.slo_policy.tpot_slo
            for r, state in zip(replicas, self.replicas, strict=True):
                self.slo_policy.set_prior(state.index, r.engine_prior())
        self.tickets: dict[int, Ticket] = {}
        self.traffic = TrafficLog()  # what an autoscaler sizes the fleet for
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        # Replicas that let a request time out before answering anything, while expiring.
        self._hung: list[tuple[int, str]] = []
        self._model_masks: dict[str, tuple[str, ...]] = {}
        self.started = time.time()
        self.closing = False
        self.decisions: dict[str, int] = {}  # replica name -> requests placed there
        # A load read older than this is no longer the replica's load (the poller sets it).
        self.load_stale_after = 1.0

    def _late_after(self) -> float | None:
        """Strategy slo: the TTFT target (given, else the 1 s that a derived one starts from)."""
        if self.slo_policy is None:
            return None
        return self.options.slo_ttft or self.slo_policy.ttft_slo or 1.0

    def _slots_of(self, replica: Replica, capacity: ConcurrencyLimit) -> int:
        """A replica's slots: its learned capacity; under ``slo``, what its engine runs at
        once at most (published, else declared), else no limit of the router's own
        (``CapacityOptions.maximum``)."""
        if self.slo_policy is None:
            return capacity.slots
        return capacity.cap or replica.slots or self.options.capacity.maximum

    def _breaker(self) -> Breaker:
        return Breaker(self.options.breaker_threshold, self.options.breaker_cooldown)

    # ------------------------------------------------------------------ admission

    def replicas_for(self, model: str) -> tuple[str, ...]:
        """Names of the replicas (not removed) that serve ``model``; ``UnknownModel`` if none,
        ``NoReplica`` if none is known to but a replica's model list was never read."""
        names = self._model_masks.get(model)
        if names is None:
            names = tuple(
                s.replica.name for s in self.replicas if not s.removed and model in s.replica.models
            )
            if not names:
                unread = [
                    s
                    for s in self.replicas
                    if not s.removed and not s.replica.declared_models and not s.models_read
                ]
                if unread:
                    # They may serve it: unknown is not unserved until their lists are read.
                    raise NoReplica(
                        f"cannot tell whether {model!r} is served: the model list of "
                        + ", ".join(s.replica.name for s in unread)
                        + " was never read (unreachable: "
                        + "; ".join(self._why_down(s) for s in unread)
                        + ")"
                    )
                raise UnknownModel(
                    f"model {brief(model)} is not served here; models: "
                    + _some(self.served_models())
                )
            self._model_masks[model] = names
        return names

    def served_models(self) -> list[str]:
        """The models the replicas (not removed) serve, sorted."""
        return sorted({m for s in self.replicas if not s.removed for m in s.replica.models})

    def admit(
        self,
        model: str,
        prompt: int,
        max_tokens: int | None,
        priority: int = 0,
        *,
        text: str | None = None,
        session: str | None = None,
    ) -> Ticket:
        """Submit one request. Raises ``UnknownModel``, ``NoReplica`` or ``QueueFull``.
        ``text`` (the prompt, ``prompt_text``) and ``session`` (a conversation's id) feed a
        policy that weighs prefix caches (``prefix_aware``); others ignore them."""
        names = self.replicas_for(model)
        if self.closing or not any(self._in_service(self.by_name[n]) for n in names):
            raise NoReplica(
                "the router is shutting down"
                if self.closing
                else f"no healthy replica serves {model!r} now ({', '.join(names)}: "
                + "; ".join(self._why_down(self.by_name[n]) for n in names)
                + ")"
            )
        loop = asyncio.get_running_loop()
        ticket = Ticket(next(self._ids), model, prompt, loop.create_future(), self.clock.now())
        self.traffic.arrived(ticket.submitted)
        # The expected output once: the cost and, under slo, the tokens are both made of it.
        output = self.outputs.expected(model, max_tokens)
        cost = self.outputs.cost_model.cost(prompt, output)
        prefix = None
        if self.prefix_aware and (text or session):
            text = text or ""
            prefix = prompt_prefix(text, session, self._block_work)
        tokens = None
        if self.slo_policy is not None:
            tokens = Tokens(prompt, output)
        item = request_item(ticket, cost, priority, prefix, tokens)
        self.tickets[ticket.id] = ticket
        try:
            # Always restricted: a replica that joins later may serve other models.
            out = self.dispatcher.submit(item, only=names)
        except BaseException:
            del self.tickets[ticket.id]
            raise
        self.apply(out)
        return ticket

    def _in_service(self, state: ReplicaState) -> bool:
        """Whether the replica takes new work (once a 429's hold is over): nothing but that
        holds it (removed, drained, gray, its circuit open)."""
        return not (state.holds - _PASSING)

    def _hold(self, state: ReplicaState, why: Hold) -> None:
        self.apply(self.dispatcher.hold(state.replica.name, why))

    def _release(self, state: ReplicaState, why: Hold) -> None:
        """End one reason the replica takes no work; it takes work once none is left."""
        self.apply(self.dispatcher.release(state.replica.name, why))

    def _sole_server(self, state: ReplicaState) -> str | None:
        """A model that no other replica in service serves (then this one must stay in
        service, however it fares: without it the model has none), or None."""
        if not self._in_service(state):
            return None
        others = [s for s in self.replicas if s is not state and self._in_service(s)]
        return next(
            (m for m in state.replica.models if not any(m in s.replica.models for s in others)),
            None,
        )

    def _why_down(self, state: ReplicaState) -> str:
        if state.removed:
            return f"{state.replica.name} removed"
        if state.draining or state.gray:
            return f"{state.replica.name} draining" + (" (gray failure)" if state.gray else "")
        return f"{state.replica.name} circuit {state.breaker.state}: {state.breaker.last_error}"

    # ------------------------------------------------------------------ outcomes

    def _met(
        self, ticket: Ticket, output_tokens: int, latency: float, ttft: float | None
    ) -> tuple[float, bool] | None:
        """(now, whether the request met the SLO) where one is set: its TTFT from arrival (the
        router's queue included) and its TPOT; None without an SLO or a first token."""
        o = self.options
        if o.slo_ttft is None or o.slo_tpot is None or ttft is None:
            return None
        now = self.clock.now()
        first = (now - ticket.submitted) - latency + ttft
        tpot = (latency - ttft) / max(output_tokens - 1, 1)
        return now, first <= o.slo_ttft and tpot <= o.slo_tpot

    def complete(
        self,
        ticket: Ticket,
        output_tokens: int | None,
        latency: float,
        ttft: float | None = None,
        prompt_tokens: int | None = None,
    ) -> None:
        """The replica answered; ``output_tokens`` is the real output length (None: unknown,
        0: it refused the request, which teaches the speed model nothing); ``ttft`` the time to
        its first streamed event; ``prompt_tokens`` the prompt's length as its engine counted
        it (None: not told; the router's own estimate, characters / 4, stands in)."""
        state = self.replicas[ticket.replica]
        if self.slo_policy is not None:
            self.slo_policy.finished(ticket.id, self.clock.now(), output_tokens or 0)
        work = None
        if output_tokens is not None:
            work = (
                self.outputs.cost_model.cost(ticket.prompt, output_tokens) if output_tokens else 0.0
            )
            if output_tokens:
                self.outputs.observe(ticket.model, output_tokens)
                # What the autoscaler sizes by: the engine's count where it gave one (for
                # text unlike English, characters / 4 was a third of it).
                prompt = ticket.prompt
                if prompt_tokens is not None and 0 < prompt_tokens <= MAX_PROMPT_TOKENS:
                    prompt = prompt_tokens
                self.traffic.finished(
                    prompt, output_tokens, self._met(ticket, output_tokens, latency, ttft)
                )
                state.output_tokens += output_tokens
                self._learn_capacity(state, output_tokens, work, latency, ttft)
        state.completed += 1
        state.latency_sum += latency
        if state.breaker.success():
            log.info("replica %s: circuit closed", state.replica.name)
        self._finish(ticket)
        self.apply(self.dispatcher.complete(ticket.id, work=work))
        if state.completed % 16 == 0:
            self._check_gray()

    def _learn_capacity(
        self,
        state: ReplicaState,
        output_tokens: int,
        work: float,
        latency: float,
        ttft: float | None,
    ) -> None:
        # A stream's time per token after the first is the engine's decode pace alone; a whole
        # reply's latency per unit of work also holds its prefill and the round trip, which
        # only longer replies amortise.
        if ttft is not None and output_tokens >= 2:
            units, measure = float(output_tokens - 1), "token"
            pace = (latency - ttft) / units
        elif output_tokens >= 8 and work > 0:
            units, measure = work, "work"
            pace = latency / work
        else:
            return
        if self.slo_policy is not None:
            return  # its engine model learns from the same reply
        in_flight = int(self.dispatcher.view.running[state.index]) - 1
        state.capacity.on_reply(self.clock.now(), in_flight, pace, latency, measure, units)
        self._sync_slots(state)

    def first_token(self, ticket: Ticket) -> None:
        """The replica's first event for ``ticket`` reached the router: its prefill is over."""
        if self.slo_policy is not None:
            self.slo_policy.first_token(ticket.id, self.clock.now())

    def measured(self, state: ReplicaState, sample: EngineSample) -> None:
        """A lone probe request's times on the replica (``hetero.serve.engine_probe``)."""
        if self.slo_policy is not None:
            self.slo_policy.measured(
                state.index, sample.prompt_tokens, sample.ttft, sample.tpot, self.clock.now()
            )

    def progress(self, ticket: Ticket, tokens: int) -> None:
        """``ticket``'s stream has brought ``tokens`` output chunks so far."""
        if self.slo_policy is not None:
            self.slo_policy.progress(ticket.id, self.clock.now(), tokens)

    def _sync_slots(self, state: ReplicaState) -> None:
        slots = self._slots_of(state.replica, state.capacity)
        if slots != self.dispatcher.view.slots[state.index] and not state.removed:
            self.apply(self.dispatcher.set_slots(state.replica.name, slots))

    def load_read(self, state: ReplicaState, engine: str, sample: LoadSample) -> None:
        """A good read of the replica's published load (the engine adapters' poller)."""
        if state.load_error:
            log.info("replica %s: %s load read again", state.replica.name, engine)
        state.engine = engine
        state.load = sample
        state.load_at = self.clock.now()
        state.load_error = ""
        if self.prefix_policy is not None:
            # The engine's cache evicts at its KV capacity, and its counters say how much of
            # what the index predicted it really found: the index follows both.
            blocks = None
            if sample.kv_tokens:
                blocks = cache_blocks(sample.kv_tokens)
            self.prefix_policy.engine_cache(
                state.index, blocks=blocks, queries=sample.prefix_queries, hits=sample.prefix_hits
            )
        capacity = state.capacity
        capacity.set_cap(sample.cap)
        if self.slo_policy is not None:
            self.slo_policy.set_kv_tokens(state.index, sample.kv_tokens)
        elif sample.waiting is not None:
            in_flight = int(self.dispatcher.view.running[state.index])
            capacity.on_load(state.load_at, in_flight, sample.waiting)
        self._sync_slots(state)

    def load_failed(
        self,
        state: ReplicaState,
        engine: str,
        reason: str,
        expected: bool = False,
        bug: Exception | None = None,
    ) -> None:
        """The replica's load could not be read: it is unknown (capacity is then learned from
        replies alone) until a read succeeds. Logged once per new reason: ``expected``, the
        server has no load page at all (a plain OpenAI server), as information; ``bug``, an
        exception no adapter meant to raise, with its traceback."""
        if reason != state.load_error:
            level = logging.INFO if expected else logging.WARNING
            log.log(level, "replica %s: load unknown: %s", state.replica.name, reason, exc_info=bug)
        state.engine = engine
        state.load_error = reason

    def fail(self, ticket: Ticket, reason: str, retryable: bool = True) -> None:
        """The attempt on ``ticket.replica`` failed (the replica's fault). The dispatcher retries
        it elsewhere or ends it; either way ``ticket.waiter`` says what happens next."""
        state = self.replicas[ticket.replica]
        state.failed += 1
        self._rearm(ticket)
        name = state.replica.name
        opens = self._breaker_opens(state, reason)
        if opens:
            # No new work there before this attempt is failed: its slot must not start the
            # request queued behind it.
            self._hold(state, Hold.CIRCUIT_OPEN)
        self.apply(self.dispatcher.fail(ticket.id, f"{name}: {reason}", retryable))
        if opens:
            self._move_unanswered(state, f"circuit open: {reason}")

    def busy(self, ticket: Ticket, retry_after: float) -> None:
        """The replica answered 429: hold it for ``retry_after`` seconds and place the request
        again without charging it an attempt."""
        state = self.replicas[ticket.replica]
        self._rearm(ticket)
        # Hold it first, so that the request is not placed straight back on it.
        if Hold.SATURATED not in state.holds and self._in_service(state):
            self._hold(state, Hold.SATURATED)
            loop = asyncio.get_running_loop()
            loop.call_later(retry_after, self._release, state, Hold.SATURATED)
        self.apply(self.dispatcher.requeue(ticket.id, f"{state.replica.name} answered 429"))

    def cancel(self, ticket: Ticket, reason: str, *, failed: bool = False) -> None:
        """The client went away or the stream cannot go on: end the request for good.
        ``failed``: the router itself could not go on (it ran out of file descriptors), so the
        request ends as failed, and no replica is blamed."""
        if not ticket.ended and ticket.id in self.dispatcher.records:
            # The dispatcher leaves an item that has already ended as it is.
            end = self.dispatcher.abandon if failed else self.dispatcher.cancel
            self.apply(end(ticket.id, reason))
        self._finish(ticket)

    def _finish(self, ticket: Ticket) -> None:
        self._attempt_over(ticket)
        ticket.ended = True
        ticket.task = None
        self.tickets.pop(ticket.id, None)

    def _attempt_over(self, ticket: Ticket) -> None:
        """``ticket``'s attempt no longer runs on its replica (a reply already taught the
        engine model; this gives back what any other end held)."""
        if self.slo_policy is not None:
            self.slo_policy.dropped(ticket.id, self.clock.now())

    def _rearm(self, ticket: Ticket) -> None:
        self._attempt_over(ticket)
        # A fresh waiter before the dispatcher is told, since its answer (a retry's Run, or the
        # Finish) comes back in the same call.
        ticket.waiter = asyncio.get_running_loop().create_future()
        ticket.stopped = ""
        ticket.stop_cause = None

    # ------------------------------------------------------------------ instructions

    def on_run(self, ins: Run) -> None:
        ticket = self.tickets.get(ins.item.id)  # type: ignore[arg-type]
        if ticket is None:
            return
        ticket.replica = ins.device
        ticket.attempts += 1
        name = ins.device_id
        self.decisions[name] = self.decisions.get(name, 0) + 1
        if not ticket.waiter.done():
            ticket.waiter.set_result(ins.device)

    def on_stop(self, ins: Stop) -> None:
        ticket = self.tickets.get(ins.item.id)  # type: ignore[arg-type]
        if ticket is None:
            return
        if ins.cause is Cause.TIMED_OUT and not ticket.answering:
            self._hung.append((ins.device, ins.reason))
        self._stop(ticket, ins.reason, ins.cause)

    def on_finish(self, ins: Finish) -> None:
        ticket = self.tickets.pop(ins.item.id, None)  # type: ignore[arg-type]
        if ticket is None:
            return
        self._attempt_over(ticket)
        ticket.ended = True
        if not ticket.waiter.done():
            ticket.waiter.set_result(ins)

    def arm_timer(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        # The loop's clock and MonotonicClock are both time.monotonic.
        self._timer = asyncio.get_running_loop().call_at(at, self._on_timer)

    def _stop(self, ticket: Ticket, reason: str, cause: Cause) -> None:
        """Its attempt was stopped: the handler talking to the replica is cancelled (unless
        it is the caller, which reported the end itself) and follows a fresh waiter."""
        ticket.stopped = reason
        ticket.stop_cause = cause
        self._attempt_over(ticket)
        task = ticket.task
        ticket.waiter = asyncio.get_running_loop().create_future()
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _move_unanswered(self, state: ReplicaState, why: str) -> None:
        """Place elsewhere, charging no attempt, what runs on the replica and has not begun
        answering its client; a stream under way stays (its work there would be lost)."""
        records = self.dispatcher.records
        for ticket in list(self.tickets.values()):
            rec = records.get(ticket.id)  # None: ended meanwhile
            if (
                rec is not None
                and rec.state is ItemState.RUNNING
                and rec.device == state.index
                and not ticket.answering
            ):
                self._stop(ticket, why, Cause.DEVICE_REMOVED)
                self.apply(self.dispatcher.requeue(ticket.id, why))

    def _on_timer(self) -> None:
        self._timer = None
        self.expire()
        # A request that timed out before its replica answered anything is that replica's
        # failure (a hung replica still answers its health check); a stream under way is not.
        hung, self._hung = self._hung, []
        for i, reason in hung:
            state = self.replicas[i]
            state.failed += 1
            self._count_failure(state, f"request {reason} with no answer")

    # ------------------------------------------------------------------ health

    def replica_failed(self, state: ReplicaState, reason: str) -> None:
        """A probe failed on this replica: count it on its circuit breaker."""
        self._count_failure(state, reason)

    def _count_failure(self, state: ReplicaState, reason: str) -> None:
        """A failure seen outside a request's own attempt (a probe, a timeout): when it opens
        the circuit, the replica takes no new work and what it has not begun answering moves
        elsewhere."""
        if self._breaker_opens(state, reason):
            self._hold(state, Hold.CIRCUIT_OPEN)
            self._move_unanswered(state, f"circuit open: {reason}")

    def _breaker_opens(self, state: ReplicaState, reason: str) -> bool:
        """Count a failure; True when it opened the replica's circuit. The last replica in
        service of a model keeps it closed, however it fails: without it the model has none."""
        kept_for = self._sole_server(state)
        breaker = state.breaker
        name = state.replica.name
        if breaker.failure(self.clock.now(), reason, may_open=kept_for is None):
            if state.removed:
                return False
            log.warning("replica %s: circuit open (%s)", name, reason)
            return True
        if kept_for is not None and breaker.failures == breaker.threshold:
            log.warning(
                "replica %s: %d failures in a row (%s); kept in service: the last replica "
                "serving %r",
                name,
                breaker.failures,
                reason,
                kept_for,
            )
        return False

    def probe_ok(self, state: ReplicaState) -> None:
        """A health probe answered: an open circuit whose cooldown has passed half-opens (the
        replica takes requests again; the first one's outcome closes or reopens it)."""
        if state.breaker.probe_ok(self.clock.now()):
            log.info("replica %s: circuit half-open, on trial", state.replica.name)
            self._release(state, Hold.CIRCUIT_OPEN)

    def _check_gray(self) -> None:
        if self.slo_policy is not None:
            # A per-request speed falls with the requests a replica runs at once, and under
            # strategy slo replicas alike run very different batches (a replica just started
            # takes the backlog): of three autoscaled vLLM replicas two in turn had nothing in
            # flight for some 30 s (the cooldown) while the other two sank under their share.
            # The engine fit judges a replica's replies against the load it carries instead
            # (it is distrusted).
            return
        speeds = self.learned_speeds().tolist()
        # Peers: replicas in service declared alike (the same GPU and speed). One known by its
        # URL alone has no class to fall short of, and one out of service (dead, drained) no
        # speed that says anything of the others now.
        classes = [
            (s.replica.device_model, s.replica.speed)
            if s.replica.speed and self._in_service(s)
            else None
            for s in self.replicas
        ]
        done = [s.completed - s.judged_from for s in self.replicas]
        options = self.options
        for i, fraction in gray_replicas(
            speeds, classes, done, options.gray_ratio, options.gray_min_done
        ):
            state = self.replicas[i]
            if self._sole_server(state) is not None:
                continue  # the last replica of a model serves, however slowly
            state.gray_since = since = self.clock.now()
            log.warning(
                "replica %s: gray failure, %.2fx the median speed of the replicas declared "
                "like it; out of service for %g s, then on trial",
                state.replica.name,
                fraction,
                options.gray_cooldown,
            )
            self._hold(state, Hold.GRAY)
            loop = asyncio.get_running_loop()
            loop.call_later(options.gray_cooldown, self._gray_over, state, since)

    def _gray_over(self, state: ReplicaState, since: float) -> None:
        """The gray replica's time out of service is over: it takes work again."""
        if state.gray and state.gray_since == since:
            log.info(
                "replica %s: back in service after its gray failure; judged again after %d replies",
                state.replica.name,
                self.options.gray_min_done,
            )
            self._end_gray(state)

    def _end_gray(self, state: ReplicaState) -> None:
        # Judged again only on replies from now on: its learned speed catches up meanwhile.
        state.judged_from = state.completed
        self._release(state, Hold.GRAY)

    # ------------------------------------------------------------------ membership

    def add(self, replica: Replica) -> ReplicaState:
        """A replica joins at run time."""
        if replica.name in self.by_name and not self.by_name[replica.name].removed:
            raise DuplicateMember([("name", f"replica {replica.name!r} is already in the fleet")])
        existing = same_engine(replica.url, (s.replica for s in self.replicas if not s.removed))
        if existing is not None:
            # A second replica at one address counts one engine twice: twice its share of
            # requests, each replica learning half its speed.
            raise DuplicateMember(
                [
                    (
                        "url",
                        f"{replica.url} is already in the fleet as replica {existing.name!r} "
                        f"({existing.url}); one engine is one replica (remove it first to add "
                        "it again with other fields)",
                    )
                ]
            )
        capacity = ConcurrencyLimit(self.options.capacity, replica.slots)
        old = self.by_name.get(replica.name)
        slots = self._slots_of(replica, capacity)
        self.apply(self.dispatcher.add_device(replica.device(slots), slots))
        if old is not None:  # joined again under its name: the dispatcher kept its position
            old.replica = replica  # add_device released every hold
            old.breaker = self._breaker()
            old.judged_from = old.completed
            old.capacity = capacity
            old.engine, old.load, old.load_error = "unknown", None, "not read yet"
            state = old
            self._sync_slots(state)
        else:
            i = len(self.replicas)
            holds = self.dispatcher.live_holds(i)
            state = ReplicaState(replica, i, self._breaker(), capacity, holds=holds)
            self.replicas.append(state)
            self.by_name[replica.name] = state
        if self.slo_policy is not None:
            self.slo_policy.set_prior(state.index, replica.engine_prior())
            if old is not None:
                self.slo_policy.forget(state.index)
        self._model_masks.clear()
        return state

    def state_of(self, name: str) -> ReplicaState:
        state = self.by_name.get(name)
        if state is None or state.removed:
            names = ", ".join(s.replica.name for s in self.replicas if not s.removed)
            raise UnknownMember([("replica", f"unknown replica {name!r}; replicas: {names}")])
        return state

    def drain(self, name: str) -> None:
        self._hold(self.state_of(name), Hold.DRAINING)

    def undrain(self, name: str) -> None:
        state = self.state_of(name)
        if state.gray:
            self._end_gray(state)
        self._release(state, Hold.DRAINING)

    def remove(self, name: str) -> None:
        state = self.state_of(name)
        self.apply(self.dispatcher.remove_device(name, "replica removed"))
        if self.prefix_policy is not None:
            self.prefix_policy.forget(state.index)  # it comes back, if ever, with a cold cache
        self._model_masks.clear()

    def set_models(self, state: ReplicaState, models: set[str]) -> None:
        """What a replica serves, as learned from its ``/v1/models``."""
        state.models_read = True
        if models != state.replica.models:
            state.replica.models = models
            self._model_masks.clear()

    # ------------------------------------------------------------------ reporting

    def status(self, full: bool = True) -> dict[str, Any]:
        """What ``GET /status`` shows: the router's queue and each replica's state (``full``:
        with what only the admin key may see)."""
        return router_status(self, full)

    def load_stale(self, state: ReplicaState, now: float) -> str:
        """Why the replica's load is unknown now ("" if it is known)."""
        if state.load_error:
            return state.load_error
        age = now - state.load_at
        if age > self.load_stale_after:
            return f"last read {age:.1f} s ago"
        return ""

    def any_up(self) -> bool:
        """Whether some replica (not removed) is in state "up", as ``status()`` words it."""
        return any(state_word(self, s) == "up" for s in self.replicas if not s.removed)

    def learned_speeds(self) -> np.ndarray:
        """Per-request speed of each replica as learned (relative, like the declared one)."""
        slots = self.dispatcher.view.slots
        return self.perf.speed() / slots / self.options.unit_rate
