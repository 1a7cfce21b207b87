"""Emulated fleets built in code, for tests, demos and benchmarks: devices like those a fleet
config's ``emulate: true`` entries give, without a config and under ids of their own."""

from __future__ import annotations

from collections.abc import Sequence

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device, DeviceSpec
from hetero.errors import ConfigError
from hetero.units import parse_size

__all__ = ["emulated_fleet"]


def emulated_fleet(
    speeds: Sequence[float],
    memory: int | str | Sequence[int | str] | None = None,
    *,
    model: str | DeviceSpec = "A100-80GB",
) -> list[Device]:
    """Emulated devices ``d0``, ``d1``, … of ``model`` (a catalog name or a ``DeviceSpec``), one
    per relative speed in ``speeds`` (a V100 is 1.0). A fleet config's ``emulate: true`` entry
    builds alike devices but names them ``a100-80gb:0``, … (or by its ``name``), not ``d0``.

    ``memory`` caps the memory each device may use: one size for all or one per device, in
    bytes or as text (``"2GB"``); unset, each has its spec's.
    """
    spec = get_catalog().get(model) if isinstance(model, str) else model
    if memory is None or isinstance(memory, (int, str)):
        limits: list[int | str | None] = [memory] * len(speeds)
    elif len(memory) == len(speeds):
        limits = list(memory)
    else:
        raise ConfigError(
            f"{len(memory)} memory sizes for {len(speeds)} devices; give one per device"
        )
    return [
        Device(
            id=f"d{i}",
            spec=spec,
            local_index=i,
            emulated=True,
            speed_override=speed,
            memory_limit=None if limit is None else parse_size(limit),
        )
        for i, (speed, limit) in enumerate(zip(speeds, limits, strict=True))
    ]
