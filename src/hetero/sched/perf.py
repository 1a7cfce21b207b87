"""``PerfModel``: how fast each device does each kind of work.

The prior comes from the catalog — dense TFLOPS of the dtype in use for compute-bound work, memory
bandwidth for memory-bound work — relative to a V100 (speed 1.0) and times ``unit_rate`` (work
units per second of a speed-1.0 device). Observed completions correct it online with an EWMA.
Speeds live in numpy arrays, one per kind of work, so policies rank all devices in one vector
operation; ``inv_speed`` holds ``1/speed`` with ``inf`` for devices that may not be used.

The catalog knows speed *ratios*; what one work unit costs in seconds is the user's (a task
without a declared cost, tokens of an unknown model, real hardware beside its datasheet). So a
device's first completion sets its speed outright, and every device not yet measured keeps its
catalog ratio to the measured ones (the geometric mean of first measurements over priors): a
slow device that finishes its first item late is not left at a prior in other units meanwhile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hetero.devices.spec import REFERENCE_TFLOPS, Device
from hetero.errors import ConfigError

__all__ = ["REFERENCE_BANDWIDTH_GBS", "PerfModel"]

# How far the fleet's unit may move before the devices not measured yet move with it.
_UNIT_TOLERANCE = 0.01

#: Memory bandwidth of a V100 (GB/s): speed 1.0 for memory-bound work.
REFERENCE_BANDWIDTH_GBS = 900.0

FloatArray = npt.NDArray[np.float64]

# Observed speeds at or below this (a work unit taking over 30 years) teach nothing: their
# inverse would overflow the policies' arithmetic.
_MIN_SPEED = 1e-9


@dataclass(slots=True)
class _Unit:
    """Measured over prior speed for one kind of work: the geometric mean over the devices'
    first measurements (the seconds a work unit really takes, relative to the catalog's
    guess), and the value the devices not measured yet were last moved to."""

    log_sum: float = 0.0
    count: int = 0
    applied: float = 1.0

    def add(self, ratio: float) -> None:
        self.log_sum += math.log(ratio)
        self.count += 1

    @property
    def value(self) -> float:
        return math.exp(self.log_sum / self.count) if self.count else 1.0


class PerfModel:
    """Speed per (device, kind of work), prior from the catalog, corrected by observation."""

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        dtype: str = "fp16",
        memory_bound_kinds: Iterable[str] = ("decode",),
        unit_rate: float = 1.0,
        alpha: float = 0.2,
        batch_table: Mapping[str, int] | None = None,
    ) -> None:
        if not 0 < alpha <= 1:
            raise ConfigError(f"PerfModel alpha must be in (0, 1], got {alpha!r}")
        if not unit_rate > 0:
            raise ConfigError(f"PerfModel unit_rate must be > 0, got {unit_rate!r}")
        self.devices = list(devices)
        self.dtype = dtype
        self.memory_bound_kinds = frozenset(memory_bound_kinds)
        self.unit_rate = unit_rate
        self.alpha = alpha
        self.batch_table = dict(batch_table or {})
        self._usable = np.ones(len(self.devices), dtype=bool)
        self._scale = np.ones(len(self.devices))  # of the priors, by rescale
        self._speed: dict[str, FloatArray] = {}
        self._prior: dict[str, FloatArray] = {}  # catalog priors per kind (without _scale)
        # Per kind, whether each device has completed an item (a list: read per completion),
        # the same negated as an array (to move the unmeasured devices at once), and the unit.
        self._measured: dict[str, list[bool]] = {}
        self._unmeasured: dict[str, npt.NDArray[np.bool_]] = {}
        self._units: dict[str, _Unit] = {}
        self._inv: dict[str, FloatArray] = {}
        self._fastest: dict[str, float] = {}  # min of _inv per kind, dropped when _inv changes
        #: Counts changes to any speed, so a reader can tell cheaply that its copy is stale.
        self.changes = 0

    def prior(self, device: Device, kind: str) -> float:
        """Catalog speed of ``device`` for ``kind`` in work units per second. A kind
        ``BASE:DETAIL`` (one task's own row, ``TaskOptions.speed_kind``) is bound as ``BASE``
        is."""
        if device.speed_override is not None:
            relative = device.speed_override
        elif kind.partition(":")[0] in self.memory_bound_kinds:
            relative = device.spec.memory_bandwidth_gbs / REFERENCE_BANDWIDTH_GBS
        else:
            relative = device.spec.peak_tflops(self.dtype) / REFERENCE_TFLOPS
        # A device with no published figure still gets a small positive speed, so it is last
        # choice rather than a division by zero.
        return max(relative, 1e-6) * self.unit_rate

    def speed(self, kind: str = "default") -> FloatArray:
        """Speeds of all devices for ``kind`` (a live array: read it, do not write it)."""
        arr = self._speed.get(kind)
        if arr is None:
            prior = np.array([self.prior(d, kind) for d in self.devices], dtype=np.float64)
            self._prior[kind] = prior
            self._measured[kind] = [False] * len(self.devices)
            self._unmeasured[kind] = np.ones(len(self.devices), dtype=bool)
            self._units[kind] = _Unit()
            arr = prior * self._scale
            self._speed[kind] = arr
            self._inv[kind] = np.where(self._usable, 1.0 / arr, np.inf)
        return arr

    def inv_speed(self, kind: str = "default") -> FloatArray:
        """``1/speed`` per device for ``kind``; ``inf`` where the device may not be used."""
        inv = self._inv.get(kind)
        if inv is None:
            self.speed(kind)
            inv = self._inv[kind]
        return inv

    def fastest_inv(self, kind: str = "default") -> float:
        """``1/speed`` of the fastest usable device for ``kind`` (``inf`` if none is usable)."""
        inv = self._fastest.get(kind)
        if inv is None:
            inv = self._fastest[kind] = float(self.inv_speed(kind).min())
        return inv

    def add(self, device: Device) -> int:
        """A device joins the fleet: its catalog prior for every kind known so far."""
        self.devices.append(device)
        self._usable = np.append(self._usable, True)
        self._scale = np.append(self._scale, 1.0)
        for kind, arr in self._speed.items():
            prior = self.prior(device, kind)
            self._prior[kind] = np.append(self._prior[kind], prior)
            self._measured[kind].append(False)
            self._unmeasured[kind] = np.append(self._unmeasured[kind], True)
            speed = prior * self._units[kind].applied
            self._speed[kind] = np.append(arr, speed)
            self._inv[kind] = np.append(self._inv[kind], 1.0 / speed)
        self._fastest.clear()
        self.changes += 1
        return len(self.devices) - 1

    def rescale(self, index: int, factor: float) -> None:
        """Multiply device ``index``'s speed for every kind by ``factor`` (its slots changed:
        each item's own speed stays, the device's throughput follows the slots)."""
        if not factor > 0 or not math.isfinite(factor):
            raise ValueError(
                f"PerfModel rescale factor must be a finite number > 0, got {factor!r}"
            )
        self._scale[index] *= factor
        for kind, arr in self._speed.items():
            arr[index] *= factor
            if self._usable[index]:
                self._inv[kind][index] = 1.0 / arr[index]
        self._fastest.clear()
        self.changes += 1

    def set_usable(self, index: int, usable: bool) -> None:
        self._usable[index] = usable
        for kind, arr in self._speed.items():
            self._inv[kind][index] = 1.0 / arr[index] if usable else np.inf
        self._fastest.clear()
        self.changes += 1

    def observe(
        self, index: int, kind: str, work: float, seconds: float, concurrency: int = 1
    ) -> None:
        """Fold one completion into the estimate: ``work`` units took ``seconds`` while the device
        ran ``concurrency`` items at once (so the device did ``work × concurrency / seconds``)."""
        if seconds <= 0 or work <= 0:
            return
        arr = self._speed.get(kind)
        if arr is None:
            arr = self.speed(kind)
        observed = work * concurrency / seconds
        if not _MIN_SPEED < observed < math.inf:
            return  # a duration too short to time, or an item too small to weigh
        if not self._measured[kind][index]:
            self._first(index, kind, observed)
            return
        current = float(arr[index])
        if abs(observed - current) <= 1e-9 * current:
            return  # already right: skip the array writes (the simulator's common case)
        value = current + self.alpha * (observed - current)
        arr[index] = value
        self.changes += 1
        if self._usable[index]:
            self._inv[kind][index] = 1.0 / value
            self._fastest.pop(kind, None)

    def _first(self, index: int, kind: str, observed: float) -> None:
        """Device ``index``'s first completion of ``kind``: its speed is what it measured, and
        the devices not measured yet move to their prior times the fleet's unit. O(1), and
        O(devices) only when the unit moved by more than ``_UNIT_TOLERANCE`` since the
        unmeasured devices last moved: on a large fleet, every device's first completion
        would otherwise cost a pass over the fleet."""
        arr = self._speed[kind]
        arr[index] = observed
        self._measured[kind][index] = True
        rest = self._unmeasured[kind]
        rest[index] = False
        unit = self._units[kind]
        unit.add(observed / float(self._prior[kind][index] * self._scale[index]))
        inv = self._inv[kind]  # in place: readers hold the live arrays
        if unit.count == 1 or abs(unit.value / unit.applied - 1.0) > _UNIT_TOLERANCE:
            unit.applied = unit.value
            if rest.any():
                arr[rest] = self._prior[kind][rest] * self._scale[rest] * unit.applied
            np.divide(1.0, arr, out=inv)
            inv[~self._usable] = np.inf
        elif self._usable[index]:
            inv[index] = 1.0 / observed
        self._fastest.pop(kind, None)
        self.changes += 1

    def expected_seconds(self, index: int, work: float, kind: str = "default") -> float:
        return work / float(self.speed(kind)[index])

    def batch_sizes(
        self,
        global_batch: int,
        sample_bytes: int = 0,
        kind: str = "default",
        free_memory: Sequence[int] | None = None,
    ) -> list[int]:
        """Split ``global_batch`` over the devices in proportion to speed, each capped by what its
        free memory holds (``sample_bytes`` per sample) or by the static ``batch_table``.

        Uses largest-remainder rounding and hands what a capped device cannot take to the others,
        so the sizes sum to ``global_batch`` unless the whole fleet cannot hold it
        (then ``ValueError``).
        """
        if global_batch < 0:
            raise ValueError(f"global_batch must be >= 0, got {global_batch}")
        n = len(self.devices)
        caps = np.full(n, global_batch, dtype=np.int64)
        for i, d in enumerate(self.devices):
            if d.id in self.batch_table:
                caps[i] = self.batch_table[d.id]
            elif d.model in self.batch_table:
                caps[i] = self.batch_table[d.model]
            elif sample_bytes > 0:
                free = free_memory[i] if free_memory is not None else d.state.memory_free
                caps[i] = free // sample_bytes
            if not self._usable[i]:
                caps[i] = 0
        if int(caps.sum()) < global_batch:
            raise ValueError(
                f"global batch {global_batch} does not fit: the devices hold at most "
                f"{int(caps.sum())} samples ({sample_bytes} bytes each)"
            )
        sizes = np.zeros(n, dtype=np.int64)
        speed = self.speed(kind)
        left = global_batch
        open_ = caps > 0
        while left > 0:
            share = np.where(open_, speed, 0.0)
            ideal = share / share.sum() * left
            take = np.minimum(np.floor(ideal).astype(np.int64), caps - sizes)
            rest = left - int(take.sum())
            # Largest remainders get the leftover samples, one each, where room remains.
            order = np.argsort(-(ideal - np.floor(ideal)), kind="stable")
            for i in order:
                if rest == 0:
                    break
                if open_[i] and sizes[i] + take[i] < caps[i]:
                    take[i] += 1
                    rest -= 1
            sizes += take
            left = global_batch - int(sizes.sum())
            open_ = open_ & (sizes < caps)
        return [int(s) for s in sizes]
