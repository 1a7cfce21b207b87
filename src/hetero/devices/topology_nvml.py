"""Reading a machine's GPU topology through NVML (``read_topology``): link kinds and bandwidths
between every pair of visible GPUs, NUMA nodes and CPU affinity."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero.devices.catalog import get_catalog
from hetero.devices.discovery import bus_id_key, nvml_text, optional_module, visible_gpu_indices
from hetero.devices.spec import DeviceKind, DeviceSpec
from hetero.devices.topology import (
    DEFAULT_PCIE_WIDTH,
    Link,
    LinkKind,
    Topology,
    TopologyDevice,
    catalog_pcie_generation,
    nvlink_gbs_per_link,
    pcie_gbs,
)

__all__ = ["read_topology"]

log = logging.getLogger("hetero.topology")

# 64-bit words asked of nvmlDeviceGetCpuAffinity: room for 1,024 CPUs.
_CPU_SET_WORDS = 16

_SELF = Link(LinkKind.SELF, 0.0)


def read_topology(nvml: Any | None = None, *, environ: Mapping[str, str] | None = None) -> Topology:
    """The topology of this machine's NVIDIA GPUs through NVML (``nvml`` replaces ``pynvml``,
    e.g. with a ``FakeNVML``).

    Devices are the GPUs ``CUDA_VISIBLE_DEVICES`` (from ``environ``, default ``os.environ``)
    leaves visible, with the ids discovery gives them (``gpu:0``, ...). A missing library or driver
    is not an error: the topology is then empty. A query the driver does not support degrades its
    answer (see docs/topology.md) instead of failing.
    """
    module = nvml if nvml is not None else optional_module("pynvml")
    if module is None:
        return Topology()
    try:
        module.nvmlInit()
    except Exception as exc:  # NVMLError or a loader error: no NVIDIA GPUs
        log.debug("NVML unavailable: %s", exc)
        return Topology()
    try:
        return _Reader(module).read(os.environ if environ is None else environ)
    except Exception as exc:  # a driver failing mid-way is not the caller's error
        log.warning("NVML failed while reading the GPU topology (%s); reporting no GPUs", exc)
        return Topology()
    finally:
        with contextlib.suppress(Exception):  # shutting down after a failure
            module.nvmlShutdown()


@dataclass(slots=True)
class _NvLinks:
    """Where one GPU's active NVLinks go."""

    active: int = 0
    to_gpu: Counter[int] = field(default_factory=Counter)  # NVML index of the peer -> links
    to_switch: int = 0


class _Reader:
    """One pass over NVML; every query that fails is logged and answered ``None``."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.levels: dict[int, LinkKind] = {
            nvml.NVML_TOPOLOGY_INTERNAL: LinkKind.PIX,  # GPUs on one board: an on-board switch
            nvml.NVML_TOPOLOGY_SINGLE: LinkKind.PIX,
            nvml.NVML_TOPOLOGY_MULTIPLE: LinkKind.PXB,
            nvml.NVML_TOPOLOGY_HOSTBRIDGE: LinkKind.PHB,
            nvml.NVML_TOPOLOGY_NODE: LinkKind.NODE,
            nvml.NVML_TOPOLOGY_SYSTEM: LinkKind.SYS,
        }

    def query(self, fn: Callable[..., Any], *args: Any) -> Any | None:
        try:
            return fn(*args)
        except Exception as exc:  # unsupported queries degrade the answer
            log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), exc)
            return None

    def read(self, environ: Mapping[str, str]) -> Topology:
        nvml = self.nvml
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        buses = []
        listed = []
        for i, h in enumerate(handles):
            uuid = self.query(nvml.nvmlDeviceGetUUID, h)
            pci = self.query(nvml.nvmlDeviceGetPciInfo, h)
            buses.append(nvml_text(pci.busId) if pci else "")
            listed.append((i, nvml_text(uuid) if uuid else "", buses[-1]))
        order = visible_gpu_indices(environ.get("CUDA_VISIBLE_DEVICES"), listed)
        by_bus = {bus_id_key(bus): i for i, bus in enumerate(buses) if bus}
        catalog = get_catalog()
        names = {i: self.query(nvml.nvmlDeviceGetName, handles[i]) or "GPU" for i in order}
        specs = {i: catalog.resolve(nvml_text(name), DeviceKind.GPU) for i, name in names.items()}
        nvlinks = {i: self.nvlinks(handles[i], by_bus) for i in order}
        numa, cpus = self.placement([handles[i] for i in order])
        devices = tuple(
            TopologyDevice(f"gpu:{o}", specs[i].model, buses[i] or None, numa[o], cpus[o])
            for o, i in enumerate(order)
        )
        # Each pair is asked once and the answer serves both ways: a link is the same in both
        # directions (a Topology refuses one that is not).
        upper = {
            (x, y): self.link(handles, a, b, specs, nvlinks, (numa[x], numa[y]))
            for (x, a), (y, b) in itertools.combinations(enumerate(order), 2)
        }
        links = tuple(
            tuple(_SELF if x == y else upper[min(x, y), max(x, y)] for y in range(len(order)))
            for x in range(len(order))
        )
        return Topology(devices, links)

    def nvlinks(self, handle: Any, by_bus: Mapping[str, int]) -> _NvLinks:
        """Count one GPU's active NVLinks by the peer (a GPU or the NVSwitch) each reaches.

        Links are numbered from 0; the first one NVML rejects ends the list (a GPU without
        NVLink rejects link 0).
        """
        nvml = self.nvml
        found = _NvLinks()
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                active = nvml.nvmlDeviceGetNvLinkState(handle, link)
            except Exception as exc:  # past the last link, or no NVLink at all
                log.debug("NVML nvmlDeviceGetNvLinkState(link %d) failed: %s", link, exc)
                break
            if not active:
                continue
            found.active += 1
            remote = self.query(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            if remote is None:
                continue  # active, but to an unknown end: counted only in ``active``
            peer = by_bus.get(bus_id_key(nvml_text(remote.busId)))
            if peer is not None:
                found.to_gpu[peer] += 1
                continue
            kind = self.query(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            # Older drivers cannot tell the remote type; a non-GPU end is then taken as a switch.
            if kind is None or kind == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                found.to_switch += 1
        return found

    def link(
        self,
        handles: Sequence[Any],
        a: int,
        b: int,
        specs: Mapping[int, DeviceSpec],
        nvlinks: Mapping[int, _NvLinks],
        numa: tuple[int | None, int | None],
    ) -> Link:
        nvml = self.nvml
        per_link = min(nvlink_gbs_per_link(specs[a]), nvlink_gbs_per_link(specs[b]))
        direct = max(nvlinks[a].to_gpu[b], nvlinks[b].to_gpu[a])
        if direct:
            return Link(LinkKind.NVLINK, direct * per_link, direct)
        p2p = self.query(
            nvml.nvmlDeviceGetP2PStatus, handles[a], handles[b], nvml.NVML_P2P_CAPS_INDEX_NVLINK
        )
        switched = min(nvlinks[a].to_switch, nvlinks[b].to_switch)
        # Two GPUs on the fabric reach each other unless NVML says peer access over NVLink fails.
        if switched and p2p in (None, nvml.NVML_P2P_STATUS_OK):
            return Link(LinkKind.NVSWITCH, switched * per_link, switched)
        shared = min(nvlinks[a].active, nvlinks[b].active)
        if p2p == nvml.NVML_P2P_STATUS_OK and shared:
            # NVLink works between them but NVML cannot say where the links go: nvidia-smi's
            # NV# reading, the links the pair could share.
            return Link(LinkKind.NVLINK, shared * per_link, shared)
        ancestor = self.query(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
        kind = None if ancestor is None else self.levels.get(ancestor)
        if kind is None:  # no PCIe answer: the NUMA nodes still tell a socket crossing
            same_node = numa[0] is not None and numa[0] == numa[1]
            kind = LinkKind.NODE if same_node else LinkKind.SYS
        (gen_a, width_a), (gen_b, width_b) = (self.pcie_link(handles[x], specs[x]) for x in (a, b))
        return Link(kind, pcie_gbs(kind, min(gen_a, gen_b), min(width_a, width_b)))

    def pcie_link(self, handle: Any, spec: DeviceSpec) -> tuple[int, int]:
        """(generation, width) of a GPU's PCIe link: NVML's maximum, else the catalog's
        ``PCIeN`` interconnect, else Gen3 x16."""
        generation = self.query(self.nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
        if not generation:
            generation = catalog_pcie_generation(spec)
        width = self.query(self.nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
        return int(generation), int(width or DEFAULT_PCIE_WIDTH)

    def placement(self, handles: Sequence[Any]) -> tuple[list[int | None], list[tuple[int, ...]]]:
        """NUMA node and local CPUs of each GPU.

        The NUMA node comes from ``nvmlDeviceGetNumaNodeId`` where the driver has it; otherwise
        GPUs with the same CPU affinity share a node, numbered in the order of their lowest CPU.
        """
        nvml = self.nvml
        cpus = []
        for h in handles:
            words = self.query(nvml.nvmlDeviceGetCpuAffinity, h, _CPU_SET_WORDS)
            cpus.append(_cpu_ids(words) if words is not None else ())
        numa: list[int | None] = []
        for h in handles:
            node = self.query(nvml.nvmlDeviceGetNumaNodeId, h)
            numa.append(int(node) if node is not None and int(node) >= 0 else None)
        if all(n is None for n in numa):  # mixing the two numberings would not compare
            classes = sorted({c for c in cpus if c})
            numa = [classes.index(c) if c else None for c in cpus]
        return numa, cpus


def _cpu_ids(words: Sequence[int]) -> tuple[int, ...]:
    """The CPU ids set in an NVML CPU mask (64-bit words, lowest CPUs first)."""
    return tuple(
        64 * w + bit for w, word in enumerate(words) for bit in range(64) if int(word) >> bit & 1
    )
