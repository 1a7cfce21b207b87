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

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import REFERENCE_TFLOPS, Device
from hetero.errors import ConfigError

__all__ = [
    "REFERENCE_BANDWIDTH_GBS",
    "BatchTable",
    "PerfModel",
    "batch_key_kind",
    "model_families",
]

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


def model_families(model: str) -> list[str]:
    """The families a model name belongs to, widest first: ``H100-SXM-80GB`` is an ``H100``
    and an ``H100-SXM``. A MIG slice (``A100-80GB/3g.40gb``) belongs to none: it holds a
    fraction of its GPU's memory, so what suits the whole GPU does not suit it."""
    if "/" in model:
        return []
    parts = model.split("-")
    return ["-".join(parts[:k]) for k in range(1, len(parts))]


def batch_key_kind(key: str) -> tuple[str, str] | None:
    """What ``key`` of a batch table names in the catalog: ``("model", CANONICAL)`` for a
    model's canonical name, ``("family", NAME)`` for a family of models (``A100``: every A100
    variant), ``("model", CANONICAL)`` for another name the catalog knows (a driver's name, a
    MIG slice); ``None`` for a name the catalog does not know. A family wins over an alias,
    so ``H100`` (also a driver's name of the SXM part) means every H100."""
    catalog = get_catalog()
    folded = key.strip().casefold()
    for name in catalog.names:
        if name.casefold() == folded:
            return ("model", name)
    if any(folded in (f.casefold() for f in model_families(name)) for name in catalog.names):
        return ("family", key.strip())
    if key in catalog:
        return ("model", catalog.get(key).model)
    return None


@dataclass(frozen=True, slots=True)
class BatchTable:
    """A static batch table (``scheduler.batch_sizes``) resolved against a fleet: sizes by
    device id, by model and by family (case-folded). The most exact key wins for a device:
    its id, then its model, then its narrowest family."""

    by_id: Mapping[str, int]
    by_model: Mapping[str, int]
    by_family: Mapping[str, int]

    @classmethod
    def resolve(
        cls,
        table: Mapping[str, int],
        devices: Sequence[Device],
        field: str = "scheduler.batch_sizes",
    ) -> BatchTable:
        """Classify every key of ``table``; ``ConfigError`` naming each key that matches no
        device id of ``devices`` nor a catalog (or fleet) model or family, with the candidates,
        and each pair of keys that name the same model or family."""
        ids = {d.id for d in devices}
        fleet_models = {d.model.casefold(): d.model for d in devices}
        fleet_families = {f.casefold(): f for d in devices for f in model_families(d.model)}
        by_id: dict[str, int] = {}
        by_model: dict[str, int] = {}
        by_family: dict[str, int] = {}
        named: dict[str, str] = {}  # ("model:"|"family:") + folded name -> the key that named it
        problems: list[tuple[str, str]] = []
        for key, size in table.items():
            if key in ids:
                by_id[key] = size
                continue
            kind = batch_key_kind(key)
            folded = key.strip().casefold()
            if kind is None and folded in fleet_models:  # a model the catalog lacks
                kind = ("model", fleet_models[folded])
            elif kind is None and folded in fleet_families:
                kind = ("family", fleet_families[folded])
            if kind is None:
                problems.append((f"{field}.{key}", _unmatched(key, devices)))
                continue
            what, name = kind
            slot = f"{what}:{name.casefold()}"
            if slot in named:
                problems.append(
                    (
                        f"{field}.{key}",
                        f"names the same {what} {name} as key {named[slot]!r}; keep one",
                    )
                )
                continue
            named[slot] = key
            (by_model if what == "model" else by_family)[name.casefold()] = size
        if problems:
            raise ConfigError(problems)
        return cls(by_id, by_model, by_family)

    def cap(self, device: Device) -> int | None:
        """The static batch size of ``device`` (``None``: the table does not name it)."""
        size = self.by_id.get(device.id)
        if size is None:
            size = self.by_model.get(device.model.casefold())
        if size is None:
            for family in reversed(model_families(device.model)):  # narrowest first
                size = self.by_family.get(family.casefold())
                if size is not None:
                    break
        return size


def _shown(names: Iterable[str], most: int = 8) -> str:
    names = list(dict.fromkeys(names))
    more = f", … ({len(names) - most} more)" if len(names) > most else ""
    return ", ".join(names[:most]) + more or "none"


def _unmatched(key: str, devices: Sequence[Device]) -> str:
    close = get_catalog().closest(key)
    hint = f"; closest catalog names: {', '.join(close)}" if close else ""
    return (
        f"{key!r} matches no device and no catalog model or family{hint}; allowed: a device "
        f"id ({_shown(d.id for d in devices)}), a model ({_shown(d.model for d in devices)}) "
        f"or a family ({_shown(f for d in devices for f in model_families(d.model)[:1])}) "
        "of this fleet, or any catalog model or family (`hetero catalog list`)"
    )


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
        # Resolved once against the fleet (an unknown key is refused here, not ignored); a
        # device that joins later is matched by the same keys.
        self._batch = BatchTable.resolve(self.batch_table, self.devices)
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
        free memory holds (``sample_bytes`` per sample) or by the static ``batch_table`` (keyed
        by device id, catalog model or family: ``BatchTable``).

        Uses largest-remainder rounding and hands what a capped device cannot take to the others,
        so the sizes sum to ``global_batch`` unless the whole fleet cannot hold it
        (then ``ValueError``).
        """
        if global_batch < 0:
            raise ValueError(f"global_batch must be >= 0, got {global_batch}")
        n = len(self.devices)
        caps = np.full(n, global_batch, dtype=np.int64)
        for i, d in enumerate(self.devices):
            static = self._batch.cap(d)
            if static is not None:
                caps[i] = static
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
