"""What hetero's HTML reports (the simulator's, the profiler's) share."""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["BASE_STYLE", "html_table"]

#: The look of a report page and its tables; each report appends its own rules.
BASE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
th { background: #f3f3f3; }
.note { color: #666; }
"""


def html_table(header: Sequence[str] | None, rows: Sequence[Sequence[str]]) -> str:
    """A table of text cells, escaped; with no ``header`` (a key/value table) no ``<thead>``."""
    head = (
        ""
        if header is None
        else "<thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead>"
    )
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows
    )
    return f"<table>{head}<tbody>{body}</tbody></table>"
