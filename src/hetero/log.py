"""Logging set-up: hetero logs under the ``hetero`` logger and never configures the root logger."""

from __future__ import annotations

import logging

from hetero.errors import ConfigError

__all__ = ["LOG_LEVELS", "config_log_level", "set_log_level"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Whether the application chose a level (set_log_level, ``hetero --log-level``): a config's
# ``logging.level`` then gives way to it.
_explicit = False


def set_log_level(level: str | int) -> None:
    """Set the level of hetero's logs (``"DEBUG"`` … ``"CRITICAL"`` or a ``logging`` constant).
    It wins over any config's ``logging.level``, read before or after.

    Adds one stderr handler to the ``hetero`` logger the first time, so messages show without the
    application configuring logging.
    """
    global _explicit
    _apply(level)
    _explicit = True


def config_log_level(level: str | int) -> None:
    """A fleet config's ``logging.level``: applied unless the application set a level."""
    if not _explicit:
        _apply(level)


def _apply(level: str | int) -> None:
    if isinstance(level, str):
        name = level.upper()
        if name not in LOG_LEVELS:
            raise ConfigError(
                f"invalid log level {level!r}; expected one of {', '.join(LOG_LEVELS)}"
            )
        value = getattr(logging, name)
    elif isinstance(level, int) and not isinstance(level, bool):
        value = level
    else:
        raise ConfigError(f"invalid log level {level!r}; expected one of {', '.join(LOG_LEVELS)}")
    logger = logging.getLogger("hetero")
    logger.setLevel(value)
    if not any(getattr(h, "_hetero", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._hetero = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
