"""``hetero config validate``: check a fleet config and print every problem in it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hetero._cli_util import console, err_console, print_problems
from hetero._format import count
from hetero.config import HeteroConfig, load_config
from hetero.errors import ConfigError
from hetero.serve.router import DEFAULT_STRATEGY

__all__ = ["register"]

config_app = typer.Typer(help="Fleet config files (hetero_config.yaml).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``config`` group to ``app``."""
    app.add_typer(config_app, name="config")


@config_app.command("validate")
def validate(file: Annotated[Path, typer.Argument(help="The YAML file to check.")]) -> None:
    """Check a fleet config; print every problem (field, bad value, what is allowed) and exit 1."""
    try:
        config = load_config(file)
    except ConfigError as exc:
        problems = count(len(exc.problems), "problem")
        err_console.print(f"[bold red]{file}: {problems}[/]", highlight=False)
        print_problems(exc, "  - ")
        raise typer.Exit(1) from None
    console.print(f"[green]ok[/]: {file}: {_contents(config)}", highlight=False)


def _contents(config: HeteroConfig) -> str:
    """What the file declares: its devices, its replicas and the strategy each user of it
    routes by (``hetero serve`` takes the file's only when it names one)."""
    devices = sum(d.count for d in config.devices)
    replicas = len(config.replicas)
    if devices:
        parts = [count(devices, "device")]
    elif config.backend.kind == "ray":
        parts = ["no devices (the Ray cluster's nodes declare theirs)"]
    else:
        parts = []
    if replicas:
        parts.append(count(replicas, "replica"))
        if not devices and config.backend.kind != "ray":
            parts.append("no devices")
    strategy = config.scheduler.strategy
    if replicas and "strategy" not in config.scheduler.model_fields_set:
        strategy = (
            f"{strategy} (hetero serve: {DEFAULT_STRATEGY})"
            if devices
            else f"{DEFAULT_STRATEGY} (hetero serve's default)"
        )
    return ", ".join([*parts, f"strategy {strategy}"])
