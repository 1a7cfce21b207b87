"""``hetero config validate``: check a fleet config and print every problem in it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hetero._cli_util import console, err_console, print_problems
from hetero._format import count
from hetero.config import load_config
from hetero.errors import ConfigError

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
    devices = count(sum(d.count for d in config.devices), "device")
    console.print(
        f"[green]ok[/]: {file}: {devices}, strategy {config.scheduler.strategy}", highlight=False
    )
