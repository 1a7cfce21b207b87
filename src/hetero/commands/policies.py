"""``hetero policies`` (also ``hetero policies list``): the built-in scheduling policies and
when to use each."""

from __future__ import annotations

import inspect

import typer

from hetero._cli_util import console
from hetero._format import plain_text
from hetero._tables import FitTable

__all__ = ["register"]

# The group runs the listing itself, so that `hetero policies` and `hetero policies list` (the
# name other help texts and docs use) print the same table.
policies_app = typer.Typer(invoke_without_command=True)

# The policy's text wraps into what the name leaves; below this width its options go first.
_TEXT_WIDTH = 30
_OPTIONS_WIDTH = 22


def register(app: typer.Typer) -> None:
    """Add ``policies`` (and ``policies list``) to ``app``."""
    app.add_typer(policies_app, name="policies")


@policies_app.callback()
def policies(ctx: typer.Context) -> None:
    """List the built-in scheduling policies and when to use each.

    Set one with a fleet config's scheduler.strategy (its options under scheduler.options),
    `Context(strategy=...)` or `hetero serve --strategy`; docs/scheduling.md compares them.
    """
    if ctx.invoked_subcommand is None:
        _list()


@policies_app.command("list")
def policies_list() -> None:
    """List the built-in scheduling policies and when to use each (as `hetero policies`)."""
    _list()


def _list() -> None:
    from hetero.config import SchedulerConfig
    from hetero.sched.registry import policy_class, policy_names

    default = SchedulerConfig().strategy
    table = FitTable(
        title="policies (scheduler.strategy)",
        caption=f"default: {default}; options: keyword arguments (scheduler.options)",
        caption_justify="left",
        hint="widen the terminal to see them",
    )
    table.add_column("name", no_wrap=True)
    table.add_wrapping_column("when to use it", width=_TEXT_WIDTH, priority=2)
    table.add_wrapping_column("options", width=_OPTIONS_WIDTH, priority=1)
    for name in policy_names():
        cls = policy_class(name)
        first = (cls.__doc__ or "").strip().split("\n\n")[0]
        table.add_row(name, plain_text(first), ", ".join(_options(cls)) or "-")
    console.print(table)


def _options(cls: type) -> list[str]:
    """The keyword arguments a policy's constructor takes (what ``scheduler.options`` sets)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(cls).parameters.values() if p.kind in kinds]
