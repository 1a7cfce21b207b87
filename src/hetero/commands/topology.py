"""``hetero topology``: how this machine's GPUs are wired, and the best group of k of them."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

import typer

from hetero._cli_util import JsonOpt, console, err_console, fail, print_json
from hetero.devices.fake_nvml import FakeNVML, mixed_box, nvswitch_box, pcie_box
from hetero.devices.topology import DeviceGroup, Topology, read_topology

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
    affinity of each GPU, as `nvidia-smi topo -m` lays them out.

    Examples: `hetero topology`, `hetero topology --fake nvswitch --group 4`,
    `hetero topology --fake mixed --json`.
    """
    nvml = _BUILDERS[fake]() if fake is not None else None
    # A fake describes a whole box; this shell's CUDA_VISIBLE_DEVICES is about the real one.
    found = read_topology(nvml, environ={} if nvml is not None else None)
    chosen = _group(found, group) if group is not None else None
    source = f"fake:{fake.value}" if fake is not None else "nvml"
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
    console.print(f"[bold]{len(found)} GPU{plural}[/] ({source})", highlight=False)
    console.print(found.format_matrix(), markup=False, highlight=False, soft_wrap=True)
    if chosen is not None:
        console.print(_describe(chosen), markup=False, highlight=False, soft_wrap=True)


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
    return f"{head}; slowest link {chosen.bottleneck.label}, {chosen.bottleneck.gbs:g} GB/s{how}"


def register(app: typer.Typer) -> None:
    """Add ``topology`` to ``app``."""
    app.command("topology")(topology)
