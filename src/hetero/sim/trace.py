"""Workload traces: JSONL or CSV files of items (their cost or token counts, and optionally
arrival time, memory, priority, kind and tags), read into columns, every bad line reported with
its number; and the items a trace's rows make, for :func:`hetero.sim.arrivals.generate`."""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from hetero.sched.item import CostModel, WorkItem
from hetero.units import parse_size

__all__ = ["Trace", "memory_size", "read_trace", "trace_rows"]

_MAX_TRACE_PROBLEMS = 20
_TAG_SPLIT = re.compile(r"[;|,\s]+")
_TRACE_COLUMNS = (
    "cost",
    "prompt_tokens",
    "max_new_tokens",
    "arrival",
    "memory",
    "priority",
    "kind",
    "tags",
)


@dataclass(frozen=True, slots=True, eq=False)
class Trace:
    """A trace in columns, sorted by arrival when it has arrivals."""

    path: Path
    cost: npt.NDArray[np.float64]
    arrival: npt.NDArray[np.float64] | None
    memory: list[int] | None
    priority: list[int] | None
    kind: list[str] | None
    tags: list[frozenset[str]] | None
    # Token counts of rows that give them (None when any row gives only a cost).
    prompt_tokens: npt.NDArray[np.int64] | None = None
    output_tokens: npt.NDArray[np.int64] | None = None

    def __len__(self) -> int:
        return len(self.cost)

    @property
    def period(self) -> float:
        """How far each repeat of the trace is shifted in time (its span plus one mean gap)."""
        if self.arrival is None or len(self.arrival) == 0:
            return 0.0
        span = float(self.arrival[-1] - self.arrival[0])
        n = len(self.arrival)
        return span * n / (n - 1) if n > 1 else float(self.arrival[-1])


def memory_size(value: Any) -> int:
    """``value`` in bytes (:func:`~hetero.units.parse_size`), at least 0, else ``ValueError``:
    a workload's ``memory`` and a trace row's are read alike."""
    size = parse_size(value)
    if size < 0:
        raise ValueError(f"size must be >= 0 bytes, got {value!r}")
    return size


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(value: Any, *, integer: bool = False) -> float | int | None:
    """``value`` (JSON number or CSV text) as a finite number >= 0, or None if it is not one."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                return None
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        return None
    if integer:
        if value != int(value):
            return None
        return int(value)
    return float(value)


class _Row:
    """Parses one trace row into column lists, collecting problems with the line number."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cost: list[float] = []
        self.arrival: list[float | None] = []
        self.memory: list[int | None] = []
        self.priority: list[int | None] = []
        self.kind: list[str | None] = []
        self.tags: list[frozenset[str] | None] = []
        self.tokens: list[tuple[int, int] | None] = []
        self.problems: list[str] = []
        self.lines: list[int] = []
        self.costs = CostModel()

    def bad(self, line: int, field: str, message: str, value: Any) -> None:
        self.problems.append(f"{self.name} line {line}: field {field!r} {message} (got {value!r})")

    def add(self, line: int, row: Mapping[str, Any]) -> None:
        def present(key: str) -> bool:
            value = row.get(key)
            return value is not None and value != ""

        ok = True
        tokens: list[int] = []
        if present("cost"):
            cost = _number(row["cost"])
            if cost is None:
                self.bad(line, "cost", "must be a finite number >= 0", row["cost"])
                ok = False
        elif present("prompt_tokens") or present("max_new_tokens"):
            for key in ("prompt_tokens", "max_new_tokens"):
                value = _number(row.get(key), integer=True) if present(key) else None
                if value is None:
                    what = "must be an integer >= 0" if present(key) else "is missing"
                    self.bad(
                        line,
                        key,
                        f"{what} (cost = prompt_tokens * 0.5 + max_new_tokens * 1.0)",
                        row.get(key),
                    )
                    ok = False
                tokens.append(int(value or 0))
            cost = self.costs.cost(tokens[0], tokens[1])
        else:
            self.problems.append(
                f"{self.name} line {line}: needs 'cost' or 'prompt_tokens' + 'max_new_tokens' "
                f"(got keys {sorted(row)!r})"
            )
            ok = False
        arrival = memory = priority = kind = tags = None
        if present("arrival"):
            arrival = _number(row["arrival"])
            if arrival is None:
                self.bad(line, "arrival", "must be a finite number of seconds >= 0", row["arrival"])
                ok = False
        if present("memory"):
            try:
                memory = memory_size(row["memory"])
            except ValueError as exc:
                self.bad(line, "memory", f"must be a size in bytes >= 0 ({exc})", row["memory"])
                ok = False
        if present("priority"):
            raw = row["priority"]
            try:
                priority = int(raw.strip()) if isinstance(raw, str) else raw
            except ValueError:
                priority = None
            if not isinstance(priority, int) or isinstance(priority, bool):
                self.bad(line, "priority", "must be an integer", raw)
                priority = None
                ok = False
        if present("kind"):
            kind = row["kind"]
            if not isinstance(kind, str) or not kind.strip():
                self.bad(line, "kind", "must be a non-empty string", kind)
                ok = False
        if present("tags"):
            raw = row["tags"]
            if isinstance(raw, str):
                tags = frozenset(t for t in _TAG_SPLIT.split(raw) if t)
            elif isinstance(raw, list) and all(isinstance(t, str) for t in raw):
                tags = frozenset(raw)
            else:
                self.bad(line, "tags", "must be a list of strings or a ';'-separated string", raw)
                ok = False
        if ok:
            assert cost is not None
            self.lines.append(line)
            self.cost.append(cost)
            self.arrival.append(arrival)
            self.memory.append(memory)
            self.priority.append(priority)
            self.kind.append(kind)
            self.tags.append(tags)
            self.tokens.append((tokens[0], tokens[1]) if tokens else None)


def read_trace(path: Path) -> tuple[Trace | None, list[str]]:
    """Read a JSONL or CSV trace; returns ``(trace, [])`` or ``(None, problems)``."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, [f"cannot read trace {str(path)!r}: {reason}"]
    rows = _Row(path.name)
    suffix = path.suffix.lower()
    as_csv = suffix == ".csv" or (
        suffix not in (".jsonl", ".json", ".ndjson") and not text.lstrip().startswith("{")
    )
    if as_csv:
        reader = csv.DictReader(text.splitlines())
        header = [h.strip() for h in reader.fieldnames or []]
        if "cost" not in header and not {"prompt_tokens", "max_new_tokens"} <= set(header):
            return None, [
                f"{path.name} line 1: the CSV header needs a 'cost' column or 'prompt_tokens' "
                f"and 'max_new_tokens' columns; known columns: {', '.join(_TRACE_COLUMNS)} "
                f"(got {header!r})"
            ]
        reader.fieldnames = header
        for row in reader:
            rows.add(reader.line_num, row)
            if len(rows.problems) > _MAX_TRACE_PROBLEMS:
                break
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                rows.problems.append(
                    f"{path.name} line {number}: invalid JSON: {exc.msg} (got {line[:60]!r})"
                )
            else:
                if isinstance(row, dict):
                    rows.add(number, row)
                else:
                    rows.problems.append(
                        f"{path.name} line {number}: expected a JSON object with 'cost' "
                        f"(got {line[:60]!r})"
                    )
            if len(rows.problems) > _MAX_TRACE_PROBLEMS:
                break
    if not rows.problems and not rows.cost:
        rows.problems.append(f"{path.name}: the trace has no items")
    if not rows.problems:
        with_arrival = [a is not None for a in rows.arrival]
        if any(with_arrival) and not all(with_arrival):
            first = rows.lines[with_arrival.index(False)]
            rows.problems.append(
                f"{path.name} line {first}: field 'arrival' is missing but other lines have it; "
                "give an arrival on every line or on none"
            )
    if rows.problems:
        if len(rows.problems) > _MAX_TRACE_PROBLEMS:
            rows.problems[_MAX_TRACE_PROBLEMS:] = ["... (more problems not shown)"]
        return None, rows.problems
    cost = np.array(rows.cost, dtype=np.float64)
    arrival = None
    order: list[int] | None = None
    if rows.arrival[0] is not None:
        arrival = np.array(rows.arrival, dtype=np.float64)
        sort = np.argsort(arrival, kind="stable")
        if (np.diff(arrival) < 0).any():
            arrival, cost, order = arrival[sort], cost[sort], sort.tolist()

    def column(values: list[Any], fill: Any) -> list[Any] | None:
        if all(v is None for v in values):
            return None
        out = [fill if v is None else v for v in values]
        return out if order is None else [out[i] for i in order]

    tokens = None
    if all(t is not None for t in rows.tokens):
        tokens = np.array(column(rows.tokens, None), dtype=np.int64).reshape(-1, 2)
    return Trace(
        path=path,
        cost=cost,
        arrival=arrival,
        memory=column(rows.memory, -1),
        priority=column(rows.priority, None),
        kind=column(rows.kind, None),
        tags=column(rows.tags, None),
        prompt_tokens=None if tokens is None else tokens[:, 0],
        output_tokens=None if tokens is None else tokens[:, 1],
    ), []


def trace_rows(
    trace: Trace,
    start: int,
    m: int,
    times: list[float],
    costs: list[float],
    prios: list[int] | None,
    kind: str,
    memory: int,
) -> Iterator[tuple[float, WorkItem]]:
    """Items ``start .. start + m - 1`` of a workload replaying ``trace`` (its rows repeated):
    each row's memory, priority, kind and tags where it gives them, else the workload's."""
    n = len(trace)
    for j in range(m):
        i = start + j
        r = i % n
        row_memory = trace.memory[r] if trace.memory is not None else -1
        row_priority = trace.priority[r] if trace.priority is not None else None
        if row_priority is None:
            row_priority = prios[j] if prios is not None else 0
        row_kind = trace.kind[r] if trace.kind is not None else None
        row_tags = trace.tags[r] if trace.tags is not None else None
        yield (
            times[j],
            WorkItem(
                cost=costs[j],
                kind=row_kind or kind,
                memory=memory if row_memory < 0 else row_memory,
                priority=row_priority,
                tags=row_tags or frozenset(),
                id=i,
            ),
        )
