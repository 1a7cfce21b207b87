"""The ``hetero`` command line: the app and its global options.

Every subcommand lives in a module of :mod:`hetero.commands` with ``register(app)``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from hetero._cli_util import console, rewrap_help
from hetero._version import __version__
from hetero.commands import (
    catalog,
    config,
    devices,
    fit,
    launch,
    match,
    mock_model,
    mock_replica,
    plan,
    plan_train,
    policies,
    profile,
    profile_engine,
    serve,
    simulate,
    top,
    topology,
)
from hetero.log import LOG_LEVELS, set_log_level


class _Group(TyperGroup):
    """The ``hetero`` group, whose help pages say what each option takes (see ``_tidy_help``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        _tidy_help(self)


def _tidy_help(command: TyperCommand | TyperGroup) -> None:
    """Help as hetero shows it, for ``command`` and every command under it.

    Typer prints a type beside every option (``--json <bool>``, ``--fleet <str>``); here a flag
    shows none and an option described only by its type shows its name in capitals, as argparse
    does (``--fleet FLEET``). Explicit metavars (``--serve URL``) and choices stay. A group lists
    each command by its docstring's first paragraph on one line, not broken where the source is.
    Help texts are rewrapped by paragraph (``rewrap_help``): typer keeps the source's line
    breaks after the first paragraph, so a sentence would break mid-line at any width; blank
    lines, lists and indented blocks stay as written.
    """
    if command.help:
        command.help = rewrap_help(command.help)
    ctx = typer.Context(command)
    for param in [*command.params, command.get_help_option(ctx)]:
        if isinstance(param, TyperOption) and param.help and "\n" in param.help:
            param.help = rewrap_help(param.help)
        if not isinstance(param, TyperOption) or param.metavar is not None:
            continue
        if param.is_flag:
            param.metavar = ""
        elif "|" not in param.display_type(ctx):
            long = next((o for o in param.opts if o.startswith("--")), param.opts[0])
            param.metavar = long.lstrip("-").replace("-", "_").upper()
    for sub in command.commands.values() if isinstance(command, TyperGroup) else ():
        if isinstance(sub, (TyperCommand, TyperGroup)):
            if sub.short_help is None and sub.help:
                sub.short_help = " ".join(sub.help.split("\n\n")[0].split())
            _tidy_help(sub)


app = typer.Typer(
    cls=_Group,
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


def _log_level(value: str | None) -> str | None:
    if value is None:
        return None  # a config's logging.level, else WARNING
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
        str | None,
        typer.Option(
            "--log-level",
            callback=_log_level,
            help=f"One of {', '.join(LOG_LEVELS)}; wins over a config's logging.level "
            "(default: that, else WARNING).",
        ),
    ] = None,
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
    mock_model,
    profile_engine,
    fit,
    match,
    plan,
    plan_train,
    topology,
    catalog,
    config,
):
    _command.register(app)
