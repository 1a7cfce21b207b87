"""The nodes of a Ray cluster as the driver knows them: each node's record (``RayNode``), and
the nodes asked, side by side, for their devices and NICs (``probe_nodes``; the probe itself
runs there: ``hetero.runtime.ray_actor.probe_node``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetero.devices.network import Nic
from hetero.devices.spec import Device

if TYPE_CHECKING:
    from hetero.runtime.ray_actor import NodeProbe

__all__ = ["RayNode", "head_first", "probe_nodes", "short_id"]

#: How long a node may take to report its devices.
_PROBE_SECONDS = 60


@dataclass
class RayNode:
    """A node of the cluster: its Ray id, address and resources, the indices of its devices
    in the backend's fleet, whether it is alive and its NICs."""

    id: str
    short: str
    address: str
    resources: dict[str, float]
    devices: list[int] = field(default_factory=list)
    alive: bool = True
    nics: list[Nic] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The node as its devices' ``Device.node`` names it."""
        return f"{self.address}/{self.short}"

    def own(self, device: Device) -> Device:
        """``device``, found on this node, as the cluster's: its id made unique across the
        cluster (``<node>/<device>``), its node named, its live state its own."""
        return dataclasses.replace(
            device,
            id=f"{self.short}/{device.id}",
            node=self.name,
            state=dataclasses.replace(device.state),
        )


def probe_nodes(ray: Any, nodes: list[dict[str, Any]]) -> dict[str, NodeProbe]:
    """Ask each of ``nodes`` (``ray.nodes()`` entries) for its devices and NICs, side by side;
    a node that cannot be asked reports why."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from hetero.runtime.ray_actor import NodeProbe, probe_node

    refs = {
        n["NodeID"]: probe_node.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in nodes
    }
    found: dict[str, NodeProbe] = {}
    for nid, ref in refs.items():
        try:
            found[nid] = ray.get(ref, timeout=_PROBE_SECONDS)
        except Exception as exc:
            found[nid] = NodeProbe(None, problem=f"could not be asked for its devices: {exc}")
    return found


def short_id(node_id: str) -> str:
    """A node's id as logs and device ids show it."""
    return node_id[:6]


def head_first(info: dict[str, Any]) -> tuple[bool, str]:
    """The order nodes join the fleet in: the head node first, then by id."""
    return ("node:__internal_head__" not in info.get("Resources", {}), info["NodeID"])
