"""``slo``: each request to the replica whose engine is predicted to meet its latency target.

Every replica is predicted as the continuous-batching engine it is (``hetero.sched.engine_fit``):
a request's time to first token from the prefill queued there, its own uncached prompt tokens
and the running batch; its time per output token from the step time at the batch it would join
and the KV tokens that batch reads. Prefix-cache affinity is not a separate switch: the prompt
blocks a replica holds (``PrefixAffinity``'s index) shorten its predicted prefill, so a cached
prefix is weighed against speed and queue by the same formula.

The choice, per request, with ``r = predicted / SLO`` for each of TTFT and TPOT:

- among the replicas that meet both (``r ≤ 1``), the one with the most headroom (least
  ``r_ttft + r_tpot`` of the fit's means); a busy replica's predictions are widened while one
  of its last replies missed its SLO: by the 90th percentile of its errors while its replies
  contradict the fit (it is distrusted), else by the median of its measured over predicted
  times where that is above 1 (the fit predicts it too fast: near its limit, the requests it is
  sent while predicted just within the SLO then miss it); an idle one's are not (one request is
  the whole risk there, and it is how a distrusted replica earns trust back), nor those of one
  whose replies keep meeting the SLO, however far from the fit (the SLO is what the widening
  protects);
- else, among those that would meet its TPOT and miss its TTFT by less than ``TTFT_SLACK``
  times, the one with the least TTFT (sending it now is its best chance; further off, a
  replica that finishes something meanwhile is the better bet);
- else, an idle replica whose fit has learned nothing for ``PROBE_AFTER`` seconds (doubling
  with each such try) takes it
  (a fit gone wrong is corrected only by new replies);
- else the request waits in the router for a replica to finish something: sending it would
  slow every request the replica runs. Unless no replica could meet the SLO even idle (then
  waiting gains nothing): then the one that misses by least (``max(r_ttft, r_tpot)``). No
  slot count decides;
- and where a busy replica holds more of the prompt in its prefix cache than the one chosen
  (more than a tenth of the prompt) and would meet the SLO once it frees something, the
  request waits until that replica is the pick, at most a quarter of its TTFT target
  (``CACHE_WAIT_TTFT``): sent on, the prompt is computed again, and a conversation's history
  is left behind on each side.

A replica known by its URL alone starts slow: 1, 2, 4... requests at once as it answers, up to
64; past that, the most it runs grows while its replies meet the SLO and halves (not below 64)
at a reply that misses (``_LIMIT_STEP``): a guard on the predictions, which a replica that
keeps meeting the SLO outgrows.

Without an SLO the targets are derived from the fleet: TTFT 1 s or ten times the best lone
TTFT of the request, whichever is more; TPOT 20 ms or the least step time at which the
replicas together reach 80% of their top decode throughput (``_KNEE``), whichever is more:
for one replica five times its step's fixed part, for a fleet whatever lets its slow replicas
carry their part. The lone times are what is known of each engine before it serves (its
catalog prior, or its prior brought to its timing probe: ``measured``), not the fit that
follows its replies: a target is the user's bound and holds still while the fit moves (on
real vLLM, a TPOT target following the fit's lone step moved between 20 and 70 ms within a
run, and the router held up to 42 requests while it was low). Only a replica known by a
guess and never timed lends its fit to the targets.

Items that carry no ``tokens`` (work that is not an LLM request) are placed as
``prefix_affinity`` places them. The executor reports each request's first token and end
(``first_token``, ``finished``, ``dropped``); the fit learns from them. Pure: times come from
the view's clock and the calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError
from hetero.sched.engine_fit import (
    BURST_PACE,
    FLOOR,
    KERNEL,
    MAX_SECONDS,
    MAX_TOKENS,
    PREFILL_RATE_SECONDS,
    EngineFit,
    EngineLoad,
    EnginePrior,
    Flight,
    FloatArray,
    token_feature,
)
from hetero.sched.item import WorkItem
from hetero.sched.policies.prefix import PrefixAffinity
from hetero.sched.policy import BoolArray
from hetero.sched.prefix import DEFAULT_CAPACITY_BLOCKS
from hetero.sched.registry import register
from hetero.sched.view import FleetView

#: The usual pick in C (``_kernel.slo_pick``); None where the kernel is not built (or was built
#: before it): numpy makes the same pick.
_PICK: Callable[..., tuple[int, float, float] | None] | None = getattr(KERNEL, "slo_pick", None)
#: The targets derived from the fleet (``SloRouting.slo``) in C likewise (``_kernel.slo_targets``):
#: in numpy they were half the cost of a pick with one replica.
_TARGETS: Callable[..., tuple[float, float]] | None = getattr(KERNEL, "slo_targets", None)

__all__ = ["FIRST_PACE_REPORT", "SloRouting", "check_slo"]

# TTFT and TPOT at least these (seconds) when derived from the fleet. TPOT's floor, 50 tokens a
# second, is faster than anyone reads: below it, the steps of a replica that answers in a
# millisecond are the router's own jitter, and a target that tight had it distrust the replica
# and run one request at a time.
_DEFAULT_TTFT = 1.0
_DEFAULT_TPOT = 0.02
#: A derived TTFT target is at least this multiple of the request's best lone TTFT.
_TTFT_MULTIPLE = 10.0
#: A derived TPOT target is the least step time at which the fleet's replicas, each batching as
#: many requests as that step allows, reach this share of their top decode throughput (each
#: replica's step ``a + c·batch``: its throughput at step ``s`` is ``(1 - a/s)/c`` of its top
#: ``1/c``, once ``s`` reaches its lone step). For one replica that is five times its fixed
#: step ``a``: the five lone steps this target was before, where ``a`` is most of a lone step
#: (a GPU's weights read each step). For a fleet it takes the slow replicas in where the fleet
#: needs them to reach that share: five lone steps of the fastest alone kept every replica of
#: the real one-model CPU fleet (speeds 1 : 0.4 : 0.2) at its 20 ms floor, under the slow
#: replicas' own lone steps, and past three quarters of capacity the router held up to 72
#: requests back (its highest rate within a 50 ms TPOT 1.00x the fast replica alone's; 1.20x
#: with this target, 28-32 ms there).
_KNEE = 0.8
#: Least step cost a request (seconds) for a replica to count toward the TPOT target: a step
#: that costs nothing more a request describes no engine (a fit that has learned no slope).
_LEAST_COST = 1e-9
#: Content chunks at which an executor first reports a stream's pace (``progress``), then at
#: twice as many each time: the router's proxy and the simulator alike.
FIRST_PACE_REPORT = 8
#: Seconds after which an idle replica that has taught the fit nothing is tried again with a
#: request that would otherwise wait: a fit gone wrong (a burst at start, a replica restarted
#: faster) is corrected only by new replies. Each such try doubles the wait before the next (up
#: to ``PROBE_MAX``) until the replica is chosen on its merits again: a replica that keeps
#: proving too slow costs a request every few minutes, not every few seconds.
PROBE_AFTER = 30.0
PROBE_MAX = 480.0
#: A replica that would meet a request's TPOT but not its TTFT takes it at once only while its
#: predicted TTFT is within this multiple of the target; further off, the request waits for a
#: replica to finish something. On real vLLM at the fleet's capacity, a replica predicted at
#: 20 s took 60 requests this way while the fast one freed a slot every tenth of a second.
TTFT_SLACK = 2.0
#: Slow start: a replica known by its URL alone runs at most ``2**k`` requests at once while it
#: has answered ``k`` (one before its first answer), up to ``k = _RAMP_MAX``. Until it answers,
#: its predictions are a guess; a burst sent on a guess is a burst of misses (on real vLLM at a
#: cold start, 15 long prompts to a replica five times slower than guessed). An answer is a
#: first token, or the end of a reply that was not streamed: counted by the fit's updates, a
#: replica sent only unstreamed requests (which teach no TTFT) ran one at a time for good.
_RAMP_MAX = 6
#: Past the slow start the most a replica runs at once is learned from its replies: each reply
#: that meets its SLO while the replica is full adds ``_LIMIT_STEP / limit`` (``_LIMIT_STEP`` a
#: round of ``limit`` replies, first tokens and ends both counted), each miss takes it down to
#: ``_LIMIT_CUT`` of itself, never below the slow start's end (``2**_RAMP_MAX``). The
#: predictions decide first; the limit keeps them from running a replica past where its replies
#: start to miss. Held at 64 for good, the fast replica of real vLLM CPU engines past the
#: fleet's capacity ran 64 requests at 0.8 of its core, its replies meeting the SLO, while up
#: to 105 requests waited in the router; with no limit at all, a simulated H100 was sent
#: requests while its predicted TPOT was just within the target, ran 110 at once, and three in
#: four of its replies missed (``bench/bench_slo_sim.py`` at 24/s: 26% within the SLO against
#: 77%).
_LIMIT_FLOOR = float(1 << _RAMP_MAX)
_LIMIT_STEP = 8.0
_LIMIT_CUT = 0.5
#: Replies (a first token, a reply's end) whose outcome against their SLO is remembered per
#: replica: a distrusted replica's predictions are widened only while one of them missed. On
#: real vLLM a replica slowed threefold for some seconds (its CPU shared with engines woken
#: beside it) was distrusted, its predictions widened by the 90th percentile of its errors
#: (14x), and the router held up to 28 requests while it ran one, though every reply it gave
#: met the SLO.
_OUTCOMES = 8
#: A request whose prompt a busy replica holds in its prefix cache waits for that replica, at
#: most this share of its TTFT target, rather than go where more than ``CACHE_WAIT_PROMPT`` of
#: its prompt would be computed again, as long as the holder would meet its SLO once it frees
#: something. A conversation's turn spilled to a slower replica took its history there and
#: came back without the turn: both engines computed again what one held (simulated on the real
#: multi-turn runs, 93 of 344 continuing turns changed replica). A turn that shares only what
#: every replica holds (a system prompt) still goes at once, so the slow replicas take new
#: conversations rather than the middle of old ones.
CACHE_WAIT_TTFT = 0.25
CACHE_WAIT_PROMPT = 0.1
_CACHE_WAITS = 65536  # requests remembered as held so, at most
_OUTCOME_MASK = (1 << _OUTCOMES) - 1

#: A replica's lone times for the derived targets (``SloRouting.reference``).
_Reference = tuple[float, float, float, float, float]


def check_slo(name: str, value: float | None) -> list[tuple[str, str]]:
    """Problems with an SLO bound ``name`` (seconds, or None: derived from the fleet)."""
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        return [(name, f"must be a number of seconds in (0, 3600], got {value!r}")]
    return []


@register
class SloRouting(PrefixAffinity):
    """Places each request where its predicted TTFT and TPOT meet the SLO with the most
    headroom (see the module's docstring)."""

    name = "slo"
    places_by_delay = True

    def __init__(
        self,
        *,
        ttft: float | None = None,
        tpot: float | None = None,
        block_tokens: float = 128.0,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        sessions: int = 65536,
    ) -> None:
        problems = check_slo("ttft", ttft) + check_slo("tpot", tpot)
        if not (isinstance(block_tokens, int | float) and 0 < block_tokens < 1e6):
            problems.append(("block_tokens", f"must be a number > 0, got {block_tokens!r}"))
        if problems:
            raise ConfigError(problems)
        super().__init__(capacity_blocks=capacity_blocks, sessions=sessions)
        self.ttft_slo = ttft
        self.tpot_slo = tpot
        self.block_tokens = float(block_tokens)
        self.fits: list[EngineFit] = []
        self.loads: list[EngineLoad] = []
        self.heard: list[float] = []  # per device, when a reply last taught its fit
        self._probe_wait: list[float] = []  # per device, how long idle before it is tried
        self.missed: list[int] = []  # per device, its last _OUTCOMES replies: a bit set a miss
        self.limit: list[float] = []  # per device, the most it runs past its slow start
        self._priors: dict[int, EnginePrior] = {}
        # Per device, the lone times its prior gives the derived targets where that prior
        # describes its engine (a catalog prior, or a guess brought to its timing probe).
        self._references: dict[int, _Reference] = {}
        self._lenders = False  # whether a bound device has no reference: it lends its fit
        self._flights: dict[int | str, Flight] = {}
        self._table = _Table(0)
        self._stale: set[int] = set()  # devices whose columns wait for a copy (_columns)
        self._cache_waits: dict[int | str, float] = {}  # request -> when first held for a cache

    # --- the fleet --------------------------------------------------------------------------

    def set_prior(self, device: int, prior: EnginePrior) -> None:
        """What is known of device ``device``'s engine before it answers (the catalog's
        figures for its GPU and model, or a declared speed); used when it joins, and at once
        when it has not answered yet."""
        self._set_prior(device, prior, timed=False)

    def _set_prior(self, device: int, prior: EnginePrior, *, timed: bool) -> None:
        self._priors[device] = prior
        if timed or not prior.guess:
            self._references[device] = _lone_times(
                (prior.ttft_base, prior.prefill_s),
                (prior.step_base, prior.step_per_request, prior.step_per_kv),
            )
        else:
            self._references.pop(device, None)
        self._count_lenders()
        if device < len(self.fits):
            if not self.fits[device].taught:
                answers = self.fits[device].answers
                self.fits[device] = EngineFit(prior)
                self.fits[device].answers = answers
            self._mirror(device)
        if device < len(self._table):
            self._table.set_reference(device, *self.reference(device))

    def measured(
        self, device: int, prompt_tokens: float, ttft: float, tpot: float | None, now: float
    ) -> None:
        """Device ``device`` answered one lone request of ``prompt_tokens`` uncached tokens in
        ``ttft`` seconds to its first token, then ``tpot`` seconds a token (None: not
        measured; its step is then scaled as its TTFT). Where its prior is a guess and no
        reply has taught its fit yet, the guess is brought to those times; absurd values
        change nothing."""
        prior = self._priors.get(device, EnginePrior.generic())
        if not (prior.guess and 0 < ttft <= MAX_SECONDS and 0 < prompt_tokens <= MAX_TOKENS):
            return
        lone_ttft = prior.ttft_base + prior.prefill_s * prompt_tokens
        lone_step = prior.step_base + prior.step_per_request
        ttft_by = ttft / lone_ttft
        tpot_by = tpot / lone_step if tpot is not None and 0 < tpot <= MAX_SECONDS else ttft_by
        self._set_prior(device, prior.scaled(ttft_by, tpot_by), timed=True)
        if device < len(self.heard):
            self.heard[device] = now

    def set_kv_tokens(self, device: int, tokens: int | None) -> None:
        """Device ``device``'s KV cache size as its engine publishes it (ignored when absurd)."""
        self.fits[device].set_kv_tokens(tokens)
        self._mirror(device)

    def bind(self, view: FleetView) -> None:
        super().bind(view)
        while len(self.fits) < view.n:
            i = len(self.fits)
            self.fits.append(EngineFit(self._priors.get(i, EnginePrior.generic())))
            self.loads.append(EngineLoad())
            self.heard.append(-math.inf)
            self._probe_wait.append(PROBE_AFTER)
            self.missed.append(0)
            self.limit.append(_LIMIT_FLOOR)
        if len(self._table) < len(self.fits):
            self._table = _Table(len(self.fits))
            for i in range(len(self.fits)):
                self._mirror(i)
                self._table.set_reference(i, *self.reference(i))
            self._count_lenders()

    def forget(self, device: int) -> None:
        """Device ``device`` left or starts again: a fresh engine, known by its prior."""
        super().forget(device)
        self.fits[device] = EngineFit(self._priors.get(device, EnginePrior.generic()))
        self.heard[device] = -math.inf
        self._probe_wait[device] = PROBE_AFTER
        self.missed[device] = 0
        self.limit[device] = _LIMIT_FLOOR
        self._mirror(device)

    # --- placement --------------------------------------------------------------------------

    def slo(self, prompt: float, output: float) -> tuple[float, float]:
        """The TTFT and TPOT targets (seconds) for a request of that size: the given ones,
        else derived from the fleet's best lone times as first known (``reference``)."""
        ttft, tpot = self.ttft_slo, self.tpot_slo
        if ttft is not None and tpot is not None:
            return ttft, tpot
        t, k = self._columns(), len(self.fits)
        features = (token_feature(prompt), token_feature(prompt + output / 2))
        if _TARGETS is not None:
            best_ttft, knee = _TARGETS(
                t.ref_ttft,
                t.ref_per_token,
                t.ref_base,
                t.ref_per_request,
                t.ref_per_kv,
                t.ref_order,
                k,
                *features,
                _KNEE,
            )
        else:
            lone_ttft = t.ref_ttft[:k] + t.ref_per_token[:k] * features[0]
            best_ttft = max(FLOOR, min(MAX_SECONDS, float(lone_ttft.min(initial=MAX_SECONDS))))
            knee = _knee_step(t.ref_base[:k], t.ref_per_request[:k], t.ref_per_kv[:k], features[1])
        if ttft is None:
            ttft = max(_DEFAULT_TTFT, _TTFT_MULTIPLE * best_ttft)
        if tpot is None:
            tpot = max(_DEFAULT_TPOT, knee)
        return ttft, tpot

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        tokens = item.tokens
        if tokens is None:
            return super().pick(item, view, allowed)
        if len(self.fits) < view.n:
            self.bind(view)
        now = view.clock.now()
        self.dropped(item.id, now)  # a retry: its last attempt no longer runs anywhere
        prompt = float(max(1, tokens.prompt))
        output = max(1.0, float(tokens.output))
        prefix = item.prefix
        matched = self._matched(prefix) if prefix is not None and prefix.blocks else None
        usable = view.usable if allowed is None else allowed
        ttft_slo, tpot_slo = self.slo(prompt, output)
        kv_new = prompt + output / 2
        n = view.n
        uncached: FloatArray | float = prompt
        if matched is not None:
            held = matched[:n]
            uncached = np.where(
                held > 0, np.maximum(1.0, prompt - held * self.block_tokens), prompt
            )
        t = self._columns()  # a column per replica of the view (bind, above)
        decay = np.minimum(1.0, np.exp((t.at - now) / PREFILL_RATE_SECONDS))
        need = kv_new + output / 2
        # The usual case, some replica meeting the SLO, in one pass of the C kernel where it is
        # built; the rest (and all of it without the kernel) in numpy, alike to the last bit.
        picked = (
            None
            if _PICK is None
            else _PICK(
                t.ttft_base,
                t.per_token,
                t.step_base,
                t.per_kv,
                t.prefill,
                decay,
                t.ttft_gate,
                t.tpot_gate,
                t.kv_room,
                usable,
                uncached,
                ttft_slo,
                tpot_slo,
                token_feature(kv_new),
                need,
            )
        )
        if picked is not None:
            self._probe_wait[picked[0]] = PROBE_AFTER
        else:
            slo = (ttft_slo, tpot_slo)
            picked = self._pick_numpy(t, usable, uncached, kv_new, need, decay, now, slo)
            if picked is None:
                return None
        i, ttft_i, tpot_i = picked
        if matched is not None and self._waits_for_cache(
            item.id, i, matched[:n], uncached, t, usable, prompt, kv_new, (ttft_slo, tpot_slo), now
        ):
            return None
        self._cache_waits.pop(item.id, None)
        if prefix is not None and prefix.blocks and matched is not None:
            self._placed(i, prefix, matched)
        own_tokens = uncached if isinstance(uncached, float) else float(uncached[i])
        self._send(item.id, i, now, own_tokens, kv_new, (ttft_i, tpot_i), (ttft_slo, tpot_slo))
        return i

    def _waits_for_cache(
        self,
        item_id: int | str,
        i: int,
        held: npt.NDArray[np.int64],
        uncached: FloatArray | float,
        t: _Table,
        usable: BoolArray,
        prompt: float,
        kv_new: float,
        slo: tuple[float, float],
        now: float,
    ) -> bool:
        """Whether the request, picked for device ``i``, waits instead for the busy replica
        holding more of its prompt (``CACHE_WAIT_TTFT``); ``held`` is each device's leading
        blocks of the prompt, ``uncached`` its tokens left to prefill there. Its wait counts
        from the first time it was held so."""
        mine = held[i]
        if held.max() <= mine:  # the usual case: it goes where most of it is held
            return False
        h = int(np.where(usable, held, -1).argmax())
        extra = float(held[h] - mine) * self.block_tokens
        if extra <= CACHE_WAIT_PROMPT * prompt or t.running[h] <= 0:
            return False
        left = uncached if isinstance(uncached, float) else float(uncached[h])
        own = t.per_token[h] * min(left, MAX_TOKENS)
        if not _meets_alone(t, h, own, t.per_kv[h] * token_feature(kv_new), slo):
            return False  # the holder would miss even once it frees something
        waits = self._cache_waits
        first = waits.setdefault(item_id, now)
        if now - first >= CACHE_WAIT_TTFT * slo[0]:
            return False
        if len(waits) > _CACHE_WAITS:  # requests held and never placed (cancelled meanwhile)
            del waits[next(iter(waits))]
        return True

    def _pick_numpy(
        self,
        t: _Table,
        usable: BoolArray,
        uncached: FloatArray | float,
        kv_new: float,
        need: float,
        decay: FloatArray,
        now: float,
        slo: tuple[float, float],
    ) -> tuple[int, float, float] | None:
        """``pick``'s choice in numpy: the replica, and its predicted TTFT and TPOT (seconds);
        None to hold the request back."""
        ttft_slo, tpot_slo = slo
        n = len(usable)
        # Every replica's predictions at once (see _Table): the fewest array operations, each
        # costing about a microsecond of numpy's call overhead at any fleet size up to hundreds.
        if isinstance(uncached, float):
            own = min(uncached, MAX_TOKENS) * t.per_token
        else:
            own = np.minimum(uncached, MAX_TOKENS) * t.per_token
        ttft_s = np.maximum(FLOOR, t.ttft_base + own)  # the model's own, in seconds
        kv_own = t.per_kv * token_feature(kv_new)
        tpot_s = np.maximum(FLOOR, t.step_base + kv_own) + np.minimum(
            MAX_SECONDS, t.prefill * decay
        )
        ttft = ttft_s / ttft_slo
        tpot = tpot_s / tpot_slo
        if t.kv_room.min() < need:
            tpot[t.kv_room < need] *= 10.0  # past its KV cache: it queues
        # Ranked by the plain means, so that a busy replica's widening (which decides whether
        # it meets the SLO at all) does not tilt the choice toward idle slow ones. A replica
        # full (its slow start's or learned limit reached) is not weighed (its gate is infinite).
        headroom = ttft + tpot
        r_ttft = ttft * t.ttft_gate
        r_tpot = tpot * t.tpot_gate
        worst = np.where(usable, np.maximum(r_ttft, r_tpot), np.inf)
        meets = worst <= 1.0
        if meets.any():
            i = int(np.where(meets, headroom, np.inf).argmin())
            self._probe_wait[i] = PROBE_AFTER
        else:
            # Only its TTFT is missed somewhere: sending it now is its best chance. Else wait
            # for a replica to finish something, unless no replica could meet the SLO even
            # idle (then waiting gains nothing).
            only_ttft = usable & (r_tpot <= 1.0) & (r_ttft <= TTFT_SLACK)
            busy = usable & (t.running > 0)
            stale = (
                usable & ~busy & (now - np.array(self.heard[:n]) > np.array(self._probe_wait[:n]))
            )
            if only_ttft.any():
                i = int(np.where(only_ttft, r_ttft, np.inf).argmin())
            elif stale.any():
                i = int(np.where(stale, worst, np.inf).argmin())  # try it again
                self._probe_wait[i] = min(2 * self._probe_wait[i], PROBE_MAX)
            else:
                if busy.any():
                    # Worth waiting if some replica would meet it once idle: a busy one by its
                    # lone predictions, an idle one as it stands, one full at its limit as soon
                    # as its reply comes.
                    lone_ok = _meets_alone(t, slice(None), own, kv_own, slo)
                    idle = np.where(busy, lone_ok, (ttft <= 1.0) & (tpot <= 1.0))
                    if (usable & (t.full | idle)).any():
                        return None
                i = int(worst.argmin())
                if not math.isfinite(worst[i]):
                    return None
        return i, float(ttft_s[i]), float(tpot_s[i])

    def _send(
        self,
        item_id: int | str,
        i: int,
        now: float,
        uncached: float,
        kv: float,
        predicted: tuple[float, float],
        targets: tuple[float, float],
    ) -> None:
        """Books the request on device ``i``, with the pick's own predictions of its TTFT and
        TPOT there (seconds, not widened: what the model's error is of) and its targets."""
        fit, load = self.fits[i], self.loads[i]
        flight = Flight(
            device=i,
            uncached=uncached,
            kv=kv,
            sent=now,
            x_ttft=fit.ttft_features(load.prefill_queue + uncached, load.running),
            predicted_ttft=predicted[0],
            predicted_tpot=predicted[1],
            fitted=(fit.ttft.updates, fit.tpot.updates),
            targets=targets,
        )
        self._flights[item_id] = flight
        load.add(now, uncached, kv)
        self._read(flight, now)  # its decode is taken to start as it is sent, until told
        self._mirror(i)

    # --- what the executor reports ----------------------------------------------------------

    def first_token(self, item_id: int | str, now: float) -> None:
        """The request's first token reached the router: its prefill is done."""
        flight = self._flights.get(item_id)
        if flight is None or flight.first is not None:
            return
        self.loads[flight.device].prefilled(now, flight.uncached)
        flight.first = now
        self.heard[flight.device] = now
        self._read(flight, now)
        fit = self.fits[flight.device]
        fit.answers += 1
        ttft = now - flight.sent
        fit.observe_ttft(flight.x_ttft, ttft, flight.predicted_ttft, flight.fitted[0])
        self._judge(flight.device, ttft > flight.targets[0])
        self._mirror(flight.device)

    def progress(self, item_id: int | str, now: float, tokens: int) -> None:
        """The request's stream has brought ``tokens`` content chunks so far: its decode so far
        teaches the step time, once (a slow replica is known within a few tokens of its first
        request, not at the end of a long reply; later reports would measure the same decode
        again, each at the cost of a fit, and fill the fit's window with a few requests' paces
        where its end teaches the whole decode anyway). A chunk is a token at least: an engine
        whose server falls behind merges several into one, which reads as slower, the safe
        side."""
        flight = self._flights.get(item_id)
        if flight is None or flight.first is None or flight.paced:
            return
        if self._learn_decode(flight, now, flight.first, tokens):
            flight.paced = True
            self._mirror(flight.device)

    def finished(self, item_id: int | str, now: float, output_tokens: int) -> None:
        """The request ended with ``output_tokens``: its whole decode teaches the step time. A
        reply that was not streamed is taken to have begun decoding when the fit predicted its
        first token (never past half its time: the fit may be far off)."""
        flight = self._flights.pop(item_id, None)
        if flight is None:
            return
        start = flight.first
        ttft_slo, tpot_slo = flight.targets
        if start is None:
            start = flight.sent + min(flight.predicted_ttft, (now - flight.sent) / 2)
            self.fits[flight.device].answers += 1
            # Not streamed: its whole time against what the SLO allows a reply of its length.
            self._judge(flight.device, now - flight.sent > ttft_slo + tpot_slo * output_tokens)
        elif output_tokens > 1:
            self._judge(flight.device, (now - start) / (output_tokens - 1) > tpot_slo)
        self._learn_decode(flight, now, start, output_tokens)
        load = self.loads[flight.device]
        if flight.first is None:  # not streamed: its prefill is known done only now
            load.prefilled(now, flight.uncached)
        load.remove(now, flight.kv, 0.0)
        self._mirror(flight.device)

    def _read(self, flight: Flight, now: float) -> None:
        load = self.loads[flight.device]
        load.advance(now)
        flight.read_at, flight.running_at, flight.kv_at = now, load.running_time, load.kv_time
        flight.prefilled_at = load.prefilled_total

    def _learn_decode(self, flight: Flight, now: float, start: float, tokens: int) -> bool:
        """One TPOT observation: the decode from ``start`` to ``tokens``, at the mean batch
        and KV tokens since the integrals were read and with the prompt tokens its replica
        prefilled meanwhile (a second). Always from the start, never the stretch
        since the last report: a server that falls behind sends chunks in bursts, and a burst
        alone would read as a step time of nothing. A decode whose chunks came faster than
        ``BURST_PACE`` a token came in one such burst from its start (its first token held
        back with the rest) and teaches nothing of the step. A reply that was not streamed has
        no chunks to come in a burst (its decode's start is a guess, ``finished``): dropping
        the fast ones left only the slowest to teach the fit (behind an instant replica it then
        under-predicted fourfold, was distrusted, and the router ran one request at a time while
        62 waited). True if it taught the fit."""
        n, span, window = tokens - 1, now - start, now - flight.read_at
        burst = flight.first is not None and span < n * BURST_PACE
        if n < 1 or burst or window <= 0:
            return False
        load = self.loads[flight.device]
        load.advance(now)
        running = (load.running_time - flight.running_at) / window
        kv = (load.kv_time - flight.kv_at) / window
        fit = self.fits[flight.device]
        prefilled = (load.prefilled_total - flight.prefilled_at) / window
        x = fit.tpot_features(running, kv, prefilled)
        taught = fit.observe_tpot(x, span / n, flight.predicted_tpot, flight.fitted[1])
        self.heard[flight.device] = now
        return taught

    def _judge(self, device: int, missed: bool) -> None:
        """One reply's outcome on ``device`` against its SLO (mirrored by the caller), and the
        limit past its slow start learned from it (``_LIMIT_STEP``)."""
        self.missed[device] = ((self.missed[device] << 1) | missed) & _OUTCOME_MASK
        if self.fits[device].answers < _RAMP_MAX:
            return
        limit = self.limit[device]
        if missed:
            self.limit[device] = max(_LIMIT_FLOOR, limit * _LIMIT_CUT)
        elif self.loads[device].running >= limit - 1:  # full: it met the SLO at its limit
            self.limit[device] = limit + _LIMIT_STEP / limit

    def dropped(self, item_id: int | str, now: float) -> None:
        """The request's attempt ended without an answer to learn from (failed, moved,
        cancelled): what it held on its replica is given back."""
        flight = self._flights.pop(item_id, None)
        if flight is not None:
            uncached = 0.0 if flight.first is not None else flight.uncached
            self.loads[flight.device].remove(now, flight.kv, uncached)
            self._mirror(flight.device)

    def _mirror(self, device: int) -> None:
        """Device ``device``'s fit or load changed: its columns are copied before the next pick
        reads them (``_columns``)."""
        self._stale.add(device)

    def _columns(self) -> _Table:
        """The columns a pick reads, with the replicas whose fit or load changed since copied
        in. Once a pick rather than at each change: between two picks a request is sent and
        another's first token, pace and end come, mostly on other replicas, and a copy each
        was a third of the learning's cost a request (``bench/bench_slo_cost.py``)."""
        stale, table = self._stale, self._table
        if stale:
            for device in stale:
                if device < len(table):
                    fit, load = self.fits[device], self.loads[device]
                    table.set(device, fit, load, self.missed[device], self._most(device))
            # The lone times of a replica its prior describes are written as the prior is
            # set; those of one that lends its fit follow the fit, here, while a derived SLO
            # reads them (the SLO is set before routing).
            if self._lenders and (self.ttft_slo is None or self.tpot_slo is None):
                references = self._references
                for device in stale:
                    if device < len(table) and device not in references:
                        table.set_reference(device, *self.reference(device))
            stale.clear()
        return table

    def _count_lenders(self) -> None:
        self._lenders = any(d not in self._references for d in range(len(self.fits)))

    def reference(self, device: int) -> _Reference:
        """Device ``device``'s lone times the derived targets are taken from: its TTFT alone
        and seconds per prompt token, its step's fixed part, seconds per request running and
        per KV token. Its prior's where that describes the engine (a catalog prior, or a guess
        brought to its timing probe), else its fit's as it stands."""
        reference = self._references.get(device)
        if reference is not None:
            return reference
        return _lone_times(self.fits[device].ttft.coef, self.fits[device].tpot.coef)

    def _most(self, device: int) -> float:
        """The most requests device ``device`` runs at once while its prior is a guess: its
        slow start's, then its learned limit."""
        answers = self.fits[device].answers
        return float(1 << answers) if answers < _RAMP_MAX else self.limit[device]

    def in_flight(self) -> int:
        """Requests the model counts as sent and not ended (0 once all have ended)."""
        return len(self._flights)

    def explain(self, device: int, view: FleetView) -> dict[str, object]:
        """Device ``device``'s fitted engine, its load, and its predictions for a typical
        request (the 512-token prompt and 128-token output of a chat turn) as it stands."""
        if len(self.fits) < view.n:
            self.bind(view)
        fit, load = self.fits[device], self.loads[device]
        prompt, output = 512.0, 128.0
        ttft = fit.ttft.predict(fit.ttft_features(load.prefill_queue + prompt, load.running))
        now = view.clock.now()
        tpot = fit.predict_tpot(
            load.running + 1, load.kv + prompt + output / 2, load.prefill_rate(now)
        )
        ttft_slo, tpot_slo = self.slo(prompt, output)
        t = self._columns()
        return {
            **fit.explain(),
            # predictions stretched now: distrusted, busy, and a recent reply missed its SLO
            "widened": bool(
                not t.full[device] and (t.ttft_gate[device] > 1 or t.tpot_gate[device] > 1)
            ),
            "recent_misses": self.missed[device].bit_count(),
            "slow_start_full": bool(t.full[device]),  # not sent more until it answers
            "most_running": round(self._most(device), 1) if fit.prior.guess else None,
            "running": load.running,
            "prefill_queue_tokens": round(load.prefill_queue),
            "kv_tokens_held": round(load.kv),
            "typical_request": {"prompt_tokens": int(prompt), "output_tokens": int(output)},
            "predicted_ttft_s": round(ttft, 4),
            "predicted_tpot_s": round(tpot, 5),
            "slo": {"ttft_s": round(ttft_slo, 4), "tpot_s": round(tpot_slo, 5)},
            # what its lone times lend a derived SLO: its catalog prior, its timing probe, or
            # its fit (a guess never timed); None where the SLO is given
            "slo_from": self._reference_kind(device),
        }

    def _reference_kind(self, device: int) -> str | None:
        if self.ttft_slo is not None and self.tpot_slo is not None:
            return None
        if device not in self._references:
            return "fit"
        return "probe" if self._priors[device].guess else "catalog"


def _lone_times(ttft: Sequence[float], tpot: Sequence[float]) -> _Reference:
    """A replica's lone times from its TTFT and step coefficients (a prior's or a fit's, in
    ``EngineFit``'s order): its TTFT alone and seconds per prompt token, its step's fixed part,
    seconds per request running and per KV token."""
    return ttft[0], ttft[1], tpot[0], tpot[1], tpot[2] / 1000.0


def _knee_step(
    base: FloatArray, per_request: FloatArray, per_kv: FloatArray, kv_feature: float
) -> float:
    """The least step time (seconds) at which the replicas reach ``_KNEE`` of their top
    decode throughput (see ``_KNEE``), for a request whose KV tokens are ``kv_feature``; the
    kernel's ``slo_targets`` to the last bit. Each replica counts from its lone step up, so
    the answer lies where the replicas counted are those with lone steps up to it: for each
    prefix of them in order of lone step, the least step meeting the share with those alone,
    not below the last one's lone step; the least of these."""
    cost = per_request + per_kv * kv_feature
    lone = base + cost
    with np.errstate(all="ignore"):  # inf × 0 among hostile coefficients
        ok = (base >= 0.0) & (cost >= _LEAST_COST) & (lone < MAX_SECONDS)
        if not ok.any():
            return MAX_SECONDS
        order = np.argsort(lone[ok], kind="stable")
        lone, base, cost = lone[ok][order], base[ok][order], cost[ok][order]
        rate = np.cumsum(1.0 / cost)
        fixed = np.cumsum(base / cost)
        spare = rate - _KNEE * rate[-1]
        steps = np.where(spare > 0.0, np.maximum(fixed / spare, lone), np.inf)
    return max(FLOOR, min(MAX_SECONDS, float(steps.min())))


def _meets_alone(
    t: _Table,
    at: int | slice,
    own: FloatArray | float,
    kv_own: FloatArray | float,
    slo: tuple[float, float],
) -> np.bool_ | BoolArray:
    """Whether the replicas ``at`` would meet the SLO alone, with nothing else running: their
    lone TTFT and step plus the request's own prefill (``own``, seconds) and KV reads."""
    ttft = np.maximum(FLOOR, t.lone_ttft[at] + own)
    tpot = np.maximum(FLOOR, t.lone_step[at] + kv_own)
    return (ttft <= slo[0]) & (tpot <= slo[1])


class _Table:
    """Every replica's fit and load as columns, so that a pick predicts them all in a few
    array operations (a loop over the replicas was most of the router's cost per request with
    tens of them). The formulas are ``EngineFit.predict_ttft``, ``predict_tpot`` and
    ``predict_step`` with ``EngineLoad.prefill_rate``; the terms that depend on the replica
    alone (its coefficients times its queue, batch and KV tokens) are summed before the first
    pick after its fit or load changed (``SloRouting._columns``), so a pick adds only the
    request's own terms."""

    def __init__(self, n: int) -> None:
        self.ttft_base = np.zeros(n)  # c0 + c1·queued + c2·running
        self.per_token = np.zeros(n)  # c1: seconds per uncached prompt token
        self.lone_ttft = np.zeros(n)  # c0
        self.step_base = np.zeros(n)  # d0 + d1·(running + 1) + d2·KV held
        self.per_kv = np.zeros(n)  # d2 per KV token
        self.lone_step = np.zeros(n)  # d0 + d1
        self.prefill = np.zeros(n)  # d3 × the prompt tokens sent a second, before decay
        self.at = np.zeros(n)  # when that rate was last decayed (EngineLoad.at)
        # What a ratio to the target is multiplied by before it is judged: the widening where
        # the replica runs something while distrusted and missing the SLO, infinite while it is
        # full (not weighed).
        self.ttft_gate = np.ones(n)
        self.tpot_gate = np.ones(n)
        # It runs all its slow start, or the limit learned past it, allows (_most).
        self.full = np.zeros(n, dtype=bool)
        self.kv_room = np.full(n, np.inf)  # KV tokens left in its cache while busy (inf: unknown)
        self.running = np.zeros(n)
        # The lone times the derived targets are taken from (SloRouting.reference).
        self.ref_ttft = np.zeros(n)
        self.ref_per_token = np.zeros(n)
        self.ref_base = np.zeros(n)
        self.ref_per_request = np.zeros(n)
        self.ref_per_kv = np.zeros(n)
        # The replicas in order of lone step as the kernel's last targets found them (it sorts
        # them again only where a request's size or a reference changed that order).
        self.ref_order = np.arange(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.running)

    def set(self, i: int, fit: EngineFit, load: EngineLoad, missed: int, most: float) -> None:
        """Device ``i``'s columns; ``most``: the requests it may run at once if its prior is
        a guess (``SloRouting._most``)."""
        c, d = fit.ttft.coef, fit.tpot.coef
        running, kv = token_feature(load.running), token_feature(load.kv)
        busy = load.running > 0
        self.ttft_base[i] = c[0] + c[1] * token_feature(load.prefill_queue) + c[2] * running
        self.per_token[i] = c[1]
        self.lone_ttft[i] = c[0]
        self.step_base[i] = d[0] + d[1] * token_feature(load.running + 1) + d[2] * (kv / 1000.0)
        self.per_kv[i] = d[2] / 1000.0
        self.lone_step[i] = d[0] + d[1]
        self.prefill[i] = d[3] * token_feature(load.sent_tokens / PREFILL_RATE_SECONDS) / 1000.0
        self.at[i] = load.at
        full = fit.prior.guess and load.running >= most
        self.full[i] = full
        if full:
            self.ttft_gate[i] = self.tpot_gate[i] = np.inf
        else:
            widen = busy and missed != 0
            self.ttft_gate[i] = fit.ttft_errors.stretch() if widen else 1.0
            self.tpot_gate[i] = fit.tpot_errors.stretch() if widen else 1.0
        self.kv_room[i] = np.inf if fit.kv_tokens is None or not busy else fit.kv_tokens - kv
        self.running[i] = load.running

    def set_reference(
        self, i: int, ttft: float, per_token: float, base: float, per_request: float, per_kv: float
    ) -> None:
        """Device ``i``'s lone times for the derived targets (``SloRouting.reference``)."""
        self.ref_ttft[i], self.ref_per_token[i] = ttft, per_token
        self.ref_base[i], self.ref_per_request[i], self.ref_per_kv[i] = base, per_request, per_kv
