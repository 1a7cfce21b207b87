"""What the multi-rank tests share: running named scenarios on one rank."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hetero.errors import HeteroError

Outcome = tuple[str, Any]  # ("ok", value) or ("error", "ErrorType: message")


def run_scenarios(scenarios: Mapping[str, Callable[[int], Any]], rank: int) -> dict[str, Outcome]:
    """Each scenario's value on this rank, or the HeteroError it raised (as text)."""
    results: dict[str, Outcome] = {}
    for name, scenario in scenarios.items():
        try:
            results[name] = ("ok", scenario(rank))
        except HeteroError as exc:
            results[name] = ("error", f"{type(exc).__name__}: {exc}")
    return results
