"""Latency and hops beside bandwidth, for GPU links and node links, and the racks of nodes,
read from a nodes file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.commands.topology import register
from hetero.devices.fake_nvml import mixed_box, nvswitch_box, pcie_box
from hetero.devices.network import Nic
from hetero.devices.topology import (
    CROSS_RACK_HOPS,
    LINK_HOPS,
    NET_LATENCY_US,
    NVLINK_LATENCY_US,
    PCIE_LATENCY_US,
    SAME_RACK_HOPS,
    Link,
    LinkKind,
    NodeTopology,
    Topology,
)
from hetero.devices.topology_file import (
    node_topology_from_dict,
    read_any_topology_file,
    topology_from_dict,
)
from hetero.devices.topology_nvml import read_topology
from hetero.errors import ConfigError
from tests.cli_apps import command_app

app = command_app(register)
runner = CliRunner()


# --- GPU links: latency and hops ----------------------------------------------------------------


def test_every_link_carries_latency_and_hops_by_its_kind() -> None:
    topo = read_topology(pcie_box(), environ={})
    pix, sys_, pxb = topo.link(0, 1), topo.link(0, 2), topo.link(2, 3)
    assert (pix.latency_us, pix.hops) == (PCIE_LATENCY_US, 2)
    assert (sys_.latency_us, sys_.hops) == (PCIE_LATENCY_US, 3)
    assert pxb.hops == 3 and topo.link(0, 0).hops == 0 and topo.link(0, 0).latency_us == 0
    fabric = read_topology(nvswitch_box(), environ={}).link(0, 5)
    assert (fabric.kind, fabric.latency_us, fabric.hops) == (LinkKind.NVSWITCH, 0.6, 2)
    direct = read_topology(mixed_box(), environ={}).link(0, 1)
    assert (direct.kind, direct.latency_us, direct.hops) == (LinkKind.NVLINK, NVLINK_LATENCY_US, 1)
    assert set(LINK_HOPS) == set(LinkKind)
    # Given figures are kept; left out, the kind's.
    assert Link(LinkKind.PIX, 64, latency_us=0.8, hops=1) != Link(LinkKind.PIX, 64)


def test_matrix_json_and_group_show_latency_and_hops() -> None:
    topo = read_topology(pcie_box(), environ={})
    lines = topo.format_matrix().splitlines()
    at = lines.index("µs/hops  gpu:0  gpu:1  gpu:2  gpu:3")
    assert lines[at + 1].split() == ["gpu:0", "-", "1/2", "1/3", "1/3"]
    assert lines[-1].startswith("µs/hops: latency of one small step")
    data = topo.to_dict()
    assert data["latency_us"][0] == [0.0, 1.0, 1.0, 1.0] and data["hops"][0] == [0, 2, 3, 3]
    result = runner.invoke(app, ["topology", "--fake", "pcie", "--group", "2"])
    assert "slowest link PIX, 64 GB/s, 1 µs, 2 hops" in result.stdout


def test_a_topology_file_may_give_latency_and_hops_and_must_agree_both_ways() -> None:
    base = {
        "devices": [{"id": "a", "model": "L4"}, {"id": "b", "model": "L4"}],
        "links": [["X", "PIX"], ["PIX", "X"]],
    }
    given = topology_from_dict(
        {**base, "latency_us": [[0, 0.8], [0.8, 0]], "hops": [[0, 1], [1, 0]]}
    )
    assert (given.link(0, 1).latency_us, given.link(0, 1).hops) == (0.8, 1)
    assert topology_from_dict(base).link(0, 1).hops == 2  # left out: the kind's
    round_trip = topology_from_dict(json.loads(json.dumps(given.to_dict())))
    assert round_trip == given
    with pytest.raises(ConfigError) as info:
        topology_from_dict({**base, "latency_us": [[0, 0.8], [0.9, 0]], "hops": [[0, -1], [1, 0]]})
    problems = dict(info.value.problems)
    assert "expected hops as a whole number >= 0, got -1" in problems["hops[0][1]"]
    with pytest.raises(ConfigError, match=r"latency_us\[1\]\[0\]: a → b is PIX at 64 GB/s, 0.8 µs"):
        topology_from_dict({**base, "latency_us": [[0, 0.8], [0.9, 0]]})


# --- node links: racks, hops, latency ---------------------------------------------------------


def _cluster() -> NodeTopology:
    ib = [Nic("ib0", "infiniband", 400)]
    return NodeTopology.from_nics(
        {"a": ib, "b": ib, "c": ib, "edge": [Nic("eth0", "ethernet", 25)]},
        {"a": "r1", "b": "r1", "c": "r2"},
    )


def test_node_links_count_hops_by_rack() -> None:
    nodes = _cluster()
    assert nodes.rack("a") == "r1" and nodes.rack("edge") is None
    assert nodes.rack_of == {"a": "r1", "b": "r1", "c": "r2"}
    same, across = nodes.link("a", "b"), nodes.link("a", "c")
    assert (same.hops, same.latency_us) == (SAME_RACK_HOPS, NET_LATENCY_US) == (2, 2.7)
    assert (across.hops, across.gbs) == (CROSS_RACK_HOPS, 100.0)
    assert nodes.same_rack("a", "b") and nodes.same_rack("a", "c") is False
    assert nodes.same_rack("a", "edge") is None and nodes.same_rack("edge", "edge")
    unknown = nodes.link("a", "edge")  # no shared fabric, no rack: neither figure
    assert (unknown.fabric, unknown.latency_us, unknown.hops) == (None, None, None)
    assert nodes.link("a", "a").hops == 0
    data = nodes.to_dict()
    assert data["nodes"][0]["rack"] == "r1" and data["hops"][0] == [0, 2, 4, None]
    lines = [line.split() for line in nodes.format_matrix().splitlines()]
    assert ["a", "-", "2.7/2", "2.7/4", "?/?"] in lines
    assert ["c", "r2", "ib0", "infiniband", "400", "Gb/s"] in lines


def test_bad_racks_are_refused_naming_the_node() -> None:
    with pytest.raises(ConfigError, match=r"racks\['x'\]: no node 'x'; the nodes are a"):
        NodeTopology.from_nics({"a": []}, {"x": "r1"})
    with pytest.raises(ConfigError, match=r"nodes\[0\].rack: expected a rack name or None"):
        NodeTopology(("a",), ((),), ("  ",))


def test_a_nodes_file_says_each_nodes_rack(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text(
        "nodes:\n"
        "  - {name: a, rack: r1, nics: [{name: ib0, fabric: infiniband, gbps: 400}]}\n"
        "  - {name: b, rack: r1, nics: [{name: ib0, fabric: infiniband, gbps: 400}]}\n"
        "  - {name: c, nics: [{name: eth0, gbps: 25}]}\n"
    )
    nodes = read_any_topology_file(path)
    assert isinstance(nodes, NodeTopology)
    assert nodes.racks == ("r1", "r1", None) and nodes.link("a", "b").hops == 2
    # What --json prints reads back the same.
    assert node_topology_from_dict(json.loads(json.dumps(nodes.to_dict()))) == nodes
    result = runner.invoke(app, ["topology", "--file", str(path)])
    assert result.exit_code == 0, result.output
    assert "3 nodes (file:" in result.stdout and "2.7/2" in result.stdout
    group = runner.invoke(app, ["topology", "--file", str(path), "--group", "2"])
    assert group.exit_code == 1 and "does not apply to a file of nodes" in group.stderr
    assert isinstance(read_any_topology_file(_box_file(tmp_path)), Topology)


def _box_file(tmp_path: Path) -> Path:
    path = tmp_path / "box.json"
    path.write_text(json.dumps(read_topology(mixed_box(), environ={}).to_dict()))
    return path


def test_a_bad_nodes_file_names_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "nodes:\n"
        "  - {name: a, rack: '', nics: [{name: e, gbps: -1}, {fabric: ethernet}]}\n"
        "  - {name: a}\n"
        "extra: 1\n"
    )
    result = runner.invoke(app, ["topology", "--file", str(path)])
    assert result.exit_code == 1
    for text in (
        "extra: unknown key 'extra'",
        "nodes[0].rack: expected a rack name (left out: unknown), got ''",
        "nodes[0].nics[0].gbps: expected Gb/s > 0, got -1",
        "nodes[0].nics[1].name: required field is missing",
        "nodes[1].name: 'a' is listed twice",
    ):
        assert f"error: --file {path}: {text}" in result.stderr
