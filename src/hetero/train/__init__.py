"""Heterogeneous data-parallel training on torch.distributed: each rank takes a share of every
global batch in proportion to its speed, and the update is still the global batch's.

Needs the ``torch`` extra; names load on first use, so ``import hetero.train`` alone is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero._lazy import lazy_exports

if TYPE_CHECKING:
    from hetero.train.sampler import HeteroSampler
    from hetero.train.trainer import RankReport, StepReport, Trainer, TrainerOptions

_EXPORTS = {
    "HeteroSampler": "hetero.train.sampler",
    "RankReport": "hetero.train.trainer",
    "StepReport": "hetero.train.trainer",
    "Trainer": "hetero.train.trainer",
    "TrainerOptions": "hetero.train.trainer",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = ["HeteroSampler", "RankReport", "StepReport", "Trainer", "TrainerOptions"]
