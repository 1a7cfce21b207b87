"""Heterogeneous data-parallel training on torch.distributed: each rank takes a share of every
global batch in proportion to its speed, and the update is still the global batch's.

Needs the ``torch`` extra; names load on first use, so ``import hetero.train`` alone is cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hetero._lazy import lazy_exports

#: Each public name and the module that defines it (imported on first use).
_EXPORTS: dict[str, str] = {
    "HeteroSampler": "hetero.train.sampler",
    "MemoryEstimate": "hetero.train.memory",
    "RankReport": "hetero.train.report",
    "StepReport": "hetero.train.report",
    "Trainer": "hetero.train.trainer",
    "TrainerOptions": "hetero.train.options",
    "write_training_report": "hetero.train.report_html",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    # What type checkers read in place of the lazy look-up: ``_EXPORTS`` again, as explicit
    # re-exports. Nothing here runs; tests/test_public_api.py checks that both say the same.
    from hetero.train.memory import MemoryEstimate as MemoryEstimate
    from hetero.train.options import TrainerOptions as TrainerOptions
    from hetero.train.report import RankReport as RankReport
    from hetero.train.report import StepReport as StepReport
    from hetero.train.report_html import write_training_report as write_training_report
    from hetero.train.sampler import HeteroSampler as HeteroSampler
    from hetero.train.trainer import Trainer as Trainer
