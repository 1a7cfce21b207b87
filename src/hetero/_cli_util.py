"""What every ``hetero`` subcommand shares: consoles, the ``--json`` option, error printing."""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterable
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from hetero.devices.spec import DeviceKind
from hetero.errors import ConfigError

__all__ = [
    "JsonOpt",
    "ProgressBars",
    "RayAddressOpt",
    "console",
    "err_console",
    "fail",
    "parse_kinds",
    "print_json",
    "print_problems",
]

console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

#: ``--address`` beside ``--ray``.
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="With --ray: the cluster ('auto', host:port, ray://host:port); default: "
        "RAY_ADDRESS, else the cluster started on this machine, else a new local one.",
    ),
]


def fail(message: str, code: int = 1) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def print_problems(exc: ConfigError, prefix: str) -> None:
    """Every problem of ``exc`` on its own stderr line, as ``field.path: message``."""
    for path, message in exc.problems:
        err_console.print(
            f"{prefix}{path + ': ' if path else ''}{message}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def parse_kinds(names: Iterable[str]) -> set[DeviceKind]:
    """The device kinds named by a repeatable ``--kind``; ``ValueError`` names the first unknown
    one, its closest kind and the allowed ones."""
    allowed = [k.value for k in DeviceKind]
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=1)
            hint = f"; closest: {close[0]}" if close else ""
            raise ValueError(f"unknown kind {name!r}{hint}; allowed: {', '.join(allowed)}")
    return {DeviceKind(name) for name in names}


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


class ProgressBars:
    """One rich progress bar per named run on stderr (or none, when not ``enabled``).

    ``with ProgressBars(True) as bars``: ``bars(name)`` adds a bar and returns its
    ``(done, total)`` callback, the ``Progress`` of the simulator; ``bars`` is ``None`` when
    disabled."""

    def __init__(self, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = (
            Progress(
                TextColumn("{task.description:>28}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console,
            )
            if enabled
            else None
        )

    def __enter__(self) -> Any:
        if self.progress is None:
            return None
        self.progress.start()
        progress = self.progress

        def for_run(name: str) -> Any:
            task = progress.add_task(name, total=None)

            def update(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total or None)

            return update

        return for_run

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()
