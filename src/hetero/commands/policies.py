"""``hetero policies``: the built-in scheduling policies and when to use each."""

from __future__ import annotations

import typer
from rich.table import Table

from hetero._cli_util import console

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``policies`` to ``app``."""
    app.command("policies")(policies)


def policies() -> None:
    """List the built-in scheduling policies and when to use each."""
    from hetero.sched.registry import policy_class, policy_names

    table = Table(title="policies (scheduler.strategy)")
    table.add_column("name")
    table.add_column("when to use it")
    for name in policy_names():
        doc = (policy_class(name).__doc__ or "").strip().split("\n\n")[0]
        table.add_row(name, " ".join(doc.split()))
    console.print(table)
