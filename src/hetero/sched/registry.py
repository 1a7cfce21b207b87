"""Policies by name: the built-in ones, and custom ones by import path (``my_pkg.mod:MyPolicy``)."""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from hetero.errors import ConfigError
from hetero.sched.policy import Policy

__all__ = ["make_policy", "policy_class", "policy_names", "register", "unknown_strategy"]

_POLICIES: dict[str, type[Policy]] = {}
P = TypeVar("P", bound=type[Policy])


def register(cls: P) -> P:
    """Class decorator: make a policy available under its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a non-empty class attribute 'name'")
    _POLICIES[cls.name] = cls
    return cls


def policy_names() -> list[str]:
    """Names of the built-in policies, sorted."""
    _load_builtins()
    return sorted(_POLICIES)


def unknown_strategy(strategy: str) -> str:
    """What to tell a user whose ``strategy`` names no built-in policy: the closest name when one
    is near (``tail-budget``: did you mean 'tail_budget'?), then every valid one."""
    names = policy_names()
    close = difflib.get_close_matches(strategy.casefold().replace("-", "_"), names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown strategy {strategy!r}; {hint}valid names: {', '.join(names)}"


def _load_builtins() -> None:
    # Importing the package registers every built-in policy.
    importlib.import_module("hetero.sched.policies")


def policy_class(strategy: str, field: str = "scheduler.strategy") -> type[Policy]:
    """The policy class named `strategy` (built-in name or `module:Class`)."""
    _load_builtins()
    if strategy in _POLICIES:
        return _POLICIES[strategy]
    if ":" not in strategy:
        raise ConfigError(
            [
                (
                    field,
                    f"{unknown_strategy(strategy)}, or a custom policy as "
                    "'package.module:ClassName'",
                )
            ]
        )
    module_name, _, attr = strategy.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            [(field, f"cannot import {module_name!r} for {strategy!r}: {exc}")]
        ) from None
    obj = getattr(module, attr, None)
    if not (inspect.isclass(obj) and issubclass(obj, Policy)):
        raise ConfigError(
            [(field, f"{strategy!r} is not a hetero.sched.Policy subclass (found {obj!r})")]
        )
    return obj


def make_policy(
    strategy: str, options: Mapping[str, Any] | None = None, *, field: str = "scheduler.strategy"
) -> Policy:
    """Build the policy ``strategy`` with keyword ``options`` (``ConfigError`` if wrong)."""
    cls = policy_class(strategy, field)
    opts = dict(options or {})
    params = inspect.signature(cls.__init__).parameters
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    allowed = sorted(
        k for k, p in params.items() if k != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD
    )
    unknown = [k for k in opts if k not in allowed]
    if unknown and not accepts_any:
        raise ConfigError(
            [
                (
                    f"scheduler.options.{k}",
                    f"{strategy} has no option {k!r}; allowed: {', '.join(allowed) or 'none'}",
                )
                for k in unknown
            ]
        )
    factory: Callable[..., Policy] = cls
    try:
        return factory(**opts)
    except (TypeError, ValueError) as exc:
        raise ConfigError([("scheduler.options", f"{strategy}: {exc}")]) from None
