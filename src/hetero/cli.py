"""The ``hetero`` command line: the app and its global options.

Every subcommand lives in a module of :mod:`hetero.commands` with ``register(app)``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from hetero._cli_util import console
from hetero._version import __version__
from hetero.commands import (
    catalog,
    config,
    devices,
    fit,
    launch,
    match,
    mock_replica,
    plan,
    policies,
    profile,
    serve,
    simulate,
    top,
    topology,
)
from hetero.log import LOG_LEVELS, set_log_level

app = typer.Typer(
    name="hetero",
    help="Run data-parallel work on a fleet of different accelerators, each kept busy in "
    "proportion to its speed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        console.print(f"hetero {__version__}")
        raise typer.Exit()


def _log_level(value: str) -> str:
    try:
        set_log_level(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    log_level: Annotated[
        str,
        typer.Option("--log-level", callback=_log_level, help=f"One of {', '.join(LOG_LEVELS)}."),
    ] = "WARNING",
) -> None:
    """hetero: heterogeneity-aware scheduling for mixed accelerator fleets."""


def run() -> None:
    """Entry point of the ``hetero`` script."""
    app()


# --help lists commands in registration order, then the groups: the core commands first, then
# the planner's, then the catalog and config groups.
for _command in (
    devices,
    top,
    simulate,
    profile,
    serve,
    launch,
    policies,
    mock_replica,
    fit,
    match,
    plan,
    topology,
    catalog,
    config,
):
    _command.register(app)
