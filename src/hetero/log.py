"""Logging set-up: hetero logs under the ``hetero`` logger and never configures the root logger."""

from __future__ import annotations

import logging

__all__ = ["LOG_LEVELS", "set_log_level"]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def set_log_level(level: str | int) -> None:
    """Set the level of hetero's logs (``"DEBUG"`` … ``"CRITICAL"`` or a ``logging`` constant).

    Adds one stderr handler to the ``hetero`` logger the first time, so messages show without the
    application configuring logging.
    """
    if isinstance(level, str):
        name = level.upper()
        if name not in LOG_LEVELS:
            raise ValueError(
                f"invalid log level {level!r}; expected one of {', '.join(LOG_LEVELS)}"
            )
        value = getattr(logging, name)
    elif isinstance(level, int) and not isinstance(level, bool):
        value = level
    else:
        raise ValueError(f"invalid log level {level!r}; expected one of {', '.join(LOG_LEVELS)}")
    logger = logging.getLogger("hetero")
    logger.setLevel(value)
    if not any(getattr(h, "_hetero", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._hetero = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
