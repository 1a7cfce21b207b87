from __future__ import annotations

from collections.abc import Sequence

import pytest

from hetero.devices.spec import Device, DeviceKind, DeviceSpec

SPEC = DeviceSpec(
    model="TEST-GPU",
    kind=DeviceKind.GPU,
    vendor="test",
    tflops={"fp16": 125.0},
    memory_bytes=16 * 2**30,
    memory_bandwidth_gbs=900.0,
)


def make_devices(speeds: Sequence[float], memory: Sequence[int] | None = None) -> list[Device]:
    """Devices named d0, d1, … with the given relative speeds (and memory in bytes)."""
    return [
        Device(
            id=f"d{i}",
            spec=SPEC,
            emulated=True,
            speed_override=s,
            memory_limit=None if memory is None else memory[i],
        )
        for i, s in enumerate(speeds)
    ]


@pytest.fixture
def devices() -> list[Device]:
    return make_devices([2.5, 2.5, 1.0, 1.0])
