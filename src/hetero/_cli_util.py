"""What every ``hetero`` subcommand shares: consoles, the ``--json`` option, error printing."""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import re
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import typer
from rich.console import Console

from hetero.devices.spec import DeviceKind
from hetero.errors import ConfigError

__all__ = [
    "HfConfigOpt",
    "JsonOpt",
    "ParagraphHelpFormatter",
    "ProgressBars",
    "console",
    "err_console",
    "fail",
    "help_paragraphs",
    "parse_kinds",
    "print_json",
    "print_problems",
    "rewrap_help",
]

console = Console()
err_console = Console(stderr=True)

JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
#: A model given by its Hugging Face config.json (``hetero fit``, ``hetero plan-train``).
HfConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help="A Hugging Face config.json (or its directory) instead of MODEL, "
        "e.g. --config ./Mistral-7B-v0.1/config.json.",
        show_default=False,
    ),
]

# A list item's first line: "- x", "* x", "• x", "1. x", "2) x".
_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")

Paragraph = tuple[Literal["prose", "list", "block"], list[str]]


def help_paragraphs(text: str) -> list[Paragraph]:
    """``text`` (a docstring or a help text) as its paragraphs, split at blank lines, with the
    source's line breaks taken out where they only wrapped the text.

    A paragraph of prose becomes one line. A list (its first line an item: ``- ``, ``* ``,
    ``1. ``) keeps one line per item, an item's continuation lines joined to it. A paragraph
    whose lines after the first are all indented more than its first (a command, a table), or
    that starts with click's ``\\b``, is kept as written: its breaks are intentional.
    """
    found: list[Paragraph] = []
    for block in re.split(r"\n[ \t]*\n", inspect.cleandoc(text)):
        lines = block.split("\n")
        if not block.strip():
            continue
        if block.startswith("\b") or _indented(lines):
            found.append(("block", lines))
        elif _LIST_ITEM.match(lines[0]):
            items: list[str] = []
            for line in lines:
                if _LIST_ITEM.match(line) or not items:
                    items.append(line.strip())
                else:
                    items[-1] += " " + line.strip()
            found.append(("list", items))
        else:
            found.append(("prose", [" ".join(line.strip() for line in lines)]))
    return found


def _indented(lines: list[str]) -> bool:
    """Whether every line is indented past column 0 (a code block, a command), or, after a
    first line at the margin, every other line is indented (a heading over a block)."""

    def deep(line: str) -> bool:
        return line.startswith((" ", "\t")) or not line.strip()

    return all(deep(line) for line in lines) or (len(lines) > 1 and all(map(deep, lines[1:])))


def rewrap_help(text: str) -> str:
    """``text`` with its paragraphs (``help_paragraphs``) one per line and blank lines
    between: the terminal wraps them to its width, not where the source broke its lines."""
    return "\n\n".join("\n".join(lines) for _, lines in help_paragraphs(text))


class ParagraphHelpFormatter(argparse.HelpFormatter):
    """An argparse formatter whose description and epilog are wrapped to the terminal by
    paragraph: blank lines, lists and indented blocks stay as written (``help_paragraphs``),
    where ``HelpFormatter`` runs everything into one paragraph and
    ``RawDescriptionHelpFormatter`` keeps the source's line breaks inside sentences."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for kind, lines in help_paragraphs(text):
            if kind == "block":
                out.append("\n".join(indent + line for line in lines))
            elif kind == "list":
                hanging = indent + "  "
                out.append(
                    "\n".join(
                        textwrap.fill(item, width, initial_indent=indent, subsequent_indent=hanging)
                        for item in lines
                    )
                )
            else:
                out.append(
                    textwrap.fill(lines[0], width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(out)


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
