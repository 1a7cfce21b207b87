"""TPU pods and their slices: how many chips a pod has, the slice topologies Google publishes
(``2x2x1`` … ``16x16x24`` on the 3D tori of v4 and v5p, ``1x1`` … ``16x16`` on the 2D tori of
v5e and v6e), and what one slice adds up to: chips, hosts, HBM and TFLOPS.

The catalog keeps a ``PodLayout`` per TPU row that has a ``pod`` block; a slice is asked of it
by its topology (``catalog.tpu_slice("v5p", "4x4x4")``) and a topology the vendor does not
publish is refused, naming those it does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from hetero.devices.spec import DeviceSpec
from hetero.errors import DeviceError

__all__ = ["PodLayout", "PodSlice", "parse_topology"]

# "4x4x4", "4×4×4", "4 x 4 x 4", "16X16": sides joined by x, any case, spaces allowed.
_TOPOLOGY = re.compile(r"\s*\d+(\s*[x×]\s*\d+)+\s*", re.IGNORECASE)


def parse_topology(text: str) -> tuple[int, ...]:
    """The sides of a topology written ``AxB`` or ``AxBxC`` (``"4x4x8"`` -> ``(4, 4, 8)``);
    ``DeviceError`` for anything else."""
    if not isinstance(text, str) or not _TOPOLOGY.fullmatch(text):
        raise DeviceError(
            f"slice topology {text!r} is not chips per side joined by x, such as 2x4 or 4x4x8"
        )
    sides = tuple(int(side) for side in re.split(r"[x×]", text.replace(" ", ""), flags=re.I))
    if 0 in sides:
        raise DeviceError(f"slice topology {text!r} has a side of 0 chips")
    return sides


def _name(sides: tuple[int, ...]) -> str:
    return "x".join(str(side) for side in sides)


@dataclass(frozen=True, slots=True)
class PodSlice:
    """One slice of a TPU pod: its topology and what its chips add up to.

    ``hosts`` is the slice's chips over the chips of one host, a fraction when the slice is
    part of one host (a v5e ``1x1`` is 1/8 of a host). ``tflops`` are the chip's dense figures
    times the chips, per dtype.
    """

    model: str
    topology: str
    sides: tuple[int, ...]
    chips: int
    hosts: Fraction
    memory_bytes: int
    memory_bandwidth_gbs: float
    tflops: Mapping[str, float] = field(hash=False)
    pod_chips: int

    @property
    def hosts_text(self) -> str:
        """``"16"``, or ``"1/8"`` for part of one host."""
        return str(self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "topology": self.topology,
            "chips": self.chips,
            "hosts": float(self.hosts),
            "memory_bytes": self.memory_bytes,
            "memory_bandwidth_gbs": self.memory_bandwidth_gbs,
            "tflops": dict(self.tflops),
            "pod_chips": self.pod_chips,
        }


@dataclass(frozen=True, slots=True)
class PodLayout:
    """How one TPU model's pod divides: its chips, chips per host and published slice shapes."""

    model: str
    chips: int
    chips_per_host: int
    slices: tuple[tuple[int, ...], ...]
    source: str = ""

    @classmethod
    def from_row(cls, model: str, row: Mapping[str, Any]) -> PodLayout:
        """The ``pod`` block of catalog row ``model``; ``DeviceError`` naming what is wrong."""
        where = f"catalog: {model}: pod"
        for key in ("chips", "chips_per_host"):
            value = row.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise DeviceError(f"{where}.{key}: expected a whole number >= 1, got {value!r}")
        shapes = row.get("slices")
        if not isinstance(shapes, list) or not shapes:
            raise DeviceError(f"{where}.slices: expected a list of topologies such as 2x2x1")
        slices = tuple(parse_topology(str(shape)) for shape in shapes)
        if len({len(sides) for sides in slices}) != 1:
            raise DeviceError(f"{where}.slices: mixes 2D and 3D topologies")
        too_big = [_name(s) for s in slices if math.prod(s) > row["chips"]]
        if too_big:
            raise DeviceError(
                f"{where}.slices: {', '.join(too_big)} has more chips than the pod's {row['chips']}"
            )
        return cls(model, row["chips"], row["chips_per_host"], slices, str(row.get("source", "")))

    @property
    def dims(self) -> int:
        """2 for a 2D torus (v5e, v6e), 3 for a 3D one (v4, v5p)."""
        return len(self.slices[0])

    @property
    def names(self) -> list[str]:
        """The published topologies, smallest first: ``['2x2x1', '2x2x2', …]``."""
        return [_name(sides) for sides in self.slices]

    def slice(self, spec: DeviceSpec, topology: str) -> PodSlice:
        """The slice of ``spec``'s pod laid out as ``topology``; ``DeviceError`` naming the
        published topologies when it is not one of them."""
        try:
            sides = parse_topology(topology)
        except DeviceError as exc:
            raise DeviceError(f"{exc}; {self._allowed()}") from None
        if sides not in self.slices:
            turned = [_name(s) for s in self.slices if sorted(s) == sorted(sides)]
            hint = ""
            if turned:
                hint = f" (did you mean {turned[0]}? the same sides, in Google's order)"
            raise DeviceError(f"{self.model} has no {_name(sides)} slice{hint}; {self._allowed()}")
        chips = math.prod(sides)
        return PodSlice(
            model=self.model,
            topology=_name(sides),
            sides=sides,
            chips=chips,
            hosts=Fraction(chips, self.chips_per_host),
            memory_bytes=spec.memory_bytes * chips,
            memory_bandwidth_gbs=spec.memory_bandwidth_gbs * chips,
            tflops=MappingProxyType({k: v * chips for k, v in spec.tflops.items()}),
            pod_chips=self.chips,
        )

    def _allowed(self) -> str:
        torus = f"{self.dims}D torus"
        return f"allowed {self.model} slices ({torus}): {', '.join(self.names)}"
