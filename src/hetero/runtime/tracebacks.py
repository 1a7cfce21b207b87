"""A task's traceback as its author reads it: every frame named by the user's file and line.

A worker formats the traceback of a task that raised, and ships it back as text. Functions that
cloudpickle sends by value (those of ``__main__``, lambdas, closures, modules registered with
``cloudpickle.register_pickle_by_value``) run there from code objects whose file name it sets to
``<dynamic-code>``, so their frames name no file and show no source. The driver still holds the
originals: here each such frame is matched, by function name and line, to the code of the
modules shipped by value, and named by its file again with its source line. The worker's own
frames before the first of the user's (``run_order``, a map's batch loop) are left out.
"""

from __future__ import annotations

import functools
import linecache
import os
import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from types import CodeType, FunctionType, MethodType, ModuleType
from typing import Any

__all__ = ["readable_traceback", "shipped_by_value"]

#: The file name cloudpickle gives the code objects it rebuilds.
DYNAMIC = "<dynamic-code>"

_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<name>.+)$')
_HEADER = "Traceback (most recent call last):"
# hetero's frames between the worker and the task: never the user's code.
_INTERNAL = f"{os.sep}hetero{os.sep}runtime{os.sep}"


@dataclass(slots=True)
class _Frame:
    file: str
    line: int
    name: str
    detail: list[str] = field(default_factory=list)  # source and caret lines under it


def shipped_by_value() -> list[ModuleType]:
    """The modules whose functions cloudpickle sends by value: ``__main__`` and those
    registered with ``cloudpickle.register_pickle_by_value``."""
    import cloudpickle

    names = ["__main__", *cloudpickle.list_registry_pickle_by_value()]
    return [sys.modules[n] for n in dict.fromkeys(names) if n in sys.modules]


def readable_traceback(text: str, modules: Iterable[ModuleType] | None = None) -> str:
    """``text`` (a ``traceback.format_exc()`` from a worker) with each ``<dynamic-code>`` frame
    named by its file and line in ``modules`` (default: ``shipped_by_value()``) and its source
    line added, and hetero's own frames before the first of the user's left out (all kept when
    the user's code never ran: they say where loading it failed). A frame that matches no code,
    or code in several files, stays as it was."""
    items = _parse(text)
    frames = [i for i in items if isinstance(i, _Frame)]
    if not any(f.file == DYNAMIC or _INTERNAL in f.file for f in frames):
        return text
    dynamic = any(f.file == DYNAMIC for f in frames)
    index = _index(shipped_by_value() if modules is None else modules) if dynamic else {}
    # One section per traceback of a chain ("During handling of the above exception, …").
    sections: list[list[_Frame | str]] = [[]]
    for item in items:
        if item == _HEADER and sections[-1]:
            sections.append([])
        sections[-1].append(item)
    out = [line for section in sections for line in _render(section, index)]
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _parse(text: str) -> list[_Frame | str]:
    items: list[_Frame | str] = []
    for line in text.splitlines():
        match = _FRAME.match(line)
        if match:
            items.append(_Frame(match["file"], int(match["line"]), match["name"]))
        elif line.startswith("    ") and items and isinstance(items[-1], _Frame):
            items[-1].detail.append(line)
        else:
            items.append(line)
    return items


def _render(section: list[_Frame | str], index: dict[str, list[tuple[str, int, int]]]) -> list[str]:
    """One traceback (a header, its frames, the exception lines after them) as lines."""
    frames = [i for i in section if isinstance(i, _Frame)]
    user = next((k for k, f in enumerate(frames) if _INTERNAL not in f.file), None)
    skip = set() if user is None else {id(f) for f in frames[:user]}
    lines: list[str] = []
    for item in section:
        if isinstance(item, str):
            lines.append(item)
        elif id(item) not in skip:
            lines += _frame_lines(item, index)
    return lines


def _frame_lines(frame: _Frame, index: dict[str, list[tuple[str, int, int]]]) -> list[str]:
    file = frame.file
    if file == DYNAMIC:
        files = {f for f, first, last in index.get(frame.name, ()) if first <= frame.line <= last}
        if len(files) == 1:
            file = files.pop()
    lines = [f'  File "{file}", line {frame.line}, in {frame.name}']
    if frame.detail:
        return lines + frame.detail
    source = linecache.getline(file, frame.line).strip() if file != DYNAMIC else ""
    return lines + ([f"    {source}"] if source else [])


def _index(modules: Iterable[ModuleType]) -> dict[str, list[tuple[str, int, int]]]:
    """Function name (and qualified name) -> ``(file, first line, last line)`` of every code
    object defined in ``modules``: their functions, classes' methods, the functions those
    wrap, and the functions, lambdas and comprehensions nested in them."""
    found: dict[str, list[tuple[str, int, int]]] = {}
    seen: set[int] = set()
    for module in modules:
        for value in list(vars(module).values()):
            for code in _codes(value, module.__name__, seen, depth=0):
                lines = [line for _, _, line in code.co_lines() if line is not None]
                span = (code.co_filename, code.co_firstlineno, max(lines, default=0))
                for name in {code.co_name, getattr(code, "co_qualname", code.co_name)}:
                    found.setdefault(name, []).append(span)
    return found


def _codes(obj: Any, module: str, seen: set[int], depth: int) -> Iterator[CodeType]:
    if depth > 4 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, MethodType):
        obj = obj.__func__
    if isinstance(obj, FunctionType) and obj.__module__ == module:
        yield from _nested(obj.__code__)
    elif isinstance(obj, type):
        if obj.__module__ == module:
            for value in list(vars(obj).values()):
                yield from _codes(value, module, seen, depth + 1)
        return
    for inner in _wrapped(obj):
        yield from _codes(inner, module, seen, depth + 1)


def _wrapped(obj: Any) -> list[Any]:
    """The functions ``obj`` wraps, found without calling any code of ``obj``'s (a global may
    be anything: a proxy whose ``__getattr__`` fetches, a mock that makes up attributes)."""
    from hetero.runtime.tasks import TaskFunction

    if isinstance(obj, (staticmethod, classmethod)):
        return [obj.__func__]
    if isinstance(obj, property):
        return [f for f in (obj.fget, obj.fset, obj.fdel) if f is not None]
    if isinstance(obj, functools.partial):
        return [obj.func]
    if isinstance(obj, TaskFunction):
        return [obj.fn]
    try:  # functools.wraps records the wrapped function in the wrapper's __dict__
        own = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return []
    wrapped = own.get("__wrapped__") if isinstance(own, dict) else None
    return [] if wrapped is None else [wrapped]


def _nested(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _nested(const)
