"""hetero serve: a heterogeneity-aware router for inference replicas, and an emulated replica.

Names load on first use, so ``import hetero.serve`` does not import aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero._lazy import lazy_exports

if TYPE_CHECKING:
    from hetero.serve.app import ServeOptions, Server
    from hetero.serve.mock import MockConfig, MockReplica
    from hetero.serve.replicas import Replica, parse_replica_flag, replica_from_config
    from hetero.serve.router import NoReplica, Router, RouterOptions, Ticket, UnknownModel

_EXPORTS = {
    "ServeOptions": "hetero.serve.app",
    "Server": "hetero.serve.app",
    "MockConfig": "hetero.serve.mock",
    "MockReplica": "hetero.serve.mock",
    "Replica": "hetero.serve.replicas",
    "parse_replica_flag": "hetero.serve.replicas",
    "replica_from_config": "hetero.serve.replicas",
    "NoReplica": "hetero.serve.router",
    "Router": "hetero.serve.router",
    "RouterOptions": "hetero.serve.router",
    "Ticket": "hetero.serve.router",
    "UnknownModel": "hetero.serve.router",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "MockConfig",
    "MockReplica",
    "NoReplica",
    "Replica",
    "Router",
    "RouterOptions",
    "ServeOptions",
    "Server",
    "Ticket",
    "UnknownModel",
    "parse_replica_flag",
    "replica_from_config",
]
