"""``local_cluster`` is for this machine alone: every process of it listens on the loopback
interface only, the nodes added after the head included, and so does a driver connected to
it."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import psutil

from hetero.runtime.ray_cluster import import_ray, local_cluster
from tests.ray.fleets import write_fleet


def listening() -> dict[tuple[str, int], str]:
    """Every TCP address this process and its descendants listen on, with the process name."""
    found: dict[tuple[str, int], str] = {}
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            connections = process.net_connections(kind="inet")
            name = process.name()
        except psutil.NoSuchProcess:
            continue
        for c in connections:
            if c.status == psutil.CONN_LISTEN:
                found[(c.laddr.ip, c.laddr.port)] = name
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def test_every_process_of_the_cluster_listens_on_127_0_0_1_only(tmp_path: Path) -> None:
    fleet = write_fleet(tmp_path, "t4", [{"type": "gpu", "model": "T4", "emulate": True}])
    ray = import_ray()
    with local_cluster([fleet]) as cluster:
        cluster.add_node(num_cpus=1)  # as a test adds a node by hand
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level="WARNING")
        assert ray.get(ray.remote(lambda: 1).remote()) == 1  # a worker process runs too
        found = listening()
    assert found
    exposed = {f"{ip}:{port}": name for (ip, port), name in found.items() if not is_loopback(ip)}
    assert not exposed
