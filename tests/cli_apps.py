"""The command line as tests run it: one command group in a Typer app, invoked by name as
under ``hetero``; or the installed ``hetero`` itself, in a process of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import typer


def command_app(register: Callable[[typer.Typer], object]) -> typer.Typer:
    """An app with the commands ``register`` adds (a ``hetero.commands`` module's)."""
    app = typer.Typer()
    register(app)

    @app.callback()
    def main() -> None:
        """hetero"""

    return app


def hetero_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``hetero`` run with ``args``, wide enough that tables do not wrap."""
    exe = Path(sys.executable).with_name("hetero")
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=env, timeout=120)
