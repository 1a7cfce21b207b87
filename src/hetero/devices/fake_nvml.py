"""A fake of the ``pynvml`` interface, shipped in the library so a box can be described without
a GPU: tests, demos and users planning a fleet pass it to ``get_device_list(nvml=...)``.

It answers the same calls, with the same names, that discovery makes of the real module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FakeGPU", "FakeNVML", "mixed_box"]

_GIB = 1024**3


class NVMLError(Exception):
    """Raised like ``pynvml.NVMLError`` (driver missing, query not supported)."""


@dataclass(frozen=True, slots=True)
class _Memory:
    total: int
    used: int
    free: int


@dataclass(frozen=True, slots=True)
class _Utilization:
    gpu: int
    memory: int


@dataclass(frozen=True, slots=True)
class _PciInfo:
    busId: str  # the field name NVML uses


@dataclass(slots=True)
class FakeGPU:
    """One GPU as NVML would describe it."""

    name: str
    memory_total: int
    memory_used: int = 0
    utilization: int = 0
    temperature: int = 40
    power_mw: int = 60_000
    uuid: str = ""
    pci_bus_id: str = ""


@dataclass
class FakeNVML:
    """Module-like stand-in for ``pynvml`` over a list of ``FakeGPU``.

    ``fail_init`` makes ``nvmlInit`` fail as it does without a driver; ``unsupported`` names
    query functions that raise ``NVMLError`` (as ``NVML_ERROR_NOT_SUPPORTED`` does on some boards).
    """

    gpus: list[FakeGPU]
    fail_init: bool = False
    unsupported: set[str] = field(default_factory=set)
    NVMLError: type[Exception] = NVMLError
    NVML_TEMPERATURE_GPU: int = 0
    initialized: bool = False

    def _check(self, name: str) -> None:
        if not self.initialized:
            raise NVMLError("NVML not initialized")
        if name in self.unsupported:
            raise NVMLError(f"{name}: Not Supported")

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise NVMLError("NVML Shared Library Not Found")
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGPU:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(f"Invalid Argument: no GPU {index}")
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: FakeGPU) -> str:
        self._check("nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGPU) -> _Memory:
        self._check("nvmlDeviceGetMemoryInfo")
        return _Memory(
            handle.memory_total, handle.memory_used, handle.memory_total - handle.memory_used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGPU) -> _Utilization:
        self._check("nvmlDeviceGetUtilizationRates")
        return _Utilization(handle.utilization, 0)

    def nvmlDeviceGetTemperature(self, handle: FakeGPU, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature")
        return handle.temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeGPU) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return handle.power_mw

    def nvmlDeviceGetUUID(self, handle: FakeGPU) -> str:
        self._check("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeGPU) -> Any:
        self._check("nvmlDeviceGetPciInfo")
        return _PciInfo(handle.pci_bus_id)


def mixed_box() -> FakeNVML:
    """2× A100-SXM4-80GB + 2× V100-SXM2-32GB, the mixed box of the examples and tests."""
    names = ["NVIDIA A100-SXM4-80GB"] * 2 + ["Tesla V100-SXM2-32GB"] * 2
    memory = [80 * _GIB] * 2 + [32 * _GIB] * 2
    return FakeNVML(
        [
            FakeGPU(
                name=name,
                memory_total=mem,
                memory_used=(i + 1) * _GIB,
                utilization=10 * i,
                temperature=40 + i,
                power_mw=(100 + 10 * i) * 1000,
                uuid=f"GPU-{i:x}{'a100' if i < 2 else 'v100'}-0000-1111-2222-333344445555",
                pci_bus_id=f"00000000:{7 + i:02X}:00.0",
            )
            for i, (name, mem) in enumerate(zip(names, memory, strict=True))
        ]
    )
