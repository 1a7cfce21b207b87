"""What this machine has: the CPU (psutil) and NVIDIA GPUs (NVML), with torch as a fallback.

A missing driver or library is never an error: discovery then reports what it can (at least
the CPU). ``CUDA_VISIBLE_DEVICES`` is honoured as CUDA itself reads it.
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
from hetero.devices.spec import Device, DeviceKind, DeviceState

__all__ = [
    "bus_id_key",
    "discover_cpu",
    "discover_nvidia_gpus",
    "get_device_list",
    "nvml_text",
    "optional_module",
    "visible_gpu_indices",
]

log = logging.getLogger("hetero.discovery")
T = TypeVar("T")


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


def visible_gpu_indices(spec: str | None, gpus: list[tuple[int, str, str]]) -> list[int]:
    """NVML indices visible under ``CUDA_VISIBLE_DEVICES=spec``, in CUDA's order.

    ``gpus`` lists ``(nvml index, uuid, pci bus id)``. Entries are indices, UUIDs (or unique
    prefixes, with or without ``GPU-``) or PCI bus ids; like CUDA, the first invalid entry ends
    the list.
    """
    if spec is None:
        return [g[0] for g in gpus]
    spec = spec.strip()
    if spec in ("", "-1", "NoDevFiles"):
        return []
    chosen: list[int] = []
    for raw in spec.split(","):
        entry = raw.strip()
        found = _match_entry(entry, gpus)
        if found is None:
            log.warning(
                "CUDA_VISIBLE_DEVICES: %r matches no GPU; ignoring it and what follows", entry
            )
            break
        if found not in chosen:
            chosen.append(found)
    return chosen


def _match_entry(entry: str, gpus: list[tuple[int, str, str]]) -> int | None:
    low = entry.lower()
    if low.isdigit():
        index = int(low)
        return index if any(g[0] == index for g in gpus) else None
    if low.startswith("mig-"):
        log.warning("CUDA_VISIBLE_DEVICES: MIG instance %r is not scheduled separately", entry)
        return None
    if ":" in low:
        key = bus_id_key(low)
        return next((g[0] for g in gpus if g[2] and bus_id_key(g[2]) == key), None)
    prefix = low.removeprefix("gpu-")
    matches = [g[0] for g in gpus if g[1].lower().removeprefix("gpu-").startswith(prefix)]
    return matches[0] if prefix and len(matches) == 1 else None


def nvml_text(value: Any) -> str:
    """NVML strings are ``bytes`` in older pynvml releases and ``str`` in newer ones."""
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_nvidia_gpus(nvml: Any, environ: Mapping[str, str]) -> list[Device] | None:
    """The NVIDIA GPUs that ``CUDA_VISIBLE_DEVICES`` leaves visible, through an NVML module.

    ``None`` when NVML has no GPUs to report (driver missing, none installed, or NVML failing),
    so the caller may ask torch instead; ``[]`` when GPUs exist but all are hidden, which torch
    would honour too."""
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError or a loader error: no NVIDIA GPUs
        log.debug("NVML unavailable: %s", exc)
        return None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        if not handles:
            return None

        def query(fn: Callable[..., T], *args: Any) -> T | None:
            try:
                return fn(*args)
            except Exception as exc:  # unsupported queries leave a field empty
                log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), exc)
                return None

        listed = []
        for i, h in enumerate(handles):
            uuid = query(nvml.nvmlDeviceGetUUID, h)
            pci = query(nvml.nvmlDeviceGetPciInfo, h)
            listed.append((i, nvml_text(uuid) if uuid else "", nvml_text(pci.busId) if pci else ""))
        order = visible_gpu_indices(environ.get("CUDA_VISIBLE_DEVICES"), listed)
        catalog = get_catalog()
        devices = []
        for ordinal, index in enumerate(order):
            h = handles[index]
            name = nvml_text(query(nvml.nvmlDeviceGetName, h) or "GPU")
            spec = catalog.resolve(name, DeviceKind.GPU)
            memory = query(nvml.nvmlDeviceGetMemoryInfo, h)
            util = query(nvml.nvmlDeviceGetUtilizationRates, h)
            temp = query(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
            power = query(nvml.nvmlDeviceGetPowerUsage, h)
            state = DeviceState(
                memory_total=int(memory.total) if memory else spec.memory_bytes,
                memory_used=int(memory.used) if memory else 0,
                utilization=util.gpu / 100 if util else 0.0,
                temperature_c=float(temp) if temp is not None else None,
                power_w=power / 1000 if power is not None else None,
            )
            _, uuid, bus = listed[index]
            devices.append(
                Device(
                    id=f"gpu:{ordinal}",
                    spec=spec,
                    local_index=ordinal,
                    state=state,
                    uuid=uuid or None,
                    pci_bus_id=bus or None,
                )
            )
        return devices
    except Exception as exc:  # a driver failing mid-way is not the caller's error
        log.warning("NVML failed while listing GPUs (%s); continuing without them", exc)
        return None
    finally:
        with contextlib.suppress(Exception):  # shutting down after a failure
            nvml.nvmlShutdown()


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
