"""Planning before work runs: memory fit, device matching, allocation and fleet sizing."""

from __future__ import annotations

from hetero.plan.match import Match, Requirements, ScoreWeights, match
from hetero.plan.memory import FitRequest, MemoryFit, fit_memory, kv_bytes_per_token, weight_bytes
from hetero.plan.models import ModelShape, get_model, load_hf_config, model_names
from hetero.plan.pool import Allocation, DevicePool, DeviceUsage, PoolSnapshot
from hetero.plan.request import Affinity, AllocationRequest, AntiAffinity

__all__ = [
    "Affinity",
    "Allocation",
    "AllocationRequest",
    "AntiAffinity",
    "DevicePool",
    "DeviceUsage",
    "FitRequest",
    "Match",
    "MemoryFit",
    "ModelShape",
    "PoolSnapshot",
    "Requirements",
    "ScoreWeights",
    "fit_memory",
    "get_model",
    "kv_bytes_per_token",
    "load_hf_config",
    "match",
    "model_names",
    "weight_bytes",
]
