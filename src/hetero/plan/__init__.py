"""Planning before work runs: memory fit, device matching, allocation and fleet sizing."""

from __future__ import annotations

from hetero.plan.allocation import (
    Allocation,
    AllocationEnd,
    DeviceUsage,
    EndCause,
    PoolSnapshot,
)
from hetero.plan.match import Match, Requirements, ScoreWeights, match
from hetero.plan.memory import FitRequest, MemoryFit, fit_memory, kv_bytes_per_token, weight_bytes
from hetero.plan.models import ModelShape, get_model, load_hf_config, model_names
from hetero.plan.pool import DevicePool
from hetero.plan.request import Affinity, AllocationRequest, AntiAffinity
from hetero.plan.sizing import FleetPlan, InfeasiblePlan, SingleTypeFleet, TypePlan, plan_fleet
from hetero.plan.sizing_spec import (
    MenuEntry,
    PlanSLO,
    PlanSpec,
    PlanWorkload,
    load_plan,
    parse_plan,
)
from hetero.plan.verification import Verification, plan_verified, verify

__all__ = [
    "Affinity",
    "Allocation",
    "AllocationEnd",
    "AllocationRequest",
    "AntiAffinity",
    "DevicePool",
    "DeviceUsage",
    "EndCause",
    "FitRequest",
    "FleetPlan",
    "InfeasiblePlan",
    "Match",
    "MemoryFit",
    "MenuEntry",
    "ModelShape",
    "PlanSLO",
    "PlanSpec",
    "PlanWorkload",
    "PoolSnapshot",
    "Requirements",
    "ScoreWeights",
    "SingleTypeFleet",
    "TypePlan",
    "Verification",
    "fit_memory",
    "get_model",
    "kv_bytes_per_token",
    "load_hf_config",
    "load_plan",
    "match",
    "model_names",
    "parse_plan",
    "plan_fleet",
    "plan_verified",
    "verify",
    "weight_bytes",
]
