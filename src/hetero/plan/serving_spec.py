"""The spec of a model-aware serving plan: which GPUs, how many, at which tensor-parallel degree,
for one model, its traffic and its TTFT/TPOT SLO. Validated with every problem reported at once
(``ConfigError``); see ``docs/fleet-sizing.md`` for the file format.

A plan spec with a ``model`` is this; one without is the work-unit spec of
:mod:`hetero.plan.sizing_spec`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hetero._errors_render import Nested, show, validation_problems
from hetero.devices.catalog import get_catalog
from hetero.errors import ConfigError
from hetero.plan.memory import MAX_TENSOR_PARALLEL
from hetero.plan.models import ModelShape, parse_params, shape_for_params
from hetero.plan.sizing_spec import LENGTHS, catalog_model, entry_problems
from hetero.serve.engine_model import Calibration, resolve_shape
from hetero.sim.trace import read_trace
from hetero.sim.workload import DrawnSize

__all__ = [
    "TENSOR_PARALLEL_DEGREES",
    "ServingDevice",
    "ServingPlanSpec",
    "ServingSLO",
    "ServingWorkload",
    "is_serving_spec",
    "parse_serving_plan",
    "resolve_model",
]

#: The tensor-parallel degrees a menu entry is planned at unless it names its own.
TENSOR_PARALLEL_DEGREES = (1, 2, 4, 8)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ServingWorkload(_Strict):
    """Poisson requests at ``rate`` per second; prompt and output lengths from distributions or
    from a ``trace`` of them (a JSONL or CSV file with ``prompt_tokens`` and ``max_new_tokens``
    per request). Requests are grouped into ``prompt_buckets × output_buckets`` length buckets
    (quantiles of each), as Mélange does."""

    rate: float = Field(gt=0, description="requests per second")
    prompt_tokens: DrawnSize | None = None
    output_tokens: DrawnSize | None = None
    trace: Path | None = None
    prompt_buckets: int = Field(default=4, ge=1, le=50)
    output_buckets: int = Field(default=5, ge=1, le=50)


class ServingSLO(_Strict):
    """Each request's time to first token and mean time per output token, in seconds; the plan
    aims for ``percentile`` % of requests within both."""

    ttft: float = Field(gt=0, description="seconds to the first token")
    tpot: float = Field(gt=0, description="seconds per output token after the first")
    percentile: float = Field(default=99.0, gt=0, lt=100)


class ServingDevice(_Strict):
    """One GPU type on the menu: ``price`` per device-hour (default the catalog's), at most
    ``max_count`` devices of it, ``owned`` of them already paid for (free in the plan up to that
    many), planned at each of ``tensor_parallel`` degrees (devices per replica)."""

    model: str = Field(min_length=1)
    price: float | None = Field(default=None, ge=0, description="$ per device-hour")
    max_count: int | None = Field(default=None, ge=0)
    owned: int = Field(default=0, ge=0)
    tensor_parallel: tuple[int, ...] | None = None
    profile: Path | None = None  # `hetero profile-engine --out` of one of these GPUs

    def calibration(self) -> Calibration | None:
        """The calibration its profile measured, or None (the engine model's defaults)."""
        if self.profile is None:
            return None
        from hetero.plan.engine_profile import EngineProfile

        return EngineProfile.load(self.profile).calibration

    @field_validator("model")
    @classmethod
    def _known(cls, value: str) -> str:
        return catalog_model(value)

    @field_validator("tensor_parallel", mode="before")
    @classmethod
    def _degrees(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = (value,)
        if isinstance(value, list | tuple):
            bad = [
                v
                for v in value
                if isinstance(v, bool)
                or not isinstance(v, int)
                or not 1 <= v <= MAX_TENSOR_PARALLEL
            ]
            if bad or not value:
                raise ValueError(
                    f"must be a list of degrees from 1 to {MAX_TENSOR_PARALLEL}, got {value!r}"
                )
            return tuple(sorted(set(value)))
        return value


class ServingPlanSpec(_Strict):
    """A whole serving plan spec; see the module docstring."""

    model: str | float
    workload: ServingWorkload
    slo: ServingSLO
    devices: list[ServingDevice] = Field(min_length=1)
    max_utilization: float = Field(default=0.8, gt=0, le=1)
    max_price_per_hour: float | None = Field(default=None, gt=0)

    @cached_property
    def shape(self) -> ModelShape:
        return resolve_model(self.model)

    @cached_property
    def lengths(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Prompt and output tokens of the requests the buckets are made from: the trace's, or
        :data:`hetero.plan.buckets.BUCKET_SAMPLES` drawn with a fixed seed."""
        from hetero.plan.buckets import BUCKET_SAMPLES, draw_lengths

        w = self.workload
        if w.trace is not None:
            trace, _ = read_trace(w.trace)
            assert trace is not None and trace.prompt_tokens is not None  # checked at parse
            assert trace.output_tokens is not None
            return trace.prompt_tokens.astype(float), trace.output_tokens.astype(float)
        assert w.prompt_tokens is not None and w.output_tokens is not None
        rng = np.random.default_rng(20240601)
        return draw_lengths(w.prompt_tokens, w.output_tokens, rng, BUCKET_SAMPLES)


def resolve_model(model: str | float) -> ModelShape:
    """A model by built-in name, Hugging Face id (built-in, or a local ``config.json`` or its
    folder) or bare parameter count (``70B``, ``7e9``); ``ConfigError`` on ``model``."""
    if isinstance(model, int | float) and not isinstance(model, bool):
        return shape_for_params(float(model))
    if isinstance(model, str) and (count := parse_params(model)) is not None:
        return shape_for_params(count)
    if not isinstance(model, str):
        raise ConfigError([("model", f"must be a model name or a parameter count, got {model!r}")])
    try:
        return resolve_shape(model, "model")
    except ConfigError as exc:
        message = exc.problems[0][1] if exc.problems else str(exc)
        raise ConfigError([("model", f"{message}, or a parameter count such as 70B")]) from None


def is_serving_spec(data: Any) -> bool:
    """Whether parsed plan data names a model (this spec) rather than work units."""
    return isinstance(data, dict) and "model" in data


def parse_serving_plan(
    data: Any, source: str = "<plan>", base_dir: str | Path | None = None
) -> ServingPlanSpec:
    """Validate parsed YAML/JSON data; raises ``ConfigError`` listing every problem at once. A
    relative trace path is taken relative to ``base_dir``."""
    if not isinstance(data, dict):
        raise ConfigError(
            [
                (
                    "",
                    f"{source}: expected a mapping with model, workload, slo and devices; "
                    f"got {show(data)}",
                )
            ]
        )
    devices = data.get("devices")
    if base_dir is not None and isinstance(devices, list):
        data = {**data, "devices": [_relative(d, "profile", base_dir) for d in devices]}
    if base_dir is not None and "workload" in data:
        data = {**data, "workload": _relative(data["workload"], "trace", base_dir)}
    problems: list[tuple[str, str]] = []
    for key, hint in _WORK_UNIT_KEYS.items():
        if _has(data, key):
            problems.append((key, hint))
    spec: ServingPlanSpec | None = None
    try:
        spec = ServingPlanSpec.model_validate(data)
    except ValidationError as exc:
        problems += [
            p
            for p in validation_problems(exc, data, ServingPlanSpec, _NESTED)
            if p[0] not in _WORK_UNIT_KEYS
        ]
    problems += [p for p in _cross_problems(data) if p not in problems]
    if problems:
        raise ConfigError(problems)
    assert spec is not None
    return spec


def _relative(entry: Any, key: str, base_dir: str | Path) -> Any:
    """``entry`` with a relative path under ``key`` taken relative to ``base_dir``."""
    value = entry.get(key) if isinstance(entry, dict) else None
    if isinstance(value, str) and value and not Path(value).is_absolute():
        return {**entry, key: str(Path(base_dir) / value)}
    return entry


def _has(data: Mapping[str, Any], dotted: str) -> bool:
    here: Any = data
    for part in dotted.split("."):
        if not isinstance(here, Mapping) or part not in here:
            return False
        here = here[part]
    return True


# Keys of the work-unit spec that mean nothing once the model is known.
_WORK_UNIT_KEYS = {
    "slo.latency": "a serving plan's SLO is slo.ttft and slo.tpot (seconds); "
    "slo.latency belongs to a plan without a model",
    "unit_rate": "the model's speed on each GPU comes from its shape and the catalog; "
    "unit_rate belongs to a plan without a model",
    "workload.buckets": "give workload.prompt_buckets and workload.output_buckets",
}


def _cross_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Checks across fields, each run on the parts that are valid by themselves, so one bad
    field does not hide another."""
    problems: list[tuple[str, str]] = []
    if "model" in data:
        try:
            resolve_model(data["model"])
        except ConfigError as exc:
            problems += exc.problems
    try:
        w = ServingWorkload.model_validate(data.get("workload"))
    except ValidationError:
        pass  # reported with the spec's own errors
    else:
        problems += _workload_problems(w)
    entries = data.get("devices")
    seen: dict[str, int] = {}
    for i, raw in enumerate(entries if isinstance(entries, list) else []):
        try:
            entry = ServingDevice.model_validate(raw)
        except ValidationError:
            continue
        if entry.max_count is not None and entry.owned > entry.max_count:
            problems.append(
                (
                    f"devices[{i}].owned",
                    f"{entry.owned} owned is more than max_count {entry.max_count}: max_count "
                    "counts every device of the type that may serve, owned ones included",
                )
            )
        if entry.profile is not None:
            problems += _profile_problems(f"devices[{i}].profile", entry)
        problems += entry_problems(i, entry.model, entry.price, seen)
    return problems


def _profile_problems(where: str, entry: ServingDevice) -> list[tuple[str, str]]:
    from hetero.plan.engine_profile import EngineProfile

    assert entry.profile is not None
    try:
        profile = EngineProfile.load(entry.profile)
    except ConfigError as exc:
        return [
            (where, f"{field}: {message}" if field else message) for field, message in exc.problems
        ]
    measured = get_catalog().get(profile.device).model
    if measured != entry.model:
        return [(where, f"{entry.profile.name} profiles a {measured}, not a {entry.model}")]
    return []


def _workload_problems(w: ServingWorkload) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if w.trace is None:
        for name in ("prompt_tokens", "output_tokens"):
            if getattr(w, name) is None:
                problems.append((f"workload.{name}", "is missing (or give workload.trace)"))
        return problems
    if w.prompt_tokens is not None or w.output_tokens is not None:
        problems.append(("workload.trace", "give a trace or prompt_tokens/output_tokens, not both"))
    trace, trace_problems = read_trace(w.trace)
    problems += [("workload.trace", p) for p in trace_problems]
    if trace is not None and trace.prompt_tokens is None:
        problems.append(
            (
                "workload.trace",
                f"{w.trace.name} gives costs; a serving plan needs "
                "'prompt_tokens' and 'max_new_tokens' on every line",
            )
        )
    return problems


_NESTED: Nested = {
    "workload": ServingWorkload,
    "slo": ServingSLO,
    "devices": ServingDevice,
    "prompt_tokens": LENGTHS,
    "output_tokens": LENGTHS,
}
