"""Reading a YAML or JSON input file (fleet config, workload, plan spec) with errors that say
which file, where in it and what is wrong, as a ``ConfigError``.

YAML is read safely (plain values only) and within bounds: PyYAML shares the value an alias
names, so a 1 KB file of nested aliases (a "billion laughs") loads at once and then makes
whatever walks it visit 10^9 values. A file that holds more than ``MAX_YAML_VALUES`` values once
its aliases are expanded, or a value that holds an alias of itself, is refused before any value
is built."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hetero.errors import ConfigError

__all__ = ["MAX_YAML_VALUES", "read_data_file"]

#: The most values (scalars, lists and mappings) a YAML file may hold, aliases expanded.
MAX_YAML_VALUES = 1_000_000


def read_data_file(path: Path, what: str) -> Any:
    """The parsed contents of ``path``: JSON for a ``.json`` file, YAML otherwise. ``what``
    names the file in the error (``"workload"``)."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError([("", f"cannot read {what} {str(path)!r}: {reason}")]) from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.load(text, Loader=_BoundedLoader)
    except RecursionError:
        raise ConfigError([("", f"{path}: values nested more deeply than hetero reads")]) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            [("", f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}")]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError([("", f"{path}: invalid YAML{where}: {problem}")]) from None


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that checks the expanded size of a document before building it."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        return super().construct_document(node)


def _check_expansion(root: yaml.Node) -> None:
    """Refuse ``root`` when it holds a node that contains itself, or more than
    ``MAX_YAML_VALUES`` nodes with every alias written out. A depth-first walk that visits each
    distinct node once, so a small file is checked at once however far it would expand."""
    sizes: dict[int, int] = {}  # node id -> expanded size, capped just past the maximum
    open_: set[int] = set()  # the nodes on the current path
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        children = _children(node)
        if finished:
            open_.discard(key)
            sizes[key] = min(MAX_YAML_VALUES + 1, 1 + sum(sizes[id(c)] for c in children))
        elif key in open_:
            raise yaml.constructor.ConstructorError(
                problem="this value holds an alias of itself", problem_mark=node.start_mark
            )
        elif key not in sizes:
            open_.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    if sizes[id(root)] > MAX_YAML_VALUES:
        raise yaml.constructor.ConstructorError(
            problem=f"it holds more than {MAX_YAML_VALUES} values once its aliases are "
            f"expanded; allowed: at most {MAX_YAML_VALUES}"
        )


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
