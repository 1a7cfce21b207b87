"""Device selectors used by ``tiered`` and ``affinity``: a device id, a catalog model
(``A100-80GB`` or a driver name), a kind (``gpu``, ``cpu``, …) or ``tag:NAME``."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DeviceKind
from hetero.errors import ConfigError
from hetero.sched.view import FleetView

__all__ = ["select"]

_KINDS = {k.value for k in DeviceKind}


def select(selectors: Iterable[str], view: FleetView, option: str) -> npt.NDArray[np.bool_]:
    """The devices matching any of ``selectors``; ``ValueError`` names one that matches none."""
    mask = np.zeros(view.n, dtype=bool)
    catalog = get_catalog()
    for selector in selectors:
        if selector in view.index:
            hit = np.array([i == selector for i in view.ids])
        elif selector.startswith("tag:"):
            tag = selector[4:]
            hit = np.array([tag in d.tags for d in view.devices])
        elif selector.lower() in _KINDS:
            hit = np.array([d.kind.value == selector.lower() for d in view.devices])
        elif selector in catalog:
            model = catalog.get(selector).model
            hit = np.array([d.model == model for d in view.devices])
        else:
            hit = np.zeros(view.n, dtype=bool)
        if not hit.any():
            raise ConfigError(
                f"{option}: selector {selector!r} matches no device; use a device id "
                f"({', '.join(view.ids[:4])}{', …' if view.n > 4 else ''}), a catalog model, "
                "a kind (cpu, gpu, tpu, npu, fpga, asic) or tag:NAME"
            )
        mask |= hit
    return mask
