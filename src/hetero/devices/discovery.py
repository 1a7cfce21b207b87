"""What this machine has: the CPU (psutil) and NVIDIA GPUs (NVML), with torch as a fallback.

A missing driver or library is never an error: discovery then reports what it can (at least
the CPU). ``CUDA_VISIBLE_DEVICES`` is honoured as CUDA itself reads it. A GPU in MIG mode is not
itself a device: each of its MIG slices is (``hetero.devices.mig``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import os
import platform
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil

from hetero.devices.catalog import get_catalog
from hetero.devices.mig import compute_slices_of, measured_share, slice_spec, split_slice_name
from hetero.devices.spec import Device, DeviceKind, DeviceState

__all__ = [
    "bus_id_key",
    "discover_cpu",
    "discover_nvidia_gpus",
    "get_device_list",
    "mig_slices",
    "nvml_text",
    "optional_module",
    "visible_gpu_indices",
    "visible_gpus",
]

log = logging.getLogger("hetero.discovery")
T = TypeVar("T")

_MIB = 1024**2

#: One GPU as discovery lists it: ``(nvml index, uuid, pci bus id)``.
Listed = tuple[int, str, str]


def get_device_list(
    *,
    nvml: Any | None = None,
    torch_module: Any | None = None,
    environ: Mapping[str, str] | None = None,
    gpus: bool = True,
) -> list[Device]:
    """This machine's devices: the CPU first, then GPUs (none asked for when ``gpus`` is false).

    GPUs come from NVML; when it reports none, from torch (CUDA, ROCm, MPS, XPU), which is
    imported only where :func:`torch_may_see_gpus`. ``nvml`` and ``torch_module`` replace the
    real modules (a ``FakeNVML`` in tests); ``environ`` replaces ``os.environ``.
    """
    env = os.environ if environ is None else environ
    devices = [discover_cpu()]
    if not gpus:
        return devices
    module = nvml if nvml is not None else optional_module("pynvml")
    found = discover_nvidia_gpus(module, env) if module is not None else None
    if found is None:
        torch = torch_module
        if torch is None and torch_may_see_gpus():
            torch = optional_module("torch")
        found = _discover_torch(torch) if torch is not None else []
    return devices + found


def torch_may_see_gpus() -> bool:
    """Whether torch could find a GPU here that NVML does not report, judged without importing
    it (seconds and some 180 MiB): torch is already imported, or the machine has a ROCm
    (``/dev/kfd``), NVIDIA (``/dev/nvidiactl``) or other render device (``/dev/dri``: Intel XPU),
    or is an Apple silicon Mac (MPS)."""
    if "torch" in sys.modules:
        return True
    if sys.platform == "darwin":
        return platform.machine() == "arm64"
    dri = Path("/dev/dri")
    return (
        Path("/dev/kfd").exists()
        or Path("/dev/nvidiactl").exists()
        or (dri.is_dir() and any(dri.glob("renderD*")))
    )


def optional_module(name: str) -> Any | None:
    """``import name``, or ``None`` when it is missing or broken (optional dependencies)."""
    try:
        return importlib.import_module(name)
    except Exception as exc:  # a broken optional install is "not available"
        log.debug("%s not available: %s", name, exc)
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "CPU"


def discover_cpu() -> Device:
    """The local CPU: model name, logical cores, memory and utilization."""
    name = _cpu_name()
    catalog = get_catalog()
    memory = psutil.virtual_memory()
    if name in catalog:
        spec = catalog.get(name)
    else:
        # Most CPU names are not in the catalog; the generic row under the real name is fine.
        log.debug("CPU %r not in the catalog; using the generic CPU spec", name)
        spec = dataclasses.replace(
            catalog.get("CPU"), model=name, aliases=(), memory_bytes=memory.total
        )
    state = DeviceState(
        memory_total=memory.total,
        memory_used=memory.total - memory.available,
        utilization=psutil.cpu_percent(interval=None) / 100,
    )
    return Device(
        id="cpu:0", spec=spec, local_index=0, state=state, cores=psutil.cpu_count(logical=True) or 1
    )


def bus_id_key(bus_id: str) -> str:
    """``bus:device.function`` of a PCI bus id, lower case: NVML writes an 8-digit domain
    (``00000000:3B:00.0``), users write 4 digits or none."""
    return ":".join(bus_id.strip().lower().split(":")[-2:])


def visible_gpus(
    spec: str | None, gpus: list[Listed], slices: Mapping[str, int] | None = None
) -> list[tuple[int, str | None]]:
    """What ``CUDA_VISIBLE_DEVICES=spec`` leaves visible, in CUDA's order: ``(index, None)`` for
    a whole GPU, ``(index, uuid)`` for the MIG slice ``uuid`` of GPU ``index``.

    ``gpus`` lists ``(nvml index, uuid, pci bus id)``; ``slices`` maps each MIG slice's UUID to
    its GPU's index (``None``: whole GPUs only are listed). Entries are indices, UUIDs (or unique
    prefixes, with or without ``GPU-``), PCI bus ids or MIG UUIDs (``MIG-...``); like CUDA, the
    first invalid entry ends the list, with a warning naming it.
    """
    if spec is None:
        return [(g[0], None) for g in gpus]
    spec = spec.strip()
    if spec in ("", "-1", "NoDevFiles"):
        return []
    chosen: list[tuple[int, str | None]] = []
    for raw in spec.split(","):
        entry = raw.strip()
        found = _match_entry(entry, gpus, slices)
        if found is None:
            _warn_unmatched(entry, slices)
            break
        if found not in chosen:
            chosen.append(found)
    return chosen


def visible_gpu_indices(spec: str | None, gpus: list[Listed]) -> list[int]:
    """NVML indices of the whole GPUs visible under ``CUDA_VISIBLE_DEVICES=spec``, in CUDA's
    order (see :func:`visible_gpus`; a MIG entry ends the list here)."""
    return [index for index, _ in visible_gpus(spec, gpus)]


def _match_entry(
    entry: str, gpus: list[Listed], slices: Mapping[str, int] | None
) -> tuple[int, str | None] | None:
    low = entry.lower()
    if low.isdigit():
        return (int(low), None) if any(g[0] == int(low) for g in gpus) else None
    if low.startswith("mig-"):
        uuid = _unique_prefix(low, {u.lower(): u for u in slices or {}})
        return None if uuid is None or slices is None else (slices[uuid], uuid)
    if ":" in low:
        key = bus_id_key(low)
        return next(((g[0], None) for g in gpus if g[2] and bus_id_key(g[2]) == key), None)
    index = _unique_prefix(
        low.removeprefix("gpu-"), {g[1].lower().removeprefix("gpu-"): g[0] for g in gpus}
    )
    return None if index is None else (index, None)


def _unique_prefix(prefix: str, named: Mapping[str, T]) -> T | None:
    """The value of the one name in ``named`` that begins with ``prefix``; ``None`` if none or
    several do."""
    matches = [value for name, value in named.items() if name.startswith(prefix)]
    return matches[0] if prefix and len(matches) == 1 else None


def _warn_unmatched(entry: str, slices: Mapping[str, int] | None) -> None:
    if not entry.lower().startswith("mig-"):
        log.warning("CUDA_VISIBLE_DEVICES: %r matches no GPU; ignoring it and what follows", entry)
    elif slices is None:
        log.warning(
            "CUDA_VISIBLE_DEVICES: %r is a MIG slice, and only whole GPUs are listed here; "
            "ignoring it and what follows",
            entry,
        )
    else:
        log.warning(
            "CUDA_VISIBLE_DEVICES: MIG slice %r is on no GPU of this machine (destroyed, or "
            "re-created under a new UUID); ignoring it and what follows. MIG slices here: %s",
            entry,
            ", ".join(slices) or "none",
        )


def nvml_text(value: Any) -> str:
    """NVML strings are ``bytes`` in older pynvml releases and ``str`` in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_nvidia_gpus(nvml: Any, environ: Mapping[str, str]) -> list[Device] | None:
    """The NVIDIA GPUs, and the MIG slices of those in MIG mode, that ``CUDA_VISIBLE_DEVICES``
    leaves visible, through an NVML module.

    ``None`` when NVML has no GPUs to report (driver missing, none installed, or NVML failing),
    so the caller may ask torch instead; ``[]`` when GPUs exist but all are hidden, which torch
    would honour too. A GPU named in ``CUDA_VISIBLE_DEVICES`` stands for all of its slices."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError or a loader error: no NVIDIA GPUs
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        if not handles:
            return None
        listed: list[Listed] = []
        for i, h in enumerate(handles):
            uuid = _query(nvml.nvmlDeviceGetUUID, h)
            pci = _query(nvml.nvmlDeviceGetPciInfo, h)
            listed.append((i, nvml_text(uuid) if uuid else "", nvml_text(pci.busId) if pci else ""))
        migs = [mig_slices(nvml, h) for h in handles]
        owners = {uuid: i for i, found in enumerate(migs) for uuid in found or {}}
        chosen = visible_gpus(environ.get("CUDA_VISIBLE_DEVICES"), listed, owners)
        devices: list[Device] = []
        for index, slice_ in _expand(chosen, migs):
            ordinal = len(devices)
            if slice_ is None:
                devices.append(_whole_gpu(nvml, handles[index], listed[index], ordinal))
            else:
                devices.append(_mig_device(nvml, handles[index], slice_, listed[index], ordinal))
        return devices
    except Exception as exc:  # a driver failing mid-way is not the caller's error
        log.warning("NVML failed while listing GPUs (%s); continuing without them", exc)
        return None
    finally:
        with contextlib.suppress(Exception):  # shutting down after a failure
            nvml.nvmlShutdown()


def _query(fn: Callable[..., T], *args: Any) -> T | None:
    try:
        return fn(*args)
    except Exception as exc:  # unsupported queries leave a field empty
        log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), exc)
        return None


def mig_slices(nvml: Any, handle: Any) -> dict[str, Any] | None:
    """The MIG slices of a GPU by UUID, in NVML's order; ``None`` when it is not in MIG mode."""
    mode = _query(nvml.nvmlDeviceGetMigMode, handle)  # [current, pending]
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    found: dict[str, Any] = {}
    for k in range(_query(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0):
        mig = _query(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, k)  # an empty slot: None
        uuid = _query(nvml.nvmlDeviceGetUUID, mig) if mig is not None else None
        if uuid:
            found[nvml_text(uuid)] = mig
    return found


def _expand(
    chosen: list[tuple[int, str | None]], migs: list[dict[str, Any] | None]
) -> list[tuple[int, tuple[str, Any] | None]]:
    """``chosen`` as devices: ``(index, None)`` for a whole GPU, ``(index, (uuid, handle))`` for
    a slice; a GPU in MIG mode stands for all of its slices, and each slice comes once."""
    out: list[tuple[int, tuple[str, Any] | None]] = []
    for index, mig in chosen:
        slices = migs[index]
        if slices is None:
            wanted: list[tuple[int, tuple[str, Any] | None]] = [(index, None)]
        elif mig is not None:
            wanted = [(index, (mig, slices[mig]))]
        else:
            if not slices:
                log.warning("GPU %d is in MIG mode without MIG slices: nothing runs on it", index)
            wanted = [(index, item) for item in slices.items()]
        out.extend(w for w in wanted if w not in out)
    return out


def _whole_gpu(nvml: Any, h: Any, listed: Listed, ordinal: int) -> Device:
    name = nvml_text(_query(nvml.nvmlDeviceGetName, h) or "GPU")
    spec = get_catalog().resolve(name, DeviceKind.GPU)
    memory = _query(nvml.nvmlDeviceGetMemoryInfo, h)
    util = _query(nvml.nvmlDeviceGetUtilizationRates, h)
    temp = _query(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
    power = _query(nvml.nvmlDeviceGetPowerUsage, h)
    state = DeviceState(
        memory_total=int(memory.total) if memory else spec.memory_bytes,
        memory_used=int(memory.used) if memory else 0,
        utilization=util.gpu / 100 if util else 0.0,
        temperature_c=float(temp) if temp is not None else None,
        power_w=power / 1000 if power is not None else None,
    )
    _, uuid, bus = listed
    return Device(
        id=f"gpu:{ordinal}",
        spec=spec,
        local_index=ordinal,
        state=state,
        uuid=uuid or None,
        pci_bus_id=bus or None,
    )


def _mig_device(
    nvml: Any, parent: Any, slice_: tuple[str, Any], listed: Listed, ordinal: int
) -> Device:
    """The MIG slice ``slice_`` (its UUID and handle) as a device: its GPU's spec scaled by its
    share (SMs as NVML counts them, memory slices as the catalog records them), its own UUID and
    memory; its GPU's UUID as ``parent``, its GPU's bus id and temperature."""
    uuid, mig = slice_
    catalog = get_catalog()
    parent_spec = catalog.resolve(nvml_text(_query(nvml.nvmlDeviceGetName, parent) or "GPU"))
    attrs = _query(nvml.nvmlDeviceGetAttributes, mig)
    memory = _query(nvml.nvmlDeviceGetMemoryInfo, mig)
    parent_memory = _query(nvml.nvmlDeviceGetMemoryInfo, parent)
    total = int(memory.total) if memory else int(attrs.memorySizeMB) * _MIB if attrs else 0
    parts = split_slice_name(nvml_text(_query(nvml.nvmlDeviceGetName, mig) or ""))
    gpu_slices = int(attrs.gpuInstanceSliceCount) if attrs else 0
    # A driver that names no profile: the one its figures make.
    profile = parts[1] if parts else f"{gpu_slices}g.{round(total / 1024**3)}gb"
    share = measured_share(
        catalog.mig_layout(parent_spec.model),
        profile,
        sms=int(attrs.multiprocessorCount) if attrs else 0,
        gpu_slices=gpu_slices or compute_slices_of(profile),
        max_slices=_query(nvml.nvmlDeviceGetMaxMigDeviceCount, parent) or 7,
        memory_bytes=total,
        parent_memory=int(parent_memory.total) if parent_memory else parent_spec.memory_bytes,
    )
    util = _query(nvml.nvmlDeviceGetUtilizationRates, mig)  # most drivers: not for a slice
    temp = _query(nvml.nvmlDeviceGetTemperature, parent, nvml.NVML_TEMPERATURE_GPU)
    state = DeviceState(
        memory_total=total,
        memory_used=int(memory.used) if memory else 0,
        utilization=util.gpu / 100 if util else 0.0,
        temperature_c=float(temp) if temp is not None else None,
    )
    _, parent_uuid, bus = listed
    return Device(
        id=f"gpu:{ordinal}",
        spec=slice_spec(parent_spec, profile, share, total),
        local_index=ordinal,
        state=state,
        uuid=uuid,
        pci_bus_id=bus or None,
        parent=parent_uuid or None,
    )


def _discover_torch(torch: Any) -> list[Device]:
    """GPUs torch can see when NVML cannot: CUDA or ROCm builds, Apple MPS, Intel XPU."""
    catalog = get_catalog()
    devices: list[Device] = []
    try:
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                name = torch.cuda.get_device_name(i)
                spec = catalog.resolve(name, DeviceKind.GPU)
                if getattr(torch.version, "hip", None) and spec.model == name:
                    spec = dataclasses.replace(spec, vendor="AMD")
                devices.append(Device(id=f"gpu:{i}", spec=spec, local_index=i))
            return devices
        mps = getattr(getattr(torch, "backends", None), "mps", None)
        if mps is not None and mps.is_available():
            spec = dataclasses.replace(catalog.get("GPU"), model="Apple MPS", vendor="Apple")
            return [Device(id="gpu:0", spec=spec, local_index=0)]
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            for i in range(xpu.device_count()):
                name = xpu.get_device_name(i)
                spec = dataclasses.replace(catalog.resolve(name, DeviceKind.GPU), vendor="Intel")
                devices.append(Device(id=f"gpu:{i}", spec=spec, local_index=i))
    except Exception as exc:  # a broken backend means no devices from it
        log.debug("torch device query failed: %s", exc)
    return devices
