"""``hetero serve --autoscale``: replicas started and stopped as the traffic asks.

``policy.py`` decides (pure, over an injected clock), ``providers.py`` starts and stops replicas
(local processes, Ray actors), ``controller.py`` runs the loop between them and the router.
Names load on first use, so the pure policy is imported without aiohttp or Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero._lazy import lazy_exports

#: Each public name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "Action": "hetero.serve.autoscale.policy",
    "Fleet": "hetero.serve.autoscale.policy",
    "Member": "hetero.serve.autoscale.policy",
    "PolicyOptions": "hetero.serve.autoscale.policy",
    "ReplicaType": "hetero.serve.autoscale.policy",
    "ScalePolicy": "hetero.serve.autoscale.policy",
    "Sizer": "hetero.serve.autoscale.policy",
    "Traffic": "hetero.serve.autoscale.policy",
    "TypeFleet": "hetero.serve.autoscale.policy",
    "LocalProcessProvider": "hetero.serve.autoscale.providers",
    "Provider": "hetero.serve.autoscale.providers",
    "RayPlacement": "hetero.serve.autoscale.providers",
    "RayProvider": "hetero.serve.autoscale.providers",
    "ReplicaHandle": "hetero.serve.autoscale.providers",
    "ReplicaProcess": "hetero.serve.autoscale.providers",
    "Retry": "hetero.serve.autoscale.providers",
    "RetryingProvider": "hetero.serve.autoscale.providers",
    "StartFailure": "hetero.serve.autoscale.providers",
    "ready_timeout": "hetero.serve.autoscale.providers",
    "AutoscaleController": "hetero.serve.autoscale.controller",
    "ControllerOptions": "hetero.serve.autoscale.controller",
    "url_only": "hetero.serve.autoscale.controller",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports (tests/serve/test_autoscale_policy.py checks that both say the same).
    from hetero.serve.autoscale.controller import AutoscaleController as AutoscaleController
    from hetero.serve.autoscale.controller import ControllerOptions as ControllerOptions
    from hetero.serve.autoscale.controller import url_only as url_only
    from hetero.serve.autoscale.policy import Action as Action
    from hetero.serve.autoscale.policy import Fleet as Fleet
    from hetero.serve.autoscale.policy import Member as Member
    from hetero.serve.autoscale.policy import PolicyOptions as PolicyOptions
    from hetero.serve.autoscale.policy import ReplicaType as ReplicaType
    from hetero.serve.autoscale.policy import ScalePolicy as ScalePolicy
    from hetero.serve.autoscale.policy import Sizer as Sizer
    from hetero.serve.autoscale.policy import Traffic as Traffic
    from hetero.serve.autoscale.policy import TypeFleet as TypeFleet
    from hetero.serve.autoscale.providers import LocalProcessProvider as LocalProcessProvider
    from hetero.serve.autoscale.providers import Provider as Provider
    from hetero.serve.autoscale.providers import RayPlacement as RayPlacement
    from hetero.serve.autoscale.providers import RayProvider as RayProvider
    from hetero.serve.autoscale.providers import ReplicaHandle as ReplicaHandle
    from hetero.serve.autoscale.providers import ReplicaProcess as ReplicaProcess
    from hetero.serve.autoscale.providers import Retry as Retry
    from hetero.serve.autoscale.providers import RetryingProvider as RetryingProvider
    from hetero.serve.autoscale.providers import StartFailure as StartFailure
    from hetero.serve.autoscale.providers import ready_timeout as ready_timeout
