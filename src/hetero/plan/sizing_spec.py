"""The fleet-sizing spec: workload (rate, token-length distributions), SLO and the menu of
device types, validated with every problem reported at once (``ConfigError``).

See ``docs/fleet-sizing.md`` for the file format.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hetero._data_files import read_data_file
from hetero._errors_render import Nested, show, validation_problems
from hetero.devices.catalog import get_catalog
from hetero.errors import ConfigError, HeteroError
from hetero.sim.workload import DrawnSize, FixedSize, LognormalSize, UniformSize

__all__ = [
    "DEFAULT_UNIT_RATE",
    "LENGTHS",
    "MenuEntry",
    "PlanSLO",
    "PlanSpec",
    "PlanWorkload",
    "catalog_model",
    "entry_problems",
    "load_plan",
    "merge_overrides",
    "parse_plan",
]

#: Work units per second of a speed-1.0 device (a V100 at fp16). A catalog estimate of a type's
#: throughput is its fp16 TFLOPS / 125 × this: about a 7B-parameter model served with continuous
#: batching. Measured ``tokens_per_second`` replaces the estimate; ``unit_rate`` in the spec
#: replaces this constant.
DEFAULT_UNIT_RATE = 2500.0


def catalog_model(value: str) -> str:
    """A menu entry's ``model``: the catalog's name for it (a validator)."""
    try:
        return get_catalog().get(value).model
    except HeteroError as exc:
        raise ValueError(str(exc)) from None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class PlanWorkload(_Strict):
    """What arrives: Poisson requests at ``rate`` per second, token lengths from distributions."""

    rate: float = Field(gt=0, description="requests per second")
    prompt_tokens: DrawnSize
    output_tokens: DrawnSize
    buckets: int = Field(default=10, ge=1, le=200, description="length buckets to plan with")


class PlanSLO(_Strict):
    """``percentile`` % of requests finish within ``latency`` seconds of arriving."""

    latency: float = Field(gt=0, description="seconds from arrival to completion")
    percentile: float = Field(default=99.0, gt=0, lt=100)


class MenuEntry(_Strict):
    """One device type on the menu. Missing ``price``/``tokens_per_second`` come from the catalog.

    ``tokens_per_second`` is a measured throughput in work units per second (prompt tokens count
    0.5, output tokens 1.0, as :class:`~hetero.sched.item.CostModel` weighs them).
    """

    model: str = Field(min_length=1)
    price: float | None = Field(default=None, ge=0, description="$ per device-hour")
    tokens_per_second: float | None = Field(default=None, gt=0)
    max_count: int | None = Field(default=None, ge=0)

    @field_validator("model")
    @classmethod
    def _known(cls, value: str) -> str:
        return catalog_model(value)


class PlanSpec(_Strict):
    """A whole plan spec; see the module docstring."""

    workload: PlanWorkload
    slo: PlanSLO
    devices: list[MenuEntry] = Field(min_length=1)
    max_utilization: float = Field(default=0.8, gt=0, lt=1)
    max_price_per_hour: float | None = Field(default=None, gt=0)
    unit_rate: float = Field(default=DEFAULT_UNIT_RATE, gt=0)


def load_plan(path: str | Path, overrides: Mapping[str, Any] | None = None) -> PlanSpec:
    """Read and validate a plan spec file; ``overrides`` are merged over it (nested mappings
    key by key) before validation, e.g. ``{"workload": {"rate": 80}}``."""
    path = Path(path)
    data = read_data_file(path, "plan spec")
    if overrides and isinstance(data, dict):
        data = merge_overrides(data, overrides)
    return parse_plan(data, source=str(path))


def merge_overrides(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_overrides(out[key], value)
        else:
            out[key] = value
    return out


def parse_plan(data: Any, source: str = "<plan>") -> PlanSpec:
    """Validate parsed YAML/JSON data; raises ``ConfigError`` listing every problem at once."""
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"{source}: expected a mapping with workload, slo and devices; got {show(data)}")]
        )
    problems: list[tuple[str, str]] = []
    spec: PlanSpec | None = None
    try:
        spec = PlanSpec.model_validate(data)
    except ValidationError as exc:
        problems += validation_problems(exc, data, PlanSpec, _NESTED)
    # Checks across fields run on every entry that is valid by itself, so one bad field does not
    # hide a missing price elsewhere.
    entries = data.get("devices")
    if isinstance(entries, list):
        problems += [p for p in _menu_problems(entries) if p not in problems]
    if problems:
        raise ConfigError(problems)
    assert spec is not None
    return spec


def _menu_problems(entries: list[Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(entries):
        try:
            entry = MenuEntry.model_validate(raw)
        except ValidationError:
            continue  # reported with the spec's own errors
        problems += entry_problems(i, entry.model, entry.price, seen)
    return problems


def entry_problems(
    i: int, model: str, price: float | None, seen: dict[str, int]
) -> list[tuple[str, str]]:
    """Menu entry ``i`` of catalog ``model``: a price, its own or the catalog's, and listed
    once (``seen``: where each model was listed first, updated)."""
    problems = []
    if price is None and get_catalog().get(model).price_per_hour is None:
        problems.append(
            (
                f"devices[{i}].price",
                f"{model} has no price in the catalog; give price: $ per device-hour",
            )
        )
    if model in seen:
        problems.append(
            (
                f"devices[{i}].model",
                f"{model} is already on the menu as devices[{seen[model]}]; list each type once",
            )
        )
    seen.setdefault(model, i)
    return problems


#: The length distributions a plan's workload names (for error messages' nested models).
LENGTHS: dict[str, type[BaseModel]] = {
    "fixed": FixedSize,
    "uniform": UniformSize,
    "lognormal": LognormalSize,
}
_NESTED: Nested = {
    "workload": PlanWorkload,
    "slo": PlanSLO,
    "devices": MenuEntry,
    "prompt_tokens": LENGTHS,
    "output_tokens": LENGTHS,
}
