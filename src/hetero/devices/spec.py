"""What a device is (``DeviceSpec``), what it is doing (``DeviceState``), and both (``Device``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from types import MappingProxyType
from typing import Any

from hetero.errors import ConfigError

__all__ = [
    "DTYPES",
    "REFERENCE_TFLOPS",
    "Device",
    "DeviceKind",
    "DeviceSpec",
    "DeviceState",
    "DeviceType",
]

#: Numeric formats the catalog records throughput for (int8/int4 in TOPS).
DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4")

#: Dense fp16 TFLOPS of a V100, the device of relative speed 1.0. An A100 (312) is then 2.5.
REFERENCE_TFLOPS = 125.0

# When a device publishes no figure for a dtype, the nearest format it runs the work in instead.
_DTYPE_FALLBACK: dict[str, tuple[str, ...]] = {
    "fp64": ("fp32",),
    "fp32": ("tf32", "fp16", "bf16"),
    "tf32": ("fp32",),
    "fp16": ("bf16", "fp32"),
    "bf16": ("fp16", "fp32"),
    "fp8": ("fp16", "bf16", "fp32"),
    "int8": ("fp8", "fp16", "bf16", "fp32"),
    "int4": ("int8", "fp8", "fp16", "bf16", "fp32"),
}


class DeviceKind(str, Enum):
    """The families of devices hetero schedules on."""

    CPU = "cpu"
    GPU = "gpu"
    TPU = "tpu"
    NPU = "npu"
    FPGA = "fpga"
    ASIC = "asic"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """The fixed facts about one model of device, as the catalog or discovery report them."""

    model: str
    kind: DeviceKind
    vendor: str
    tflops: Mapping[str, float] = field(hash=False)
    memory_bytes: int
    memory_bandwidth_gbs: float
    interconnect: str = "none"
    interconnect_gbs: float = 0.0
    tdp_w: float = 0.0
    price_per_hour: float | None = None
    capabilities: frozenset[str] = frozenset()
    aliases: tuple[str, ...] = ()
    source: str = ""
    notes: str = ""
    # What the vendor publishes about the chip itself; empty or None where it publishes nothing.
    architecture: str = ""  # "Ampere", "Hopper", "CDNA 3"
    compute_capability: str = ""  # CUDA's "8.0", kept as text so that "10.0" stays "10.0"
    cuda_cores: int | None = None
    tensor_cores: int | None = None
    pod_chips: int | None = None  # chips in one full pod (a TPU's ICI domain)

    def __post_init__(self) -> None:
        # Freeze the mapping so a shared catalog spec cannot be edited through one device.
        object.__setattr__(self, "tflops", MappingProxyType(dict(self.tflops)))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # A mapping proxy does not pickle; workers receive their device's spec.
        values = [getattr(self, f.name) for f in fields(self)]
        values[3] = dict(self.tflops)
        return (DeviceSpec, tuple(values))

    def peak_tflops(self, dtype: str = "fp16") -> float:
        """Dense peak for ``dtype``, falling back to the closest published format (0.0 if none)."""
        if dtype not in _DTYPE_FALLBACK:
            raise ConfigError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
        value = self.tflops.get(dtype)
        if value:
            return value
        for other in _DTYPE_FALLBACK[dtype]:
            value = self.tflops.get(other)
            if value:
                return value
        return 0.0


class DeviceType(str):
    """A device's kind as text that compares without regard to case (``"GPU" == "gpu"``)."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and self.casefold() == other.casefold()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.casefold())


@dataclass(slots=True)
class DeviceState:
    """Live, changing facts about one device (refreshed by discovery or by an executor)."""

    healthy: bool = True
    memory_used: int = 0
    memory_total: int = 0
    utilization: float = 0.0
    in_flight: int = 0
    queued_work: float = 0.0
    temperature_c: float | None = None
    power_w: float | None = None

    @property
    def memory_free(self) -> int:
        return max(0, self.memory_total - self.memory_used)


@dataclass(slots=True)
class Device:
    """One schedulable device: identity, spec and live state.

    ``speed`` is the device's relative speed (a V100 is 1.0). It comes from the catalog unless the
    fleet config sets it; an emulated device paces its work by it. ``parent`` names the physical
    GPU a MIG slice is carved from (its UUID): slices of one GPU never join one collective.
    ``rack`` names the rack of its node, where known (a fleet config's ``rack:``), for
    ``Affinity.same_rack``.
    """

    id: str
    spec: DeviceSpec
    node: str = "localhost"
    local_index: int | None = None
    state: DeviceState = field(default_factory=DeviceState)
    emulated: bool = False
    speed_override: float | None = None
    memory_limit: int | None = None
    cores: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    tags: frozenset[str] = frozenset()
    parent: str | None = None
    rack: str | None = None

    def __post_init__(self) -> None:
        if self.state.memory_total == 0:
            self.state.memory_total = self.memory_bytes

    @property
    def kind(self) -> DeviceKind:
        return self.spec.kind

    @property
    def type(self) -> DeviceType:
        """The kind as text, compared case-insensitively: ``device.type == "GPU"``."""
        return DeviceType(self.spec.kind.value)

    @property
    def model(self) -> str:
        return self.spec.model

    @property
    def memory_bytes(self) -> int:
        """Memory this device may use: the spec's, capped by ``memory_limit``."""
        if self.memory_limit is None:
            return self.spec.memory_bytes
        return min(self.memory_limit, self.spec.memory_bytes)

    @property
    def speed(self) -> float:
        if self.speed_override is not None:
            return self.speed_override
        return self.spec.peak_tflops("fp16") / REFERENCE_TFLOPS

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready description (used by ``hetero devices --json``)."""
        spec = self.spec
        return {
            "id": self.id,
            "node": self.node,
            "rack": self.rack,
            "kind": spec.kind.value,
            "model": spec.model,
            "vendor": spec.vendor,
            "local_index": self.local_index,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "parent": self.parent,
            "emulated": self.emulated,
            "speed": round(self.speed, 4),
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "tflops": dict(spec.tflops),
            "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
            "interconnect": spec.interconnect,
            "tdp_w": spec.tdp_w,
            "price_per_hour": spec.price_per_hour,
            "capabilities": sorted(spec.capabilities),
            "tags": sorted(self.tags),
            "state": {
                "healthy": self.state.healthy,
                "memory_total": self.state.memory_total,
                "memory_used": self.state.memory_used,
                "memory_free": self.state.memory_free,
                "utilization": self.state.utilization,
                "temperature_c": self.state.temperature_c,
                "power_w": self.state.power_w,
            },
        }
