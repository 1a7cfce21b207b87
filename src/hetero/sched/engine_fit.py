"""A continuous-batching engine's latencies, learned online per replica: what the router predicts.

An engine such as vLLM or SGLang has no slot count. What it does to a request is set by two
quantities, and those are what differ between an H100 and a T4:

- **time to first token**: the prefill work ahead of the request (prompt tokens not in its
  prefix cache, of requests sent there and not yet answering) plus its own, over the engine's
  prefill rate, plus the decode steps it shares those steps with::

      TTFT = ttft_base + prefill_s · (queued + own uncached tokens) + ttft_per_running · running

- **time per output token**: the engine's step time, which grows with the running batch and
  with the KV tokens the batch reads::

      TPOT = step_base + step_per_request · running + step_per_kv · KV tokens (thousands)

These are the emulator's equations (``hetero.serve.engine_model.StepCost``: a step costs an
overhead, a share per request, the weights and the KV cache read at the memory bandwidth, the
tokens computed at the TFLOPS), linearised: ``StepCost.prior`` gives their coefficients for a
model on a catalog device, and ``EnginePrior.generic`` a guess for a replica known by its URL
alone. Each reply then corrects them: its TTFT with the prefill queue and batch it met on
arrival, its TPOT with the mean batch and KV tokens over its decode (``EngineLoad`` integrates
both over time). The fit is recursive least squares with forgetting, started at the prior and
kept non-negative, so a replica that changes speed is followed within some tens of replies.

Predictions are the fit's means. They are not made pessimistic by the fit's uncertainty: the
spread of a batch size never seen stays at the prior's, so a replica judged by one deviation
more is never sent the larger batch that would teach it (on real vLLM the router held dozens of
requests while its fastest replica ran one). Each reply's measured value is compared with what
was predicted for it instead; a replica whose replies keep contradicting the model (a median
error over 3×) is *distrusted*: its predictions while it runs something are widened by its
observed error until it agrees again.

Pure: no I/O, no clock of its own (times are passed in), nothing that can overflow or divide by
zero on hostile numbers: every observation is checked finite and within bounds, and refused
otherwise.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["EngineFit", "EngineLoad", "EnginePrior", "Flight", "LinearFit"]

FloatArray = npt.NDArray[np.float64]

#: Seconds beyond which a measured TTFT or TPOT is not believed (a broken clock, a hostile reply).
MAX_SECONDS = 3600.0
#: Tokens beyond which a count is not believed (no engine holds a billion tokens at once).
MAX_TOKENS = 1e9
#: The least a prediction can be (seconds): a fit that extrapolates below zero predicts this.
FLOOR = 1e-4
# Replies whose error is remembered, per replica and measure.
_ERRORS = 64
# The median |log(measured / predicted)| above which a replica is distrusted: 3x off.
_DISTRUST = math.log(3.0)
# Replies needed before a replica can be judged.
_JUDGE_AFTER = 8


@dataclass(frozen=True, slots=True)
class EnginePrior:
    """Starting coefficients (seconds) and how unsure of them the fit starts: each ``*_sd`` is
    one standard deviation of the coefficient. ``kv_tokens``: the KV cache size, where known."""

    ttft_base: float
    prefill_s: float  # seconds per uncached prompt token
    ttft_per_running: float
    step_base: float
    step_per_request: float
    step_per_kv: float  # seconds per thousand KV tokens read per step
    ttft_sd: tuple[float, float, float]
    tpot_sd: tuple[float, float, float]
    kv_tokens: int | None = None

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
        )


class LinearFit:
    """``y ≈ θ·x`` by recursive least squares, forgetting old replies by ``forget`` per reply,
    started at ``prior`` with standard deviations ``sd``. Each reply is weighed by its size
    (noise ``noise`` × the measured or the predicted value, the larger), so a 10 ms step and a
    2 s prefill count alike.
    The coefficients are not held non-negative (projecting each update onto that bound drives
    correlated ones apart without end), but a negative one never extrapolates: its feature is
    capped at the largest value the replies have shown. A slope fitted below zero from a few
    noisy replies would otherwise predict a busy replica at no time at all and draw every
    request to it (seen on a throttled vLLM replica). The covariance never grows past the
    prior's."""

    __slots__ = ("_ceiling", "_p0", "forget", "high", "noise", "p", "theta", "updates")

    def __init__(
        self, prior: tuple[float, ...], sd: tuple[float, ...], forget: float = 0.98
    ) -> None:
        self.theta = np.array(prior, dtype=np.float64)
        self.high = np.zeros_like(self.theta)  # the largest of each feature fitted so far
        self._p0 = np.diag(np.square(np.array(sd, dtype=np.float64)))
        self.p = self._p0.copy()
        self._ceiling = MAX_SECONDS
        self.forget = forget
        self.noise = 0.15
        self.updates = 0

    def predict(self, x: FloatArray) -> float:
        """The mean at features ``x`` (at least ``FLOOR``)."""
        theta = self.theta
        if theta.min() < 0:
            x = np.where(theta < 0, np.minimum(x, self.high), x)
        return max(FLOOR, float(theta @ x))

    def update(self, x: FloatArray, y: float) -> None:
        mean = float(self.theta @ x)
        px = self.p @ x
        # Weighed by the larger of the measured and the predicted value: a reply far below the
        # fit (a burst of tokens the server had held back) must not pull it with the weight of
        # a tiny, exact-looking measurement.
        r = (self.noise * max(y, mean, FLOOR)) ** 2
        gain = px / (r + float(x @ px))
        theta = np.clip(self.theta + gain * (y - mean), -self._ceiling, self._ceiling)
        p = (self.p - np.outer(gain, px)) / self.forget
        p = (p + p.T) / 2
        # Bounded: directions no reply excites do not wind up past the prior's spread.
        diag = np.diag(p)
        limit = np.diag(self._p0)
        if not (np.all(np.isfinite(p)) and np.all(np.isfinite(theta))):
            return  # numerically lost (never seen): keep the last good state
        if np.any(diag > limit):
            scale = np.sqrt(np.minimum(1.0, limit / np.maximum(diag, 1e-300)))
            p = p * np.outer(scale, scale)
        self.theta = theta
        self.p = p
        self.high = np.maximum(self.high, x)
        self.updates += 1


@dataclass(slots=True)
class Flight:
    """One request sent to a replica, as the model tracks it."""

    device: int
    uncached: float  # prompt tokens it must prefill there
    kv: float  # KV tokens it holds while it runs (its prompt and half its expected output)
    sent: float
    x_ttft: FloatArray  # the TTFT features it met on arrival
    predicted_ttft: float
    predicted_tpot: float
    first: float | None = None  # when its first token came
    # EngineLoad's integrals of the running count and the KV tokens, and when they were read
    # (at its first token; until then at its send): the mean batch its decode met is their
    # growth over the time since.
    read_at: float = 0.0
    running_at: float = 0.0
    kv_at: float = 0.0


class EngineLoad:
    """What runs on one replica as the router sent it: requests in the engine, prompt tokens
    still to prefill, KV tokens held, and the time integrals of the running count and the KV
    tokens (the mean batch a reply decoded in is their difference over its decode)."""

    __slots__ = ("at", "kv", "kv_time", "prefill_queue", "running", "running_time")

    def __init__(self) -> None:
        self.running = 0
        self.prefill_queue = 0.0
        self.kv = 0.0
        self.at = 0.0
        self.running_time = 0.0
        self.kv_time = 0.0

    def advance(self, now: float) -> None:
        dt = now - self.at
        if dt > 0:
            self.running_time += self.running * dt
            self.kv_time += self.kv * dt
            self.at = now
        elif dt < 0 or not math.isfinite(now):
            self.at = now if math.isfinite(now) else self.at  # a clock set back: start over

    def add(self, now: float, uncached: float, kv: float) -> None:
        self.advance(now)
        self.running += 1
        self.prefill_queue += uncached
        self.kv += kv

    def prefilled(self, now: float, uncached: float) -> None:
        self.advance(now)
        self.prefill_queue = max(0.0, self.prefill_queue - uncached)

    def remove(self, now: float, kv: float, uncached: float) -> None:
        self.advance(now)
        self.running = max(0, self.running - 1)
        self.kv = max(0.0, self.kv - kv) if self.running else 0.0
        self.prefill_queue = max(0.0, self.prefill_queue - uncached) if self.running else 0.0


class _Errors:
    """The last replies' log-ratios of measured to predicted, and the factor predictions are
    widened by while they contradict the model (kept current as replies come, not computed on
    every prediction: the router asks for it per replica per request)."""

    __slots__ = ("factor", "ratios")

    def __init__(self) -> None:
        self.ratios: deque[float] = deque(maxlen=_ERRORS)
        self.factor = 1.0

    def add(self, predicted: float, measured: float) -> None:
        if predicted > 0 and measured > 0:
            self.ratios.append(math.log(measured / predicted))
            self.factor = self._widening()

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile of |relative error| (0.25: 25% off), None before any reply."""
        if not self.ratios:
            return None
        errors = np.abs(np.expm1(np.array(self.ratios)))
        return float(np.quantile(errors, q))

    def _widening(self) -> float:
        """The 90th percentile of measured / predicted (at least 1) while the replies
        contradict the model, else 1."""
        if len(self.ratios) < _JUDGE_AFTER:
            return 1.0
        logs = np.array(self.ratios)
        if float(np.median(np.abs(logs))) <= _DISTRUST:
            return 1.0
        return max(1.0, math.exp(min(float(np.quantile(logs, 0.9)), 20.0)))


class EngineFit:
    """One replica's engine: its fitted TTFT and TPOT coefficients, its KV capacity, and how
    well its replies bear the fit out."""

    __slots__ = ("kv_tokens", "prior", "tpot", "tpot_errors", "ttft", "ttft_errors")

    def __init__(self, prior: EnginePrior) -> None:
        self.prior = prior
        self.ttft = LinearFit(
            (prior.ttft_base, prior.prefill_s, prior.ttft_per_running), prior.ttft_sd
        )
        self.tpot = LinearFit(
            (prior.step_base, prior.step_per_request, prior.step_per_kv), prior.tpot_sd
        )
        self.kv_tokens: int | None = prior.kv_tokens
        self.ttft_errors = _Errors()
        self.tpot_errors = _Errors()

    # --- features ---------------------------------------------------------------------------

    @staticmethod
    def ttft_features(prefill_tokens: float, running: float) -> FloatArray:
        return np.array([1.0, _tokens(prefill_tokens), _tokens(running)])

    @staticmethod
    def tpot_features(running: float, kv_tokens: float) -> FloatArray:
        return np.array([1.0, _tokens(running), _tokens(kv_tokens) / 1000.0])

    # --- predictions ------------------------------------------------------------------------

    # Predictions: ``ttft.predict(x)`` and ``tpot.predict(x)``, times ``ttft_errors.factor``
    # and ``tpot_errors.factor`` where they are to be widened while distrusted.

    @property
    def distrusted(self) -> bool:
        return self.ttft_errors.factor > 1.0 or self.tpot_errors.factor > 1.0

    # --- learning ---------------------------------------------------------------------------

    def observe_ttft(self, x: FloatArray, measured: float, predicted: float) -> bool:
        """A reply's time to first token at the features it met; False if refused."""
        if not _seconds(measured):
            return False
        if self.ttft.updates >= _JUDGE_AFTER:  # the fit's error, not its first guess's
            self.ttft_errors.add(predicted, measured)
        self.ttft.update(x, measured)
        return True

    def observe_tpot(self, x: FloatArray, measured: float, predicted: float) -> bool:
        if not _seconds(measured):
            return False
        if self.tpot.updates >= _JUDGE_AFTER:
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
            v = errors.quantile(p)
            return None if v is None else round(v, 3)

        return {
            "prefill_tokens_per_s": round(float(1.0 / t[1]), 1) if t[1] > 0 else None,
            "ttft_base_s": round(float(t[0]), 5),
            "ttft_per_running_s": round(float(t[2]), 5),
            "step_base_s": round(float(d[0]), 5),
            "step_per_request_s": round(float(d[1]), 6),
            "step_per_1k_kv_s": round(float(d[2]), 6),
            "kv_tokens": self.kv_tokens,
            "replies_fitted": {"ttft": self.ttft.updates, "tpot": self.tpot.updates},
            "error_ttft": {"p50": q(self.ttft_errors, 0.5), "p90": q(self.ttft_errors, 0.9)},
            "error_tpot": {"p50": q(self.tpot_errors, 0.5), "p90": q(self.tpot_errors, 0.9)},
            "distrusted": self.distrusted,
        }


def _tokens(value: float) -> float:
    """A count as a feature: finite, in [0, MAX_TOKENS]."""
    if not value > 0:  # also NaN
        return 0.0
    return min(float(value), MAX_TOKENS)


def _seconds(value: float) -> bool:
    return isinstance(value, int | float) and 0 < value <= MAX_SECONDS
