"""``hetero devices``: the devices of a fleet config, or the ones found on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hetero._cli_util import JsonOpt, console, fail, print_json
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
    as_json: JsonOpt = False,
) -> None:
    """List the devices of a fleet config, or the ones discovered on this machine."""
    try:
        from hetero.devices.fleet import fleet_for

        fleet = fleet_for(load_config(config) if config is not None else None)
    except HeteroError as exc:
        fail(str(exc))
    if as_json:
        print_json([d.to_dict() for d in fleet])
        return
    console.print(_device_table(fleet))


def _device_table(fleet: list[Device]) -> Table:
    # Most telling columns first: on a narrow console the last ones move to a table below.
    table = SplitTable(
        title=f"{len(fleet)} devices",
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
