"""The fleet the scheduler's tests run on: GPUs alike in everything but their relative speed
(and, where a test says, their memory)."""

from __future__ import annotations

from collections.abc import Sequence

from hetero.devices.spec import Device, DeviceKind, DeviceSpec
from hetero.testing import emulated_fleet

#: A plain 16 GiB GPU (a V100's fp16 and bandwidth, nothing else): no catalog entry's extras.
TEST_GPU = DeviceSpec(
    model="TEST-GPU",
    kind=DeviceKind.GPU,
    vendor="test",
    tflops={"fp16": 125.0},
    memory_bytes=16 * 2**30,
    memory_bandwidth_gbs=900.0,
)


def make_devices(speeds: Sequence[float], memory: Sequence[int] | None = None) -> list[Device]:
    """Devices d0, d1, … of ``TEST_GPU`` with the given relative speeds (and memory in bytes)."""
    return emulated_fleet(speeds, memory, model=TEST_GPU)
