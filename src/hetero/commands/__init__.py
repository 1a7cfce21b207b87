"""``hetero`` subcommands that live in modules of their own; each has ``register(app)``."""

from __future__ import annotations
