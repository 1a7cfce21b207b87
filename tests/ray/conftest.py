"""Ray tests: a real multi-node cluster on this machine (``ray.cluster_utils.Cluster``), every
node declaring its own emulated fleet. All carry the ``ray`` marker (``pytest -m ray``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")

from hetero.runtime.ray_cluster import local_cluster
from tests.ray.fleets import FLEETS, write_fleet


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.ray)


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
