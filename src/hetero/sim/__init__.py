"""The fleet simulator: any policy, unchanged, against any fleet in virtual time."""

from __future__ import annotations

from hetero.sim.engine import Simulator
from hetero.sim.result import SimResult, TimeSeries
from hetero.sim.run import devices_from_names, simulate
from hetero.sim.workload import WorkloadSpec, generate, load_workload, parse_workload

__all__ = [
    "SimResult",
    "Simulator",
    "TimeSeries",
    "WorkloadSpec",
    "devices_from_names",
    "generate",
    "load_workload",
    "parse_workload",
    "simulate",
]
