"""What the multi-rank tests share: a free port, and running named scenarios on one rank."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import Any

from hetero.errors import HeteroError

Outcome = tuple[str, Any]  # ("ok", value) or ("error", "ErrorType: message")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_scenarios(scenarios: Mapping[str, Callable[[int], Any]], rank: int) -> dict[str, Outcome]:
    """Each scenario's value on this rank, or the HeteroError it raised (as text)."""
    results: dict[str, Outcome] = {}
    for name, scenario in scenarios.items():
        try:
            results[name] = ("ok", scenario(rank))
        except HeteroError as exc:
            results[name] = ("error", f"{type(exc).__name__}: {exc}")
    return results
