"""Reading rich tables back from the text they print, for tests of the terminal output."""

from __future__ import annotations

from rich.console import Console, RenderableType


def render(renderable: RenderableType, width: int) -> str:
    """``renderable`` as a console ``width`` columns wide prints it."""
    console = Console(record=True, width=width)
    console.print(renderable)
    return console.export_text()


def _cells(line: str, bar: str) -> list[str]:
    """The cells of one table line whose columns ``bar`` divides."""
    return [cell.strip() for cell in line.strip().strip(bar).split(bar)]


def headers(text: str) -> list[list[str]]:
    """The header cells of each table in ``text``."""
    return [_cells(line, "┃") for line in text.splitlines() if line.startswith("┃")]


def assert_whole(text: str, width: int, cells: list[str]) -> None:
    """Nothing wider than ``width``, no cell cut to "…", every one of ``cells`` in full."""
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    assert [c for c in cells if c not in text] == []


def flat(text: str) -> str:
    """``text`` without borders, line breaks or runs of spaces: a cell wrapped over several lines
    reads as one line when the cells beside it are empty on the lines it runs on to."""
    return " ".join(text.replace("│", " ").split())


def body_cells(text: str) -> list[str]:
    """Every body cell of the tables in ``text`` as one line: a cell wrapped over several lines
    is joined, its row's continuation lines being those whose first cell is empty."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        parts = _cells(line, "│")
        if rows and not parts[0] and len(parts) == len(rows[-1]):
            rows[-1] = [
                " ".join(p for p in pair if p) for pair in zip(rows[-1], parts, strict=True)
            ]
        else:
            rows.append(parts)
    return [cell for row in rows for cell in row]
