"""``FleetView``: what a policy sees of the fleet when it decides.

The dispatcher owns one view and keeps its arrays current as items are placed, started and
finished; policies only read it. Per-device numbers are numpy arrays indexed by device position,
so a policy ranks every device with a handful of vector operations instead of a Python loop. The
expected delay that most policies rank by, and its argmin, are one call into the C kernel
(``_kernel.c``) where it is built, and the same numpy expressions, bit for bit, where it is not.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from functools import partial
from types import ModuleType
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from hetero.devices.spec import Device
from hetero.sched.clock import Clock
from hetero.sched.perf import PerfModel

KERNEL: ModuleType | None
try:  # the hot path in C (_kernel.c); without it, numpy computes the same scores
    from hetero.sched import _kernel as KERNEL
except ImportError:  # pragma: no cover - installed where no C compiler was found
    KERNEL = None

__all__ = ["SIZE_CLASSES", "FleetView"]

#: Size classes of the per-device queue histograms: half-octaves of cost, 32 octaves wide.
SIZE_CLASSES = 64

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


_T = TypeVar("_T")


class Cells(Protocol[_T]):
    """One entry at a time of a per-device array (a memoryview of it)."""

    def __getitem__(self, index: int, /) -> _T: ...

    def __setitem__(self, index: int, value: _T, /) -> None: ...


def _cells(array: npt.NDArray[Any]) -> Any:
    # numpy's arrays are typed as buffers only from Python 3.12 on.
    return memoryview(array)  # type: ignore[arg-type,unused-ignore]


# Work units per item in flight that break ties between free (cost 0) items' delays.
_TIE = 1e-9


def _class_bounds(base: int) -> list[float]:
    """The lowest cost of each size class from 1 up, classes being half-octaves from ``base``:
    where ``int(2 log2(cost) - base)`` first reaches the class, to the last float, so that a
    bisection classes every cost as that formula does (at the cost of one search, not a log2
    and three clips for each new cost)."""

    def level(cost: float) -> int:
        return int(2.0 * math.log2(cost) - base)

    tiniest = math.ulp(0.0)  # a bound below it would class a cost of 0 above class 0
    bounds = []
    for size_class in range(1, SIZE_CLASSES):
        cost = max(2.0 ** ((base + size_class) / 2), tiniest)
        while cost > tiniest and level(cost) >= size_class:
            cost = math.nextafter(cost, 0.0)
        while level(cost) < size_class:
            cost = math.nextafter(cost, math.inf)
        bounds.append(cost)
    return bounds


class FleetView:
    """Live per-device load, memory and health, plus the speeds of the ``PerfModel``.

    Attributes (arrays of length ``n``, read-only for policies):

    - ``slots``: items a device runs at once; ``running``: items running now;
    - ``in_flight``: items placed on the device (queued there or running);
    - ``outstanding``: work units placed on the device and not finished;
    - ``queued_work``: the part of ``outstanding`` still waiting in the device's queue (a list);
    - ``running_work``: the rest, the work of the running items; ``running_since``: the sum of
      their start times, so that with the clock, how long they have run (``elapsed_work``) is a
      few vector operations; ``last_start``: when the latest of them started, kept only where
      some slots hold prefetched items (``prefetching``);
    - ``mem_total`` / ``mem_used``: bytes, ``mem_used`` counting every placed item's ``memory``;
    - ``mem_external``: bytes measured in use beyond that (``Dispatcher.set_external_memory``);
    - ``usable``: healthy and accepting work.

    When the dispatcher orders device queues by size (``size_order``), it also keeps, per device,
    how many queued items and how much queued work fall below each size class (``queued_below``),
    so that a policy can tell how much of a queue a new item would wait behind and how many
    items it would pass (``delay_score``) in a few vector operations.
    """

    def __init__(
        self,
        devices: Sequence[Device],
        perf: PerfModel,
        clock: Clock,
        slots: Sequence[int] | None = None,
        parallel: Sequence[int] | None = None,
    ) -> None:
        if not devices:
            raise ValueError("a fleet needs at least one device")
        self.devices = list(devices)
        self.ids = [d.id for d in self.devices]
        if len(set(self.ids)) != len(self.ids):
            dup = next(i for i in self.ids if self.ids.count(i) > 1)
            raise ValueError(f"duplicate device id {dup!r}")
        self.index = {d: i for i, d in enumerate(self.ids)}
        self.n = len(self.devices)
        self.perf = perf
        self.clock = clock
        n = self.n
        self.slots: IntArray = np.array(slots if slots is not None else [1] * n, dtype=np.int64)
        if self.slots.shape != (n,) or (self.slots < 1).any():
            raise ValueError(f"slots must be {n} integers >= 1, got {list(self.slots)}")
        # Items each device runs at the same time, each at speed / parallel: its slots, unless
        # some slots only hold the next item ready (the engine's prefetch).
        self.parallel: IntArray = (
            self.slots.copy() if parallel is None else np.array(parallel, dtype=np.int64)
        )
        if (
            self.parallel.shape != (n,)
            or (self.parallel < 1).any()
            or (self.parallel > self.slots).any()
        ):
            raise ValueError(
                f"parallel must be {n} integers from 1 to the slots, got {list(self.parallel)}"
            )
        self.multi_slot = bool((self.parallel > 1).any())
        self.prefetching = bool((self.parallel < self.slots).any())
        self.running: IntArray = np.zeros(n, dtype=np.int64)
        self.in_flight: IntArray = np.zeros(n, dtype=np.int64)
        self.outstanding: FloatArray = np.zeros(n, dtype=np.float64)
        # A list, not an array: only the dispatcher reads it, one device at a time, and a list
        # element costs a fraction of a numpy scalar update on the hot path.
        self.queued_work: list[float] = [0.0] * n
        self.mem_total: IntArray = np.array([d.memory_bytes for d in self.devices], dtype=np.int64)
        self.mem_used: IntArray = np.zeros(n, dtype=np.int64)
        # Held outside the dispatcher's accounting (other processes, caches), as last measured.
        self.mem_external: IntArray = np.zeros(n, dtype=np.int64)
        self.usable: BoolArray = np.array([d.state.healthy for d in self.devices], dtype=bool)
        self.size_order = False
        # ``outstanding`` less ``queued_work``, as an array so a policy reads it in one vector
        # operation.
        self.running_work: FloatArray = np.zeros(n)
        self.running_since: FloatArray = np.zeros(n)
        self.last_start: FloatArray = np.zeros(n)
        # Kept by the dispatcher for size-ordered queues only: row k of ``queued_below`` the
        # queued work in size classes below k and row k of ``queued_from`` the number of queued
        # items in classes k and up, per device. Rows, not columns, so that reading one class for
        # every device is one contiguous slice; both views of ``queued_sums``, where each
        # device's two sit side by side, so that an item joining or leaving a queue writes one
        # cache line per row rather than two.
        self.queued_sums: FloatArray = np.zeros((SIZE_CLASSES + 1, n, 2))
        # Only the rows of the classes met so far are kept, [lo, hi] of ``queued_below`` and
        # [lo - 1, hi - 1] of ``queued_from`` (lo > hi: none yet); those beyond repeat an end
        # row's sums, and are written when a class there first comes (``size_class``). A
        # workload spans a few octaves: an item joining a queue then writes a score of rows,
        # not all 65, each a cache line apart on a large fleet.
        self.class_rows: IntArray = np.array([1, 0], dtype=np.int64)
        self._kept = (1, 0)  # class_rows as ints, for the check each new cost makes
        self.queued = 0  # items waiting in device queues, on every device (the dispatcher's)
        self._class_bounds: list[float] = []  # set by the first positive cost (_class_bounds)
        #: The last (cost, class) ``size_class`` gave: the class of the item just placed.
        self.last_class: tuple[float, int] = (-1.0, 0)
        self.kernel = KERNEL  # the compiled hot path, or None: numpy does its work
        self._scratch: FloatArray = np.empty(n)  # the scores ``soonest`` ranks
        self._bind_cells()
        for i in np.flatnonzero(~self.usable):
            perf.set_usable(int(i), False)

    def _bind_cells(self) -> None:
        # Memoryviews of the arrays for the dispatcher's one-entry updates: an entry reads and
        # writes in half the time of numpy's scalar indexing, in the array's own memory.
        self.in_flight_at: Cells[int] = _cells(self.in_flight)
        self.running_at: Cells[int] = _cells(self.running)
        self.outstanding_at: Cells[float] = _cells(self.outstanding)
        self.running_work_at: Cells[float] = _cells(self.running_work)
        self.running_since_at: Cells[float] = _cells(self.running_since)
        self.last_start_at: Cells[float] = _cells(self.last_start)
        self.mem_used_at: Cells[int] = _cells(self.mem_used)
        self.usable_at: Cells[bool] = _cells(self.usable)
        self.queued_below: FloatArray = self.queued_sums[:, :, 0]
        self.queued_from: FloatArray = self.queued_sums[:, :, 1]
        #: ``note_queued(index, size_class, cost, sign)``: an item of ``cost`` in ``size_class``
        #: joined (``sign=1``) or left (``-1``) device ``index``'s queue. The kernel's function
        #: itself where it is built: no Python frame on the way.
        self.note_queued: Callable[[int, int, float, int], None] = (
            self._note_queued_numpy
            if self.kernel is None
            else partial(self.kernel.note_queued, self.queued_sums, self.class_rows)
        )

    def add(self, device: Device, slots: int, parallel: int | None = None) -> int:
        """Append ``device`` (idle, usable) to every per-device array; returns its position.
        The performance model must have the device already."""
        if device.id in self.index:
            raise ValueError(f"duplicate device id {device.id!r}")
        i = self.n
        self.devices.append(device)
        self.ids.append(device.id)
        self.index[device.id] = i
        self.n += 1
        self.slots = np.append(self.slots, np.int64(slots))
        together = slots if parallel is None else parallel
        self.parallel = np.append(self.parallel, np.int64(together))
        self.multi_slot = self.multi_slot or together > 1
        self.prefetching = self.prefetching or together < slots
        self.running = np.append(self.running, np.int64(0))
        self.in_flight = np.append(self.in_flight, np.int64(0))
        self.outstanding = np.append(self.outstanding, 0.0)
        self.queued_work.append(0.0)
        self.mem_total = np.append(self.mem_total, np.int64(device.memory_bytes))
        self.mem_used = np.append(self.mem_used, np.int64(0))
        self.mem_external = np.append(self.mem_external, np.int64(0))
        self.usable = np.append(self.usable, True)
        self.running_work = np.append(self.running_work, 0.0)
        self.running_since = np.append(self.running_since, 0.0)
        self.last_start = np.append(self.last_start, 0.0)
        self._scratch = np.empty(self.n)
        column = np.zeros((SIZE_CLASSES + 1, 1, 2))
        self.queued_sums = np.concatenate([self.queued_sums, column], axis=1)
        self._bind_cells()
        return i

    @property
    def now(self) -> float:
        return self.clock.now()

    def speed(self, kind: str = "default") -> FloatArray:
        return self.perf.speed(kind)

    def inv_speed(self, kind: str = "default") -> FloatArray:
        """``1/speed`` for ``kind``, ``inf`` on devices that are not usable."""
        return self.perf.inv_speed(kind)

    def batch_depth(self, kind: str = "default") -> int:
        """Equal items a closed batch must keep in flight for least-finish-time placement to
        give every usable device work to the end: while fewer are placed, the fastest devices'
        queues drain before the slowest would finish the items its slots hold, so the slowest
        stays idle. The fleet's total speed over its slowest device's, times that device's
        slots (a prefetch slot holds an item too), plus one item per device."""
        speed = self.perf.speed(kind)[self.usable]
        if speed.size == 0:
            return 1
        slowest = int(self.slots[self.usable][speed.argmin()])
        return math.ceil(float(speed.sum()) / float(speed.min()) * slowest) + int(speed.size)

    def mem_free(self) -> IntArray:
        return self.mem_total - self.mem_used - self.mem_external

    def set_usable(self, index: int, usable: bool) -> None:
        self.usable[index] = usable
        self.devices[index].state.healthy = usable
        self.perf.set_usable(index, usable)

    def size_class(self, cost: float) -> int:
        """The half-octave class of ``cost``, centred on the first positive cost seen (costs are
        in the user's units: tokens, FLOPs, seconds; classes beyond either end are clipped)."""
        if cost == self.last_class[0]:
            return self.last_class[1]  # the item the policy just classed, queued now
        bounds = self._class_bounds
        if not bounds and cost > 0:
            base = math.floor(2.0 * math.log2(cost)) - SIZE_CLASSES // 2
            bounds = self._class_bounds = _class_bounds(base)
        size_class = bisect_right(bounds, cost)  # 0 for a cost <= 0 or before any bounds
        self.last_class = (cost, size_class)
        row = size_class + 1
        lo, hi = self._kept
        if not lo <= row <= hi:
            self._keep_row(row, lo, hi)
        return size_class

    def _keep_row(self, row: int, lo: int, hi: int) -> None:
        """Extend the rows kept to ``row``: the new rows of ``queued_below`` above the kept
        ones sum every queued item, as the highest kept row does, and those of
        ``queued_from`` below them count every queued item, as the lowest kept row does; the
        others are 0, as they were left."""
        if lo > hi:
            lo = hi = row  # the first class: nothing is queued yet
        elif row > hi:
            self.queued_below[hi + 1 : row + 1] = self.queued_below[hi]
            hi = row
        else:
            self.queued_from[row - 1 : lo - 1] = self.queued_from[lo - 1]
            lo = row
        self.class_rows[:] = self._kept = (lo, hi)

    def queued_totals(self) -> tuple[FloatArray, FloatArray]:
        """Per device, the work and the number of items queued, as the class sums hold them."""
        lo, hi = self._kept
        if lo > hi:
            return np.zeros(self.n), np.zeros(self.n)
        return self.queued_below[hi], self.queued_from[lo - 1]

    def _note_queued_numpy(self, index: int, size_class: int, cost: float, sign: int) -> None:
        k = size_class + 1
        lo, hi = self._kept
        below = self.queued_below[k : hi + 1, index]
        # ufuncs on the views, ``out`` by position: a third less than ``+=``
        np.add(below, sign * cost, below)
        counts = self.queued_from[lo - 1 : k, index]
        np.add(counts, sign, counts)

    def clear_queue(self, index: int) -> None:
        """Device ``index``'s queue is empty: drop the float drift of its sums."""
        self.queued_sums[:, index] = 0.0

    def starts_now(self, index: int) -> bool:
        """Whether an item placed on device ``index`` now would start at once: a slot is free
        and nothing is queued there."""
        running = self.running[index]
        return bool(running < self.slots[index] and self.in_flight[index] == running)

    def elapsed_work(self) -> FloatArray:
        """Per device: the work its running items have done so far, estimated from how long they
        have run at the device's speed (each of ``parallel`` items at ``speed / parallel``),
        and never more than their cost. A device that holds more items than it runs (the
        others wait in prefetch slots) works through them in turn: it has done its speed times
        the time since the latest start (when it finished one item, it started the next and
        was sent another)."""
        now = self.clock.now()
        speed = self.perf.speed()
        done = np.multiply(self.running, now, dtype=np.float64)
        done -= self.running_since
        done *= speed
        done /= self.parallel
        if self.prefetching:
            done = np.where(self.running > self.parallel, (now - self.last_start) * speed, done)
        return np.clip(done, 0.0, self.running_work, out=done)

    def delay_score(
        self, cost: float, inv: FloatArray, overtake_weight: float, remaining: bool = False
    ) -> FloatArray:
        """Per device (``inv``: 1/speed, ``inf`` where unusable): when an item of ``cost`` placed
        now would finish, plus ``overtake_weight`` times the delay it adds to the queued items it
        passes.

        ``remaining``: count only what is left of the running items (``elapsed_work``) rather
        than their whole cost. The whole cost is the default: it is what the queue order and the
        performance model are calibrated with, and it costs no extra vector operations.

        FIFO queues: ``(outstanding + cost) / speed``. Size-ordered queues: the item waits only
        for the running items and the queued ones of its size class or smaller (aging is not
        modelled: it only moves old items forward), and pushes each larger one back by its own
        service time; counting that keeps small items from crowding the fast devices that the
        large ones need (weight 1 is the total latency the placement adds; more favours the
        large).

        A device of speed ``s`` running ``k`` items at once (``parallel``, by default its slots)
        runs each at ``s / k``, so an item never finishes sooner than its own service time
        ``cost × k / s``, however idle the device: on an idle many-slot device the work-ahead
        sum alone would promise ``k`` times too soon.

        A free item (cost 0) would finish at once on every idle device: ties are broken by the
        items in flight, so that free items spread instead of all landing on the first
        device."""
        if self.kernel is None:
            return self._delay_numpy(cost, inv, overtake_weight, remaining)
        score = np.empty(self.n)
        self.soonest(cost, inv, overtake_weight, remaining, score)
        return score

    def soonest(
        self,
        cost: float,
        inv: FloatArray,
        overtake_weight: float,
        remaining: bool = False,
        out: FloatArray | None = None,
    ) -> int | None:
        """The position of the lowest ``delay_score`` (the first of equals), or ``None`` when no
        device's is finite: ``shortest_expected_delay``'s pick, one pass with the kernel.
        ``out``: the kernel writes the scores there too."""
        if self.kernel is None:
            score = self._delay_numpy(cost, inv, overtake_weight, remaining)
            i = int(score.argmin())
            return i if score[i] < np.inf else None
        if not self.size_order:
            base, sums, k = self.outstanding, None, 0
        elif not self.queued:
            base, sums, k = self.running_work, None, 0
        else:
            base, sums = self.running_work, self.queued_sums
            k = self.size_class(cost) + 1
        best: int = self.kernel.delay(
            self._scratch if out is None else out,
            base,
            inv,
            sums,
            k,
            self.elapsed_work() if remaining else None,
            self.parallel if self.multi_slot else None,
            self.in_flight,
            cost,
            overtake_weight,
        )
        return best if best >= 0 else None

    def _delay_numpy(
        self, cost: float, inv: FloatArray, overtake_weight: float, remaining: bool
    ) -> FloatArray:
        """``delay_score`` in numpy: what the kernel computes, operation for operation."""
        if not self.size_order:
            score: FloatArray = self.outstanding + cost
        elif not self.queued:
            score = self.running_work + cost  # no queue anywhere: nothing to wait for or pass
        else:
            # running + queued work ahead + cost × (1 + weight × passed), in place: this runs
            # for every item placed.
            k = self.size_class(cost) + 1
            score = self.queued_from[k] * (cost * overtake_weight)
            score += self.running_work
            score += self.queued_below[k]
            score += cost
        if remaining:
            score -= self.elapsed_work()
        if cost == 0:
            # Nothing ahead × inf is NaN, which argmin would pick: unusable stays inf.
            with np.errstate(invalid="ignore"):
                score *= inv
            return np.where(np.isinf(inv), np.inf, score + self.in_flight * _TIE)
        score *= inv
        if self.multi_slot:
            np.maximum(score, self.parallel * (cost * inv), out=score)
        return score

    def delay_at(self, index: int, cost: float, inv: float, overtake_weight: float) -> float:
        """``delay_score`` on one device, for policies that compare a few sampled devices."""
        if cost == 0 and inv == np.inf:
            return np.inf  # 0 × inf would be NaN
        tie = _TIE * float(self.in_flight[index]) if cost == 0 else 0.0
        if not self.size_order:
            delay = (float(self.outstanding[index]) + cost) * inv
        else:
            k = self.size_class(cost) + 1
            ahead = float(self.running_work[index]) + float(self.queued_below[k, index])
            passed = float(self.queued_from[k, index])
            delay = (ahead + cost * (1.0 + overtake_weight * passed)) * inv
        return max(delay, cost * int(self.parallel[index]) * inv) + tie

    def expected_delay(self, kind: str, cost: float) -> FloatArray:
        """Seconds until an item of ``cost`` placed now would finish on each device (or ``inf``),
        given the order of the device queues."""
        return self.delay_score(cost, self.inv_speed(kind), 0.0)
