"""Topology files: what `hetero topology --json` writes reads back, rates follow from labels,
and a file that contradicts itself is refused with every problem named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hetero.devices.fake_nvml import mixed_box, nvswitch_box, pcie_box
from hetero.devices.topology import LinkKind
from hetero.devices.topology_file import read_topology_file, topology_from_dict
from hetero.devices.topology_nvml import read_topology
from hetero.errors import ConfigError


@pytest.mark.parametrize("build", [nvswitch_box, pcie_box, mixed_box])
def test_a_topology_reads_back_from_its_json(build: object, tmp_path: Path) -> None:
    topology = read_topology(build(), environ={})  # type: ignore[operator]
    path = tmp_path / "box.json"
    path.write_text(json.dumps({"source": "fake", **topology.to_dict(), "group": None}))
    assert read_topology_file(path) == topology


def test_rates_follow_from_labels_and_the_catalog(tmp_path: Path) -> None:
    path = tmp_path / "box.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "devices": [
                    {"id": "a", "model": "A100-80GB", "numa_node": 0, "cpu_affinity": "0-3,8"},
                    {"id": "b", "model": "A100-80GB"},
                    {"id": "v", "model": "V100-32GB"},
                ],
                "links": [["X", "NV12", "SYS"], ["NV12", "X", "PHB"], ["SYS", "PHB", "X"]],
            }
        )
    )
    topology = read_topology_file(path)
    assert topology.link("a", "b").gbs == 600  # 12 NVLink3 links of 50 GB/s
    assert topology.link("a", "v").kind is LinkKind.SYS
    assert topology.link("a", "v").gbs == 16  # the V100's PCIe Gen3 x16, halved
    assert topology.link("b", "v").gbs == pytest.approx(25.6)  # PHB: 0.8 of Gen3
    assert topology.devices[0].cpus == (0, 1, 2, 3, 8)


def test_every_contradiction_is_named() -> None:
    data = read_topology(mixed_box(), environ={}).to_dict()
    data["devices"][3]["id"] = "gpu:1"
    data["links"][2][0] = "NV6"
    data["bandwidth_gbs"][1][0] = 300.0
    with pytest.raises(ConfigError) as info:
        topology_from_dict(data)
    assert info.value.problems == [
        ("devices[3].id", "'gpu:1' is listed twice (also devices[1])"),
        (
            "bandwidth_gbs[1][0]",
            "gpu:0 → gpu:1 is NV12 at 600 GB/s but gpu:1 → gpu:0 is NV12 at 300 GB/s; a link "
            "is the same both ways",
        ),
        (
            "links[2][0]",
            "gpu:0 → gpu:2 is SYS at 16 GB/s but gpu:2 → gpu:0 is NV6 at 16 GB/s; a link is the "
            "same both ways",
        ),
    ]


@pytest.mark.parametrize(
    ("change", "where", "text"),
    [
        (lambda d: d.update(extra=1), "extra", "unknown key 'extra'; allowed keys: devices, links"),
        (lambda d: d.pop("links"), "links", "required field is missing"),
        (lambda d: d.update(devices="gpu:0"), "devices", "expected a list of devices"),
        (lambda d: d["devices"][0].pop("model"), "devices[0].model", "required field is missing"),
        (lambda d: d["devices"][1].update(id=""), "devices[1].id", "expected a non-empty string"),
        (lambda d: d["devices"][0].update(numa_node=-1), "devices[0].numa_node", "got -1"),
        (lambda d: d["devices"][0].update(cpu_affinity="0-x"), "devices[0].cpu_affinity", "'0-x'"),
        (lambda d: d["devices"][0].update(colour=1), "devices[0].colour", "unknown key"),
        (lambda d: d["links"].pop(), "links", "expected a 4×4 matrix, one row per device"),
        (lambda d: d["links"][0].__setitem__(1, "NV"), "links[0][1]", "unknown link label 'NV'"),
        (lambda d: d["links"][0].__setitem__(1, "NV0"), "links[0][1]", "'NV0' has no NVLinks"),
        (lambda d: d["links"][0].__setitem__(1, "XGMI"), "links[0][1]", "allowed: X, NVS<n>"),
        (lambda d: d["links"][0].__setitem__(0, "PIX"), "links[0][0]", "to itself must be X"),
        (
            lambda d: d["bandwidth_gbs"][0].__setitem__(1, -5),
            "bandwidth_gbs[0][1]",
            "expected GB/s as a number >= 0, got -5",
        ),
    ],
)
def test_bad_files_name_the_place(change: object, where: str, text: str) -> None:
    data = read_topology(mixed_box(), environ={}).to_dict()
    change(data)  # type: ignore[operator]
    with pytest.raises(ConfigError) as info:
        topology_from_dict(data)
    assert where in [path for path, _ in info.value.problems], info.value.problems
    assert text in str(info.value)


def test_not_a_mapping_and_a_bad_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="expected a mapping with 'devices' and 'links'"):
        topology_from_dict([1, 2])
    path = tmp_path / "box.json"
    path.write_text("{")
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        read_topology_file(path)
    path.write_text(json.dumps({"devices": [], "links": [], "colour": "red"}))
    with pytest.raises(ConfigError, match=rf"{path}: colour: unknown key 'colour'"):
        read_topology_file(path)
