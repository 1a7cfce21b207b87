"""``hetero devices``: the devices of a fleet config, the ones found on this machine, or every
node's of a Ray cluster."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.table import Table

from hetero._cli_util import JsonOpt, console, fail, print_json
from hetero._format import count
from hetero._tables import FitTable
from hetero.config import load_config
from hetero.devices.spec import Device
from hetero.errors import HeteroError
from hetero.units import format_size

__all__ = [
    "NO_CLUSTER",
    "RayClusterAddressOpt",
    "RayStartOpt",
    "check_ray_flags",
    "join_ray",
    "no_cluster",
    "register",
]

_T = TypeVar("_T")


def no_cluster(started: str) -> str:
    """What a ``--ray`` command says when no address is given and no cluster runs here;
    ``started``: what ``--ray-start`` does instead ("list the devices of")."""
    return (
        "no Ray cluster is running on this machine (no --address given, RAY_ADDRESS not set). "
        "Start one with `ray start --head` (nodes join it with `ray start --address HEAD:6379`), "
        f"pass --address HOST:PORT for a cluster elsewhere, or --ray-start to {started} a "
        "throwaway local Ray instance"
    )


#: What ``devices --ray`` says when no address is given and no cluster runs here.
NO_CLUSTER = no_cluster("list the devices of")

#: ``--address`` of the commands that take ``--ray`` and join only a running cluster.
RayClusterAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="With --ray: the cluster ('auto', host:port, ray://host:port); default: "
        "RAY_ADDRESS, else the cluster running on this machine. None running is an error, "
        "not a reason to start one (see --ray-start).",
    ),
]


#: ``--ray-start`` of the same commands.
RayStartOpt = Annotated[
    bool,
    typer.Option(
        "--ray-start",
        help="With --ray: start a throwaway local Ray instance (this machine alone) and show "
        "it, instead of joining a running cluster.",
    ),
]


def check_ray_flags(ray: bool, address: str | None, start: bool) -> None:
    """Refuse ``--address`` or ``--ray-start`` without ``--ray``, and the two together."""
    for flag, given in (("--address", address is not None), ("--ray-start", start)):
        if given and not ray:
            fail(f"{flag} applies to --ray only")
    if address is not None and start:
        fail("--address joins a running cluster and --ray-start starts one; give one of them")


def join_ray(ask: Callable[[str], _T], address: str | None, start: bool, started: str) -> _T:
    """``ask(where)`` of the Ray cluster at ``address``, else ``RAY_ADDRESS``, else the one
    running on this machine (``auto``); a throwaway local instance (``local``) only with
    ``start``. Fails the command with ``no_cluster(started)`` when none runs here, and with
    the error's message for any other ``HeteroError``."""
    # Without an address, only a running cluster: what a Ray instance started for the command
    # (and gone when it ends) shows would pass for the cluster's.
    where = address or os.environ.get("RAY_ADDRESS") or ("local" if start else "auto")
    try:
        return ask(where)
    except HeteroError as exc:
        if where == "auto" and isinstance(exc.__context__, ConnectionError):
            fail(no_cluster(started))
        fail(str(exc))


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
    address: RayClusterAddressOpt = None,
    ray_start: RayStartOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """List the devices of a fleet config, the ones discovered on this machine, or (--ray)
    those of every node of a Ray cluster, by node."""
    if ray and config is not None:
        fail("--ray lists the cluster's devices, which its nodes declare; drop --config")
    check_ray_flags(ray, address, ray_start)
    if ray:
        _ray_devices(address, ray_start, as_json)
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


def _ray_devices(address: str | None, start: bool, as_json: bool) -> None:
    from hetero.runtime.ray_backend import ray_fleet

    nodes = join_ray(ray_fleet, address, start, "list the devices of")
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


# Columns in the order shown, with their priority: on a narrow console the lowest are left out
# (and named under the table). The id stays; a long model name (a CPU's) wraps.
_COLUMNS = {
    "id": 9,
    "model": 8,
    "memory": 6,
    "speed": 7,
    "fp16": 3,
    "fp32": 2,
    "kind": 4,
    "emulated": 1,
    "health": 5,
}
_MODEL_WIDTH = 14


def _device_table(fleet: list[Device]) -> Table:
    table = FitTable(
        title=count(len(fleet), "device"),
        caption="fp16, fp32: dense TFLOPS; speed: relative to a V100",
        caption_justify="left",
        hint="--json shows every field",
    )
    for col, priority in _COLUMNS.items():
        if col == "model":
            table.add_wrapping_column(col, width=_MODEL_WIDTH, priority=priority)
        else:
            justify = "right" if col in ("speed", "fp16", "fp32") else "left"
            table.add_column(col, justify=justify, priority=priority)
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
