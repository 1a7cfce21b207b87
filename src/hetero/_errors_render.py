"""Helpers that turn pydantic validation errors into ``(field path, message)`` problems, shared
by the fleet config, the workload spec and the fleet-sizing spec."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["Nested", "lookup", "render_path", "show", "validation_problems"]


def show(value: Any) -> str:
    """A short ``repr`` of a bad value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def render_path(loc: Sequence[int | str]) -> str:
    """``("devices", 2, "model")`` → ``devices[2].model``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def lookup(data: Any, loc: Sequence[int | str]) -> Any:
    """The value at ``loc`` in nested dicts/lists, or ``None`` if there is none."""
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


#: Where a field's value is validated: a model, or a discriminated union (tag -> model).
Nested = Mapping[str, "type[BaseModel] | Mapping[str, type[BaseModel]]"]


def _walk(
    loc: tuple[int | str, ...], root: type[BaseModel], nested: Nested
) -> tuple[list[int | str], type[BaseModel] | None]:
    """Drop pydantic's union tags from ``loc``; also return the model holding the last part."""
    model: type[BaseModel] | None = root
    clean: list[int | str] = []
    parent: type[BaseModel] | None = None
    skip_tag: Mapping[str, type[BaseModel]] | None = None
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if skip_tag is not None:
            tagged = skip_tag
            skip_tag = None
            if isinstance(part, str) and part in tagged:
                model = tagged[part]
                continue
        if isinstance(part, int):
            clean.append(part)
            continue
        if model is not None and part not in model.model_fields and not last:
            continue  # a union member's name (e.g. 'function-before[...]'): noise
        clean.append(part)
        parent = model
        inner = nested.get(part) if model is not None else None
        if isinstance(inner, Mapping):
            skip_tag, model = inner, None
        else:
            model = inner
    return clean, parent


def validation_problems(
    exc: ValidationError, data: Any, root: type[BaseModel], nested: Nested
) -> list[tuple[str, str]]:
    """``(field path, message)`` for every error of ``exc``, raised validating ``data`` as
    ``root``. ``nested`` maps field names to the model (or tag -> model union) that validates
    them, so paths leave out pydantic's union tags and unknown keys list the allowed ones."""
    problems: list[tuple[str, str]] = []
    for err in exc.errors():
        kind = err["type"]
        loc, parent = _walk(tuple(err["loc"]), root, nested)
        ctx = err.get("ctx") or {}
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            key = str(ctx.get("discriminator", "")).strip("'")
            tags = nested.get(str(loc[-1])) if loc else None
            allowed = (
                ", ".join(tags) if isinstance(tags, Mapping) else str(ctx.get("expected_tags"))
            )
            path = render_path([*loc, key])
            if kind == "union_tag_not_found":
                problems.append((path, f"required field is missing; allowed: {allowed}"))
            else:
                problems.append((path, f"unknown {key} {ctx.get('tag')!r}; allowed: {allowed}"))
            continue
        path = render_path(loc)
        if kind == "extra_forbidden":
            fields = sorted(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(
                (
                    path,
                    f"unknown key {str(loc[-1])!r}; {hint}allowed keys: "
                    f"{', '.join(fields) or 'none'}",
                )
            )
            continue
        if kind == "missing":
            problems.append((path, "required field is missing"))
            continue
        if loc and loc[-1] == "[key]":
            path = render_path([*loc[:-2], loc[-2]]) if len(loc) >= 2 else path
            problems.append((path, f"keys must be integers (got {show(loc[-2])})"))
            continue
        message = str(err["msg"]).removeprefix("Value error, ")
        value = lookup(data, loc)
        if "(got " in message or "closest" in message or repr(value) in message:
            problems.append((path, message))
        else:
            problems.append((path, f"{message} (got {show(value)})"))
    return list(dict.fromkeys(problems))
