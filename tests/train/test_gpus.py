"""Which GPU each rank of ``hetero launch`` runs on: ring order by the topology, and never two
ranks on MIG slices of one GPU (fake NVML boxes)."""

from __future__ import annotations

import pytest

from hetero.devices.discovery import get_device_list
from hetero.devices.fake_nvml import mig_box, nvswitch_box, pcie_box
from hetero.devices.spec import DeviceKind
from hetero.devices.topology import Topology
from hetero.devices.topology_nvml import read_topology
from hetero.errors import ConfigError
from hetero.train.gpus import check_slices, ring_slots


def neighbours(order: tuple[int, ...]) -> set[frozenset[int]]:
    return {frozenset((order[i], order[(i + 1) % len(order)])) for i in range(len(order))}


def test_ranks_follow_the_ring_through_the_fastest_links() -> None:
    topology = read_topology(pcie_box(), environ={})  # gpu:0-1 and gpu:2-3 share a switch
    # Given as 0, 2, 1, 3 every neighbour would cross the sockets; the ring pairs them.
    order = ring_slots((0, 2, 1, 3), topology)
    assert sorted(order) == [0, 1, 2, 3] and order[0] == 0
    assert {frozenset((0, 1)), frozenset((2, 3))} <= neighbours(order)


def test_slots_stay_as_given_without_links_to_follow() -> None:
    assert ring_slots((0, 2, 1), Topology()) == (0, 2, 1)  # no GPUs: ranks on the CPU
    assert ring_slots((1, 0), read_topology(pcie_box(), environ={})) == (1, 0)  # a pair
    # Every link alike (NVSwitch): the order given is as good as any.
    assert sorted(ring_slots((3, 1, 2, 0), read_topology(nvswitch_box(), environ={}))) == [
        0,
        1,
        2,
        3,
    ]


def test_ranks_on_two_slices_of_one_gpu_are_refused() -> None:
    gpus = [d for d in get_device_list(nvml=mig_box(), environ={}) if d.kind is DeviceKind.GPU]
    check_slices([0], gpus)  # one slice alone
    whole, first_of_h100 = 4, 5  # gpu:4 is the whole A100, gpu:5 a slice of another GPU
    check_slices([0, whole, first_of_h100], gpus)
    with pytest.raises(ConfigError, match=r"--nproc.*gpu:0 and gpu:1.*MIG slices of one GPU"):
        check_slices([0, 1], gpus)
