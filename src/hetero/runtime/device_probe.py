"""Device probes: what each device is doing now, read at once or polled on a background
thread.

``sample_device`` reads one device: a real GPU through NVML, the CPU through psutil, an emulated
device through its worker process. ``Monitor`` polls a fleet every ``interval`` seconds.
``MemoryPressure`` is a pure rule over samples, for the engine to apply.
A failing query leaves a field ``None``; sampling never raises for a device's sake.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import psutil

from hetero.devices.discovery import (
    bus_id_key,
    mig_slices,
    nvml_text,
    optional_module,
    visible_gpu_indices,
)
from hetero.devices.spec import Device, DeviceKind
from hetero.runtime.procs import tree_rss

__all__ = [
    "DeviceSample",
    "MemoryPressure",
    "Monitor",
    "memory_usage",
    "sample_device",
    "sample_devices",
    "usage_of",
]

log = logging.getLogger("hetero.monitor")
T = TypeVar("T")

#: ``psutil.sensors_temperatures()`` keys of CPU package sensors, most specific first.
_CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "acpitz")


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One reading of one device. ``None``: not measured (no sensor, query unsupported)."""

    device_id: str
    time: float  # time.monotonic()
    utilization: float | None  # percent, 0-100
    memory_used: int | None  # bytes
    memory_total: int | None  # bytes, capped by the device's memory_limit
    temperature: float | None  # °C
    errors: int | None  # uncorrected ECC errors since the driver loaded
    rss: int | None  # bytes resident in the device's worker and the processes its tasks started
    healthy: bool


def sample_device(device: Device, pid: int | None = None, nvml: Any | None = None) -> DeviceSample:
    """Read ``device`` now; ``pid`` is its worker process, if it has one.

    ``nvml`` replaces the ``pynvml`` module (a ``FakeNVML`` in tests). A device is unhealthy when
    its worker has died, its GPU has left NVML, or the GPU reports uncorrected ECC errors.
    """
    return sample_devices([(device, pid)], nvml)[0]


def sample_devices(
    targets: Iterable[tuple[Device, int | None]], nvml: Any | None = None
) -> list[DeviceSample]:
    """``sample_device`` for each ``(device, pid)``, opening NVML once for all of them."""
    targets = list(targets)
    real_gpus = any(d.kind is DeviceKind.GPU and not d.emulated for d, _ in targets)
    module = nvml if nvml is not None else _default_nvml()
    opened = _open_gpus(module) if real_gpus and module is not None else contextlib.nullcontext()
    with opened as gpus:
        return [_sample(device, pid, gpus) for device, pid in targets]


def memory_usage(
    devices: Iterable[Device], pids: Mapping[str, int], nvml: Any | None = None
) -> dict[str, dict[str, int]]:
    """``{device id: {"used", "free", "total"}}`` in bytes, ``pids`` giving each device's worker.

    A device whose memory cannot be read counts its configured memory, none of it used."""
    devices = list(devices)
    samples = sample_devices([(d, pids.get(d.id)) for d in devices], nvml)
    return {d.id: usage_of(d, s) for d, s in zip(devices, samples, strict=True)}


def usage_of(device: Device, sample: DeviceSample) -> dict[str, int]:
    """``{"used", "free", "total"}`` bytes of one reading (the configured memory, none of it
    used, where the reading has none)."""
    total = sample.memory_total if sample.memory_total is not None else device.memory_bytes
    used = sample.memory_used or 0
    return {"used": used, "free": max(0, total - used), "total": total}


@functools.cache
def _default_nvml() -> Any | None:
    # Looked up once: a missing pynvml stays missing, and a monitor polls every second.
    return optional_module("pynvml")


def _query(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except Exception as exc:  # NVMLError (not supported, GPU lost) or an older pynvml
        log.debug("query failed: %s", exc)
        return None


def _capped(total: int | None, device: Device) -> int | None:
    if total is None or device.memory_limit is None:
        return total
    return min(total, device.memory_limit)


def _sample(device: Device, pid: int | None, gpus: _Gpus | None) -> DeviceSample:
    alive, cpu, rss = _process_stats(pid) if pid is not None else (True, None, None)
    utilization: float | None = None
    used: int | None = None
    total: int | None = None
    temperature: float | None = None
    errors: int | None = None
    found = True
    if device.emulated:
        # The worker stands for the device: its CPU share (of its cores) and its memory.
        if cpu is not None:
            utilization = min(100.0, cpu / (device.cores or 1))
        used, total = rss, device.memory_bytes
    elif device.kind is DeviceKind.CPU:
        utilization = psutil.cpu_percent(interval=None)
        memory = psutil.virtual_memory()
        used, total = memory.total - memory.available, _capped(memory.total, device)
        temperature = _cpu_temperature()
    elif device.kind is DeviceKind.GPU and gpus is not None:
        handle = gpus.find(device)
        found = handle is not None
        if handle is not None:
            nvml = gpus.nvml
            info = _query(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
            rates = _query(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
            temp = _query(lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
            ecc = _query(
                lambda: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
            utilization = float(rates.gpu) if rates is not None else None
            if info is not None:
                used, total = int(info.used), _capped(int(info.total), device)
            temperature = float(temp) if temp is not None else None
            errors = int(ecc) if ecc is not None else None
    return DeviceSample(
        device_id=device.id,
        time=time.monotonic(),
        utilization=utilization,
        memory_used=used,
        memory_total=total,
        temperature=temperature,
        errors=errors,
        rss=rss,
        healthy=alive and found and not errors,
    )


def _cpu_temperature() -> float | None:
    read = getattr(psutil, "sensors_temperatures", None)  # Linux and FreeBSD only
    if read is None:
        return None
    try:
        sensors = read()
    except Exception as exc:  # an unreadable /sys entry is "no sensor"
        log.debug("sensors_temperatures failed: %s", exc)
        return None
    for name in _CPU_SENSORS:
        readings = [t.current for t in sensors.get(name, ()) if t.current]
        if readings:
            return float(max(readings))
    return None


# psutil measures a process's CPU share between two calls on the same Process object, so the
# objects are kept across samples; is_running() notices a pid reused by another process.
_processes: dict[int, psutil.Process] = {}
_processes_lock = threading.Lock()


def _process_stats(pid: int) -> tuple[bool, float | None, int | None]:
    """``(alive, cpu percent, rss)`` of ``pid``; cpu is ``None`` on the first look at it. The
    rss counts the processes under ``pid`` too: what a task starts is its device's load."""
    try:
        with _processes_lock:
            proc = _processes.get(pid)
            first = proc is None or not proc.is_running()
            if proc is None or first:
                # A new worker, often replacing one that died: forget the exited ones.
                for gone in [p for p, known in _processes.items() if not known.is_running()]:
                    del _processes[gone]
                proc = _processes[pid] = psutil.Process(pid)
        with proc.oneshot():
            if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped
                raise psutil.NoSuchProcess(pid)
            cpu = proc.cpu_percent(interval=None)
            rss = tree_rss(proc)
        return True, None if first else cpu, rss
    except psutil.NoSuchProcess:
        with _processes_lock:
            _processes.pop(pid, None)
        return False, None, None
    except psutil.AccessDenied:  # another user's process: alive, but not ours to read
        return True, None, None


class _Gpus:
    """The GPUs NVML lists, for finding a device's handle as discovery numbered it."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles: list[Any] = []
        self.listed: list[tuple[int, str, str]] = []  # (nvml index, uuid, pci bus id)
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _query(functools.partial(nvml.nvmlDeviceGetUUID, handle))
            pci = _query(functools.partial(nvml.nvmlDeviceGetPciInfo, handle))
            self.handles.append(handle)
            self.listed.append(
                (i, nvml_text(uuid) if uuid else "", nvml_text(pci.busId) if pci else "")
            )
        # MIG slices, by UUID: each is a device, and its GPU is not.
        self.slices = {
            uuid.lower(): mig
            for handle in self.handles
            for uuid, mig in (mig_slices(nvml, handle) or {}).items()
        }

    def find(self, device: Device) -> Any | None:
        """The handle of ``device``: by UUID, else PCI bus id, else its CUDA index."""
        if device.uuid:
            wanted = device.uuid.lower()
            return next(
                (self.handles[i] for i, u, _ in self.listed if u.lower() == wanted),
                self.slices.get(wanted),
            )
        if device.pci_bus_id:
            key = bus_id_key(device.pci_bus_id)
            return next(
                (self.handles[i] for i, _, b in self.listed if b and bus_id_key(b) == key), None
            )
        if device.local_index is None:
            return None
        order = visible_gpu_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), self.listed)
        if not 0 <= device.local_index < len(order):
            return None
        return self.handles[order[device.local_index]]


@contextlib.contextmanager
def _nvml_session(nvml: Any) -> Iterator[bool]:
    """NVML initialised for the ``with`` block; yields ``False`` when it cannot be (no driver)."""
    try:
        nvml.nvmlInit()
    except Exception as exc:
        log.debug("NVML unavailable: %s", exc)
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


@contextlib.contextmanager
def _open_gpus(nvml: Any) -> Iterator[_Gpus | None]:
    """The GPUs for one round of samples; ``None`` when NVML cannot list them."""
    with _nvml_session(nvml) as ready:
        yield _query(lambda: _Gpus(nvml)) if ready else None


# --- the polling thread ---------------------------------------------------------------------


class Monitor:
    """Samples devices every ``interval`` seconds on a daemon thread.

    ``targets()`` returns the ``(device, worker pid or None)`` pairs to sample each time (the
    engine's devices change as workers restart); ``on_sample`` receives each round's samples. An
    exception in either is logged to ``hetero.monitor`` and the thread carries on.
    """

    def __init__(
        self,
        targets: Callable[[], Iterable[tuple[Device, int | None]]],
        on_sample: Callable[[list[DeviceSample]], None],
        *,
        interval: float = 1.0,
        nvml: Any | None = None,
    ) -> None:
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = interval
        self._targets = targets
        self._on_sample = on_sample
        self._nvml = nvml
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start polling; the first round is sampled at once."""
        if self._thread is not None:
            raise RuntimeError("this Monitor was already started; make a new one")
        self._thread = threading.Thread(target=self._run, name="hetero-monitor", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling and wait for the thread (at most ``timeout`` seconds)."""
        self._stopping.set()
        thread = self._thread
        # A callback may stop its own monitor; joining itself would raise.
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        module = self._nvml if self._nvml is not None else _default_nvml()
        # NVML counts initialisations: holding one for the monitor's life makes each round's
        # init/shutdown a counter update instead of a full driver start-up.
        held = _nvml_session(module) if module is not None else contextlib.nullcontext()
        with held:
            while True:
                self._poll(module)
                if self._stopping.wait(self.interval):
                    return

    def _poll(self, nvml: Any | None) -> None:
        try:
            samples = sample_devices(self._targets(), nvml)
            self._on_sample(samples)
        except Exception:
            log.exception("device monitoring round failed; trying again in %gs", self.interval)


# --- rule over samples (pure) --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryPressure:
    """Flags a device whose used memory is above ``threshold`` × its total."""

    threshold: float = 0.95

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {self.threshold!r}")

    def is_high(self, used: int | None, total: int | None) -> bool:
        if used is None or not total or total <= 0:
            return False
        return used > self.threshold * total

    def pressured_devices(self, samples: Iterable[DeviceSample]) -> list[str]:
        """The ids of the samples that ``is_high`` flags, in order."""
        return [s.device_id for s in samples if self.is_high(s.memory_used, s.memory_total)]
