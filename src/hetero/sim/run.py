"""Run one workload through a fleet under several policies: the engine behind ``hetero simulate``
and the simulator benchmarks."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetero.config import SchedulerConfig
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.errors import ConfigError, HeteroError
from hetero.sched.prefix import DEFAULT_CAPACITY_BLOCKS
from hetero.sched.registry import make_policy, policy_class
from hetero.sim.engine import Progress, Simulator
from hetero.sim.result import SimResult
from hetero.sim.workload import WorkloadSpec, arrival_rate, generate, mean_cost

__all__ = ["devices_from_names", "expected_duration", "simulate"]

_NAME_RE = re.compile(r"^\s*([^:*]+?)\s*(?:[:*x]\s*(\d+))?\s*$")


def devices_from_names(text: str) -> list[Device]:
    """Emulated devices from ``"A100-80GB:2,V100-32GB:2,T4"`` (``model[:count]``)."""
    catalog = get_catalog()
    devices: list[Device] = []
    counts: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        match = _NAME_RE.match(part)
        if match is None:
            raise ConfigError([("--fleet", f"cannot read {part!r}; expected MODEL or MODEL:COUNT")])
        name, count = match.group(1), int(match.group(2) or 1)
        if count < 1:
            raise ConfigError([("--fleet", f"count for {name!r} must be >= 1, got {count}")])
        try:
            spec = catalog.get(name)
        except HeteroError as exc:
            raise ConfigError([("--fleet", str(exc))]) from None
        for _ in range(count):
            k = counts.get(spec.model, 0)
            counts[spec.model] = k + 1
            devices.append(
                Device(id=f"{spec.model.lower()}:{k}", spec=spec, emulated=True, local_index=k)
            )
    if not devices:
        raise ConfigError([("--fleet", f"no devices in {text!r}; expected e.g. A100-80GB:2,T4:4")])
    return devices


def expected_duration(spec: WorkloadSpec, capacity: float) -> float:
    """Roughly how long the workload lasts in simulated seconds (for the sampling interval)."""
    busy = spec.requests * mean_cost(spec) / capacity
    rate = arrival_rate(spec, capacity)
    return busy if rate is None else max(spec.requests / rate, busy)


def _policy(name: str, options: Mapping[str, Any], seed: int) -> Any:
    opts = dict(options)
    params = inspect.signature(policy_class(name, "policies").__init__).parameters
    if "seed" in params and "seed" not in opts:
        opts["seed"] = seed
    return make_policy(name, opts, field="policies")


def simulate(
    devices: Sequence[Device],
    workload: WorkloadSpec,
    policies: Sequence[str],
    *,
    scheduler: SchedulerConfig | None = None,
    slots: int = 1,
    unit_rate: float = 1.0,
    actual_speed: Mapping[str, float] | None = None,
    dispatcher_options: Mapping[str, Any] | None = None,
    progress: Callable[[str], Progress] | None = None,
    cache_blocks: int | None = None,
) -> list[SimResult]:
    """One ``SimResult`` per policy, all on the same workload (same seed, same arrivals).

    ``scheduler`` (from a fleet config) gives the queue bound, the timeout and the options of its
    own ``strategy``; ``dispatcher_options`` override those. ``cache_blocks`` is each device's
    prefix cache in blocks; when it is not given, a workload with ``prompts`` gets
    ``DEFAULT_CAPACITY_BLOCKS`` (what ``prefix_affinity`` assumes) and one without, no cache.
    """
    if slots < 1:
        raise ConfigError([("--slots", f"must be >= 1, got {slots}")])
    if cache_blocks is not None and cache_blocks < 0:
        raise ConfigError([("--cache-blocks", f"must be >= 0, got {cache_blocks}")])
    if cache_blocks is None and workload.prompts is not None:
        cache_blocks = DEFAULT_CAPACITY_BLOCKS
    options: dict[str, Any] = {}
    if scheduler is not None:
        options.update(
            max_queue_size=scheduler.max_queue_size,
            timeout=scheduler.timeout,
            max_retries=scheduler.max_retries,
            preemption=scheduler.preemption,
            stealing=scheduler.stealing,
            queue_order=scheduler.queue_order,
            aging=scheduler.aging,
            max_bypass=scheduler.max_bypass,
        )
    options.update(dispatcher_options or {})
    for name in policies:
        policy_class(name, "policies")  # fail on a bad name before any run starts
    results = []
    for name in policies:
        strategy_options = scheduler.options if scheduler and scheduler.strategy == name else {}
        for device in devices:  # every run starts from a healthy fleet
            device.state.healthy = True
        sim = Simulator(
            devices,
            _policy(name, strategy_options, workload.seed),
            slots=[slots] * len(devices),
            unit_rate=unit_rate,
            actual_speed=actual_speed,
            dispatcher_options=options,
            cache_blocks=cache_blocks,
        )
        result = sim.run(
            generate(workload, sim.capacity),
            expected_duration=expected_duration(workload, sim.capacity),
            failures=[(f.device, f.at, f.recover) for f in workload.failures],
            slo_latency=workload.slo.latency if workload.slo else None,
            total=workload.requests,
            progress=progress(name) if progress else None,
        )
        results.append(result)
    return results
