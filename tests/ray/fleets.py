"""The Ray tests' nodes: the emulated fleet each declares, written to a file that a node reads,
and a node added to a running cluster."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hetero.runtime.ray_cluster import node_args

# Three nodes with different emulated device sets (relative speeds in the names' order).
FLEETS: dict[str, list[dict[str, Any]]] = {
    "head": [{"type": "gpu", "model": "A100-80GB", "emulate": True, "speed": 2.5, "count": 2}],
    "n1": [{"type": "gpu", "model": "V100-32GB", "emulate": True, "speed": 1.0}],
    "n2": [
        {"type": "gpu", "model": "T4", "emulate": True, "speed": 0.5},
        {"type": "gpu", "model": "V100-32GB", "emulate": True, "speed": 1.0},
    ],
}


def write_fleet(directory: Path, name: str, devices: Sequence[dict[str, Any]]) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"devices": list(devices)}))
    return path


def add_node(cluster: Any, config: Path) -> Any:
    node = cluster.add_node(num_cpus=1, **node_args(config))
    cluster.wait_for_nodes()
    return node
