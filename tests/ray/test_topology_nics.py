"""Each Ray node reports its NICs (declared in its HETERO_NODE_CONFIG, else read there), and
``hetero topology --ray`` shows how the nodes reach each other."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from hetero.commands.topology import register
from hetero.devices.network import Nic, read_nics
from hetero.devices.topology import NodeTopology
from hetero.runtime import ray_actor
from hetero.runtime.ray_backend import RayBackend
from hetero.runtime.ray_cluster import NODE_CONFIG_ENV, local_cluster
from tests.cli_apps import command_app, hetero_cli

T4 = {"type": "gpu", "model": "T4", "emulate": True}
# Two nodes declare their NICs; the third declares none, so it reports those read on it.
NICS: dict[str, list[dict[str, Any]]] = {
    "head": [
        {"name": "ib0", "fabric": "infiniband", "gbps": 400},
        {"name": "eth0", "gbps": 100},
    ],
    "n1": [
        {"name": "ib0", "fabric": "infiniband", "gbps": 200},
        {"name": "eth0", "gbps": 25},
    ],
    "n2": [],
}
READ_HERE = [Nic("eth7", "ethernet", 10.0)]


def node_config(directory: Path, name: str, nodes: dict[str, Any] | None = None) -> Path:
    path = directory / f"{name}.yaml"
    data: dict[str, Any] = {"devices": [T4]}
    if nodes:
        data["nodes"] = nodes
    path.write_text(yaml.safe_dump(data))
    return path


def declared(name: str) -> list[Nic]:
    return [Nic(n["name"], n.get("fabric", "ethernet"), float(n["gbps"])) for n in NICS[name]]


# --- the probe, run here as a node runs it ------------------------------------------------------


@pytest.fixture
def nics_read_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_actor, "read_nics", lambda: list(READ_HERE))


@pytest.mark.usefixtures("nics_read_here")
def test_a_node_without_a_config_reports_the_nics_read_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NODE_CONFIG_ENV, raising=False)
    probe = ray_actor._probe_node()
    assert probe.devices and probe.nics == READ_HERE and probe.problem == ""


@pytest.mark.usefixtures("nics_read_here")
def test_nics_declared_in_the_node_config_win_over_those_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = node_config(tmp_path, "head", {"localhost": {"nics": NICS["head"]}})
    monkeypatch.setenv(NODE_CONFIG_ENV, str(path))
    probe = ray_actor._probe_node()
    assert probe.nics == declared("head")
    assert [d.model for d in probe.devices or []] == ["T4"]
    monkeypatch.setenv(NODE_CONFIG_ENV, str(node_config(tmp_path, "bare")))
    assert ray_actor._probe_node().nics == READ_HERE


def test_a_node_config_declaring_nics_for_two_nodes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "devices": [{**T4, "node": "a"}, {**T4, "node": "b"}],
                "nodes": {"a": {"nics": NICS["head"]}, "b": {"nics": NICS["n1"]}},
            }
        )
    )
    monkeypatch.setenv(NODE_CONFIG_ENV, str(path))
    probe = ray_actor._probe_node()
    assert probe.devices is None
    assert f"{NODE_CONFIG_ENV}={path}" in probe.problem
    assert "NICs are declared for a, b, but a Ray node's config describes that one node" in (
        probe.problem
    )


# --- a real three-node cluster -------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    directory = tmp_path_factory.mktemp("nic-fleets")
    configs = [
        node_config(directory, name, {"localhost": {"nics": nics}} if nics else None)
        for name, nics in NICS.items()
    ]
    with local_cluster(configs) as c:
        yield c


def by_nics(nodes: NodeTopology) -> dict[str, str]:
    """Which config each node of ``nodes`` started from, told by the NICs it reported."""
    read = read_nics()  # the node that declares none is this machine too
    wanted = {"head": declared("head"), "n1": declared("n1"), "n2": read}
    found = {}
    for node, nics in zip(nodes.nodes, nodes.nics, strict=True):
        (name,) = [n for n, want in wanted.items() if list(nics) == want and n not in found]
        found[name] = node
    return found


def test_the_backend_keeps_every_nodes_nics_under_its_devices_node_name(cluster: Any) -> None:
    backend = RayBackend(cluster.address)
    try:
        devices = backend.discover()
        nodes = backend.node_topology()
    finally:
        backend.close()
    assert len(nodes) == 3
    assert {d.node for d in devices} == set(nodes.nodes)  # rank_order can take it as it is
    name = by_nics(nodes)
    link = nodes.link(name["head"], name["n1"])
    assert (link.fabric, link.gbps, link.label) == ("infiniband", 200.0, "IB 200G")
    assert nodes.nodes[0] == name["head"]  # the head first, as in the fleet


def test_hetero_topology_ray_prints_the_node_matrix_as_config_does(cluster: Any) -> None:
    done = hetero_cli("topology", "--ray", "--address", cluster.address, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["source"] == f"ray:{cluster.address}"
    names = [n["name"] for n in data["nodes"]]
    nodes = NodeTopology.from_nics(
        {n["name"]: [Nic(**nic) for nic in n["nics"]] for n in data["nodes"]}
    )
    assert data["links"] == nodes.to_dict()["links"]
    name = by_nics(nodes)
    head, n1 = names.index(name["head"]), names.index(name["n1"])
    assert data["links"][head][n1] == "IB 200G"
    assert data["bandwidth_gbs"][head][n1] == 50.0  # 200 Gb/s each way, both ways in GB/s

    shown = hetero_cli("topology", "--ray", "--address", cluster.address)
    assert shown.returncode == 0, shown.stderr
    assert f"3 nodes (ray:{cluster.address})" in shown.stdout
    assert nodes.format_matrix() in shown.stdout
    if not read_nics():  # this machine has no NIC with a link speed (a container's veth)
        assert f"no NICs known for {name['n2']}" in " ".join(shown.stderr.split())


# --- bad input -----------------------------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    return command_app(register)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_nobody_answers_is_a_clear_error(cli: typer.Typer) -> None:
    address = f"127.0.0.1:{free_port()}"
    result = CliRunner().invoke(cli, ["topology", "--ray", "--address", address])
    assert result.exit_code == 1
    message = " ".join(result.stderr.split())
    assert f"error: cannot reach the Ray cluster at {address}" in message
    assert "is `ray start --head` running there" in message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ray", "--config", "c.yaml"], "--ray shows the nodes of a Ray cluster; drop --config"),
        (
            ["--ray", "--group", "2"],
            "--group picks GPUs of one machine; it does not apply to --ray",
        ),
        (["--address", "auto"], "--address 'auto' applies to --ray only"),
    ],
)
def test_ray_option_errors(cli: typer.Typer, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["topology", *args])
    assert result.exit_code == 1
    assert message in " ".join(result.stderr.split())
