"""Reading a YAML or JSON input file (fleet config, workload, plan spec) with errors that say
which file, where in it and what is wrong, as a ``ConfigError``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hetero.errors import ConfigError

__all__ = ["read_data_file"]


def read_data_file(path: Path, what: str) -> Any:
    """The parsed contents of ``path``: JSON for a ``.json`` file, YAML otherwise. ``what``
    names the file in the error (``"workload"``)."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError([("", f"cannot read {what} {str(path)!r}: {reason}")]) from None
    try:
        return json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            [("", f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([("", f"{path}: invalid YAML{where}: {problem}")]) from None
