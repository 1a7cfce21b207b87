"""What arrives when: the arrival clocks (Poisson, bursty, a trace's own times), the prompts
items share (chats, single turns, hot prefixes) and :func:`generate`, which draws a workload's
items in numpy chunks, in time order."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator

import numpy as np
import numpy.typing as npt

from hetero.sched.item import WorkItem
from hetero.sched.prefix import Prefix
from hetero.sim.trace import Trace, trace_rows
from hetero.sim.workload_spec import (
    BurstyArrivals,
    ChatPrompts,
    ClosedArrivals,
    FixedSize,
    HotPrompts,
    LognormalSize,
    SinglePrompts,
    TraceSize,
    UniformSize,
    WorkloadSpec,
)

__all__ = ["CHUNK", "arrival_rate", "generate", "mean_cost", "mean_size"]

#: Items drawn per numpy call by :func:`generate`.
CHUNK = 65536


def mean_size(spec: WorkloadSpec) -> float:
    """The mean work units per item of ``spec``'s size distribution (or of its trace)."""
    size = spec.size
    if isinstance(size, FixedSize):
        return size.value
    if isinstance(size, UniformSize):
        return (size.low + size.high) / 2
    if isinstance(size, LognormalSize):
        return size.mean
    return float(size.trace().cost.mean())


def mean_cost(spec: WorkloadSpec) -> float:
    """The mean work units per item: its size's, plus its prompt's prefill with ``prompts``."""
    prompts = spec.prompts
    prefill = prompts.mean_blocks * prompts.block_work if prompts is not None else 0.0
    return mean_size(spec) + prefill


def _trace_arrivals(spec: WorkloadSpec) -> Trace | None:
    if isinstance(spec.size, TraceSize):
        trace = spec.size.trace()
        if trace.arrival is not None:
            return trace
    return None


def arrival_rate(spec: WorkloadSpec, capacity: float) -> float | None:
    """The mean arrival rate in items/s for a fleet of ``capacity`` work units/s.

    ``None`` for a batch (``closed``, or a trace whose items all arrive at once).
    """
    trace = _trace_arrivals(spec)
    if trace is not None:
        return len(trace) / trace.period if trace.period > 0 else None
    arrivals = spec.arrivals
    if isinstance(arrivals, ClosedArrivals):
        return None
    if arrivals.rate is not None:
        return arrivals.rate
    assert arrivals.load is not None
    if not (capacity > 0 and math.isfinite(capacity)):
        raise ValueError(
            f"capacity must be a finite number > 0 work units/s to use load, got {capacity!r}"
        )
    return arrivals.load * capacity / mean_cost(spec)


class _PoissonClock:
    def __init__(self, rng: np.random.Generator, rate: float) -> None:
        self.rng, self.scale, self.last = rng, 1.0 / rate, 0.0

    def __call__(self, m: int) -> npt.NDArray[np.float64]:
        t = np.cumsum(self.rng.exponential(self.scale, m))
        t += self.last
        self.last = float(t[-1])
        return t


class _BurstyClock:
    """Markov-modulated Poisson arrivals by time rescaling.

    Unit-rate Poisson points ``s`` are mapped through the inverse of the cumulative intensity
    ``Λ(t)``, which is piecewise linear over the calm and burst periods (generated in blocks).
    """

    _BLOCK = 1024

    def __init__(self, rng: np.random.Generator, spec: BurstyArrivals, rate: float) -> None:
        self.rng = rng
        calm, burst = spec.rates(rate)
        self.durations = (spec.calm_seconds, spec.burst_seconds)
        self.levels = (calm, burst)
        b, c = spec.burst_seconds, spec.calm_seconds
        self.bursting = bool(rng.random() < b / (b + c))  # start in the stationary distribution
        self.s = 0.0  # last unit-rate point
        self.t_start = np.zeros(1)  # start time of each known period
        self.lam_start = np.zeros(1)  # Λ at each start
        self.rate = np.array([self.levels[self.bursting]])
        first = rng.exponential(self.durations[self.bursting])
        self.t_end, self.lam_end = first, first * self.rate[0]

    def _extend(self) -> None:
        k = self._BLOCK
        state = (np.arange(1, k + 1) + int(self.bursting)) % 2  # alternate, starting after ours
        self.bursting = bool(state[-1])
        calm_s, burst_s = self.durations
        lengths = self.rng.exponential(1.0, k) * np.where(state == 1, burst_s, calm_s)
        rates = np.where(state == 1, self.levels[1], self.levels[0])
        t_start = self.t_end + np.concatenate(([0.0], np.cumsum(lengths[:-1])))
        lam_start = self.lam_end + np.concatenate(([0.0], np.cumsum((lengths * rates)[:-1])))
        self.t_end = float(t_start[-1] + lengths[-1])
        self.lam_end = float(lam_start[-1] + lengths[-1] * rates[-1])
        self.t_start = np.concatenate((self.t_start, t_start))
        self.lam_start = np.concatenate((self.lam_start, lam_start))
        self.rate = np.concatenate((self.rate, rates))

    def __call__(self, m: int) -> npt.NDArray[np.float64]:
        s = np.cumsum(self.rng.exponential(1.0, m))
        s += self.s
        self.s = float(s[-1])
        while self.lam_end <= self.s:
            self._extend()
        k = np.searchsorted(self.lam_start, s, side="right") - 1
        t: npt.NDArray[np.float64] = self.t_start[k] + (s - self.lam_start[k]) / self.rate[k]
        keep = int(k[-1])  # periods before the last point's are done with
        self.t_start = self.t_start[keep:]
        self.lam_start = self.lam_start[keep:]
        self.rate = self.rate[keep:]
        return t


class _TraceClock:
    """A trace's own arrivals, repeated (each repeat shifted by the trace's period)."""

    def __init__(self, arrival: npt.NDArray[np.float64], period: float) -> None:
        self.arrival, self.period, self.position = arrival, period, 0

    def __call__(self, m: int) -> npt.NDArray[np.float64]:
        idx = np.arange(self.position, self.position + m)
        self.position += m
        n = len(self.arrival)
        t: npt.NDArray[np.float64] = self.arrival[idx % n] + (idx // n) * self.period
        return t


def generate(spec: WorkloadSpec, capacity: float) -> Iterator[tuple[float, WorkItem]]:
    """Yield ``(arrival time, item)`` for ``spec.requests`` items in non-decreasing time order.

    Lazy (items are drawn in numpy chunks of :data:`CHUNK`) and deterministic for ``spec.seed``;
    arrival times, sizes and priorities come from independent random streams, so changing the
    size distribution leaves the arrival times alone. ``capacity`` is the fleet's total work
    units per second; it turns ``load`` into a rate: ``load * capacity / mean_cost(spec)``.
    Items have ids ``0 .. requests - 1`` in arrival order.
    """
    rate = arrival_rate(spec, capacity)  # validates capacity now, not at the first next()
    # Spawned children do not depend on how many there are: adding the prompts' stream kept
    # every earlier workload's items as they were.
    arrival_rng, size_rng, priority_rng, prompt_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(4)
    )
    trace = spec.size.trace() if isinstance(spec.size, TraceSize) else None
    clock: Callable[[int], npt.NDArray[np.float64]]
    if trace is not None and trace.arrival is not None:
        clock = _TraceClock(trace.arrival, trace.period)
    elif isinstance(spec.arrivals, ClosedArrivals) or rate is None:

        def clock(m: int) -> npt.NDArray[np.float64]:
            return np.zeros(m)

    elif isinstance(spec.arrivals, BurstyArrivals):
        clock = _BurstyClock(arrival_rng, spec.arrivals, rate)
    else:
        clock = _PoissonClock(arrival_rng, rate)
    prompts = None if spec.prompts is None else _prompt_source(spec.prompts, prompt_rng)
    return _items(spec, clock, size_rng, priority_rng, trace, prompts)


#: ``m`` items' prompts, and each one's prefill in work units.
_PromptSource = Callable[[int], tuple[list[Prefix], npt.NDArray[np.float64]]]


class _NewBlocks:
    """Block hashes never seen before: consecutive ints. A new block after a prefix then names
    that prefix alone, as an engine's chained hash does, with no hashing, no collision and the
    same blocks for a seed (a ``str`` hash would differ from process to process)."""

    def __init__(self) -> None:
        self._ints = itertools.count(1)

    def __call__(self, k: int) -> tuple[int, ...]:
        return tuple(itertools.islice(self._ints, k))


class _ChatPrompts:
    """``sessions`` conversations in progress: each item is the next turn of one picked at
    random, and one that has had all its turns gives way to a new one."""

    def __init__(self, spec: ChatPrompts, rng: np.random.Generator) -> None:
        self.spec, self.rng, self.new = spec, rng, _NewBlocks()
        self.systems = [self.new(spec.system_blocks) for _ in range(spec.systems)]
        n = spec.sessions
        self.history: list[tuple[int, ...]] = [()] * n  # each conversation's last prompt
        self.name = [""] * n
        self.left = [0] * n  # each conversation's turns still to come
        self.started = 0

    def __call__(self, m: int) -> tuple[list[Prefix], npt.NDArray[np.float64]]:
        spec, rng, new = self.spec, self.rng, self.new
        slots: list[int] = rng.integers(spec.sessions, size=m).tolist()
        # A system pick for every item, used by those that start a conversation: a chunk's draws
        # are then fixed, and the stream never depends on what came before.
        systems: list[int] = rng.integers(spec.systems, size=m).tolist()
        history, name, left, work = self.history, self.name, self.left, spec.block_work
        turn_blocks = spec.turn_blocks
        prefixes: list[Prefix] = []
        lengths: list[int] = []
        for j, system in zip(slots, systems, strict=True):
            if not left[j]:
                history[j] = self.systems[system]
                name[j] = f"s{self.started}"
                self.started += 1
                left[j] = spec.turns
            left[j] -= 1
            blocks = history[j] = history[j] + new(turn_blocks)
            prefixes.append(Prefix(blocks, work, name[j]))
            lengths.append(len(blocks))
        return prefixes, np.array(lengths, dtype=np.float64) * work


def _single_prompts(spec: SinglePrompts) -> _PromptSource:
    work, new = spec.block_work, _NewBlocks()

    def draw(m: int) -> tuple[list[Prefix], npt.NDArray[np.float64]]:
        return [Prefix(new(spec.blocks), work) for _ in range(m)], np.full(m, spec.longest * work)

    return draw


def _hot_prompts(spec: HotPrompts, rng: np.random.Generator) -> _PromptSource:
    work, head, tail, new = spec.block_work, spec.system_blocks, spec.turn_blocks, _NewBlocks()
    hot = [new(head) for _ in range(spec.systems)]

    def draw(m: int) -> tuple[list[Prefix], npt.NDArray[np.float64]]:
        shared: list[bool] = (rng.random(m) < spec.share).tolist()
        which: list[int] = rng.integers(spec.systems, size=m).tolist()
        prefixes = [
            Prefix((hot[w] if s else new(head)) + new(tail), work)
            for s, w in zip(shared, which, strict=True)
        ]
        return prefixes, np.full(m, spec.longest * work)

    return draw


def _prompt_source(
    spec: ChatPrompts | SinglePrompts | HotPrompts, rng: np.random.Generator
) -> _PromptSource:
    if isinstance(spec, ChatPrompts):
        return _ChatPrompts(spec, rng)
    if isinstance(spec, SinglePrompts):
        return _single_prompts(spec)
    return _hot_prompts(spec, rng)


def _sizes(
    spec: WorkloadSpec, rng: np.random.Generator, start: int, m: int
) -> npt.NDArray[np.float64]:
    size = spec.size
    if isinstance(size, FixedSize):
        return np.full(m, size.value)
    if isinstance(size, UniformSize):
        return rng.uniform(size.low, size.high, m)
    if isinstance(size, LognormalSize):
        return rng.lognormal(size.mu, size.sigma, m)
    cost = size.trace().cost
    picked: npt.NDArray[np.float64] = cost[np.arange(start, start + m) % len(cost)]
    return picked


def _items(
    spec: WorkloadSpec,
    clock: Callable[[int], npt.NDArray[np.float64]],
    size_rng: np.random.Generator,
    priority_rng: np.random.Generator,
    trace: Trace | None,
    prompts: _PromptSource | None,
) -> Iterator[tuple[float, WorkItem]]:
    total = spec.requests
    kind = spec.kind
    memory = spec.memory or 0
    no_tags: frozenset[str] = frozenset()
    prio_keys = prio_p = None
    if spec.priorities is not None:
        prio_keys = np.array(list(spec.priorities), dtype=np.int64)
        prio_p = np.array(list(spec.priorities.values()), dtype=np.float64)
        prio_p /= prio_p.sum()
    per_row = trace is not None and any(
        c is not None for c in (trace.memory, trace.priority, trace.kind, trace.tags)
    )
    item = WorkItem
    start = 0
    while start < total:
        m = min(CHUNK, total - start)
        times: list[float] = clock(m).tolist()
        sizes = _sizes(spec, size_rng, start, m)
        prefixes: list[Prefix] | None = None
        if prompts is not None:
            prefixes, prefill = prompts(m)
            sizes = sizes + prefill
        costs: list[float] = sizes.tolist()
        ids = range(start, start + m)
        prios: list[int] | None = None
        if prio_keys is not None:
            prios = priority_rng.choice(prio_keys, size=m, p=prio_p).tolist()
        if per_row:
            assert trace is not None
            yield from trace_rows(trace, start, m, times, costs, prios, kind, memory)
        elif prefixes is not None:
            for i, t, c, p, x in zip(ids, times, costs, prios or [0] * m, prefixes, strict=True):
                yield t, item(c, kind, memory, p, None, no_tags, None, i, False, x)
        elif prios is None:
            for i, t, c in zip(ids, times, costs, strict=True):
                yield t, item(c, kind, memory, 0, None, no_tags, None, i)
        else:
            for i, t, c, p in zip(ids, times, costs, prios, strict=True):
                yield t, item(c, kind, memory, p, None, no_tags, None, i)
        start += m
