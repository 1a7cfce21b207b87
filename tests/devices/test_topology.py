from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hetero.commands.topology import register
from hetero.devices.catalog import get_catalog
from hetero.devices.fake_nvml import FakeGPU, FakeNVML, mixed_box, nvswitch_box, pcie_box
from hetero.devices.network import Nic
from hetero.devices.rings import device_bandwidth, rank_order, ring_order
from hetero.devices.spec import Device
from hetero.devices.topology import (
    PCIE_PATH_FACTOR,
    Link,
    LinkKind,
    NodeLink,
    NodeTopology,
    Topology,
    TopologyDevice,
    best_group_indices,
    nvlink_gbs_per_link,
    pcie_gbs,
)
from hetero.devices.topology_file import read_topology_file
from hetero.devices.topology_nvml import read_topology
from hetero.errors import AllocationError, ConfigError, DeviceError
from tests.cli_apps import command_app

GIB = 1024**3


def labels(topology: Topology) -> list[list[str]]:
    return [[link.label for link in row] for row in topology.links]


def read(box: FakeNVML, **environ: str) -> Topology:
    return read_topology(box, environ=environ)


# --- the three fake boxes ---------------------------------------------------------------------


def test_nvswitch_box() -> None:
    topo = read(nvswitch_box())
    assert topo.ids == [f"gpu:{i}" for i in range(8)]
    assert {d.model for d in topo.devices} == {"H100-SXM-80GB"}
    assert labels(topo) == [["X" if i == j else "NVS18" for j in range(8)] for i in range(8)]
    # 18 links × 50 GB/s: the catalog's NVLink4 figure for the H100.
    bw = topo.bandwidth
    assert bw[~np.eye(8, dtype=bool)].tolist() == [900.0] * 56
    assert get_catalog().get("H100-SXM-80GB").interconnect_gbs == 900
    assert [d.numa_node for d in topo.devices] == [0] * 4 + [1] * 4
    assert [d.cpu_affinity for d in topo.devices] == ["0-55"] * 4 + ["56-111"] * 4


def test_pcie_box() -> None:
    topo = read(pcie_box())
    assert labels(topo) == [
        ["X", "PIX", "SYS", "SYS"],
        ["PIX", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "PXB"],
        ["SYS", "SYS", "PXB", "X"],
    ]
    # PCIe Gen4 x16 = 64 GB/s both ways; PXB keeps 0.9 of it, SYS half.
    assert topo.bandwidth.tolist() == [
        [0.0, 64.0, 32.0, 32.0],
        [64.0, 0.0, 32.0, 32.0],
        [32.0, 32.0, 0.0, pytest.approx(57.6)],
        [32.0, 32.0, pytest.approx(57.6), 0.0],
    ]
    assert [d.numa_node for d in topo.devices] == [0, 0, 1, 1]
    assert all(link.nvlinks == 0 for row in topo.links for link in row)


def test_mixed_box() -> None:
    topo = read(mixed_box())
    assert [d.model for d in topo.devices] == ["A100-80GB"] * 2 + ["V100-32GB"] * 2
    assert labels(topo) == [
        ["X", "NV12", "SYS", "SYS"],
        ["NV12", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV6"],
        ["SYS", "SYS", "NV6", "X"],
    ]
    assert topo.link("gpu:0", "gpu:1") == Link(LinkKind.NVLINK, 600.0, 12)
    assert topo.link(2, 3) == Link(LinkKind.NVLINK, 300.0, 6)
    # Across the sockets the slower card sets the rate: the V100's Gen3 x16, halved.
    assert topo.link(0, 3) == Link(LinkKind.SYS, 16.0)
    assert topo.devices[3].pci_bus_id == "00000000:0A:00.0"


def test_bandwidth_ordering() -> None:
    nvswitch = read(nvswitch_box()).link(0, 1)
    nvlink = read(mixed_box()).link(0, 1)
    pcie = read(pcie_box())
    pix, pxb, sys_ = pcie.link(0, 1), pcie.link(2, 3), pcie.link(0, 2)
    assert [x.kind for x in (nvswitch, nvlink, pix, pxb, sys_)] == [
        LinkKind.NVSWITCH,
        LinkKind.NVLINK,
        LinkKind.PIX,
        LinkKind.PXB,
        LinkKind.SYS,
    ]
    assert nvswitch.gbs > nvlink.gbs > pix.gbs > pxb.gbs > sys_.gbs
    # Every PCIe path, at any generation, is slower than the one before it in LinkKind's order.
    for generation in range(1, 7):
        rates = [pcie_gbs(kind, generation) for kind in PCIE_PATH_FACTOR]
        assert rates == sorted(rates, reverse=True) and len(set(rates)) == len(rates)
        assert list(PCIE_PATH_FACTOR) == list(LinkKind)[3:]


def test_link_rates() -> None:
    catalog = get_catalog()
    assert nvlink_gbs_per_link(catalog.get("P100-16GB")) == 40
    assert nvlink_gbs_per_link(catalog.get("B200")) == 100
    assert nvlink_gbs_per_link(catalog.get("L4")) == 50  # no NVLink generation: the common one
    assert pcie_gbs(LinkKind.PIX, 5) == 128 and pcie_gbs(LinkKind.PIX, 4, width=8) == 32
    with pytest.raises(ConfigError, match="kind: NV is not a PCIe path; expected one of PIX, PXB"):
        pcie_gbs(LinkKind.NVLINK, 4)
    with pytest.raises(
        ConfigError, match="generation: 0 is not a PCIe generation; it must be at least 1"
    ):
        pcie_gbs(LinkKind.PIX, 0)


# --- best group --------------------------------------------------------------------------------


def test_best_group_picks_the_nvlink_pair_and_the_numa_local_pair() -> None:
    mixed = read(mixed_box())
    pair = mixed.best_group(2)
    assert pair.ids == ("gpu:0", "gpu:1") and pair.bottleneck_gbs == 600 and pair.exact
    assert pair.bottleneck is not None and pair.bottleneck.label == "NV12"
    three = mixed.best_group(3)
    # Any three cross the sockets; the tie on 16 GB/s goes to the group with the A100 pair.
    assert three.bottleneck_gbs == 16 and {"gpu:0", "gpu:1"} <= set(three.ids)
    pcie = read(pcie_box())
    local = pcie.best_group(2)
    assert local.ids == ("gpu:0", "gpu:1") and local.bottleneck_gbs == 64
    assert len({pcie.devices[i].numa_node for i in local.indices}) == 1
    assert pcie.best_group(4).bottleneck_gbs == 32


def test_best_group_of_one_and_of_all() -> None:
    topo = read(nvswitch_box())
    one = topo.best_group(1)
    assert len(one.ids) == 1 and one.bottleneck is None and one.bottleneck_gbs is None
    assert one.to_dict() == {"ids": ["gpu:0"], "bottleneck": None, "search": "exact"}
    assert topo.best_group(8).ids == tuple(topo.ids)
    assert topo.best_group(4).bottleneck_gbs == 900


@pytest.mark.parametrize("k", [0, -1, 5])
def test_best_group_out_of_range(k: int) -> None:
    with pytest.raises(AllocationError, match=rf"k={k} is out of range: .* 1 to 4"):
        read(pcie_box()).best_group(k)


def test_best_group_rejects_a_non_square_matrix() -> None:
    with pytest.raises(
        ConfigError, match=r"bandwidth: must be a square matrix, got shape \(2, 3\)"
    ):
        best_group_indices(np.zeros((2, 3)), 1)


def brute_force(matrix: np.ndarray, k: int) -> tuple[float, float]:
    def key(group: tuple[int, ...]) -> tuple[float, float]:
        pairs = [matrix[i, j] for i, j in itertools.combinations(group, 2)]
        return (min(pairs, default=float("inf")), sum(pairs))

    return max(key(g) for g in itertools.combinations(range(len(matrix)), k))


@st.composite
def matrices(draw: st.DrawFn) -> tuple[np.ndarray, int]:
    n = draw(st.integers(1, 8))
    # Few distinct values, so that ties (the hard part) are common.
    values = st.sampled_from([16.0, 32.0, 57.6, 64.0, 300.0, 600.0, 900.0])
    upper = [draw(values) for _ in range(n * (n - 1) // 2)]
    matrix = np.zeros((n, n))
    matrix[np.triu_indices(n, 1)] = upper
    matrix += matrix.T
    return matrix, draw(st.integers(1, n))


@settings(max_examples=200, deadline=None)
@given(matrices())
def test_exact_search_matches_brute_force(case: tuple[np.ndarray, int]) -> None:
    matrix, k = case
    group, exact = best_group_indices(matrix, k)
    assert exact and len(group) == k and list(group) == sorted(set(group))
    pairs = [matrix[i, j] for i, j in itertools.combinations(group, 2)]
    assert (min(pairs, default=float("inf")), sum(pairs)) == pytest.approx(brute_force(matrix, k))


@settings(max_examples=100, deadline=None)
@given(matrices())
def test_greedy_search_returns_a_valid_group_no_better_than_the_best(
    case: tuple[np.ndarray, int],
) -> None:
    matrix, k = case
    group, exact = best_group_indices(matrix, k, exact_up_to=0)
    assert not exact and len(group) == k and list(group) == sorted(set(group))
    slowest = min((matrix[i, j] for i, j in itertools.combinations(group, 2)), default=np.inf)
    assert slowest <= brute_force(matrix, k)[0]


def test_greedy_finds_a_fast_clique_in_a_large_box() -> None:
    n, clique = 24, [1, 4, 6, 9, 13, 17, 20, 23]
    matrix = np.full((n, n), 32.0)
    matrix[np.ix_(clique, clique)] = 900.0
    group, exact = best_group_indices(matrix, 8)
    assert group == tuple(clique) and not exact


# --- degraded answers --------------------------------------------------------------------------


def test_without_nvlink_queries_links_fall_back_to_pcie_levels() -> None:
    box = mixed_box()
    box.unsupported = {"nvmlDeviceGetNvLinkState"}
    assert labels(read(box))[0] == ["X", "PIX", "SYS", "SYS"]
    assert read(box).link(0, 1).gbs == 64  # the A100s' Gen4 link


def test_links_with_unknown_ends_count_when_p2p_says_nvlink() -> None:
    box = nvswitch_box()
    box.unsupported = {"nvmlDeviceGetNvLinkRemotePciInfo"}
    topo = read(box)
    assert topo.link(0, 7) == Link(LinkKind.NVLINK, 900.0, 18)  # nvidia-smi's NV18 reading


def test_unknown_remote_device_type_is_taken_as_the_switch() -> None:
    box = nvswitch_box()
    box.unsupported = {"nvmlDeviceGetNvLinkRemoteDeviceType"}
    assert read(box).link(3, 4).label == "NVS18"


def test_switched_gpus_without_nvlink_peer_access_use_pcie() -> None:
    box = nvswitch_box()
    box.unsupported = {"nvmlDeviceGetP2PStatus"}
    assert read(box).link(0, 1).label == "NVS18"  # unknown P2P status: trust the fabric
    box = nvswitch_box()
    assert box.topology is not None
    box.topology = dataclasses.replace(box.topology, nvswitch_links=dict.fromkeys(range(7), 18))
    topo = read(box)
    assert topo.link(0, 7).kind is LinkKind.SYS and topo.link(0, 6).label == "NVS18"
    assert topo.link(0, 1).gbs == 900 and topo.link(4, 7).kind is LinkKind.NODE


def test_without_pcie_levels_numa_nodes_tell_node_from_sys() -> None:
    box = pcie_box()
    box.unsupported = {"nvmlDeviceGetTopologyCommonAncestor"}
    assert labels(read(box))[0] == ["X", "NODE", "SYS", "SYS"]
    box.unsupported.add("nvmlDeviceGetNumaNodeId")  # the CPU affinity still groups them
    topo = read(box)
    assert labels(topo)[2] == ["SYS", "SYS", "X", "NODE"]
    assert [d.numa_node for d in topo.devices] == [0, 0, 1, 1]
    box.unsupported.add("nvmlDeviceGetCpuAffinity")
    topo = read(box)
    assert [d.numa_node for d in topo.devices] == [None] * 4
    assert {link.kind for row in topo.links for link in row} == {LinkKind.SELF, LinkKind.SYS}


def test_pcie_generation_from_the_catalog_when_nvml_has_none() -> None:
    box = pcie_box()
    box.unsupported = {"nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth"}
    assert read(box).link(0, 1).gbs == 64  # the catalog's PCIe4 for the L4
    box = mixed_box()
    box.unsupported = {"nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetNvLinkState"}
    assert read(box).link(0, 1).gbs == 32  # NVLink3 in the catalog: Gen3 assumed


def test_a_box_without_topology_answers_is_all_sys() -> None:
    box = FakeNVML([FakeGPU("NVIDIA L4", 24 * GIB), FakeGPU("Tesla T4", 16 * GIB)])
    topo = read(box)
    assert labels(topo) == [["X", "SYS"], ["SYS", "X"]]
    assert [d.numa_node for d in topo.devices] == [None, None]
    assert [d.cpu_affinity for d in topo.devices] == ["", ""]


def test_missing_driver_or_library_gives_an_empty_topology(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box = mixed_box()
    box.fail_init = True
    assert len(read(box)) == 0
    monkeypatch.setitem(sys.modules, "pynvml", None)
    empty = read_topology(environ={})
    assert len(empty) == 0 and empty.format_matrix() == "no GPUs"
    assert empty.to_dict() == {
        "devices": [],
        "links": [],
        "bandwidth_gbs": [],
        "latency_us": [],
        "hops": [],
    }


def test_nvml_failing_midway_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    box = mixed_box()
    box.unsupported = {"nvmlDeviceGetCount"}
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert len(read(box)) == 0
    assert "nvmlDeviceGetCount" in caplog.text
    assert not box.initialized  # shut down after the failure


def test_cuda_visible_devices_selects_and_renumbers() -> None:
    topo = read(mixed_box(), CUDA_VISIBLE_DEVICES="3,2,0")
    assert topo.ids == ["gpu:0", "gpu:1", "gpu:2"]
    assert [d.model for d in topo.devices] == ["V100-32GB", "V100-32GB", "A100-80GB"]
    assert labels(topo)[0] == ["X", "NV6", "SYS"]


# --- value objects -----------------------------------------------------------------------------


def test_topology_rejects_a_ragged_link_matrix() -> None:
    with pytest.raises(DeviceError, match="2×2"):
        Topology(
            (TopologyDevice("a", "T4"), TopologyDevice("b", "T4")), ((Link(LinkKind.SELF, 0),),)
        )


def test_unknown_device_names_the_known_ones() -> None:
    with pytest.raises(DeviceError, match=r"no device 'gpu:9'.*gpu:0, gpu:1, gpu:2, gpu:3"):
        read(pcie_box()).link("gpu:9", 0)


def test_cpu_affinity_ranges() -> None:
    device = TopologyDevice("gpu:0", "T4", cpus=(0, 1, 2, 5, 7, 8))
    assert device.cpu_affinity == "0-2,5,7-8"


def test_format_matrix_and_to_dict() -> None:
    topo = read(mixed_box())
    text = topo.format_matrix()
    lines = text.splitlines()
    header = ["gpu:0", "gpu:1", "gpu:2", "gpu:3", "NUMA", "CPU", "affinity", "model"]
    assert lines[0].split() == header
    assert lines[3].split() == ["gpu:2", "SYS", "SYS", "X", "NV6", "1", "32-63", "V100-32GB"]
    assert lines[6].split() == ["GB/s", "gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert lines[7].split() == ["gpu:0", "-", "600", "16", "16"]
    assert "NVS#" in text and "SYS" in text.split("Legend:")[1]
    data = json.loads(json.dumps(topo.to_dict()))
    assert data["links"][0] == ["X", "NV12", "SYS", "SYS"]
    assert data["bandwidth_gbs"][2][3] == 300
    assert data["devices"][2] == {
        "id": "gpu:2",
        "model": "V100-32GB",
        "pci_bus_id": "00000000:09:00.0",
        "numa_node": 1,
        "cpu_affinity": "32-63",
    }


# --- CLI ---------------------------------------------------------------------------------------


@pytest.fixture
def cli() -> typer.Typer:
    return command_app(register)


runner = CliRunner()


def test_cli_table_with_group(cli: typer.Typer) -> None:
    result = runner.invoke(cli, ["topology", "--fake", "mixed", "--group", "2"])
    assert result.exit_code == 0, result.output
    assert "4 GPUs (fake:mixed)" in result.output
    assert "gpu:0  X      NV12   SYS    SYS    0     0-31          A100-80GB" in result.output
    assert "best group of 2: gpu:0, gpu:1; slowest link NV12, 600 GB/s" in result.output


def test_cli_json(cli: typer.Typer) -> None:
    result = runner.invoke(cli, ["topology", "--fake", "pcie", "--group", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "fake:pcie"
    assert data["links"][2][3] == "PXB"
    assert data["group"] == {
        "ids": ["gpu:0", "gpu:1"],
        "bottleneck": {
            "kind": "PIX",
            "label": "PIX",
            "nvlinks": 0,
            "gbs": 64.0,
            "latency_us": 1.0,
            "hops": 2,
        },
        "search": "exact",
    }


def test_cli_group_of_one(cli: typer.Typer) -> None:
    result = runner.invoke(cli, ["topology", "--fake", "nvswitch", "--group", "1"])
    assert "best group of 1: gpu:0 (a single GPU: no links)" in result.output


@pytest.mark.parametrize("k", ["0", "9"])
def test_cli_group_out_of_range(cli: typer.Typer, k: str) -> None:
    result = runner.invoke(cli, ["topology", "--fake", "nvswitch", "--group", k])
    assert result.exit_code == 1
    assert f"--group {k} is out of range: there are 8 GPUs, so K must be 1 to 8" in result.output


def test_cli_unknown_fake_lists_the_boxes(cli: typer.Typer) -> None:
    result = runner.invoke(cli, ["topology", "--fake", "pcei"])
    assert result.exit_code == 2
    assert "'nvswitch'" in result.output and "'pcie'" in result.output


def test_cli_without_a_gpu_suggests_fake(cli: typer.Typer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    result = runner.invoke(cli, ["topology"])
    assert result.exit_code == 0
    assert "no NVIDIA GPU found" in result.output and "--fake nvswitch" in result.output
    result = runner.invoke(cli, ["topology", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["devices"] == []
    result = runner.invoke(cli, ["topology", "--group", "2"])
    assert result.exit_code == 1
    assert "--group 2: no NVIDIA GPU was found" in result.output


def test_cli_help_explains_every_option_with_an_example(cli: typer.Typer) -> None:
    result = runner.invoke(cli, ["topology", "--help"])
    assert result.exit_code == 0
    flat = " ".join(result.output.replace("│", " ").split())  # undo rich's wrapping
    for text in (
        "--fake",
        "Example: --fake pcie",
        "Example: --file box.json",
        "Example: --config cluster.yaml",
        "--group",
        "Example: --group 4",
        "--json",
    ):
        assert text in flat


# --- rank order --------------------------------------------------------------------------------


def devices_of(topo: Topology, order: list[int], node: str = "box") -> list[Device]:
    """The GPUs of ``topo`` at positions ``order``, as fleet devices on ``node``."""
    catalog = get_catalog()
    return [
        Device(id=topo.ids[i], spec=catalog.get(topo.devices[i].model), node=node) for i in order
    ]


def ring_links(matrix: np.ndarray, order: list[int]) -> list[float]:
    return [float(matrix[order[k], order[(k + 1) % len(order)]]) for k in range(len(order))]


def test_rank_order_puts_the_fast_pairs_side_by_side() -> None:
    topo = read(pcie_box())
    # Given as gpu:0, gpu:2, gpu:1, gpu:3, the ring would cross the sockets four times.
    devices = devices_of(topo, [0, 2, 1, 3])
    order = rank_order(devices, topo)
    assert [devices[i].id for i in order] == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert ring_links(device_bandwidth(devices, topo), order) == [
        64.0,
        32.0,
        pytest.approx(57.6),
        32.0,
    ]
    mixed = read(mixed_box())
    devices = devices_of(mixed, [0, 2, 1, 3])
    order = rank_order(devices, mixed)
    # Each NVLink pair side by side: the ring crosses the sockets twice, not four times.
    assert [devices[i].id for i in order] == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert ring_links(device_bandwidth(devices, mixed), order) == [600.0, 16.0, 300.0, 16.0]
    # An order that is already as good stays as it is.
    devices = devices_of(mixed, [0, 2, 3, 1])
    assert rank_order(devices, mixed) == [0, 1, 2, 3]


def test_rank_order_keeps_rank_zero_and_equal_links_in_order() -> None:
    topo = read(nvswitch_box())
    devices = devices_of(topo, [5, 1, 7, 0])
    assert rank_order(devices, topo) == [0, 1, 2, 3]
    assert rank_order([], topo) == [] and rank_order(devices[:1], topo) == [0]


def test_rank_order_keeps_each_node_together() -> None:
    topo = read(pcie_box())
    a, b = devices_of(topo, [0, 2, 1, 3], "a"), devices_of(topo, [0, 2, 1, 3], "b")
    interleaved = [a[0], b[0], a[1], b[1], a[2], b[2], a[3], b[3]]
    order = rank_order(interleaved, {"a": topo, "b": topo})
    assert [(interleaved[i].node, interleaved[i].id) for i in order] == [
        ("a", "gpu:0"),
        ("a", "gpu:1"),
        ("a", "gpu:2"),
        ("a", "gpu:3"),
        ("b", "gpu:2"),
        ("b", "gpu:3"),
        ("b", "gpu:0"),
        ("b", "gpu:1"),
    ]
    # Each node's chain is opened at a SYS link: only the two node crossings are slower.
    matrix = device_bandwidth(interleaved, {"a": topo, "b": topo})
    assert sorted(ring_links(matrix, order))[:2] == [0.0, 0.0]
    assert min(sorted(ring_links(matrix, order))[2:]) == 32.0


def test_rank_order_follows_the_node_links() -> None:
    nics = {
        "a": [Nic("ib0", "infiniband", 400)],
        "edge": [Nic("eth0", "ethernet", 25)],
        "b": [Nic("ib0", "infiniband", 400), Nic("eth0", "ethernet", 100)],
        "c": [Nic("ib0", "infiniband", 200), Nic("eth0", "ethernet", 25)],
    }
    nodes = NodeTopology.from_nics(nics)
    catalog = get_catalog()
    devices = [Device(id=f"{n}/cpu", spec=catalog.get("T4"), node=n) for n in nics]
    order = rank_order(devices, {}, nodes=nodes)
    # Node a has InfiniBand only, so the edge node (Ethernet only) cannot neighbour it: it sits
    # between b and c, and the slowest link of the ring is Ethernet, not nothing.
    assert [devices[i].node for i in order] == ["a", "b", "edge", "c"]


def test_rank_order_rejects_one_topology_for_several_nodes() -> None:
    topo = read(pcie_box())
    devices = devices_of(topo, [0], "a") + devices_of(topo, [1], "b")
    with pytest.raises(ConfigError, match="topology: one Topology describes one machine, but"):
        rank_order(devices, topo)
    with pytest.raises(ConfigError, match=r"topology\['a'\]: expected a Topology, got 1"):
        rank_order(devices, {"a": 1})  # type: ignore[dict-item]


@settings(max_examples=150, deadline=None)
@given(matrices())
def test_ring_order_is_a_ring_from_zero_no_worse_than_the_given_order(
    case: tuple[np.ndarray, int],
) -> None:
    matrix, _ = case
    n = len(matrix)
    order = ring_order(matrix)
    assert sorted(order) == list(range(n)) and (n == 0 or order[0] == 0)
    if n > 2:
        slowest = min(ring_links(matrix, order))
        assert slowest >= min(ring_links(matrix, list(range(n))))
        best = max(
            min(ring_links(matrix, [0, *rest])) for rest in itertools.permutations(range(1, n))
        )
        assert slowest <= best


def test_ring_order_rejects_a_non_square_matrix() -> None:
    with pytest.raises(ConfigError, match="bandwidth: must be a square matrix"):
        ring_order(np.zeros((2, 3)))


# --- contradictions ----------------------------------------------------------------------------


def test_a_topology_that_contradicts_itself_is_refused() -> None:
    a, b = TopologyDevice("gpu:0", "A100-80GB"), TopologyDevice("gpu:1", "A100-80GB")
    nv, pix = Link(LinkKind.NVLINK, 600.0, 12), Link(LinkKind.PIX, 64.0)
    self_ = Link(LinkKind.SELF, 0.0)
    with pytest.raises(ConfigError) as info:
        Topology((a, b), ((self_, nv), (pix, self_)))
    assert str(info.value) == (
        "links[1][0]: gpu:0 → gpu:1 is NV12 at 600 GB/s but gpu:1 → gpu:0 is PIX at 64 GB/s; "
        "a link is the same both ways"
    )
    with pytest.raises(ConfigError, match=r"devices\[1\]\.id: 'gpu:0' is listed twice"):
        Topology((a, a), ((self_, nv), (nv, self_)))
    with pytest.raises(ConfigError, match="the link of gpu:0 to itself must be X, got NV12"):
        Topology((a, b), ((nv, nv), (nv, self_)))
    with pytest.raises(ConfigError, match=r"X \(a device itself\) between two devices"):
        Topology((a, b), ((self_, self_), (self_, self_)))
    slower = Link(LinkKind.NVLINK, 300.0, 12)
    with pytest.raises(ConfigError, match=r"bandwidth_gbs\[1\]\[0\]: .* NV12 at 300 GB/s"):
        Topology((a, b), ((self_, nv), (slower, self_)))


# --- between nodes -----------------------------------------------------------------------------


def test_node_links_take_the_best_shared_fabric_at_the_slower_node() -> None:
    nodes = NodeTopology.from_nics(
        {
            "dgx-a": [Nic(f"ib{i}", "infiniband", 400) for i in range(4)]
            + [Nic("eth0", "ethernet", 100)],
            "dgx-b": [Nic("ib0", "infiniband", 400), Nic("eth0", "ethernet", 200)],
            "edge": [Nic("eth0", "ethernet", 25)],
            "dark": [],
        }
    )
    # No racks known: NCCL's network latency, hops unknown.
    assert nodes.link("dgx-a", "dgx-b") == NodeLink("infiniband", 400, 2.7, None)
    assert nodes.link("dgx-a", "dgx-b").label == "IB 400G"
    assert nodes.link("dgx-a", "dgx-b").gbs == 100  # 400 Gb/s each way: 100 GB/s both ways
    assert nodes.link("edge", "dgx-b") == NodeLink("ethernet", 25, 2.7, None)
    assert (
        nodes.link("dark", "edge") == NodeLink(None, 0) and nodes.link("dark", "edge").label == "-"
    )
    assert nodes.bandwidth[0].tolist() == [0.0, 100.0, 6.25, 0.0]
    text = nodes.format_matrix()
    assert text.splitlines()[0].split() == ["dgx-a", "dgx-b", "edge", "dark"]
    assert text.splitlines()[1].split() == ["dgx-a", "X", "IB", "400G", "ETH", "25G", "-"]
    assert ["dark", "-", "none", "known"] in [line.split() for line in text.splitlines()]
    data = json.loads(json.dumps(nodes.to_dict()))
    assert data["links"][2] == ["ETH 25G", "ETH 25G", "X", "-"]
    assert data["nodes"][2] == {
        "name": "edge",
        "rack": None,
        "nics": [{"name": "eth0", "fabric": "ethernet", "gbps": 25}],
    }
    with pytest.raises(DeviceError, match="no node 'x' in this topology; it has dgx-a"):
        nodes.link("x", "edge")
    with pytest.raises(ConfigError, match=r"nodes\[1\]: 'a' is listed twice"):
        NodeTopology(("a", "a"), ((), ()))


def test_device_bandwidth_links_nodes_through_their_nics() -> None:
    topo = read(pcie_box())
    devices = devices_of(topo, [0, 1], "a") + devices_of(topo, [0], "b")
    nodes = NodeTopology.from_nics(
        {"a": [Nic("ib0", "infiniband", 200)], "b": [Nic("ib0", "infiniband", 400)]}
    )
    matrix = device_bandwidth(devices, {"a": topo}, nodes)
    assert matrix.tolist() == [[0.0, 64.0, 50.0], [64.0, 0.0, 50.0], [50.0, 50.0, 0.0]]
    assert device_bandwidth(devices, {"a": topo})[0, 2] == 0.0  # no node links known


# --- CLI: files and nodes ----------------------------------------------------------------------


def test_cli_reads_back_what_json_wrote(cli: typer.Typer, tmp_path: Path) -> None:
    written = runner.invoke(cli, ["topology", "--fake", "mixed", "--json"])
    path = tmp_path / "box.json"
    path.write_text(written.stdout)
    result = runner.invoke(cli, ["topology", "--file", str(path), "--group", "2"])
    assert result.exit_code == 0, result.output
    assert f"4 GPUs (file:{path})" in result.output
    assert "best group of 2: gpu:0, gpu:1; slowest link NV12, 600 GB/s" in result.output
    assert read_topology_file(path) == read(mixed_box())


def test_cli_names_every_contradiction_of_a_file(cli: typer.Typer, tmp_path: Path) -> None:
    data = read(mixed_box()).to_dict()
    data["links"][1][0] = "PIX"
    data["devices"][3]["id"] = "gpu:2"
    path = tmp_path / "box.json"
    path.write_text(json.dumps(data))
    result = runner.invoke(cli, ["topology", "--file", str(path)])
    assert result.exit_code == 1
    lines = " ".join(result.stderr.split())
    assert (
        f"error: --file {path}: devices[3].id: 'gpu:2' is listed twice (also devices[2])" in lines
    )
    assert f"{path}: links[1][0]: gpu:0 → gpu:1 is NV12 at 600 GB/s but gpu:1 → gpu:0 is PIX" in (
        lines
    )


def test_cli_node_matrix_from_a_fleet_config(cli: typer.Typer, tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        """
devices:
  - {type: gpu, model: H100-SXM-80GB, emulate: true, count: 8, node: dgx-a}
  - {type: gpu, model: H100-SXM-80GB, emulate: true, count: 8, node: dgx-b}
  - {type: gpu, model: L4, emulate: true, node: edge}
nodes:
  dgx-a:
    nics: [{name: ib0, fabric: infiniband, gbps: 400}, {name: ib1, fabric: infiniband, gbps: 400}]
  dgx-b:
    nics: [{name: ib0, fabric: InfiniBand, gbps: 400}, {name: eth0, gbps: 100}]
"""
    )
    result = runner.invoke(cli, ["topology", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert f"3 nodes (config:{path})" in result.stdout
    assert result.stdout.splitlines()[2].split() == ["dgx-a", "X", "IB", "400G", "-"]
    assert "no NICs known for edge: declare them under nodes:" in result.stderr
    result = runner.invoke(cli, ["topology", "--config", str(path), "--json"])
    data = json.loads(result.stdout)
    assert data["source"] == f"config:{path}"
    assert data["bandwidth_gbs"][0] == [0.0, 100.0, 0.0]


def test_cli_node_view_takes_racks_from_the_device_entries(
    cli: typer.Typer, tmp_path: Path
) -> None:
    path = tmp_path / "racks.yaml"
    path.write_text(
        """
devices:
  - {type: gpu, model: A100-80GB, emulate: true, node: a, rack: r1}
  - {type: gpu, model: A100-80GB, emulate: true, node: b, rack: r1}
  - {type: gpu, model: T4, emulate: true, node: c}
"""
    )
    result = runner.invoke(cli, ["topology", "--config", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [n["rack"] for n in data["nodes"]] == ["r1", "r1", None]
    assert data["hops"][0][1] == 2  # one rack


def test_cli_node_matrix_reads_this_machines_nics_for_localhost(
    cli: typer.Typer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "local.yaml"
    path.write_text(
        "devices: [{type: cpu}, {type: gpu, model: T4, emulate: true, node: other}]\n"
        "nodes: {other: {nics: [{name: eth0, gbps: 10}]}}\n"
    )
    monkeypatch.setattr(
        "hetero.commands.topology.read_nics", lambda: [Nic("eth0", "ethernet", 25.0)]
    )
    result = runner.invoke(cli, ["topology", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].split() == ["localhost", "X", "ETH", "10G"]
    assert "localhost: NICs read from this machine (/sys/class/net)" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fake", "pcie", "--file", "x.json"], "give at most one of --fake, --file or --config"),
        (["--config", "c.yaml", "--group", "2"], "--group picks GPUs of one machine"),
        (["--file", "missing.json"], "error: --file cannot read topology 'missing.json'"),
        (["--config", "missing.yaml"], "error: --config missing.yaml: cannot read config"),
    ],
)
def test_cli_source_errors(cli: typer.Typer, args: list[str], message: str) -> None:
    result = runner.invoke(cli, ["topology", *args])
    assert result.exit_code == 1
    assert message in " ".join(result.stderr.split())
