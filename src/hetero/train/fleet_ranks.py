"""A fleet's devices as the pipeline planners' ranks, and the bandwidth their gradients'
all-reduce is planned at when none is given.

Rank i is the fleet's device i. Its speed is its catalog peak TFLOPS for the training dtype
over ``REFERENCE_TFLOPS`` (the unit ``hetero.train.model_costs`` states layer times in), or the
speed the fleet config gives it; its memory is the device's (a config's ``memory_limit``
honoured) less the CUDA context ``hetero fit`` counts. Pure code: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero.devices.spec import REFERENCE_TFLOPS, Device
from hetero.devices.topology import LinkKind, catalog_pcie_generation, pcie_gbs
from hetero.errors import ConfigError
from hetero.plan.memory import DEFAULT_CONTEXT_BYTES
from hetero.train.stages import PipelineRank
from hetero.units import format_size

__all__ = ["NETWORK_BANDWIDTH", "default_bandwidth", "dtype_fallbacks", "pipeline_ranks"]

#: Bytes a second a rank sends (and receives) between nodes when none is given: a 100 Gb/s
#: NIC, the common figure of cloud GPU nodes; pass the real one (``--bandwidth``).
NETWORK_BANDWIDTH = 100e9 / 8


def pipeline_ranks(
    devices: Sequence[Device], *, dtype: str, context_bytes: int = DEFAULT_CONTEXT_BYTES
) -> list[PipelineRank]:
    """Rank i for ``devices[i]``: its relative speed for ``dtype`` and its memory less
    ``context_bytes``; a device with no TFLOPS figure or no memory left is refused by name."""
    problems: list[tuple[str, str]] = []
    ranks: list[PipelineRank] = []
    for i, device in enumerate(devices):
        speed = device.speed_override
        if speed is None:
            speed = device.spec.peak_tflops(dtype) / REFERENCE_TFLOPS
        memory = device.memory_bytes - context_bytes
        if speed <= 0:
            problems.append(
                (f"fleet[{i}]", f"{device.id} ({device.model}) has no {dtype} TFLOPS figure")
            )
        if memory <= 0:
            problems.append(
                (
                    f"fleet[{i}]",
                    f"{device.id} ({device.model}) has {format_size(device.memory_bytes)}, no "
                    f"more than the {format_size(context_bytes)} of CUDA context",
                )
            )
        ranks.append(PipelineRank(i, speed, memory))
    if problems:
        raise ConfigError(problems)
    return ranks


def dtype_fallbacks(devices: Sequence[Device], dtype: str) -> list[str]:
    """The catalog models among ``devices`` with no ``dtype`` figure of their own, whose
    closest format's stands in (``DeviceSpec.peak_tflops``): a T4's fp16 for bf16."""
    return list(
        dict.fromkeys(
            d.model for d in devices if d.speed_override is None and not d.spec.tflops.get(dtype)
        )
    )


def default_bandwidth(devices: Sequence[Device]) -> tuple[float, str]:
    """Bytes a second each rank sends in the all-reduce, and where the figure comes from:
    devices of different models share no NVLink, so within a node the ring crosses PCIe,
    planned at the slowest path (between sockets) of the oldest generation among them, one
    way (``hetero.devices.topology``); across nodes at most ``NETWORK_BANDWIDTH``."""
    generation = min(catalog_pcie_generation(d.spec) for d in devices)
    # Topology figures are both directions together; a ring sends one way and receives the other.
    pcie = pcie_gbs(LinkKind.SYS, generation) * 1e9 / 2
    source = f"PCIe Gen{generation} between sockets, one way"
    if len({d.node for d in devices}) > 1 and pcie > NETWORK_BANDWIDTH:
        return NETWORK_BANDWIDTH, "a 100 Gb/s network between nodes"
    return pcie, source
