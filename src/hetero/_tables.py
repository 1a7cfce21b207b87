"""Tables that read at any terminal width, with no cell cut to "…" and columns of free text
wrapped: ``FitTable`` leaves out the columns least worth seeing and says which."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.style import Style
from rich.table import Table
from rich.text import Text

__all__ = ["FitTable"]

# Wide enough that measuring a table gives its natural width, every cell on one line.
_UNBOUNDED = 1_000_000


class FitTable(Table):
    """A rich ``Table`` that fits the console by leaving columns out, in one table.

    When the table is wider than the console, the columns least worth seeing go first until the
    rest fit at their full width (a column of free text, ``add_wrapping_column``, at its
    ``width``; it then wraps into the room left). The first ``key_columns`` always stay. The
    priority of a column is ``add_column(..., priority=)``, by default the order it was added
    in: add the columns most worth seeing first, and the last go first. A line under the table
    names what was left out and ``hint`` says where to see it (``--json``, a wider terminal).
    When not even the key columns fit, they are squeezed to the console, as any rich table is.
    """

    def __init__(
        self,
        *args: Any,
        key_columns: int = 1,
        hint: str = "widen the terminal to see them",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.key_columns = key_columns
        self.hint = hint
        # Column position -> the width it counts as when deciding what fits.
        self._wrap_widths: dict[int, int] = {}
        # Column position -> priority; higher stays longer.
        self._priority: dict[int, float] = {}

    def add_column(self, *args: Any, priority: float | None = None, **kwargs: Any) -> None:
        """``Table.add_column``; ``priority``: higher stays longer (default: minus the column's
        position, so that columns added later go first)."""
        position = len(self.columns)
        self._priority[position] = -position if priority is None else priority
        super().add_column(*args, **kwargs)

    def add_wrapping_column(self, header: str, *, width: int, **kwargs: Any) -> None:
        """Add a column whose cells wrap (and fold a word longer than the column) rather than
        leave the table: it counts as ``width`` columns, or its text on one line if narrower."""
        self._wrap_widths[len(self.columns)] = width
        self.add_column(header, overflow="fold", **kwargs)

    def shown(self, console: Console, options: ConsoleOptions) -> list[int]:
        """The positions of the columns that fit ``options.max_width``, in table order."""
        keys = min(self.key_columns, len(self.columns))
        shown = list(range(len(self.columns)))
        # Lowest priority first; of equal ones, the column further right.
        order = sorted(range(keys, len(self.columns)), key=lambda i: (self._priority[i], -i))
        dropped: list[int] = []
        for position in order:
            if self._width(console, options, shown, wrap=True) <= options.max_width:
                break
            shown.remove(position)
            dropped.append(position)
        # A column dropped early may fit again beside the rest once a wider one has gone too.
        for position in reversed(dropped):
            tried = sorted([*shown, position])
            if self._width(console, options, tried, wrap=True) <= options.max_width:
                shown = tried
        return shown

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        shown = self.shown(console, options)
        fits = self._width(console, options, shown, wrap=True) <= options.max_width
        table = self._select(shown, hold=fits)
        left_out = [str(self.columns[i].header) for i in range(len(self.columns)) if i not in shown]
        if not left_out:
            yield from Table.__rich_console__(table, console, options)
            return
        note = f"not shown at {options.max_width} columns: {', '.join(left_out)} ({self.hint})"
        # The legend under the table, as wide as the console: a table narrowed to its key
        # columns would fold it into a column of words.
        caption, table.caption = table.caption, None
        yield from Table.__rich_console__(table, console, options)
        style = Style.pick_first(self.caption_style, "table.caption")
        if isinstance(caption, str):
            yield Text(caption, style=style, justify=self.caption_justify)
        elif caption is not None:
            yield caption
        yield Text(note, style=style, justify=self.caption_justify)

    def _width(
        self, console: Console, options: ConsoleOptions, columns: list[int], *, wrap: bool
    ) -> int:
        """Width of a table of these columns with every cell on one line, or with the wrapping
        columns at their ``width`` if ``wrap``, borders included."""
        table = self._select(columns)
        if wrap:
            table.columns = [
                replace(column, max_width=self._wrap_widths.get(i, column.max_width))
                for i, column in zip(columns, table.columns, strict=True)
            ]
        return Measurement.get(console, options.update_width(_UNBOUNDED), table).maximum

    def _select(self, columns: list[int], *, hold: bool = False) -> FitTable:
        """A copy of this table (rows, style, title) with only these columns; with ``hold``, the
        cells of the columns that do not wrap stay on one line."""
        part = copy.copy(self)
        # A column's _index is its position, which rich reads for edge padding.
        part.columns = [
            replace(
                self.columns[i],
                _index=n,
                no_wrap=self.columns[i].no_wrap or (hold and i not in self._wrap_widths),
            )
            for n, i in enumerate(columns)
        ]
        part._wrap_widths = {
            n: self._wrap_widths[i] for n, i in enumerate(columns) if i in self._wrap_widths
        }
        return part
