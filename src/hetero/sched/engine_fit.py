"""A continuous-batching engine's latencies, learned online per replica: what the router predicts.

An engine such as vLLM or SGLang has no slot count. What it does to a request is set by two
quantities, and those are what differ between an H100 and a T4:

- **time to first token**: the prefill work ahead of the request (prompt tokens not in its
  prefix cache, of requests sent there and not yet answering) plus its own, over the engine's
  prefill rate, plus the decode steps it shares those steps with::

      TTFT = ttft_base + prefill_s · (queued + own uncached tokens) + ttft_per_running · running

- **time per output token**: the engine's step time, which grows with the running batch and
  the KV tokens it holds, stretched by the prompts the engine prefills meanwhile (a continuous
  batcher runs them in the same steps: with long prompts arriving, prefill takes a large share
  of its time, and every running decode waits through it)::

      step = step_base + step_per_request · running + step_per_kv · KV tokens (thousands)
      TPOT = step + step_per_prefill · prompt tokens prefilled a second (thousands)

  learned in that form from each decode (the prompt tokens its replica prefilled while it ran,
  over its duration) and predicted in it with the prompt tokens sent to the replica a second
  lately. First order in the prefill's share of the engine's time (``step / (1 − u)`` is the
  exact form): a prefill chunk rides partly free in a step bound by memory, and on a simulated
  fleet near saturation the exact form over-predicted the fast replica's TPOT
  (``bench/bench_slo_sim.py``). The prefill enters as a term of its own, not as a factor of the
  step: the prompt tokens a decode shares its steps with are a rate that holds for tens of
  seconds, so a fit may take much of the step for the prefill's term; predicted with the same
  rate the sum stays right, where a factor of the step collapsed with it (on real vLLM a fit
  with a step of 0.05 ms predicted the fast replica at 0.1 ms a token where it took 20 ms).

These are the emulator's equations (``hetero.serve.engine_model.StepCost``: a step costs an
overhead, a share per request, the weights and the KV cache read at the memory bandwidth, the
tokens computed at the TFLOPS), linearised: ``StepCost.prior`` gives their coefficients for a
model on a catalog device, and ``EnginePrior.generic`` a guess for a replica known by its URL
alone. Each reply then corrects them: its TTFT with the prefill queue and batch it met on
arrival, its TPOT with the mean batch and KV tokens over its decode (``EngineLoad`` integrates
both over time). The fit is least squares over the last replies, started at the prior, its
coefficients never below zero, so a replica that changes speed is followed within some tens of
replies.

Predictions are the fit's means. They are not made pessimistic by the fit's uncertainty: the
spread of a batch size never seen stays at the prior's, so a replica judged by one deviation
more is never sent the larger batch that would teach it (on real vLLM the router held dozens of
requests while its fastest replica ran one). Each reply's measured value is compared with what
was predicted for it instead; a replica whose replies keep contradicting the model (a median
error over 3×) is *distrusted*: its predictions while it runs something are widened by its
observed error until it agrees again. Short of that, the median of measured over predicted,
where the model predicts too fast, corrects the predictions (``stretch``: the ``slo`` policy
applies it while the replica's replies miss their SLO).

Pure: no I/O, no clock of its own (times are passed in), nothing that can overflow or divide by
zero on hostile numbers: every observation is checked finite and within bounds, and refused
otherwise.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import numpy.typing as npt

KERNEL: ModuleType | None
try:  # an update's arithmetic in C (_kernel.c); without it, _step does the same in Python
    from hetero.sched import _kernel as KERNEL
except ImportError:  # pragma: no cover - installed where no C compiler was found
    KERNEL = None

__all__ = ["EngineFit", "EngineLoad", "EnginePrior", "Flight", "LinearFit", "token_feature"]

FloatArray = npt.NDArray[np.float64]

#: Seconds beyond which a measured TTFT or TPOT is not believed (a broken clock, a hostile reply).
MAX_SECONDS = 3600.0
#: Tokens beyond which a count is not believed (no engine holds a billion tokens at once).
MAX_TOKENS = 1e9
#: The least a prediction can be (seconds).
FLOOR = 1e-4
#: Seconds a token below which a decode's chunks came in a burst, not at the engine's pace (no
#: engine decodes a request at 5,000 tokens a second). On real vLLM with the machine's cores
#: all busy, a streaming server falls behind and sends a whole reply at once; read as a pace,
#: such replies (0.03 to 0.2 ms a token) fitted the fast replica's step at nothing, its
#: predictions then missed its replies threefold and it was distrusted.
BURST_PACE = 2e-4
# Seconds over which the prompt tokens sent to a replica are averaged into a rate.
PREFILL_RATE_SECONDS = 10.0
# Replies whose error is remembered, per replica and measure.
_ERRORS = 64
# The median |log(measured / predicted)| above which a replica is distrusted: 3x off.
_DISTRUST = math.log(3.0)
# Replies needed before a replica can be judged.
_JUDGE_AFTER = 8


@dataclass(frozen=True, slots=True)
class EnginePrior:
    """Starting coefficients (seconds) and how unsure of them the fit starts: each ``*_sd`` is
    one standard deviation of the coefficient. ``kv_tokens``: the KV cache size, where known;
    ``guess``: the prior of a replica known by its URL alone (``generic``)."""

    ttft_base: float
    prefill_s: float  # seconds per uncached prompt token
    ttft_per_running: float
    step_base: float
    step_per_request: float
    step_per_kv: float  # seconds per thousand KV tokens read per step
    ttft_sd: tuple[float, float, float]
    tpot_sd: tuple[float, float, float]
    kv_tokens: int | None = None
    guess: bool = False  # a guess at a replica known by its URL alone, not a model of it

    @classmethod
    def generic(cls, speed: float | None = None) -> EnginePrior:
        """A replica known by its URL alone: about a 7B model on a V100 (50 output tokens/s
        alone, 2,000 prompt tokens/s), divided by its relative ``speed`` where declared, and
        unsure by as much as the guess itself, so its first replies decide."""
        s = speed if speed is not None and 0 < speed < math.inf else 1.0
        base = (0.05 / s, 5e-4 / s, 0.005 / s)
        step = (0.02 / s, 0.001 / s, 0.0005 / s)
        return cls(
            *base,
            *step,
            ttft_sd=(base[0] * 2, base[1] * 2, base[2] * 4),
            tpot_sd=(step[0] * 2, step[1] * 4, step[2] * 4),
            guess=True,
        )

    def scaled(self, ttft_by: float, tpot_by: float) -> EnginePrior:
        """This prior with its TTFT coefficients (and their spreads) times ``ttft_by`` and its
        step's times ``tpot_by``: a guess brought to what one measured request took. Factors
        outside [1e-3, 1e3] are taken at those bounds."""
        a, b = (min(1e3, max(1e-3, f)) for f in (ttft_by, tpot_by))
        return EnginePrior(
            self.ttft_base * a,
            self.prefill_s * a,
            self.ttft_per_running * a,
            self.step_base * b,
            self.step_per_request * b,
            self.step_per_kv * b,
            ttft_sd=(self.ttft_sd[0] * a, self.ttft_sd[1] * a, self.ttft_sd[2] * a),
            tpot_sd=(self.tpot_sd[0] * b, self.tpot_sd[1] * b, self.tpot_sd[2] * b),
            kv_tokens=self.kv_tokens,
            guess=self.guess,
        )


class LinearFit:
    """``y ≈ θ·x`` with no coefficient below zero, by weighted least squares over the last
    ``window`` replies, started at ``prior`` with standard deviations ``sd`` (the prior stays
    as one pseudo-reply: a direction the replies never excite keeps the prior's value). Each
    reply is weighed by its size (noise ``noise`` × the measured or the predicted value, the
    larger), so a 10 ms step and a 2 s prefill count alike; a replica that changes speed is
    followed once the window has turned over.

    Bounded because a step time cannot fall with the batch, nor a prefill cost less than
    nothing: unbounded, a throttled vLLM replica's noisy replies at batches of 5 to 15 fitted
    a falling base, predicted it alone at 0.1 ms a token where it took 100 ms and drew requests
    to it. A recursive fit whose iterate is projected onto the bound drifts correlated
    coefficients apart; this one solves the windowed problem exactly after each reply (with
    three or four coefficients, its bounded solution is found among the supports: at most 15
    solves of at most 4×4, and one where no coefficient falls below zero; tried from the last
    reply's support, which rarely changes, usually one). In plain floats, not numpy (its call
    overhead on 4×4 sums and solves was most of an update's cost), and in C where the kernel
    is built (``_kernel.fit_step``, the same operations in the same order as ``_step``): in
    Python the sums and the supports' solves were most of the ``slo`` strategy's cost a
    request (``bench/bench_slo_cost.py``)."""

    __slots__ = (
        "_a",
        "_b",
        "_prior_a",
        "_prior_b",
        "_replies",
        "_support",
        "coef",
        "noise",
        "updates",
    )

    def __init__(self, prior: tuple[float, ...], sd: tuple[float, ...], window: int = 48) -> None:
        start = np.maximum(np.array(prior, dtype=np.float64), 0.0)
        # The coefficients as plain floats: what every prediction and update reads (numpy's
        # call overhead on 3 or 4 numbers was most of their cost); ``theta`` is their array.
        self.coef: tuple[float, ...] = tuple(start.tolist())
        self._prior_a = np.diag(1.0 / np.square(np.array(sd, dtype=np.float64)))
        self._prior_b = self._prior_a @ start
        # The window's replies (features, measured, weight) and their sums, kept as they come
        # and go (and summed afresh each time the window turns over, against drift).
        self._replies: deque[tuple[list[float], float, float]] = deque(maxlen=window)
        self._a: list[list[float]] = self._prior_a.tolist()
        self._b: list[float] = self._prior_b.tolist()
        self._support: tuple[int, ...] | None = None  # the last solution's nonzero coefficients
        self.noise = 0.15
        self.updates = 0

    @property
    def theta(self) -> FloatArray:
        """The coefficients as an array (for reading: ``coef`` is the state)."""
        return np.array(self.coef)

    def predict(self, x: Sequence[float]) -> float:
        """The mean at features ``x`` (at least ``FLOOR``)."""
        return max(FLOOR, float(sum(map(operator.mul, self.coef, x))))

    def update(self, x: Sequence[float], y: float) -> None:
        # Weighed by the larger of the measured and the predicted value: a reply far below the
        # fit (a burst of tokens the server had held back) must not pull it with the weight of
        # a tiny, exact-looking measurement.
        v = [float(f) for f in x]
        if len(v) != len(self.coef):
            raise ValueError(f"{len(self.coef)} features expected, got {len(v)}")
        predicted = sum(map(operator.mul, self.coef, v))
        w = 1.0 / (self.noise * max(y, predicted, FLOOR)) ** 2
        replies = self._replies
        if len(replies) == replies.maxlen and self.updates % len(replies):
            # The oldest reply out and this one in
            stepped = _STEP(self._a, self._b, (v, y, w), replies[0], self._support)
        else:  # summed afresh: at the start and once a window
            xs = np.array([r[0] for r in replies] + [v])
            ws = np.array([r[2] for r in replies] + [w])
            ys = np.array([r[1] for r in replies] + [y])
            if len(replies) == replies.maxlen:
                xs, ws, ys = xs[1:], ws[1:], ys[1:]
            a = ((xs.T * ws) @ xs + self._prior_a).tolist()
            b = ((xs.T * ws) @ ys + self._prior_b).tolist()
            stepped = _STEP(a, b, None, None, self._support)
        if stepped is None:
            return  # numerically lost (never seen): keep the last good state
        self._a, self._b, theta, self._support = stepped
        replies.append((v, y, w))
        self.coef = tuple(theta)
        self.updates += 1


Reply = tuple[list[float], float, float]


def _step(
    a: list[list[float]],
    b: list[float],
    add: Reply | None,
    drop: Reply | None,
    first: tuple[int, ...] | None,
) -> tuple[list[list[float]], list[float], list[float], tuple[int, ...]] | None:
    """``LinearFit``'s normal equations with the reply ``add`` in and ``drop`` out (both or
    neither), and their least-squares coefficients with none below zero (``_nonnegative``,
    tried from ``first``); None when the numbers are lost. The C kernel's ``fit_step`` does the
    same arithmetic in the same order, where it is built."""
    if add is not None and drop is not None:
        (v, y, w), (v0, y0, w0) = add, drop
        new_a = []
        for row, p0, p in zip(a, v0, v, strict=True):
            c0, c = w0 * p0, w * p
            new_a.append([m - c0 * q0 + c * q for m, q0, q in zip(row, v0, v, strict=True)])
        a = new_a
        b = [m - w0 * y0 * p0 + w * y * p for m, p0, p in zip(b, v0, v, strict=True)]
    solved = _nonnegative(a, b, first)
    return None if solved is None else (a, b, *solved)


def _nonnegative(
    m: list[list[float]], v: list[float], first: tuple[int, ...] | None = None
) -> tuple[list[float], tuple[int, ...]] | None:
    """``argmin θᵀmθ − 2vᵀθ`` over ``θ ≥ 0`` for a positive definite ``m``, and the support
    it was found on (None when the numbers are lost): the free minimiser on the support where
    it is non-negative and the objective's gradient off the support is not negative (its KKT
    conditions, which only the one minimiser meets), supports tried from ``first`` (the last
    update's: it rarely changes), then largest first. In plain floats: numpy's per-call
    overhead on 4×4 systems was most of the router's cost per reply."""
    n = len(v)
    tolerance = 1e-9 * (max(map(abs, v)) + 1.0)
    supports = _SUPPORTS[n] if first is None else _AFTER[n][first]
    for support in supports:
        part = _solve(m, v, support)
        if part is None or min(part) < 0:
            continue
        if len(support) == n:  # no coefficient held at zero: nothing more to check
            theta = part
        else:
            theta = [0.0] * n
            for k, value in zip(support, part, strict=True):
                theta[k] = value
        if len(support) == n or all(
            sum(m[k][j] * theta[j] for j in support) - v[k] >= -tolerance
            for k in range(n)
            if k not in support
        ):
            if max(theta) > MAX_SECONDS:
                return None
            return theta, support
    finite = all(math.isfinite(x) for row in m for x in row) and all(map(math.isfinite, v))
    return ([0.0] * n, ()) if finite else None


# Supports of up to four coefficients, largest first; and in the order tried after each: that
# one first, then the others.
_SUPPORTS = {
    n: [c for size in range(n, 0, -1) for c in itertools.combinations(range(n), size)]
    for n in (1, 2, 3, 4)
}
_AFTER = {
    n: {(): supports} | {first: [first, *(c for c in supports if c != first)] for first in supports}
    for n, supports in _SUPPORTS.items()
}


#: One update's arithmetic: the C kernel's where it is built (``_kernel.fit_step``; a kernel
#: built before it has none), else ``_step``; the two agree bit for bit
#: (tests/sched/test_kernel.py).
_STEP = getattr(KERNEL, "fit_step", _step)


def _solve(m: list[list[float]], v: list[float], idx: tuple[int, ...]) -> list[float] | None:
    """``m[idx, idx] θ = v[idx]`` by Cholesky (the block of a positive definite matrix is
    one; None if it is not, or not finite). Loops written out: sums over generators cost more
    than the arithmetic at this size."""
    n = len(idx)
    low: list[list[float]] = []
    for r in range(n):
        mr = m[idx[r]]
        row = [0.0] * n
        for c in range(r + 1):
            total = mr[idx[c]]
            other = low[c] if c < r else row
            for k in range(c):
                total -= row[k] * other[k]
            if r == c:
                if not total > 1e-300:  # also NaN
                    return None
                row[r] = math.sqrt(total)
            else:
                row[c] = total / other[c]
        low.append(row)
    z = [0.0] * n
    for r in range(n):
        total, row = v[idx[r]], low[r]
        for k in range(r):
            total -= row[k] * z[k]
        z[r] = total / row[r]
    theta = [0.0] * n
    for r in range(n - 1, -1, -1):
        total = z[r]
        for k in range(r + 1, n):
            total -= low[k][r] * theta[k]
        theta[r] = total / low[r][r]
    return theta if all(map(math.isfinite, theta)) else None


@dataclass(slots=True)
class Flight:
    """One request sent to a replica, as the model tracks it."""

    device: int
    uncached: float  # prompt tokens it must prefill there
    kv: float  # KV tokens it holds while it runs (its prompt and half its expected output)
    sent: float
    x_ttft: list[float]  # the TTFT features it met on arrival
    predicted_ttft: float
    predicted_tpot: float
    fitted: tuple[int, int]  # the replies the TTFT and TPOT fits had learned from at its send
    targets: tuple[float, float]  # its TTFT and TPOT targets (seconds), to judge its reply by
    first: float | None = None  # when its first token came
    # EngineLoad's integrals of the running count and the KV tokens, and when they were read
    # (at its first token; until then at its send): the mean batch its decode met is their
    # growth over the time since.
    read_at: float = 0.0
    running_at: float = 0.0
    kv_at: float = 0.0
    prefilled_at: float = 0.0  # EngineLoad.prefilled_total then
    paced: bool = False  # its stream's pace has taught the fit (see SloRouting.progress)


class EngineLoad:
    """What runs on one replica as the router sent it: requests in the engine, prompt tokens
    still to prefill, KV tokens held, and the time integrals of the running count and the KV
    tokens (the mean batch a reply decoded in is their difference over its decode); the prompt
    tokens prefilled so far (those prefilled during a decode are their growth over it) and the
    rate at which prompt tokens are sent (averaged over some seconds)."""

    __slots__ = (
        "at",
        "kv",
        "kv_time",
        "prefill_queue",
        "prefilled_total",
        "running",
        "running_time",
        "sent_tokens",
    )

    def __init__(self) -> None:
        self.running = 0
        self.prefill_queue = 0.0
        self.kv = 0.0
        self.at = 0.0
        self.running_time = 0.0
        self.kv_time = 0.0
        self.prefilled_total = 0.0
        self.sent_tokens = 0.0  # prompt tokens sent, decaying over PREFILL_RATE_SECONDS

    def prefill_rate(self, now: float) -> float:
        """Prompt tokens sent to be prefilled a second, lately."""
        dt = now - self.at
        decay = math.exp(-dt / PREFILL_RATE_SECONDS) if dt > 0 else 1.0
        return self.sent_tokens * decay / PREFILL_RATE_SECONDS

    def advance(self, now: float) -> None:
        dt = now - self.at
        if dt > 0:
            self.running_time += self.running * dt
            self.kv_time += self.kv * dt
            self.sent_tokens *= math.exp(-dt / PREFILL_RATE_SECONDS)
            self.at = now
        elif dt < 0 or not math.isfinite(now):
            self.at = now if math.isfinite(now) else self.at  # a clock set back: start over

    def add(self, now: float, uncached: float, kv: float) -> None:
        self.advance(now)
        self.running += 1
        self.prefill_queue += uncached
        self.kv += kv
        self.sent_tokens += uncached

    def prefilled(self, now: float, uncached: float) -> None:
        self.advance(now)
        self.prefill_queue = max(0.0, self.prefill_queue - uncached)
        self.prefilled_total += uncached

    def remove(self, now: float, kv: float, uncached: float) -> None:
        self.advance(now)
        self.running = max(0, self.running - 1)
        self.kv = max(0.0, self.kv - kv) if self.running else 0.0
        self.prefill_queue = max(0.0, self.prefill_queue - uncached) if self.running else 0.0


class _Errors:
    """The last replies' log-ratios of measured to predicted, the factor predictions are
    widened by while they contradict the model (kept current as replies come, not computed on
    every prediction: the router asks for it per replica per request), and the stretch while
    they are too fast (``stretch``, found when asked for). The ratios are kept in order of
    arrival and, for the quantiles, sorted as they come (sorting them afresh twice a reply was
    most of the cost of judging it)."""

    __slots__ = ("_magnitudes", "_sorted", "factor", "ratios")

    def __init__(self) -> None:
        self.ratios: deque[float] = deque()
        self._sorted: list[float] = []  # the ratios, ascending
        self._magnitudes: list[float] = []  # their absolute values, ascending
        self.factor = 1.0

    def add(self, predicted: float, measured: float) -> None:
        if predicted > 0 and measured > 0:
            ratio = math.log(measured / predicted)
            if len(self.ratios) == _ERRORS:
                old = self.ratios.popleft()
                del self._sorted[bisect.bisect_left(self._sorted, old)]
                del self._magnitudes[bisect.bisect_left(self._magnitudes, abs(old))]
            self.ratios.append(ratio)
            bisect.insort(self._sorted, ratio)
            bisect.insort(self._magnitudes, abs(ratio))
            self.factor = self._widening()

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of |relative error| (0.25: 25% off), None before any reply."""
        if not self.ratios:
            return None
        errors = np.abs(np.expm1(np.array(self.ratios)))
        return float(np.quantile(errors, q))

    def bias(self) -> float | None:
        """The median of measured / predicted (above 1: the model predicts too fast), None
        before any reply."""
        if not self.ratios:
            return None
        return math.exp(_quantile(self._sorted, 0.5))

    def stretch(self) -> float:
        """What a prediction is multiplied by while the replica's replies miss their SLO:
        ``factor`` while distrusted, else the median of measured / predicted where that is
        above 1 (the model predicts too fast), else 1; 1 before ``_JUDGE_AFTER`` replies.
        Found when asked for, not kept current at each reply: a reply's cost is the router's,
        and a replica that meets its SLO is never asked."""
        if self.factor > 1.0 or len(self.ratios) < _JUDGE_AFTER:
            return self.factor
        return max(1.0, self._ratio(0.5))

    def _widening(self) -> float:
        """The 90th percentile of measured / predicted (at least 1) while the replies
        contradict the model, else 1."""
        if len(self.ratios) < _JUDGE_AFTER:
            return 1.0
        if _quantile(self._magnitudes, 0.5) <= _DISTRUST:
            return 1.0
        return max(1.0, self._ratio(0.9))

    def _ratio(self, q: float) -> float:
        """The ``q`` quantile of measured / predicted (of a non-empty window), at most e^20."""
        return math.exp(min(_quantile(self._sorted, q), 20.0))


def _quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of a sorted, non-empty list, interpolated as ``numpy.quantile``."""
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class EngineFit:
    """One replica's engine: its fitted TTFT and TPOT coefficients, its KV capacity, and how
    well its replies bear the fit out."""

    __slots__ = ("answers", "kv_tokens", "prior", "tpot", "tpot_errors", "ttft", "ttft_errors")

    def __init__(self, prior: EnginePrior) -> None:
        self.prior = prior
        self.answers = 0  # requests it answered (a first token, or an unstreamed reply's end)
        self.ttft = LinearFit(
            (prior.ttft_base, prior.prefill_s, prior.ttft_per_running), prior.ttft_sd
        )
        # A thousand prompt tokens prefilled a second take 1000 · prefill_s of each second,
        # and stretch a lone step by that share: the TPOT fit's fourth coefficient starts at
        # the lone step times it, unsure by four times as much.
        per_rate = (prior.step_base + prior.step_per_request) * 1000 * prior.prefill_s
        self.tpot = LinearFit(
            (prior.step_base, prior.step_per_request, prior.step_per_kv, per_rate),
            (*prior.tpot_sd, max(4 * per_rate, FLOOR)),
        )
        self.kv_tokens: int | None = prior.kv_tokens
        self.ttft_errors = _Errors()
        self.tpot_errors = _Errors()

    # --- features ---------------------------------------------------------------------------

    # As plain lists: building a numpy array of three or four numbers costs more than the
    # arithmetic done with them.

    @staticmethod
    def ttft_features(prefill_tokens: float, running: float) -> list[float]:
        return [1.0, token_feature(prefill_tokens), token_feature(running)]

    @staticmethod
    def tpot_features(running: float, kv_tokens: float, prefill_rate: float = 0.0) -> list[float]:
        """A decode's features: its mean batch, the KV tokens it read, and the prompt tokens
        its replica prefilled a second while it ran (0 for the step alone)."""
        return [
            1.0,
            token_feature(running),
            token_feature(kv_tokens) / 1000.0,
            token_feature(prefill_rate) / 1000.0,
        ]

    def predict_ttft(self, prefill_tokens: float, running: float) -> float:
        """``ttft.predict(ttft_features(prefill_tokens, running))``, in plain floats."""
        c = self.ttft.coef
        queued, batch = token_feature(prefill_tokens), token_feature(running)
        return max(FLOOR, c[0] + c[1] * queued + c[2] * batch)

    def predict_step(self, running: float, kv_tokens: float) -> float:
        """``tpot.predict(tpot_features(running, kv_tokens))`` (the step alone, no prefill
        beside it), in plain floats."""
        c = self.tpot.coef
        batch, kv = token_feature(running), token_feature(kv_tokens)
        return max(FLOOR, c[0] + c[1] * batch + c[2] * (kv / 1000.0))

    def predict_tpot(self, running: float, kv_tokens: float, prefill_rate: float) -> float:
        """The TPOT of a decode in a batch of ``running`` holding ``kv_tokens`` while the
        engine is sent ``prefill_rate`` prompt tokens a second to prefill (see the module)."""
        prefill = self.tpot.coef[3] * token_feature(prefill_rate) / 1000
        return self.predict_step(running, kv_tokens) + min(MAX_SECONDS, prefill)

    # --- predictions ------------------------------------------------------------------------

    # Predictions: ``ttft.predict(x)`` and ``tpot.predict(x)``, times ``ttft_errors.factor``
    # and ``tpot_errors.factor`` where they are to be widened while distrusted.

    @property
    def taught(self) -> bool:
        """Whether any reply has taught the fit."""
        return bool(self.ttft.updates or self.tpot.updates)

    @property
    def distrusted(self) -> bool:
        return self.ttft_errors.factor > 1.0 or self.tpot_errors.factor > 1.0

    # --- learning ---------------------------------------------------------------------------

    def observe_ttft(
        self, x: Sequence[float], measured: float, predicted: float, fitted: int | None = None
    ) -> bool:
        """A reply's time to first token at the features it met, ``predicted`` by the fit
        when it had learned from ``fitted`` replies (None: as it stands); False if refused.
        The prediction is judged only if that fit had learned from enough replies: the
        fit's error, not its first guess's (requests sent in a burst before the first reply
        came all carry the prior's guess, and judged they kept a replica distrusted)."""
        if not _seconds(measured):
            return False
        if (self.ttft.updates if fitted is None else fitted) >= _JUDGE_AFTER:
            self.ttft_errors.add(predicted, measured)
        self.ttft.update(x, measured)
        return True

    def observe_tpot(
        self, x: Sequence[float], measured: float, predicted: float, fitted: int | None = None
    ) -> bool:
        """A reply's time per output token, as ``observe_ttft``."""
        if not _seconds(measured):
            return False
        if (self.tpot.updates if fitted is None else fitted) >= _JUDGE_AFTER:
            self.tpot_errors.add(predicted, measured)
        self.tpot.update(x, measured)
        return True

    def set_kv_tokens(self, tokens: int | None) -> None:
        """The engine's KV cache size as it publishes it (ignored when absurd)."""
        if tokens is not None and 0 < tokens <= MAX_TOKENS:
            self.kv_tokens = int(tokens)

    def explain(self) -> dict[str, object]:
        """The fitted coefficients and the prediction errors, as ``/status`` shows them."""
        t, d = self.ttft.theta, self.tpot.theta

        def q(errors: _Errors, p: float) -> float | None:
            return _round(errors.quantile(p))

        return {
            "prefill_tokens_per_s": round(float(1.0 / t[1]), 1) if t[1] > 0 else None,
            "ttft_base_s": round(float(t[0]), 5),
            "ttft_per_running_s": round(float(t[2]), 5),
            "step_base_s": round(float(d[0]), 5),
            "step_per_request_s": round(float(d[1]), 6),
            "step_per_1k_kv_s": round(float(d[2]), 6),
            "step_per_1k_prefilled_per_s": round(float(d[3]), 6),
            "kv_tokens": self.kv_tokens,
            "replies_fitted": {"ttft": self.ttft.updates, "tpot": self.tpot.updates},
            "error_ttft": {"p50": q(self.ttft_errors, 0.5), "p90": q(self.ttft_errors, 0.9)},
            "error_tpot": {"p50": q(self.tpot_errors, 0.5), "p90": q(self.tpot_errors, 0.9)},
            "measured_over_predicted": {
                "ttft": _round(self.ttft_errors.bias()),
                "tpot": _round(self.tpot_errors.bias()),
            },
            "distrusted": self.distrusted,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def token_feature(value: float) -> float:
    """A count as a feature: finite, in [0, MAX_TOKENS]."""
    if not value > 0:  # also NaN
        return 0.0
    return min(float(value), MAX_TOKENS)


def _seconds(value: float) -> bool:
    return isinstance(value, int | float) and 0 < value <= MAX_SECONDS
