"""What traffic the router has seen: arrivals and the lengths of finished requests, over a
sliding window, for the autoscaler's sizer. Two appends on the request path, nothing more."""

from __future__ import annotations

from bisect import bisect_right
from collections import deque

from hetero.serve.autoscale.policy import RISE_WINDOW, Traffic, observed_rate

__all__ = ["TrafficLog"]


class TrafficLog:
    """Arrival times and ``(prompt, output)`` tokens of finished requests; ``traffic(now)``
    summarises the last ``window`` seconds (lengths: the last ``samples`` finished), its rate
    that of the last ``RISE_WINDOW`` seconds when those are beyond chance above it."""

    def __init__(self, window: float = 60.0, samples: int = 2000) -> None:
        self.window = window
        self._arrivals: deque[float] = deque()
        self._lengths: deque[tuple[int, int]] = deque(maxlen=samples)
        self._met: deque[tuple[float, bool]] = deque()  # (when it finished, within the SLO)
        self._first: float | None = None

    def arrived(self, now: float) -> None:
        self._arrivals.append(now)
        if self._first is None:
            self._first = now
        self._trim(now)

    def finished(self, prompt: int, output: int, met: tuple[float, bool] | None = None) -> None:
        """A request done: its lengths, and (when an SLO is known) when it finished and whether
        it met the SLO."""
        self._lengths.append((prompt, output))
        if met is not None:
            self._met.append(met)

    def _trim(self, now: float) -> None:
        while self._arrivals and self._arrivals[0] <= now - self.window:
            self._arrivals.popleft()
        while self._met and self._met[0][0] <= now - self.window:
            self._met.popleft()

    def traffic(self, now: float) -> Traffic:
        """The last ``window`` seconds (less, in the first minute of traffic)."""
        self._trim(now)
        span = self.window if self._first is None else min(self.window, now - self._first)
        span = max(span, 1.0)
        recent = len(self._arrivals) - bisect_right(self._arrivals, now - RISE_WINDOW)
        prompts = tuple(p for p, _ in self._lengths)
        outputs = tuple(o for _, o in self._lengths)
        n = len(prompts)
        return Traffic(
            rate=observed_rate(len(self._arrivals), span, recent, min(RISE_WINDOW, span)),
            window=span,
            prompt_tokens=sum(prompts) / n if n else 0.0,
            output_tokens=sum(outputs) / n if n else 0.0,
            prompt_samples=prompts,
            output_samples=outputs,
            attainment=sum(m for _, m in self._met) / len(self._met) if self._met else None,
            judged=len(self._met),
        )
