"""The ``hetero serve --autoscale FILE`` file: the serving plan it sizes with, the replica types
it may start (each a planner option and a command), the provider and the hysteresis. Validated
with every problem named at once (``ConfigError``); see ``docs/serve.md``.

.. code-block:: yaml

    plan: plan_model.yaml          # model, SLO, menu (prices, max_count, owned) and the traffic
    provider: local                # or ray
    interval: 5                    # seconds between decisions
    types:
      a100x2:
        gpu: A100-80GB
        tensor_parallel: 2
        command: [vllm, serve, meta-llama/Llama-3.1-70B-Instruct, --tensor-parallel-size, "2",
                  --port, "{port}"]
        startup_s: 180
        max_count: 4
        initial: 1                 # started before the router opens
    policy: {up_after: 15, down_after: 300, cooldown: 120, max_actions_per_hour: 6}
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetero._data_files import read_data_file
from hetero._errors_render import validation_problems
from hetero.devices.catalog import get_catalog
from hetero.errors import ConfigError
from hetero.plan.serving import replica_options
from hetero.plan.serving_spec import ServingPlanSpec, parse_serving_plan
from hetero.sched.perf import REFERENCE_BANDWIDTH_GBS
from hetero.serve.autoscale.policy import PolicyOptions, ReplicaType
from hetero.serve.autoscale.providers import ReplicaHandle
from hetero.serve.autoscale.sizing import PlanSizer, TypeOption
from hetero.serve.engine_model import EngineSpec
from hetero.serve.replicas import Replica

__all__ = ["AutoscaleConfig", "AutoscaleSetup", "TypeConfig", "load_autoscale"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class TypeConfig(_Strict):
    """One replica type: the planner's option (``gpu`` on the plan's menu at
    ``tensor_parallel``) and how to start one (``command``, an argv with ``{port}`` and
    ``{host}``)."""

    gpu: str = Field(min_length=1)
    tensor_parallel: int = Field(default=1, ge=1, le=8)
    command: list[str] = Field(min_length=1)
    startup_s: float = Field(default=120.0, ge=0)
    max_count: int = Field(default=8, ge=1)
    min_count: int = Field(default=0, ge=0)
    initial: int = Field(default=0, ge=0)
    accelerator: str | None = None  # provider ray: the Ray accelerator type to land on
    num_gpus: float = Field(default=0.0, ge=0)


class PolicyConfig(_Strict):
    up_after: float = Field(default=15.0, ge=0)
    down_after: float = Field(default=300.0, ge=0)
    cooldown: float = Field(default=120.0, ge=0)
    max_down_after: float | None = Field(default=None, ge=0)
    max_actions_per_hour: int = Field(default=6, ge=1)


class AutoscaleConfig(_Strict):
    plan: Path
    provider: Literal["local", "ray"] = "local"
    interval: float = Field(default=5.0, gt=0)
    types: dict[str, TypeConfig] = Field(min_length=1)
    policy: PolicyConfig = PolicyConfig()


@dataclass(frozen=True, slots=True)
class AutoscaleSetup:
    """What ``hetero serve --autoscale`` builds from the file."""

    config: AutoscaleConfig
    spec: ServingPlanSpec
    types: tuple[ReplicaType, ...]
    sizer: PlanSizer
    options: PolicyOptions
    engines: dict[str, EngineSpec | None]  # each type's, as the planner sizes it (None: unfit)

    def describe(self, handle: ReplicaHandle) -> Replica:
        """A started replica as the router first knows it: its URL, its GPU and the plan's
        model (so the ``slo`` strategy starts from their engine model, as the plan's menu
        entry measured it where it has a profile); what it serves is asked at its
        /v1/models. Without the profile the prior was the catalog's defaults: for vLLM in
        half a core, a step's cost per request held near the defaults' tiny one where the
        replies said many times more, so the predictions barely rose with a replica's batch
        and the router sent bursts of dozens to one replica while another stood idle. An
        engine the plan found unfit (a type started only as ``initial``) starts from the
        generic prior."""
        t = self.config.types[handle.type_name]
        gpu = get_catalog().get(t.gpu)
        engine = self.engines[handle.type_name]
        speed = gpu.memory_bandwidth_gbs * t.tensor_parallel / REFERENCE_BANDWIDTH_GBS
        return Replica(
            handle.name,
            handle.url,
            speed,
            None,
            set(),
            False,
            device_model=gpu.model,
            prior=engine.prior() if engine is not None else None,
        )


def load_autoscale(path: str | Path) -> AutoscaleSetup:
    """Read and check an autoscale file and the plan it names (relative to it)."""
    path = Path(path)
    data = read_data_file(path, "autoscale file")
    if not isinstance(data, dict):
        raise ConfigError([("", f"{path}: expected a mapping with plan and types")])
    if isinstance(data.get("plan"), str) and not Path(data["plan"]).is_absolute():
        data = {**data, "plan": str(path.parent / data["plan"])}
    try:
        config = AutoscaleConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_problems(exc, data, AutoscaleConfig, _NESTED)) from None
    plan_path = config.plan
    plan_data = read_data_file(plan_path, "serving plan")
    spec = parse_serving_plan(plan_data, source=str(plan_path), base_dir=plan_path.parent)
    problems = _type_problems(config, spec)
    if problems:
        raise ConfigError(problems)
    types = tuple(
        ReplicaType(name, t.startup_s, t.max_count, t.min_count) for name, t in config.types.items()
    )
    options = PolicyOptions(**config.policy.model_dump())
    sizer = PlanSizer(
        spec,
        {name: TypeOption(t.gpu, t.tensor_parallel) for name, t in config.types.items()},
        interval=config.interval,
        hold=options.down_after,
    )
    by_option = {(o.gpu, o.tensor_parallel): o.engine for o in replica_options(sizer.spec)}
    engines = {
        name: by_option[get_catalog().get(t.gpu).model, t.tensor_parallel]
        for name, t in config.types.items()
    }
    return AutoscaleSetup(config, spec, types, sizer, options, engines)


def _type_problems(config: AutoscaleConfig, spec: ServingPlanSpec) -> list[tuple[str, str]]:
    menu = {d.model for d in spec.devices}
    problems = []
    for name, t in config.types.items():
        if t.gpu not in menu:
            problems.append(
                (f"types.{name}.gpu", f"{t.gpu!r} is not on the plan's menu: {', '.join(menu)}")
            )
        if not any("{port}" in arg for arg in t.command):
            problems.append((f"types.{name}.command", "needs {port} where the replica's port goes"))
        if t.min_count > t.max_count or t.initial > t.max_count:
            problems.append(
                (f"types.{name}", f"min_count and initial must be at most max_count {t.max_count}")
            )
    if not any(t.initial for t in config.types.values()):
        problems.append(("types", "start at least one replica: give a type initial: 1"))
    return problems


_NESTED: dict[str, Any] = {"types": TypeConfig, "policy": PolicyConfig}
