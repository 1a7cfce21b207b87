"""``hetero profile``: run a Python script with every ``hetero.Context`` in it profiled, and the
collectives of every rank it starts (``hetero.comm``) merged into one report."""

from __future__ import annotations

import os
import re
import runpy
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

from hetero._cli_util import console, err_console, fail
from hetero.telemetry import PROFILE_DIR_ENV, PROFILE_NAME_ENV

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``profile`` to ``app``."""
    # Everything after SCRIPT is the script's own (its options included), as with `python`.
    app.command(
        "profile",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(profile)


def profile(
    script: Annotated[Path, typer.Argument(help="The Python script to run.", show_default=False)],
    args: Annotated[
        list[str] | None,
        typer.Argument(help="Arguments passed to the script.", show_default=False),
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="Directory the reports are written to.")
    ] = Path("hetero-profile"),
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            help="Stem of the report files. Default: the script's name.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run a script with every hetero.Context in it profiled; say where the reports are.

    SCRIPT runs as `python SCRIPT ARGS...` would. Each Context writes NAME.html (open it in a
    browser) and NAME.trace.json (open it at ui.perfetto.dev) into --out; a second Context in
    the script writes NAME-2.*, and so on. When the script, or ranks it starts, make
    hetero.comm collectives, one more report shows each rank's time in them.

    Examples: `hetero profile train.py --epochs 3`, `hetero profile --out runs/a job.py`.
    """
    if not script.is_file():
        fail(f"{script}: no such script", code=2)
    name = name or script.stem
    out = out.resolve()  # the script may change directory
    before = _reports(out, name)
    ranks_before = _rank_files(out, name)
    code = _run(script, args or [], {PROFILE_DIR_ENV: str(out), PROFILE_NAME_ENV: name})
    ranks = [p for p, stamp in _rank_files(out, name).items() if ranks_before.get(p) != stamp]
    if ranks:
        _merge_ranks(out, name, ranks)
    written = sorted(p for p, stamp in _reports(out, name).items() if before.get(p) != stamp)
    if written:
        console.print("profile written:", highlight=False)
        for path in written:
            how = "open at ui.perfetto.dev" if path.suffix == ".json" else "open in a browser"
            console.print(f"  {path}  ({how})", markup=False, highlight=False, soft_wrap=True)
    else:
        err_console.print(
            f"no profile was written to {out}: the script created no hetero.Context and "
            "joined no process group with hetero.comm.init",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    if code:
        raise typer.Exit(code)


def _run(script: Path, args: list[str], env: dict[str, str]) -> int:
    """Run ``script`` as ``__main__`` with ``env`` set and its directory first on ``sys.path``,
    as ``python script`` would; returns its exit code. The process's ``argv``, ``path`` and
    environment are restored after, so that a caller running several commands is unaffected."""
    saved_env = {key: os.environ.get(key) for key in env}
    saved_argv, saved_path = sys.argv, list(sys.path)
    os.environ.update(env)
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return _exit_code(exc.code)
    except Exception:
        traceback.print_exc()
        return 1
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return 0


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s status as Python computes it: a message is printed and means 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _reports(directory: Path, name: str) -> dict[Path, tuple[int, int]]:
    """The report files for ``name`` in ``directory`` with their (mtime, size), so that files
    left by an earlier run are not reported as this run's."""
    pattern = re.compile(rf"{re.escape(name)}(-\d+)?\.(html|trace\.json)")
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.iterdir():
        if pattern.fullmatch(path.name):
            stat = path.stat()
            found[path] = (stat.st_mtime_ns, stat.st_size)
    return found


def _rank_files(directory: Path, name: str) -> dict[Path, tuple[int, int]]:
    """The files ranks leave for ``name`` in ``directory`` (``hetero.comm`` writes
    ``<name>.collectives.<pid>.json`` at ``destroy()``), with their (mtime, size)."""
    pattern = re.compile(rf"{re.escape(name)}\.collectives\.\d+\.json")
    if not directory.is_dir():
        return {}
    return {
        path: (path.stat().st_mtime_ns, path.stat().st_size)
        for path in directory.iterdir()
        if pattern.fullmatch(path.name)
    }


def _merge_ranks(directory: Path, name: str, paths: list[Path]) -> None:
    """One report of every rank's collectives from the files this run's ranks left, which it
    replaces."""
    from hetero.errors import HeteroError
    from hetero.runtime.profiling import unique_name
    from hetero.telemetry import Profile
    from hetero.telemetry.collectives import read_rank_files

    try:
        ranks = read_rank_files(sorted(paths))
        started = min(r.started for r in ranks)
        ended = max(r.ended for r in ranks)
        Profile([], [], started, ended, collectives=ranks).save(
            directory, unique_name(directory, name)
        )
    except HeteroError as exc:
        fail(f"the ranks' collective times could not be reported: {exc}")
    for path in paths:
        path.unlink(missing_ok=True)
