"""The discrete-event simulator: a virtual clock, an event heap and emulated devices driving the
real ``Dispatcher`` and any ``Policy`` unchanged.

Events are ``(time, seq, kind, payload)`` in a heap, so a run is deterministic for a seed: ties
in time resolve in the order the events were scheduled. Arrivals are pulled one at a time from
the workload generator and never enter the heap, which keeps the heap as small as the number of
running items. A device of speed ``s`` with ``k`` slots runs each item at ``s / k`` work units
per second, so ``s`` is its throughput when all slots are busy.

With ``cache_blocks``, each device also has a prefix cache (its engine's KV cache, the truth, not
a policy's belief of it): an item whose prompt starts with blocks cached there skips their
prefill, and its prompt is then cached there, least recently used blocks evicted at capacity.
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from hetero.devices.spec import Device
from hetero.errors import QueueFull
from hetero.sched.clock import ManualClock
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.driver import Driver
from hetero.sched.instructions import Finish, Instruction, Run, Stop
from hetero.sched.item import Cause, ItemState, WorkItem
from hetero.sched.perf import PerfModel
from hetero.sched.policy import Policy
from hetero.sched.prefix import Prefix, PrefixIndex
from hetero.sim.result import SimResult, TimeSeries

__all__ = ["Simulator"]

_COMPLETE, _DOWN, _UP, _EXPIRE, _SAMPLE = 0, 1, 2, 3, 4
DONE = ItemState.DONE
Progress = Callable[[int, int], None]  # (items finished or rejected, items submitted in all)


class Simulator:
    """Runs a workload through a fleet under one policy, in virtual time.

    Args:
        devices: the fleet (emulated or real: here every device is paced by its speed).
        policy: the policy under test (a fresh instance per run: policies keep state).
        slots: concurrent items per device (default 1 each).
        actual_speed: per device id, the factor by which the device really is faster or slower
            than its catalog speed (the policy does not know it; adaptive policies learn it).
        dispatcher_options: passed to ``Dispatcher`` (max_queue_size, timeout, preemption, ...).
        samples: time-series points to aim for: between ``samples`` and ``2 × samples`` once the
            run outlasts its first interval (``expected_duration / samples``) that many times.
        keep_finished: keep every item's record (needed for ``validate_state``; costs memory).
        cache_blocks: each device's prefix cache in blocks (one number for all, or one per
            device): an item with a ``prefix`` runs for its cost less the prefill of the leading
            blocks the device holds (``matched × block_work``, at most its cost), and leaves its
            blocks there. ``None``: no cache, every item runs for its whole cost. A device that
            fails loses its cache.
    """

    def __init__(
        self,
        devices: Sequence[Device],
        policy: Policy,
        *,
        slots: Sequence[int] | None = None,
        unit_rate: float = 1.0,
        actual_speed: Mapping[str, float] | None = None,
        dispatcher_options: Mapping[str, object] | None = None,
        samples: int = 200,
        keep_finished: bool = False,
        cache_blocks: int | Sequence[int] | None = None,
    ) -> None:
        self.clock = ManualClock()
        self.devices = list(devices)
        perf = PerfModel(self.devices, unit_rate=unit_rate)
        options = {"max_queue_size": 1_000_000_000, **(dispatcher_options or {})}
        self.dispatcher = Dispatcher(
            self.devices,
            policy,
            self.clock,
            perf=perf,
            slots=slots,
            keep_finished=keep_finished,
            **options,  # type: ignore[arg-type]
        )
        view = self.dispatcher.view
        factors = dict(actual_speed or {})
        unknown = sorted(set(factors) - set(view.ids))
        if unknown:
            raise ValueError(f"actual_speed names unknown device(s) {unknown}; devices: {view.ids}")
        true_speed = perf.speed().copy()
        for device_id, factor in factors.items():
            if not factor > 0:
                raise ValueError(f"actual_speed[{device_id!r}] must be > 0, got {factor!r}")
            true_speed[view.index[device_id]] *= factor
        # Seconds per work unit of one item on each device (each slot runs at speed / slots).
        self._unit_seconds = (view.slots / true_speed).tolist()
        self.capacity = float(true_speed.sum())
        self.samples = samples
        self.policy_name = policy.name or type(policy).__name__
        self.cache_blocks: list[int] | None = None
        if cache_blocks is not None:
            n = len(self.devices)
            blocks = [cache_blocks] * n if isinstance(cache_blocks, int) else list(cache_blocks)
            if len(blocks) != n:
                raise ValueError(f"cache_blocks gives {len(blocks)} capacities for {n} devices")
            PrefixIndex(blocks)  # refuses a bad capacity now rather than at run
            self.cache_blocks = blocks

    def run(
        self,
        arrivals: Iterator[tuple[float, WorkItem]],
        *,
        expected_duration: float | None = None,
        failures: Sequence[tuple[str, float, float | None]] = (),
        slo_latency: float | None = None,
        total: int = 0,
        progress: Progress | None = None,
        log: list[tuple[float, str, int | str, str]] | None = None,
    ) -> SimResult:
        """Run until every arrival has been handled and every admitted item has ended.

        ``failures`` lists ``(device id, down at, up at or None)``. ``expected_duration`` sets
        the sampling interval; ``total`` (the number of arrivals) only feeds ``progress``.
        ``log``, when given, receives ``(time, what, item id, device id)`` for every run, stop,
        finish and rejection: the exact history scenario tests assert.
        """
        d = self.dispatcher
        clock = self.clock
        view = d.view
        cache = None if self.cache_blocks is None else PrefixIndex(self.cache_blocks)
        events = _Events(d, self._unit_seconds, log, cache)
        heap = events.heap
        for device_id, down, up in failures:
            if device_id not in view.index:
                raise ValueError(f"failure names unknown device {device_id!r}; devices: {view.ids}")
            events.push(down, _DOWN, device_id)
            if up is not None:
                events.push(up, _UP, device_id)
        interval = (expected_duration or 1.0) / max(self.samples, 1)
        events.push(interval, _SAMPLE, None)
        # Cumulative busy slot-seconds per sample, not per-interval utilization: dropping every
        # other sample then leaves each kept interval's exact average (see _series).
        sample_t: list[float] = []
        sample_busy: list[np.ndarray] = []
        sample_queue: list[int] = []
        max_points = 2 * max(self.samples, 1)
        submitted = rejected = handled = 0
        pop = heapq.heappop
        submit, complete, set_time, apply = d.submit, d.complete, clock.setter(), events.apply
        on_run, on_finish = events.on_run, events.on_finish
        run_token = events.run_token
        next_arrival = next(arrivals, None)
        gc_was_enabled = gc.isenabled()
        gc.disable()  # the loop allocates many short-lived objects and no cycles
        wall = time.perf_counter()
        try:
            while True:
                if next_arrival is not None and (not heap or next_arrival[0] <= heap[0][0]):
                    now, item = next_arrival
                    next_arrival = next(arrivals, None)
                    set_time(now)
                    submitted += 1
                    try:
                        out: list[Instruction] = submit(item)
                    except QueueFull:
                        rejected += 1
                        if log is not None:
                            log.append((now, "rejected", item.id, ""))
                        continue
                elif heap and (next_arrival is not None or len(heap) > 1 or heap[0][2] != _SAMPLE):
                    now, token, kind, payload = pop(heap)
                    set_time(now)
                    if kind == _COMPLETE:
                        # The event's seq is its run's token: a stopped run's event is stale.
                        if run_token.get(payload) != token:  # type: ignore[call-overload]
                            continue
                        del run_token[payload]  # type: ignore[arg-type]
                        out = complete(payload)  # type: ignore[arg-type]
                    elif kind == _SAMPLE:
                        sample_t.append(now)
                        sample_busy.append(d.busy_seconds())
                        sample_queue.append(d.waiting)
                        if len(sample_t) == max_points:
                            # Bounded however long the run: double the interval, keep the later
                            # sample of each pair. Its queue length (rather than the pair's max)
                            # stays an observation at its own time, so the series is exactly
                            # what sampling at the final interval from the start gives.
                            del sample_t[::2], sample_busy[::2], sample_queue[::2]
                            interval *= 2
                        if d.active or next_arrival is not None:
                            events.push(now + interval, _SAMPLE, None)
                        continue
                    elif kind == _DOWN:
                        out = d.device_down(str(payload), "simulated device failure")
                        if cache is not None:  # its engine restarts with an empty cache
                            cache.forget(view.index[str(payload)])
                    elif kind == _UP:
                        out = d.device_up(str(payload))
                    else:
                        if token != events.expire_token:
                            continue  # replaced: running it would re-arm a duplicate, run after run
                        handled += 1
                        events.now = now
                        events.expire()
                        continue
                else:
                    break
                handled += 1
                events.now = now
                # Driver.apply inlined for the two instructions of every item: a simulated run
                # or finish leads to no further instruction, and an item done needs nothing
                # more unless logged (the dispatcher's metrics count it).
                for ins in out:
                    cls = type(ins)
                    if cls is Run:
                        on_run(ins)  # type: ignore[arg-type]
                    elif cls is Finish:
                        if log is not None or ins.state is not DONE:  # type: ignore[union-attr]
                            on_finish(ins)  # type: ignore[arg-type]
                    else:
                        apply((ins,))
                if progress is not None and handled % 20000 == 0:
                    progress(len(d.metrics.latency) + events.failed + rejected, total)
        finally:
            wall = time.perf_counter() - wall
            if gc_was_enabled:
                gc.enable()
        # Items still waiting had no usable device left to run on: end them, do not lose them.
        if d.active:
            reason = "no usable device before the simulation ended"
            apply(d.abandon_stranded(reason, down_is_final=True))
        done, failed, reasons = len(d.metrics.latency), events.failed, events.reasons
        if progress is not None:
            progress(done + failed + rejected, total)
        metrics = d.metrics.report(view)
        latencies, costs = (
            (
                np.frombuffer(d.metrics.latency, dtype=np.float64).copy(),
                np.frombuffer(d.metrics.latency_cost, dtype=np.float64).copy(),
            )
            if done
            else (np.zeros(0), np.zeros(0))
        )
        attainment = None
        if slo_latency is not None:
            met = int((latencies <= slo_latency).sum())
            attainment = met / submitted if submitted else math.nan
        series = _series(interval, sample_t, sample_busy, sample_queue, view.slots)
        looked_up = sum(events.looked_up)
        return SimResult(
            policy=self.policy_name,
            device_ids=list(view.ids),
            device_models=[dev.model for dev in view.devices],
            metrics=metrics,
            submitted=submitted,
            completed=done,
            failed=failed,
            rejected=rejected,
            slo_latency=slo_latency,
            slo_attainment=attainment,
            events=handled,
            wall_seconds=wall,
            latencies=latencies,
            costs=costs,
            series=series,
            failure_reasons=dict(reasons),
            prefix_hit_rate=sum(events.hit) / looked_up if looked_up else None,
            prefix_hits=np.array(events.hit, dtype=np.int64) if cache is not None else None,
            prefix_lookups=np.array(events.looked_up, dtype=np.int64)
            if cache is not None
            else None,
        )


class _Events(Driver):
    """One run's event heap, driven by the dispatcher's instructions: a ``Run`` schedules the
    item's completion at its speed on the device, a ``Stop`` makes that event stale, a
    ``Finish`` is counted, and the timer is an ``_EXPIRE`` event."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        unit_seconds: list[float],
        log: list[tuple[float, str, int | str, str]] | None,
        cache: PrefixIndex | None = None,
    ) -> None:
        super().__init__(dispatcher)
        self.log = log  # (time, what, item id, device id or reason) of each instruction
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0  # events' order among equal times; a run's seq is its token
        self.now = 0.0  # the time of the event whose instructions are carried out
        self.unit_seconds = unit_seconds  # per device: seconds per work unit of one item
        self.run_token: dict[int | str, int] = {}  # the live run of each running item
        self.expire_token = -1  # the seq of the live _EXPIRE event (-1: none)
        self.failed = 0
        self.reasons: Counter[str] = Counter()
        self.cache = cache  # the devices' prefix caches (None: not modelled)
        n = len(unit_seconds)
        self.looked_up = [0] * n  # per device: prompt blocks looked up in its cache
        self.hit = [0] * n  # per device: those it held

    def push(self, at: float, kind: int, payload: object) -> int:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, payload))
        return self.seq

    def on_run(self, ins: Run) -> None:
        item = ins.item
        work = item.cost
        if self.cache is not None and item.prefix is not None:
            work -= self._cached(item.prefix, ins.device, work)
        self.seq = seq = self.seq + 1
        self.run_token[item.id] = seq
        at = self.now + work * self.unit_seconds[ins.device]
        heapq.heappush(self.heap, (at, seq, _COMPLETE, item.id))
        if self.log is not None:
            self.log.append((self.now, "run", item.id, ins.device_id))

    def _cached(self, prefix: Prefix, device: int, cost: float) -> float:
        """The prefill ``device`` skips for a prompt of ``prefix``, at most ``cost``; the prompt
        is then cached there (the engine prefills it as the run starts)."""
        cache, blocks = self.cache, prefix.blocks
        assert cache is not None
        matched = int(cache.match(blocks)[device])
        cache.insert(device, blocks)
        self.looked_up[device] += len(blocks)
        self.hit[device] += matched
        return min(matched * prefix.block_work, cost)

    def on_stop(self, ins: Stop) -> None:
        self.run_token.pop(ins.item.id, None)
        if self.log is not None:
            device_id = self.dispatcher.view.ids[ins.device]
            self.log.append((self.now, "stop", ins.item.id, device_id))

    def on_finish(self, ins: Finish) -> None:
        # Items done are counted by the dispatcher's metrics (one latency each).
        if self.log is not None:
            self.log.append((self.now, ins.state.value, ins.item.id, ins.reason))
        if ins.state is not DONE:
            self.failed += 1
            self.reasons[_failure_label(ins)] += 1

    def arm_timer(self, at: float) -> None:
        self.expire_token = self.push(at, _EXPIRE, None)


def _failure_label(ins: Finish) -> str:
    """How a failure shows in the report: the reason where it holds no device name (a
    timeout's says after how long), else the cause (a device failure's reason names one of
    the devices it hit)."""
    if ins.cause in (Cause.TIMED_OUT, Cause.REJECTED, Cause.ABANDONED):
        return ins.reason
    return str(ins.cause)


def _series(
    interval: float,
    t: list[float],
    busy: list[np.ndarray],
    queue: list[int],
    slots: np.ndarray,
) -> TimeSeries:
    """Utilization averaged over each interval (not the instant's 0 or 1): the difference of
    cumulative busy slot-seconds between samples, from 0 busy at time 0."""
    times = np.array(t)
    cumulative = np.array(busy) if busy else np.zeros((0, slots.size))
    spent = np.diff(cumulative, axis=0, prepend=np.zeros((1, slots.size)))
    lengths = np.diff(times, prepend=0.0)
    return TimeSeries(
        interval=interval,
        t=times,
        utilization=spent / (slots * np.maximum(lengths, 1e-12)[:, None]),
        queue_length=np.array(queue, dtype=np.int64),
    )
