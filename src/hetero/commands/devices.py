"""``hetero devices``: the devices of a fleet config, the ones found on this machine, or every
node's of a Ray cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hetero._cli_util import JsonOpt, RayAddressOpt, console, fail, print_json
from hetero._format import count
from hetero._tables import SplitTable
from hetero.config import load_config
from hetero.devices.spec import Device
from hetero.errors import HeteroError
from hetero.units import format_size

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``devices`` to ``app``."""
    app.command("devices")(devices)


def devices(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Fleet config; default: this machine's devices."),
    ] = None,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="List every node's devices of a Ray cluster (each node's HETERO_NODE_CONFIG, "
            "else its detected devices).",
        ),
    ] = False,
    address: RayAddressOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the devices of a fleet config, the ones discovered on this machine, or (--ray)
    those of every node of a Ray cluster, by node."""
    if ray and config is not None:
        fail("--ray lists the cluster's devices, which its nodes declare; drop --config")
    if address is not None and not ray:
        fail(f"--address {address!r} applies to --ray only")
    if ray:
        _ray_devices(address, as_json)
        return
    try:
        from hetero.devices.fleet import fleet_for

        fleet = fleet_for(load_config(config) if config is not None else None)
    except HeteroError as exc:
        fail(str(exc))
    if as_json:
        print_json([d.to_dict() for d in fleet])
        return
    console.print(_device_table(fleet))


def _ray_devices(address: str | None, as_json: bool) -> None:
    try:
        from hetero.runtime.ray_backend import ray_fleet

        nodes = ray_fleet(address)
    except HeteroError as exc:
        fail(str(exc))
    if as_json:
        print_json(
            [
                {
                    "node_id": n["node_id"],
                    "address": n["address"],
                    "devices": [d.to_dict() for d in n["devices"]],
                }
                for n in nodes
            ]
        )
        return
    total = sum(len(n["devices"]) for n in nodes)
    console.print(f"Ray cluster: {count(len(nodes), 'node')}, {count(total, 'device')}")
    for n in nodes:
        table = _device_table(n["devices"])
        devices = count(len(n["devices"]), "device")
        table.title = f"node {n['node_id'][:6]} at {n['address']}: {devices}"
        console.print(table)


def _device_table(fleet: list[Device]) -> Table:
    # Most telling columns first: on a narrow console the last ones move to a table below.
    table = SplitTable(
        title=count(len(fleet), "device"),
        caption="fp16, fp32: dense TFLOPS; speed: relative to a V100",
        caption_justify="left",
    )
    for col in ("id", "model", "memory", "speed", "fp16", "fp32", "kind", "emulated", "health"):
        table.add_column(col, justify="right" if col in ("speed", "fp16", "fp32") else "left")
    for d in fleet:
        table.add_row(
            d.id,
            d.model,
            format_size(d.memory_bytes),
            f"{d.speed:.2f}",
            f"{d.spec.peak_tflops('fp16'):.1f}",
            f"{d.spec.peak_tflops('fp32'):.1f}",
            d.kind.value,
            "yes" if d.emulated else "no",
            "[green]healthy[/]" if d.state.healthy else "[red]unhealthy[/]",
        )
    return table
