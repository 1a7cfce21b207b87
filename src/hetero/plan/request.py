"""What a ``DevicePool`` is asked for: ``AllocationRequest`` with its ``Affinity`` and
``AntiAffinity``, each checked on construction (every problem at once, as a ``ConfigError``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection
from dataclasses import KW_ONLY, dataclass
from typing import Literal

from hetero._checks import is_positive
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DTYPES, DeviceKind
from hetero.errors import ConfigError, HeteroError
from hetero.units import format_size

__all__ = ["Affinity", "AllocationRequest", "AntiAffinity", "lease_problems"]

Problems = list[tuple[str, str]]
_Grouping = Literal["any", "one_node", "spread"]
_LEVELS = ("device", "node")
_KINDS = [kind.value for kind in DeviceKind]


def norm_name(name: str) -> str:
    """Interconnect names compared as the catalog compares models: case, spaces, dashes ignored."""
    return re.sub(r"[\s_\-]+", "", name.casefold())


def closest(value: str, known: Collection[str]) -> str:
    """``"; closest: …"`` naming known names that look like ``value`` (any case), or ``""``."""
    by_folded = {name.casefold(): name for name in known}
    close = difflib.get_close_matches(value.casefold(), list(by_folded), n=3, cutoff=0.5)
    return f"; closest: {', '.join(by_folded[c] for c in close)}" if close else ""


def _names(value: object, path: str, problems: Problems) -> tuple[str, ...]:
    """``value`` as distinct non-empty strings in their order, or a problem at ``path``."""
    if isinstance(value, str) or not isinstance(value, Collection):
        problems.append((path, f"expected a list of names, got {value!r}"))
        return ()
    bad = [item for item in value if not isinstance(item, str) or not item]
    if bad:
        problems.append((path, f"expected non-empty strings, got {bad[0]!r}"))
        return ()
    return tuple(dict.fromkeys(value))


def _flag(value: object, path: str, problems: Problems) -> None:
    if not isinstance(value, bool):
        problems.append((path, f"expected true or false, got {value!r}"))


def lease_problems(value: object, path: str = "lease") -> Problems:
    """What is wrong with ``value`` as a lease: seconds, finite and > 0, or None (no lease)."""
    if value is None or is_positive(value):
        return []
    return [(path, f"expected seconds > 0 (None: no lease), got {value!r}")]


@dataclass(frozen=True, slots=True, kw_only=True)
class Affinity:
    """Where the chosen devices must be.

    ``same_node``: all on one node. ``same_rack``: all on nodes of one rack (a node's rack comes
    from a fleet config's ``rack:``, ``Device.rack``, or a nodes file, ``NodeTopology.racks``,
    given to ``DevicePool(racks=…)``; a node whose rack is not known shares none with another),
    looser than ``same_node``. ``interconnect``: all on one node and with this
    interconnect family in their spec (``"nvlink"`` matches NVLink2 to NVLink5, ``"nvlink4"``
    only NVLink4). ``devices``: only these device ids. ``tags``: only devices that carry every
    one of these tags.
    """

    same_node: bool = False
    same_rack: bool = False
    interconnect: str | None = None
    devices: Collection[str] = ()
    tags: Collection[str] = ()

    def __post_init__(self) -> None:
        problems: Problems = []
        _flag(self.same_node, "affinity.same_node", problems)
        _flag(self.same_rack, "affinity.same_rack", problems)
        if self.interconnect is not None and (
            not isinstance(self.interconnect, str) or not norm_name(self.interconnect)
        ):
            problems.append(
                (
                    "affinity.interconnect",
                    f"expected an interconnect name such as 'nvlink' or 'pcie4', "
                    f"got {self.interconnect!r}",
                )
            )
        object.__setattr__(self, "devices", _names(self.devices, "affinity.devices", problems))
        tags = _names(self.tags, "affinity.tags", problems)
        object.__setattr__(self, "tags", frozenset(tags))
        if problems:
            raise ConfigError(problems)

    @property
    def one_node(self) -> bool:
        """Whether every chosen device must sit on one node."""
        return self.same_node or self.interconnect is not None

    @property
    def one_rack(self) -> bool:
        """Whether every chosen device must sit in one rack (one node is in one rack)."""
        return self.same_rack or self.one_node


@dataclass(frozen=True, slots=True, kw_only=True)
class AntiAffinity:
    """Where the chosen devices must not be.

    ``spread_nodes``: every chosen device on a different node. ``avoid``: device ids never to
    pick. ``allocations``: names of live allocations whose devices (``level="device"``) or whole
    nodes (``level="node"``) to keep away from, e.g. the other replicas of one service.
    """

    spread_nodes: bool = False
    avoid: Collection[str] = ()
    allocations: Collection[str] = ()
    level: Literal["device", "node"] = "device"

    def __post_init__(self) -> None:
        problems: Problems = []
        _flag(self.spread_nodes, "anti_affinity.spread_nodes", problems)
        object.__setattr__(self, "avoid", _names(self.avoid, "anti_affinity.avoid", problems))
        allocations = _names(self.allocations, "anti_affinity.allocations", problems)
        object.__setattr__(self, "allocations", allocations)
        if self.level not in _LEVELS:
            problems.append(
                (
                    "anti_affinity.level",
                    f"got {self.level!r}; allowed: {', '.join(_LEVELS)}"
                    f"{closest(str(self.level), _LEVELS)}",
                )
            )
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class AllocationRequest:
    """What to allocate: ``count`` devices, each with ``memory`` bytes free.

    ``kind`` (``"gpu"``, ...) and ``model`` (a catalog or driver name, stored as the catalog's
    canonical name) narrow the devices, and so does ``min_tflops``: each device's dense peak in
    ``dtype`` must reach it. A device is shared by several allocations up to its memory unless
    ``exclusive``, which needs a device nobody holds and keeps everyone else off it. ``name``
    names the allocation (unique among live ones; one is made up when left out) so that later
    requests can keep away from it. With ``lease`` (seconds) the allocation ends by itself that
    long after it is made unless renewed. Invalid values raise ``ConfigError`` naming each
    field, the value and what is allowed.
    """

    count: int = 1
    _: KW_ONLY
    kind: DeviceKind | str | None = None
    model: str | None = None
    memory: int = 0
    min_tflops: float | None = None
    dtype: str = "bf16"
    exclusive: bool = False
    affinity: Affinity = Affinity()
    anti_affinity: AntiAffinity = AntiAffinity()
    name: str | None = None
    lease: float | None = None

    def __post_init__(self) -> None:
        problems: Problems = []
        if not isinstance(self.count, int) or isinstance(self.count, bool) or self.count < 1:
            problems.append(("count", f"expected a whole number >= 1, got {self.count!r}"))
        if not isinstance(self.memory, int) or isinstance(self.memory, bool) or self.memory < 0:
            problems.append(
                (
                    "memory",
                    f"expected bytes as a whole number >= 0 (hetero.units.parse_size('40GB') "
                    f"converts sizes), got {self.memory!r}",
                )
            )
        if self.min_tflops is not None and not is_positive(self.min_tflops):
            problems.append(
                ("min_tflops", f"expected TFLOPS > 0 (None: no minimum), got {self.min_tflops!r}")
            )
        if self.dtype not in DTYPES:
            problems.append(
                (
                    "dtype",
                    f"got {self.dtype!r}; allowed: {', '.join(DTYPES)}"
                    f"{closest(str(self.dtype), DTYPES)}",
                )
            )
        _flag(self.exclusive, "exclusive", problems)
        problems += lease_problems(self.lease)
        if not isinstance(self.affinity, Affinity):
            problems.append(("affinity", f"expected an Affinity, got {self.affinity!r}"))
        if not isinstance(self.anti_affinity, AntiAffinity):
            problems.append(
                ("anti_affinity", f"expected an AntiAffinity, got {self.anti_affinity!r}")
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            problems.append(("name", f"expected a non-empty string, got {self.name!r}"))
        self._resolve_device_type(problems)
        if not problems:
            self._check_consistent(problems)
        if problems:
            raise ConfigError(problems)

    def _resolve_device_type(self, problems: Problems) -> None:
        kind = self.kind
        if kind is not None and not isinstance(kind, DeviceKind):
            text = str(kind).lower()
            if text in _KINDS:
                kind = DeviceKind(text)
                object.__setattr__(self, "kind", kind)
            else:
                problems.append(
                    (
                        "kind",
                        f"got {self.kind!r}; allowed: {', '.join(_KINDS)}{closest(text, _KINDS)}",
                    )
                )
                kind = None
        if self.model is None:
            return
        if not isinstance(self.model, str):
            problems.append(("model", f"expected a catalog model name, got {self.model!r}"))
            return
        try:
            spec = get_catalog().get(self.model)
        except HeteroError as exc:
            problems.append(("model", str(exc)))
            return
        object.__setattr__(self, "model", spec.model)
        if kind is not None and spec.kind is not kind:
            problems.append(
                ("kind", f"{kind.value!r} contradicts model {spec.model}, which is a {spec.kind}")
            )

    def _check_consistent(self, problems: Problems) -> None:
        affinity, anti = self.affinity, self.anti_affinity
        if self.count > 1 and anti.spread_nodes and affinity.one_node:
            problems.append(
                (
                    "anti_affinity.spread_nodes",
                    f"{self.count} devices cannot be each on a different node and all on one "
                    "node (affinity.same_node or affinity.interconnect); drop one of the two",
                )
            )
        if affinity.devices and self.count > len(affinity.devices):
            problems.append(
                (
                    "count",
                    f"asks for {self.count} devices but affinity.devices names only "
                    f"{len(affinity.devices)}",
                )
            )
        if self.name is not None and self.name in anti.allocations:
            problems.append(
                ("anti_affinity.allocations", f"allocation {self.name!r} cannot avoid itself")
            )

    @property
    def grouping(self) -> _Grouping:
        """How the chosen devices must spread over nodes."""
        if self.affinity.one_node:
            return "one_node"
        return "spread" if self.anti_affinity.spread_nodes else "any"

    def describe(self) -> str:
        """The request in words, as error messages quote it."""
        what = self.model or (str(self.kind) if self.kind else "device")
        head = f"{self.count} × {what}"
        if self.memory:
            head += f" with {format_size(self.memory)} free each"
        parts = [head]
        affinity, anti = self.affinity, self.anti_affinity
        if self.min_tflops is not None:
            parts.append(f"at least {self.min_tflops:g} {self.dtype} TFLOPS each")
        if self.exclusive:
            parts.append("exclusive")
        if affinity.interconnect:
            parts.append(f"on one node over {affinity.interconnect}")
        elif affinity.same_node:
            parts.append("on one node")
        elif affinity.same_rack:
            parts.append("in one rack")
        if anti.spread_nodes:
            parts.append("each on a different node")
        if affinity.tags:
            parts.append(f"tagged {', '.join(sorted(affinity.tags))}")
        if affinity.devices:
            parts.append(f"among {', '.join(affinity.devices)}")
        if anti.avoid:
            parts.append(f"avoiding {', '.join(anti.avoid)}")
        if anti.allocations:
            parts.append(f"away from the {anti.level}s of {', '.join(anti.allocations)}")
        if self.lease is not None:
            parts.append(f"leased for {self.lease:g} s")
        return ", ".join(parts)
