"""The event loop ``hetero serve`` runs on: uvloop where it is installed (as uvicorn's
``--loop auto``), else asyncio's own. uvloop's libuv transports cut the router's CPU per
request (docs/benchmarks.md, "Router overhead")."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from hetero.errors import ConfigError

__all__ = ["LOOPS", "run", "uses_uvloop"]

T = TypeVar("T")
LOOPS = ("auto", "asyncio", "uvloop")


def uses_uvloop(loop: str) -> bool:
    """Whether ``loop`` (one of ``LOOPS``) means uvloop here; ``ConfigError`` naming
    ``--loop`` for a name not in ``LOOPS``, or for uvloop asked for and not installed."""
    if loop not in LOOPS:
        allowed = ", ".join(LOOPS)
        raise ConfigError([("--loop", f"{loop!r} is not an event loop; allowed: {allowed}")])
    if loop == "asyncio":
        return False
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if loop == "uvloop":
            message = "uvloop is not installed (pip install uvloop); allowed here: auto, asyncio"
            raise ConfigError([("--loop", message)]) from None
        return False
    return True


def run(main: Coroutine[Any, Any, T], uvloop: bool) -> T:
    """``asyncio.run(main)``, on uvloop's event loop when ``uvloop`` (see ``uses_uvloop``)."""
    if uvloop:
        import uvloop as uv

        return uv.run(main)
    return asyncio.run(main)
