"""Workloads for the simulator: what arrives, when, and how big each item is.

A workload file (YAML or JSON) is validated into a :class:`WorkloadSpec`; every problem in it is
reported at once through one :class:`~hetero.errors.ConfigError`, each as
``field.path: message (got VALUE)``. :func:`generate` turns a spec into ``(arrival time, item)``
pairs in time order, lazily and deterministically for a seed::

    requests: 100000
    arrivals: {process: poisson, load: 0.8}      # or rate: 250 (items/s); bursty; closed
    size: {dist: lognormal, mean: 300, sigma: 1.0}
    prompts: {kind: chat, systems: 20, turns: 6}  # or single, hot: prompts that share prefixes
    memory: 2GB
    priorities: {0: 0.9, 5: 0.1}
    slo: {latency: 2.0}
    failures: [{device: "a100-80gb:0", at: 30, recover: 90}]
    seed: 7

Sizes are work units: a device of speed ``s`` takes ``cost / s`` seconds for an item. ``load`` is
a fraction of the fleet's capacity (its total work units per second), so ``load: 0.8`` keeps any
fleet 80 % busy on average. With ``prompts``, an item's cost is its prompt's prefill (blocks ×
``block_work``) plus its size (its output), and ``load`` counts the prefill whole: a prefix cache
that spares some of it leaves the fleet less busy than that.

The models live in :mod:`hetero.sim.workload_spec`, trace files are read by
:mod:`hetero.sim.trace` and items drawn by :mod:`hetero.sim.arrivals`; this module reads and
validates workload files, and is the import path of all their public names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hetero._data_files import read_data_file
from hetero._errors_render import Nested, show, validation_problems
from hetero.errors import ConfigError
from hetero.sim.arrivals import arrival_rate, generate, mean_cost, mean_size
from hetero.sim.workload_spec import (
    SLO,
    BurstyArrivals,
    ChatPrompts,
    ClosedArrivals,
    DeviceFailure,
    DrawnSize,
    FixedSize,
    HotPrompts,
    LognormalSize,
    PoissonArrivals,
    SinglePrompts,
    TraceSize,
    UniformSize,
    WorkloadSpec,
)

__all__ = [
    "SLO",
    "BurstyArrivals",
    "ChatPrompts",
    "ClosedArrivals",
    "DeviceFailure",
    "DrawnSize",
    "FixedSize",
    "HotPrompts",
    "LognormalSize",
    "PoissonArrivals",
    "SinglePrompts",
    "TraceSize",
    "UniformSize",
    "WorkloadSpec",
    "arrival_rate",
    "generate",
    "load_workload",
    "mean_cost",
    "mean_size",
    "parse_workload",
]


def load_workload(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload file (YAML or JSON). A trace path is relative to the file."""
    path = Path(path)
    data = read_data_file(path, "workload")
    return parse_workload(data, source=str(path), base_dir=path.parent)


def parse_workload(
    data: Any, source: str = "<workload>", base_dir: str | Path | None = None
) -> WorkloadSpec:
    """Validate already-parsed YAML/JSON data; raises ``ConfigError`` listing every problem.

    A relative trace path is taken relative to ``base_dir`` (default: the working directory).
    The trace is read here, so its problems are reported now. Without ``requests``, a trace
    workload has as many requests as the trace has items.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"{source}: expected a mapping of workload fields, got {show(data)}")]
        )
    size = data.get("size")
    if base_dir is not None and isinstance(size, dict) and size.get("dist") == "trace":
        trace_path = size.get("path")
        if isinstance(trace_path, str) and trace_path and not Path(trace_path).is_absolute():
            data = {**data, "size": {**size, "path": str(Path(base_dir) / trace_path)}}
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, data, WorkloadSpec, _NESTED)) from None
    if isinstance(spec.size, TraceSize):
        trace = spec.size.trace()
        if "requests" not in spec.model_fields_set:
            spec = spec.model_copy(update={"requests": len(trace)})
    return spec


_NESTED: Nested = {
    "arrivals": {"poisson": PoissonArrivals, "bursty": BurstyArrivals, "closed": ClosedArrivals},
    "size": {
        "fixed": FixedSize,
        "uniform": UniformSize,
        "lognormal": LognormalSize,
        "trace": TraceSize,
    },
    "prompts": {"chat": ChatPrompts, "single": SinglePrompts, "hot": HotPrompts},
    "slo": SLO,
    "failures": DeviceFailure,
}
