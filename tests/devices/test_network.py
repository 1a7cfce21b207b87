"""A node's NICs, read from a /sys/class/net laid out in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetero.config import parse_config
from hetero.devices.network import Nic, read_nics
from hetero.errors import ConfigError


def interface(
    root: Path,
    name: str,
    *,
    kind: int = 1,
    speed: str | None = "25000",
    state: str = "up",
    hardware: bool = True,
) -> None:
    path = root / "sys" / "class" / "net" / name
    path.mkdir(parents=True)
    (path / "type").write_text(f"{kind}\n")
    (path / "operstate").write_text(f"{state}\n")
    if speed is not None:
        (path / "speed").write_text(f"{speed}\n")
    if hardware:
        (path / "device").mkdir()  # a symlink to the PCI device on a real machine


def test_read_nics_keeps_hardware_that_is_up_with_a_speed(tmp_path: Path) -> None:
    interface(tmp_path, "eth0", speed="100000")
    interface(tmp_path, "ib0", kind=32, speed="400000")
    interface(tmp_path, "lo", kind=772, hardware=False)
    interface(tmp_path, "docker0", hardware=False)  # a bridge
    interface(tmp_path, "veth1a2b", speed="10000", hardware=False)
    interface(tmp_path, "eth1", speed="-1", state="down")
    interface(tmp_path, "eth2", speed=None)  # reading speed fails (EINVAL) on some drivers
    interface(tmp_path, "eth3", speed="unknown")
    assert read_nics(tmp_path) == [
        Nic("eth0", "ethernet", 100.0),
        Nic("ib0", "infiniband", 400.0),
    ]


def test_no_sysfs_means_no_nics(tmp_path: Path) -> None:
    assert read_nics(tmp_path) == []


def test_read_nics_on_this_machine_returns_nics() -> None:
    assert all(isinstance(nic, Nic) and nic.gbps > 0 for nic in read_nics())


@pytest.mark.parametrize(
    ("fields", "text"),
    [
        ({"name": ""}, "name: expected a non-empty interface name"),
        ({"fabric": "roce"}, "fabric: got 'roce'; allowed: ethernet, infiniband"),
        ({"gbps": 0}, "gbps: expected Gb/s > 0, got 0"),
        ({"gbps": float("nan")}, "gbps: expected Gb/s > 0, got nan"),
    ],
)
def test_bad_nics(fields: dict[str, object], text: str) -> None:
    values: dict[str, object] = {"name": "eth0", "fabric": "ethernet", "gbps": 25.0, **fields}
    with pytest.raises(ConfigError, match=text):
        Nic(**values)  # type: ignore[arg-type]


def test_a_fleet_config_declares_each_nodes_nics() -> None:
    config = parse_config(
        {
            "devices": [{"type": "gpu", "model": "L4", "emulate": True, "node": "n1"}],
            "nodes": {"n1": {"nics": [{"name": "ib0", "fabric": "InfiniBand", "gbps": 400}]}},
        }
    )
    (nic,) = config.nodes["n1"].nics
    assert (nic.name, nic.fabric, nic.gbps) == ("ib0", "infiniband", 400)


def test_bad_node_entries_are_named() -> None:
    devices = [{"type": "cpu"}]
    nics = [{"name": "a", "gbps": 0}, {"name": "b", "fabric": "ib", "gbps": 1, "speed": 2}]
    with pytest.raises(ConfigError) as info:
        parse_config({"devices": devices, "nodes": {"localhst": {"nics": nics}}})
    assert info.value.problems == [
        ("nodes.localhst.nics[0].gbps", "Input should be greater than 0 (got 0)"),
        ("nodes.localhst.nics[1].fabric", "Input should be 'ethernet' or 'infiniband' (got 'ib')"),
        (
            "nodes.localhst.nics[1].speed",
            "unknown key 'speed'; allowed keys: fabric, gbps, name",
        ),
        (
            "nodes.localhst",
            "no device is on node 'localhst'; closest: localhost; devices are on: localhost",
        ),
    ]
    twice = {"nics": [{"name": "eth0", "gbps": 1}, {"name": "eth0", "gbps": 2}]}
    with pytest.raises(ConfigError, match="NIC 'eth0' is listed twice; each name once per node"):
        parse_config({"devices": devices, "nodes": {"localhost": twice}})
