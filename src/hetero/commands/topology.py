"""``hetero topology``: how a machine's GPUs are wired and the best group of k of them, or
how the nodes of a fleet, of a nodes file or of a Ray cluster reach each other (with their
racks, where a nodes file gives them)."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from hetero._cli_util import (
    JsonOpt,
    console,
    err_console,
    fail,
    print_json,
    print_problems,
)
from hetero.commands.devices import RayClusterAddressOpt, RayStartOpt, check_ray_flags, join_ray
from hetero.config import load_config
from hetero.devices.fake_nvml import FakeNVML, mixed_box, nvswitch_box, pcie_box
from hetero.devices.network import Nic, read_nics
from hetero.devices.topology import DeviceGroup, NodeTopology, Topology
from hetero.devices.topology_file import read_any_topology_file
from hetero.devices.topology_nvml import read_topology
from hetero.errors import ConfigError

__all__ = ["register"]


class FakeBox(str, Enum):
    """The boxes ``--fake`` can describe instead of this machine."""

    nvswitch = "nvswitch"
    pcie = "pcie"
    mixed = "mixed"


_BUILDERS: dict[FakeBox, Callable[[], FakeNVML]] = {
    FakeBox.nvswitch: nvswitch_box,
    FakeBox.pcie: pcie_box,
    FakeBox.mixed: mixed_box,
}

_NO_GPU = (
    "no NVIDIA GPU found (no NVML library, no driver, or no GPU visible under "
    "CUDA_VISIBLE_DEVICES); try `hetero topology --fake nvswitch` to see a sample box"
)


def topology(
    fake: Annotated[
        FakeBox | None,
        typer.Option(
            "--fake",
            help="Describe a built-in box instead of this machine: nvswitch (8× H100 SXM on "
            "NVSwitch), pcie (4× L4 on PCIe, two sockets) or mixed (2× A100 + 2× V100). "
            "Example: --fake pcie",
            show_default=False,
        ),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            help="Describe the GPUs of a topology file (what --json prints, JSON or YAML) "
            "instead of this machine; a file of nodes (each with its rack and NICs) shows "
            "the nodes. Example: --file box.json",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Show how the nodes of a fleet config reach each other, from the NICs its "
            "nodes: section declares (node localhost: this machine's, when not declared). "
            "Example: --config cluster.yaml",
            show_default=False,
        ),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Show how the nodes of a Ray cluster reach each other, from the NICs each node "
            "reports (its HETERO_NODE_CONFIG's nodes: section, else read there).",
        ),
    ] = False,
    address: RayClusterAddressOpt = None,
    ray_start: RayStartOpt = False,
    group: Annotated[
        int | None,
        typer.Option(
            "--group",
            metavar="K",
            help="Also pick the K GPUs whose slowest link among them is fastest, and print that "
            "link. K is 1 to the number of GPUs. Example: --group 4",
            show_default=False,
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Show how the GPUs are connected: link kind and GB/s for every pair, NUMA node and CPU
    affinity of each GPU, as `nvidia-smi topo -m` lays them out; with --config or --ray, the
    same for the nodes of a fleet or of a Ray cluster and their NICs.

    Examples: `hetero topology`, `hetero topology --fake nvswitch --group 4`,
    `hetero topology --fake mixed --json`, `hetero topology --config cluster.yaml`,
    `hetero topology --ray --address HEAD:6379`.
    """
    given = [
        name for name, value in (("--fake", fake), ("--file", file), ("--config", config)) if value
    ]
    if len(given) > 1:
        fail(f"give at most one of --fake, --file or --config (got {' and '.join(given)})")
    if address is not None and not ray:
        fail(f"--address {address!r} applies to --ray only")
    check_ray_flags(ray, address, ray_start)
    if ray:
        if given:
            fail(f"--ray shows the nodes of a Ray cluster; drop {' and '.join(given)}")
        if group is not None:
            fail("--group picks GPUs of one machine; it does not apply to --ray")
        _ray_nodes(address, ray_start, json_out)
        return
    if config is not None:
        if group is not None:
            fail("--group picks GPUs of one machine; it does not apply to --config")
        _nodes(config, json_out)
        return
    if file is not None:
        described = _read_file(file)
        if isinstance(described, NodeTopology):
            if group is not None:
                fail("--group picks GPUs of one machine; it does not apply to a file of nodes")
            _print_nodes(described, f"file:{file}", json_out)
            return
        found = described
    else:
        found = _gpus(fake)
    chosen = _group(found, group) if group is not None else None
    source = f"fake:{fake.value}" if fake is not None else f"file:{file}" if file else "nvml"
    if json_out:
        data: dict[str, Any] = {"source": source, **found.to_dict()}
        if chosen is not None:
            data["group"] = chosen.to_dict()
        print_json(data)
        if not len(found):
            err_console.print(_NO_GPU, markup=False, highlight=False, soft_wrap=True)
        return
    if not len(found):
        console.print(_NO_GPU, markup=False, highlight=False, soft_wrap=True)
        return
    plural = "" if len(found) == 1 else "s"
    console.print(f"[bold]{len(found)} GPU{plural}[/] ({source})", highlight=False, soft_wrap=True)
    console.print(found.format_matrix(), markup=False, highlight=False, soft_wrap=True)
    if chosen is not None:
        console.print(_describe(chosen), markup=False, highlight=False, soft_wrap=True)


def _read_file(file: Path) -> Topology | NodeTopology:
    try:
        return read_any_topology_file(file)
    except ConfigError as exc:
        print_problems(exc, "error: --file ")
        raise typer.Exit(1) from None


def _gpus(fake: FakeBox | None) -> Topology:
    nvml = _BUILDERS[fake]() if fake is not None else None
    # A fake describes a whole box; this shell's CUDA_VISIBLE_DEVICES is about the real one.
    return read_topology(nvml, environ={} if nvml is not None else None)


def _nodes(path: Path, json_out: bool) -> None:
    """The node-to-node view of the fleet config at ``path``."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        print_problems(exc, f"error: --config {path}: ")
        raise typer.Exit(1) from None
    names = dict.fromkeys([d.node for d in config.devices] + list(config.nodes))
    nics: dict[str, list[Nic]] = {}
    read_here = False
    for name in names:
        declared = config.nodes.get(name)
        if declared is not None and declared.nics:
            nics[name] = [Nic(n.name, n.fabric, n.gbps) for n in declared.nics]
        elif name == "localhost":  # the default node of a device: this machine
            nics[name] = read_nics()
            read_here = True
        else:
            nics[name] = []
    nodes = NodeTopology.from_nics(nics, {d.node: d.rack for d in config.devices if d.rack})
    _print_nodes(nodes, f"config:{path}", json_out)
    if json_out:
        return
    if read_here:
        console.print(
            "localhost: NICs read from this machine (/sys/class/net)", markup=False, highlight=False
        )
    _no_nics_known(
        nodes, "declare them under nodes: <name>: nics: [{name, fabric, gbps}] in the config"
    )


def _ray_nodes(address: str | None, start: bool, json_out: bool) -> None:
    """The node-to-node view of the Ray cluster at ``address`` (else ``RAY_ADDRESS``, else the
    one running on this machine; a throwaway local instance only with ``start``): each live
    node reports its NICs."""
    from hetero.runtime.ray_backend import ray_node_topology

    nodes = join_ray(ray_node_topology, address, start, "show the NICs of")
    _print_nodes(nodes, f"ray:{address}" if address else "ray", json_out)
    if not json_out:
        _no_nics_known(
            nodes,
            "no Ethernet or InfiniBand interface that is up with a link speed was read there; "
            "declare them under nodes: <name>: nics: [{name, fabric, gbps}] in the node's "
            "HETERO_NODE_CONFIG",
        )


def _print_nodes(nodes: NodeTopology, source: str, json_out: bool) -> None:
    if json_out:
        print_json({"source": source, **nodes.to_dict()})
        return
    plural = "" if len(nodes) == 1 else "s"
    console.print(f"[bold]{len(nodes)} node{plural}[/] ({source})", highlight=False, soft_wrap=True)
    console.print(nodes.format_matrix(), markup=False, highlight=False, soft_wrap=True)


def _no_nics_known(nodes: NodeTopology, hint: str) -> None:
    """Name the nodes with no NICs known (they reach no other) on stderr, with ``hint``."""
    unknown = [name for name, nics in zip(nodes.nodes, nodes.nics, strict=True) if not nics]
    if unknown:
        err_console.print(
            f"no NICs known for {', '.join(unknown)}: {hint}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _group(found: Topology, k: int) -> DeviceGroup:
    if not len(found):
        fail(f"--group {k}: no NVIDIA GPU was found, so there is no group to pick (try --fake)")
    if not 1 <= k <= len(found):
        n = len(found)
        fail(f"--group {k} is out of range: there are {n} GPUs, so K must be 1 to {n}")
    return found.best_group(k)


def _describe(chosen: DeviceGroup) -> str:
    head = f"\nbest group of {len(chosen.ids)}: {', '.join(chosen.ids)}"
    if chosen.bottleneck is None:
        return f"{head} (a single GPU: no links)"
    how = "" if chosen.exact else "; greedy search, may not be the best"
    slowest = chosen.bottleneck
    return (
        f"{head}; slowest link {slowest.label}, {slowest.gbs:g} GB/s, "
        f"{slowest.latency_us:g} µs, {slowest.hops} hop{'' if slowest.hops == 1 else 's'}{how}"
    )


def register(app: typer.Typer) -> None:
    """Add ``topology`` to ``app``."""
    app.command("topology")(topology)
