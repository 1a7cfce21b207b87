"""MIG: an NVIDIA GPU carved into instances ("slices") that hetero schedules as devices.

A profile such as ``3g.40gb`` is 3 of the GPU's 7 compute slices (its SMs) and 4 of its 8 memory
slices (each with its own memory controllers and L2, so its own share of the bandwidth). The
catalog records, for each GPU it knows the layout of, every profile's SMs and memory as
``nvidia-smi mig -lgip`` prints them; a slice's spec is then its parent's, scaled: TFLOPS by its
share of the parent's SMs, memory bandwidth by its share of the memory slices, power and price by
the share of the GPU it takes from the other slices.

A process sees one slice (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``) and slices have no NVLink or P2P
path between them, so a collective must never span two slices of one GPU: ``shared_parents``
names the GPUs a group of devices would share.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hetero.devices.spec import Device, DeviceSpec
from hetero.errors import DeviceError

__all__ = [
    "MigLayout",
    "MigProfile",
    "SliceShare",
    "compute_slices_of",
    "measured_share",
    "profile_key",
    "shared_parents",
    "slice_spec",
    "split_slice_name",
]

_GIB = 1024**3

# "3g.40gb", "1g.10gb+me", "1c.3g.20gb": compute slices, GPU slices and memory; "+..." names
# extra media engines only. A ``Nc.`` compute instance has N of its GPU instance's slices.
_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\.\d+(?:\.\d+)?gb(?:\+[a-z.]+)?")

# "A100-80GB/3g.40gb" (the catalog's form) or "NVIDIA A100-SXM4-80GB MIG 3g.40gb" (NVML's and
# torch's name of a MIG device).
_SLICE_NAME = re.compile(r"(?P<parent>.+?)\s*(?:/\s*(?:mig\s+)?|\s+mig\s+)(?P<profile>\S+)", re.I)

# What a slice cannot do that its parent can: be split again, or reach another GPU over NVLink.
_WHOLE_GPU_ONLY = frozenset({"mig", "nvlink", "nvswitch"})


def profile_key(name: str) -> str:
    """A profile's name as the catalog keys it: lower case, without ``MIG `` or the media-engine
    suffix (``MIG 1g.10gb+me`` -> ``1g.10gb``), which changes neither compute nor memory."""
    text = name.strip().casefold().removeprefix("mig").strip()
    return text.split("+", 1)[0]


def split_slice_name(name: str) -> tuple[str, str] | None:
    """``(parent name, profile)`` of a slice's name, or ``None`` when ``name`` names no slice."""
    found = _SLICE_NAME.fullmatch(name.strip())
    return None if found is None else (found["parent"], found["profile"])


def compute_slices_of(profile: str) -> int:
    """The compute slices a profile name states (``3g.40gb`` -> 3, ``1c.3g.20gb`` -> 1); 0 for a
    name of no profile."""
    found = _PROFILE.fullmatch(profile_key(profile))
    return int(found[1] or found[2]) if found else 0


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One profile of a GPU: its SMs, memory slices and memory as the driver reports them."""

    name: str
    sms: int
    memory_slices: int
    memory_bytes: int

    @property
    def compute_slices(self) -> int:
        return compute_slices_of(self.name)


@dataclass(frozen=True, slots=True)
class SliceShare:
    """What part of its GPU a slice has: ``compute`` of the SMs (TFLOPS), ``memory`` of the
    memory slices (bandwidth), and ``occupied``, the larger of its shares of the compute and
    memory slices: what it keeps from the other slices (power, price)."""

    compute: float
    memory: float
    occupied: float


@dataclass(frozen=True, slots=True)
class MigLayout:
    """How one GPU model divides: its SMs, its compute and memory slices, and its profiles."""

    sms: int
    compute_slices: int
    memory_slices: int
    profiles: tuple[MigProfile, ...]
    source: str = ""

    @classmethod
    def from_row(cls, model: str, row: Mapping[str, Any]) -> MigLayout:
        """A catalog row's ``mig`` block: ``profiles`` maps a name to ``[SMs, memory slices,
        GiB]``."""
        try:
            layout = cls(
                sms=int(row["sms"]),
                compute_slices=int(row["compute_slices"]),
                memory_slices=int(row["memory_slices"]),
                profiles=tuple(
                    MigProfile(profile_key(name), int(sms), int(slices), round(float(gib) * _GIB))
                    for name, (sms, slices, gib) in row["profiles"].items()
                ),
                source=str(row.get("source", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DeviceError(
                f"catalog: {model}.mig must give sms, compute_slices, memory_slices and "
                f"profiles as name: [SMs, memory slices, GiB] ({exc})"
            ) from None
        for p in layout.profiles:
            if not (
                0 < p.compute_slices <= layout.compute_slices
                and 0 < p.memory_slices <= layout.memory_slices
                and 0 < p.sms <= layout.sms
            ):
                raise DeviceError(f"catalog: {model}.mig profile {p.name} exceeds its GPU")
        return layout

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.profiles]

    def profile(self, name: str) -> MigProfile | None:
        key = profile_key(name)
        return next((p for p in self.profiles if p.name == key), None)

    def share(self, profile: MigProfile) -> SliceShare:
        memory = profile.memory_slices / self.memory_slices
        return SliceShare(
            compute=profile.sms / self.sms,
            memory=memory,
            occupied=max(profile.compute_slices / self.compute_slices, memory),
        )


def slice_spec(
    parent: DeviceSpec, profile: str, share: SliceShare, memory_bytes: int, source: str = ""
) -> DeviceSpec:
    """The spec of a ``profile`` slice of a ``parent`` GPU: named ``parent/profile``, its
    parent's figures scaled by ``share``, with ``memory_bytes`` of memory."""
    key = profile_key(profile)
    return dataclasses.replace(
        parent,
        model=f"{parent.model}/{key}",
        tflops={dtype: round(value * share.compute, 2) for dtype, value in parent.tflops.items()},
        memory_bytes=memory_bytes,
        memory_bandwidth_gbs=round(parent.memory_bandwidth_gbs * share.memory, 1),
        # Slices reach each other and other GPUs only through the host, not over NVLink.
        interconnect="none",
        interconnect_gbs=0.0,
        tdp_w=round(parent.tdp_w * share.occupied, 1),
        price_per_hour=None
        if parent.price_per_hour is None
        else round(parent.price_per_hour * share.occupied, 3),
        capabilities=parent.capabilities - _WHOLE_GPU_ONLY,
        aliases=(),
        source=source or parent.source,
        notes=(
            f"MIG {key} slice of {parent.model}: {share.compute:.3f} of its SMs, "
            f"{share.memory:.3f} of its memory slices; power and price are "
            f"{share.occupied:.3f} of the GPU's."
        ),
    )


def measured_share(
    layout: MigLayout | None,
    profile: str,
    *,
    sms: int,
    gpu_slices: int,
    max_slices: int,
    memory_bytes: int,
    parent_memory: int,
) -> SliceShare:
    """A discovered slice's share of its GPU, from what the driver reports of it.

    Compute: its ``sms`` of the GPU's (``layout.sms``); for a GPU without a layout, its
    ``gpu_slices`` of the ``max_slices`` the GPU divides into (NVIDIA's "fraction of SMs").
    Memory: its profile's memory slices of the GPU's; for a profile the layout lacks, its
    ``memory_bytes`` of the GPU's ``parent_memory``. No share is above 1.
    """
    known = layout.profile(profile) if layout else None
    slices = layout.compute_slices if layout else max_slices
    compute = sms / layout.sms if layout and sms else gpu_slices / slices
    if layout and known:
        memory = known.memory_slices / layout.memory_slices
    else:
        memory = memory_bytes / parent_memory if parent_memory else 1.0
    occupied = max(gpu_slices / slices, memory)
    return SliceShare(*(min(1.0, value) for value in (compute, memory, occupied)))


def shared_parents(devices: Iterable[Device]) -> dict[str, list[str]]:
    """The physical GPUs that more than one of ``devices`` lives on, each mapped to those
    devices' ids (in the order given): MIG slices of one GPU (same ``Device.parent``), or a
    whole GPU listed with its slices or twice (its UUID). A group of devices may run one
    collective only if this is empty: slices of one GPU have no path between them."""
    by_gpu: dict[str, list[str]] = {}
    for device in devices:
        gpu = device.parent or device.uuid
        if gpu:
            by_gpu.setdefault(gpu, []).append(device.id)
    return {gpu: ids for gpu, ids in by_gpu.items() if len(ids) > 1}
