"""Lazy exports for packages: ``import hetero`` stays fast (a worker process starts in a fraction
of the time), and each name is imported from its module on first use."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (a package or a plain module): ``exports``
    maps a public name to the module that defines it; a package's subpackage or submodule is
    imported by its name too."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module), name)
        elif (
            not name.startswith("__")
            and hasattr(sys.modules[package], "__path__")
            and importlib.util.find_spec(f"{package}.{name}")
        ):
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # later look-ups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
