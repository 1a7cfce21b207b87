"""A stand-in for the ``ray`` module, by the part of its interface that connecting uses:
``ray.init`` refuses "auto" as Ray does when no cluster runs, so a test of the CLI's Ray flags
joins no cluster a neighbouring test runs."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

__all__ = ["FakeRay", "install_fake_ray"]


class FakeRay(types.ModuleType):
    """The part of ``ray`` that connecting uses; records every ``init``."""

    __version__ = "2.60.0"

    def __init__(self) -> None:
        super().__init__("ray")
        self.inits: list[str | None] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, address: str | None = None, **options: Any) -> None:
        self.inits.append(address)
        if address == "auto":  # Ray's own words when no cluster runs on this machine
            raise ConnectionError(
                "Could not find any running Ray instance. Please specify the one to connect "
                "to by setting `--address` flag or `RAY_ADDRESS` environment variable."
            )
        raise RuntimeError(f"fake ray: nothing at {address}")

    def shutdown(self) -> None:
        pass


def install_fake_ray(monkeypatch: pytest.MonkeyPatch) -> FakeRay:
    """A ``FakeRay`` in place of ``ray`` for the test, with no ``RAY_ADDRESS`` set."""
    ray = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return ray
