"""A node's network interfaces: what a node reports so that the links between nodes can be
ranked (``hetero.devices.topology.NodeTopology``).

``read_nics`` reads them where Linux describes them, ``/sys/class/net/<name>/``, under a root that
tests point at a directory of their own.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.errors import ConfigError

__all__ = ["FABRICS", "Nic", "read_nics"]

log = logging.getLogger("hetero.topology")

#: The fabrics a NIC may sit on.
FABRICS: tuple[str, ...] = ("ethernet", "infiniband")

# ``/sys/class/net/<name>/type`` is an ARPHRD_* number (linux/if_arp.h); other types (loopback
# 772, tunnels, ...) carry no traffic between nodes.
_ARPHRD_FABRIC = {1: "ethernet", 32: "infiniband"}


@dataclass(frozen=True, slots=True)
class Nic:
    """One network interface of a node: its name, fabric and link speed in Gb/s each way."""

    name: str
    fabric: str
    gbps: float

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        if not isinstance(self.name, str) or not self.name:
            problems.append(("name", f"expected a non-empty interface name, got {self.name!r}"))
        if self.fabric not in FABRICS:
            problems.append(("fabric", f"got {self.fabric!r}; allowed: {', '.join(FABRICS)}"))
        if (
            isinstance(self.gbps, bool)
            or not isinstance(self.gbps, int | float)
            or not math.isfinite(self.gbps)
            or self.gbps <= 0
        ):
            problems.append(("gbps", f"expected Gb/s > 0, got {self.gbps!r}"))
        if problems:
            raise ConfigError(problems)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "fabric": self.fabric, "gbps": self.gbps}


def read_nics(root: str | os.PathLike[str] = "/") -> list[Nic]:
    """The NICs of this machine that can carry traffic to other nodes, by name.

    Each interface of ``<root>/sys/class/net`` is read: ``type`` (1 Ethernet, 32 InfiniBand;
    others, such as loopback, are left out), ``device`` (present for hardware only: bridges,
    veth pairs, bonds and tunnels are left out, a bond's members are read instead),
    ``operstate`` (``down`` is left out) and ``speed`` (Mb/s; -1 or unreadable when the link is
    down or the driver cannot tell, and left out). No ``sys/class/net`` (not Linux): no NICs.
    """
    base = Path(root, "sys", "class", "net")
    try:
        names = sorted(entry.name for entry in base.iterdir())
    except OSError as exc:
        log.debug("no network interfaces under %s: %s", base, exc)
        return []
    nics = []
    for name in names:
        nic = _read_nic(base / name)
        if nic is not None:
            nics.append(nic)
    return nics


def _read_nic(path: Path) -> Nic | None:
    fabric = _ARPHRD_FABRIC.get(_read_int(path / "type") or 0)
    if fabric is None:
        log.debug("%s: not Ethernet or InfiniBand; left out", path.name)
        return None
    if not (path / "device").exists():
        log.debug("%s: a virtual interface; left out", path.name)
        return None
    if _read_text(path / "operstate") == "down":
        log.debug("%s: down; left out", path.name)
        return None
    speed = _read_int(path / "speed")
    if speed is None or speed <= 0:
        log.debug("%s: no link speed reported; left out", path.name)
        return None
    return Nic(path.name, fabric, speed / 1000)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text("ascii").strip()
    except (OSError, UnicodeDecodeError):  # EINVAL on a link that is down, absent files
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None
