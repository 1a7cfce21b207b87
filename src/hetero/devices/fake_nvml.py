"""A fake of the ``pynvml`` interface, shipped in the library so a box can be described without
a GPU: tests, demos and users planning a fleet pass it to ``get_device_list(nvml=...)`` or
``read_topology(nvml=...)``.

It answers the same calls, with the same names and constants, that discovery and topology make of
the real module, MIG included (a ``FakeGPU`` whose ``mig`` lists its ``FakeMigDevice`` slices).
Four boxes are built in: ``mixed_box()``, ``nvswitch_box()``, ``pcie_box()`` and ``mig_box()``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MIG_PROFILES",
    "FakeGPU",
    "FakeMigDevice",
    "FakeNVML",
    "FakeTopology",
    "mig_box",
    "mig_slices",
    "mixed_box",
    "nvswitch_box",
    "pcie_box",
]

_GIB = 1024**3
_MIB = 1024**2

# The values pynvml defines for these names (checked against nvidia-ml-py 12/13).
NVML_NVLINK_MAX_LINKS = 36
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

#: What NVML reports of each MIG profile of two GPUs, by the name NVML gives the GPU:
#: ``(GPU instance slices, SMs, memory MiB)``, as ``nvidia-smi mig -lgip`` prints them.
MIG_PROFILES: Mapping[str, Mapping[str, tuple[int, int, int]]] = {
    "NVIDIA A100-SXM4-80GB": {
        "1g.10gb": (1, 14, 9728),
        "1g.20gb": (1, 14, 19968),
        "2g.20gb": (2, 28, 19968),
        "3g.40gb": (3, 42, 40192),
        "4g.40gb": (4, 56, 40192),
        "7g.80gb": (7, 98, 80896),
    },
    "NVIDIA H100 80GB HBM3": {
        "1g.10gb": (1, 16, 9984),
        "1g.20gb": (1, 26, 20096),
        "2g.20gb": (2, 32, 20096),
        "3g.40gb": (3, 60, 40448),
        "4g.40gb": (4, 64, 40448),
        "7g.80gb": (7, 132, 81152),
    },
}

# The PCI bus id an NVSwitch link reports as its remote end.
_NVSWITCH_BUS_ID = "00000000:C0:00.0"


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


@dataclass(frozen=True, slots=True)
class _Attributes:
    """``nvmlDeviceGetAttributes`` of a MIG device (the field names NVML uses)."""

    multiprocessorCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int
    sharedCopyEngineCount: int = 1
    sharedDecoderCount: int = 0
    sharedEncoderCount: int = 0
    sharedJpegCount: int = 0
    sharedOfaCount: int = 0


@dataclass(slots=True)
class FakeMigDevice:
    """One MIG slice as NVML would describe it: its profile (``3g.40gb``), GPU instance slices,
    SMs and memory; NVML names it ``<its GPU's name> MIG <profile>``."""

    profile: str
    slices: int
    sms: int
    memory_mb: int
    uuid: str = ""
    memory_used: int = 0


@dataclass(slots=True)
class FakeGPU:
    """One GPU as NVML would describe it. ``mig`` is ``None`` with MIG mode off; with it on, the
    slices it is carved into (none yet: an empty list), of at most ``max_mig_devices``."""

    name: str
    memory_total: int
    memory_used: int = 0
    utilization: int = 0
    temperature: int = 40
    power_mw: int = 60_000
    uuid: str = ""
    pci_bus_id: str = ""
    pcie_generation: int = 4
    pcie_width: int = 16
    mig: list[FakeMigDevice] | None = None
    max_mig_devices: int = 7


@dataclass(frozen=True, slots=True)
class FakeTopology:
    """How the GPUs of a fake box are wired, by GPU index.

    ``nvlinks`` maps a pair ``(i, j)`` to its number of direct NVLinks; ``nvswitch_links`` maps a
    GPU to its number of NVLinks into the NVSwitch fabric (every switched GPU reaches every other);
    ``levels`` maps a pair to its PCIe common-ancestor level (an ``NVML_TOPOLOGY_*`` value),
    ``NVML_TOPOLOGY_SYSTEM`` when absent; ``numa_nodes`` gives each GPU's NUMA node, whose CPUs are
    ``cpus_per_node`` consecutive ids.
    """

    nvlinks: Mapping[tuple[int, int], int] = field(default_factory=dict)
    nvswitch_links: Mapping[int, int] = field(default_factory=dict)
    levels: Mapping[tuple[int, int], int] = field(default_factory=dict)
    numa_nodes: tuple[int, ...] = ()
    cpus_per_node: int = 32

    def direct_links(self, i: int, j: int) -> int:
        return self.nvlinks.get((i, j), 0) or self.nvlinks.get((j, i), 0)

    def level(self, i: int, j: int) -> int:
        if i == j:
            return NVML_TOPOLOGY_INTERNAL
        return self.levels.get((i, j), self.levels.get((j, i), NVML_TOPOLOGY_SYSTEM))

    def link_ends(self, i: int, count: int) -> list[int | None]:
        """Where each NVLink of GPU ``i`` goes: a GPU index, or ``None`` for the NVSwitch."""
        ends: list[int | None] = [None] * self.nvswitch_links.get(i, 0)
        for j in range(count):
            if j != i:
                ends += [j] * self.direct_links(i, j)
        return ends


@dataclass
class FakeNVML:
    """Module-like stand-in for ``pynvml`` over a list of ``FakeGPU``.

    ``fail_init`` makes ``nvmlInit`` fail as it does without a driver; ``unsupported`` names
    query functions that raise ``NVMLError`` (as ``NVML_ERROR_NOT_SUPPORTED`` does on some boards).
    Without a ``topology`` the topology queries raise ``NVMLError`` too.
    """

    gpus: list[FakeGPU]
    fail_init: bool = False
    unsupported: set[str] = field(default_factory=set)
    topology: FakeTopology | None = None
    NVMLError: type[Exception] = NVMLError
    NVML_TEMPERATURE_GPU: int = 0
    NVML_NVLINK_MAX_LINKS: int = NVML_NVLINK_MAX_LINKS
    NVML_P2P_CAPS_INDEX_NVLINK: int = NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK: int = NVML_P2P_STATUS_OK
    NVML_NVLINK_DEVICE_TYPE_GPU: int = NVML_NVLINK_DEVICE_TYPE_GPU
    NVML_NVLINK_DEVICE_TYPE_SWITCH: int = NVML_NVLINK_DEVICE_TYPE_SWITCH
    NVML_TOPOLOGY_INTERNAL: int = NVML_TOPOLOGY_INTERNAL
    NVML_TOPOLOGY_SINGLE: int = NVML_TOPOLOGY_SINGLE
    NVML_TOPOLOGY_MULTIPLE: int = NVML_TOPOLOGY_MULTIPLE
    NVML_TOPOLOGY_HOSTBRIDGE: int = NVML_TOPOLOGY_HOSTBRIDGE
    NVML_TOPOLOGY_NODE: int = NVML_TOPOLOGY_NODE
    NVML_TOPOLOGY_SYSTEM: int = NVML_TOPOLOGY_SYSTEM
    NVML_DEVICE_MIG_DISABLE: int = NVML_DEVICE_MIG_DISABLE
    NVML_DEVICE_MIG_ENABLE: int = NVML_DEVICE_MIG_ENABLE
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

    def nvmlDeviceGetName(self, handle: FakeGPU | FakeMigDevice) -> str:
        self._check("nvmlDeviceGetName")
        if isinstance(handle, FakeMigDevice):
            return f"{self._parent(handle).name} MIG {handle.profile}"
        return handle.name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGPU | FakeMigDevice) -> _Memory:
        self._check("nvmlDeviceGetMemoryInfo")
        if isinstance(handle, FakeMigDevice):
            total = handle.memory_mb * _MIB
            return _Memory(total, handle.memory_used, total - handle.memory_used)
        return _Memory(
            handle.memory_total, handle.memory_used, handle.memory_total - handle.memory_used
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGPU | FakeMigDevice) -> _Utilization:
        self._check("nvmlDeviceGetUtilizationRates")
        return _Utilization(self._whole(handle, "nvmlDeviceGetUtilizationRates").utilization, 0)

    def nvmlDeviceGetTemperature(self, handle: FakeGPU | FakeMigDevice, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature")
        return self._whole(handle, "nvmlDeviceGetTemperature").temperature

    def nvmlDeviceGetPowerUsage(self, handle: FakeGPU | FakeMigDevice) -> int:
        self._check("nvmlDeviceGetPowerUsage")
        return self._whole(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetUUID(self, handle: FakeGPU | FakeMigDevice) -> str:
        self._check("nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeGPU | FakeMigDevice) -> Any:
        self._check("nvmlDeviceGetPciInfo")
        return _PciInfo(self._whole(handle, "nvmlDeviceGetPciInfo").pci_bus_id)

    # MIG queries. Like the real driver, a MIG device answers its identity and memory; board
    # queries (utilization, temperature, power, PCI) are for its GPU's handle only.

    def _whole(self, handle: FakeGPU | FakeMigDevice, name: str) -> FakeGPU:
        if isinstance(handle, FakeMigDevice):
            raise NVMLError(f"{name}: Not Supported on a MIG device")
        return handle

    def _parent(self, handle: FakeMigDevice) -> FakeGPU:
        # By identity: two slices may be described by equal values.
        for gpu in self.gpus:
            if any(mig is handle for mig in gpu.mig or ()):
                return gpu
        raise NVMLError("Invalid Argument: not a MIG device of this box")

    def nvmlDeviceGetMigMode(self, handle: FakeGPU) -> list[int]:
        """``[current, pending]`` mode, as pynvml returns them."""
        self._check("nvmlDeviceGetMigMode")
        mode = NVML_DEVICE_MIG_DISABLE if handle.mig is None else NVML_DEVICE_MIG_ENABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGPU) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount")
        return handle.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGPU, index: int) -> FakeMigDevice:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex")
        if handle.mig is None:
            raise NVMLError("Invalid Argument: MIG mode is disabled")
        if not 0 <= index < len(handle.mig):
            raise NVMLError(f"Not Found: no MIG device {index}")
        return handle.mig[index]

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: FakeMigDevice) -> FakeGPU:
        self._check("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return self._parent(handle)

    def nvmlDeviceIsMigDeviceHandle(self, handle: FakeGPU | FakeMigDevice) -> bool:
        self._check("nvmlDeviceIsMigDeviceHandle")
        return isinstance(handle, FakeMigDevice)

    def nvmlDeviceGetAttributes(self, handle: FakeGPU | FakeMigDevice) -> _Attributes:
        self._check("nvmlDeviceGetAttributes")
        if not isinstance(handle, FakeMigDevice):
            raise NVMLError("nvmlDeviceGetAttributes: Not Supported on a whole GPU")
        return _Attributes(
            multiprocessorCount=handle.sms,
            gpuInstanceSliceCount=handle.slices,
            computeInstanceSliceCount=handle.slices,
            memorySizeMB=handle.memory_mb,
        )

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeGPU) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkGeneration")
        return handle.pcie_generation

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeGPU) -> int:
        self._check("nvmlDeviceGetMaxPcieLinkWidth")
        return handle.pcie_width

    # Topology queries: answered from ``self.topology``.

    def _wiring(self, name: str) -> FakeTopology:
        self._check(name)
        if self.topology is None:
            raise NVMLError(f"{name}: Not Supported")
        return self.topology

    def _index(self, handle: FakeGPU) -> int:
        # By identity: two GPUs may be described by equal values.
        return next(i for i, gpu in enumerate(self.gpus) if gpu is handle)

    def _link_end(self, name: str, handle: FakeGPU, link: int) -> int | None:
        ends = self._wiring(name).link_ends(self._index(handle), len(self.gpus))
        if not ends:
            raise NVMLError(f"{name}: Not Supported")  # a GPU without NVLink
        if not 0 <= link < min(len(ends), NVML_NVLINK_MAX_LINKS):
            raise NVMLError(f"{name}: Invalid Argument (link {link})")
        return ends[link]

    def nvmlDeviceGetNvLinkState(self, handle: FakeGPU, link: int) -> int:
        self._link_end("nvmlDeviceGetNvLinkState", handle, link)
        return 1  # every described link is active

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: FakeGPU, link: int) -> Any:
        end = self._link_end("nvmlDeviceGetNvLinkRemotePciInfo", handle, link)
        return _PciInfo(_NVSWITCH_BUS_ID if end is None else self.gpus[end].pci_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: FakeGPU, link: int) -> int:
        end = self._link_end("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        return NVML_NVLINK_DEVICE_TYPE_SWITCH if end is None else NVML_NVLINK_DEVICE_TYPE_GPU

    def nvmlDeviceGetP2PStatus(self, handle1: FakeGPU, handle2: FakeGPU, index: int) -> int:
        wiring = self._wiring("nvmlDeviceGetP2PStatus")
        if index != NVML_P2P_CAPS_INDEX_NVLINK:
            raise NVMLError("nvmlDeviceGetP2PStatus: only the NVLink capability is faked")
        i, j = self._index(handle1), self._index(handle2)
        switched = wiring.nvswitch_links.get(i, 0) and wiring.nvswitch_links.get(j, 0)
        if wiring.direct_links(i, j) or switched:
            return NVML_P2P_STATUS_OK
        return NVML_P2P_STATUS_NOT_SUPPORTED

    def nvmlDeviceGetTopologyCommonAncestor(self, handle1: FakeGPU, handle2: FakeGPU) -> int:
        wiring = self._wiring("nvmlDeviceGetTopologyCommonAncestor")
        return wiring.level(self._index(handle1), self._index(handle2))

    def _numa_node(self, name: str, handle: FakeGPU) -> int:
        nodes = self._wiring(name).numa_nodes
        if not nodes:
            raise NVMLError(f"{name}: Not Supported")
        return nodes[self._index(handle)]

    def nvmlDeviceGetNumaNodeId(self, handle: FakeGPU) -> int:
        return self._numa_node("nvmlDeviceGetNumaNodeId", handle)

    def nvmlDeviceGetCpuAffinity(self, handle: FakeGPU, cpu_set_size: int) -> list[int]:
        """The CPUs of the GPU's NUMA node as ``cpu_set_size`` 64-bit words, as NVML fills them."""
        node = self._numa_node("nvmlDeviceGetCpuAffinity", handle)
        per_node = self._wiring("nvmlDeviceGetCpuAffinity").cpus_per_node
        mask = ((1 << per_node) - 1) << (node * per_node)
        return [(mask >> (64 * word)) & (2**64 - 1) for word in range(cpu_set_size)]


def mixed_box() -> FakeNVML:
    """2× A100-SXM4-80GB + 2× V100-SXM2-32GB, the mixed box of the examples and tests.

    Wiring: the A100s share 12 NVLinks (all of an A100's), the V100s 6 (all of a V100's); the
    A100s sit under one PCIe switch on socket 0, the V100s under one on socket 1, so the pairs
    reach each other only across the sockets (SYS).
    """
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
                pcie_generation=4 if i < 2 else 3,
            )
            for i, (name, mem) in enumerate(zip(names, memory, strict=True))
        ],
        topology=FakeTopology(
            nvlinks={(0, 1): 12, (2, 3): 6},
            levels={(0, 1): NVML_TOPOLOGY_SINGLE, (2, 3): NVML_TOPOLOGY_SINGLE},
            numa_nodes=(0, 0, 1, 1),
        ),
    )


def _box(name: str, memory: int, count: int, topology: FakeTopology, generation: int) -> FakeNVML:
    return FakeNVML(
        [
            FakeGPU(
                name=name,
                memory_total=memory,
                uuid=f"GPU-{i:08x}-0000-1111-2222-333344445555",
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                pcie_generation=generation,
            )
            for i in range(count)
        ],
        topology=topology,
    )


def nvswitch_box() -> FakeNVML:
    """8× H100-SXM5-80GB on an HGX board: 18 NVLinks each into the NVSwitch fabric.

    PCIe and NUMA in the manner of a DGX H100: two GPUs per PCIe switch (PIX), two switches per
    socket on separate host bridges (NODE), GPUs 0-3 on socket 0 and 4-7 on socket 1 (SYS).
    """
    levels: dict[tuple[int, int], int] = {}
    for i in range(8):
        for j in range(i + 1, 8):
            if i // 2 == j // 2:
                levels[i, j] = NVML_TOPOLOGY_SINGLE
            elif i // 4 == j // 4:
                levels[i, j] = NVML_TOPOLOGY_NODE
    topology = FakeTopology(
        nvswitch_links=dict.fromkeys(range(8), 18),
        levels=levels,
        numa_nodes=(0, 0, 0, 0, 1, 1, 1, 1),
        cpus_per_node=56,
    )
    return _box("NVIDIA H100 80GB HBM3", 80 * _GIB, 8, topology, generation=5)


def pcie_box() -> FakeNVML:
    """4× L4 on PCIe Gen4, no NVLink, two sockets.

    Socket 0: GPUs 0 and 1 under one PCIe switch (PIX). Socket 1: GPUs 2 and 3 each under their
    own switch below a shared upstream switch (PXB). Between the sockets: SYS.
    """
    topology = FakeTopology(
        levels={(0, 1): NVML_TOPOLOGY_SINGLE, (2, 3): NVML_TOPOLOGY_MULTIPLE},
        numa_nodes=(0, 0, 1, 1),
    )
    return _box("NVIDIA L4", 24 * _GIB, 4, topology, generation=4)


def mig_slices(gpu_name: str, profiles: Sequence[str], gpu_index: int) -> list[FakeMigDevice]:
    """Slices of the named profiles (``MIG_PROFILES``) for GPU ``gpu_index`` of a box, each with a
    UUID of its own."""
    table = MIG_PROFILES[gpu_name]
    return [
        FakeMigDevice(
            profile,
            *table[profile],
            uuid=f"MIG-{gpu_index:x}{k:x}c0ffee-1111-5222-8333-444455556666",
        )
        for k, profile in enumerate(profiles)
    ]


def mig_box() -> FakeNVML:
    """2× A100-SXM4-80GB + 2× H100-SXM5-80GB, three of them in MIG mode: GPU 0 is split into
    3g.40gb + 2g.20gb + 2× 1g.10gb, GPU 1 is whole, GPU 2 is 4g.40gb + 3g.40gb and GPU 3 one
    7g.80gb: eight devices to schedule on, seven of them slices."""
    layout: list[tuple[str, list[str] | None]] = [
        ("NVIDIA A100-SXM4-80GB", ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]),
        ("NVIDIA A100-SXM4-80GB", None),
        ("NVIDIA H100 80GB HBM3", ["4g.40gb", "3g.40gb"]),
        ("NVIDIA H100 80GB HBM3", ["7g.80gb"]),
    ]
    return FakeNVML(
        [
            FakeGPU(
                name=name,
                memory_total=80 * _GIB,
                uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-ddddeeeeffff",
                pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                pcie_generation=4 if "A100" in name else 5,
                mig=None if profiles is None else mig_slices(name, profiles, i),
            )
            for i, (name, profiles) in enumerate(layout)
        ]
    )
