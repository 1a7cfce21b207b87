"""Ray tests: a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``), every
node declaring its own emulated fleet. All carry the ``ray`` marker (``pytest -m ray``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("ray")

from hetero.runtime.ray_cluster import local_cluster, node_args

# Three nodes with different emulated device sets (relative speeds in the names' order).
FLEETS: dict[str, list[dict[str, Any]]] = {
    "head": [{"type": "gpu", "model": "A100-80GB", "emulate": True, "speed": 2.5, "count": 2}],
    "n1": [{"type": "gpu", "model": "V100-32GB", "emulate": True, "speed": 1.0}],
    "n2": [
        {"type": "gpu", "model": "T4", "emulate": True, "speed": 0.5},
        {"type": "gpu", "model": "V100-32GB", "emulate": True, "speed": 1.0},
    ],
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.ray)


def write_fleet(directory: Path, name: str, devices: Sequence[dict[str, Any]]) -> Path:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"devices": list(devices)}))
    return path


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("fleets")
    for name, devices in FLEETS.items():
        write_fleet(directory, name, devices)
    return directory


@pytest.fixture(scope="module")
def cluster(fleet_dir: Path) -> Iterator[Any]:
    """The three-node cluster, shared by a module's tests (which leave it as they found it)."""
    with local_cluster([fleet_dir / f"{n}.yaml" for n in FLEETS]) as c:
        yield c


def add_node(cluster: Any, config: Path) -> Any:
    node = cluster.add_node(num_cpus=1, **node_args(config))
    cluster.wait_for_nodes()
    return node
