"""hetero serve: a heterogeneity-aware router for inference replicas, and an emulated replica.

Names load on first use, so ``import hetero.serve`` does not import aiohttp.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero._lazy import lazy_exports

#: Each public name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "ServeOptions": "hetero.serve.app",
    "Server": "hetero.serve.app",
    "MockConfig": "hetero.serve.emulator.config",
    "MockReplica": "hetero.serve.emulator.server",
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
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports. Nothing here runs; tests/test_public_api.py checks that both say the same.
    from hetero.serve.app import ServeOptions as ServeOptions
    from hetero.serve.app import Server as Server
    from hetero.serve.emulator.config import MockConfig as MockConfig
    from hetero.serve.emulator.server import MockReplica as MockReplica
    from hetero.serve.replicas import Replica as Replica
    from hetero.serve.replicas import parse_replica_flag as parse_replica_flag
    from hetero.serve.replicas import replica_from_config as replica_from_config
    from hetero.serve.router import NoReplica as NoReplica
    from hetero.serve.router import Router as Router
    from hetero.serve.router import RouterOptions as RouterOptions
    from hetero.serve.router import Ticket as Ticket
    from hetero.serve.router import UnknownModel as UnknownModel
