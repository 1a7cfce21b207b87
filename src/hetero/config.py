"""The fleet config (``hetero_config.yaml``): value objects validated with pydantic.

Every problem in a file is reported at once, each as ``field.path: message (got VALUE)``, through
one :class:`~hetero.errors.ConfigError`. Cross-field checks (duplicate ids, memory limits above a
model's memory, unknown models with suggestions) live here too, so ``hetero config validate`` and
``load_config`` give the same answers.

The keys of the design's seed documents that name no hetero setting (``heterogeneous_config``,
``scheduler.enable_preemption``, …) are aliases: ``parse_config`` maps each to the hetero
setting it means, or refuses it naming that setting (docs/config.md, "Seed keys").
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from hetero._data_files import read_data_file
from hetero._errors_render import lookup, render_path, show
from hetero.devices.catalog import get_catalog
from hetero.devices.mig import split_slice_name
from hetero.devices.spec import Device, DeviceKind
from hetero.errors import ConfigError
from hetero.log import config_log_level
from hetero.sched.options import DEFAULT_MAX_QUEUE_SIZE as DEFAULT_MAX_QUEUE_SIZE
from hetero.sched.options import DispatchOptions, QueueOrder
from hetero.sched.perf import BatchTable, batch_key_kind
from hetero.units import format_size, parse_size

__all__ = [
    "MAX_DEVICES",
    "MAX_SPEED",
    "MIN_SPEED",
    "BackendConfig",
    "CommunicationConfig",
    "DeviceConfig",
    "HeteroConfig",
    "HeterogeneousConfig",
    "LoggingConfig",
    "NicConfig",
    "NodeConfig",
    "ReplicaConfig",
    "SchedulerConfig",
    "load_config",
    "parse_config",
]


#: The most devices a config may declare, in one entry or in all: more than any fleet hetero
#: runs or simulates.
MAX_DEVICES = 100_000
#: The range of a relative speed (V100 = 1.0): a slow CPU core is about 0.008, a wafer-scale
#: chip 500. Outside it, durations of cost / speed overflow or round to nothing.
MIN_SPEED, MAX_SPEED = 1e-6, 1_000_000
_DAY = 86_400  # seconds
_YEAR = 365 * _DAY


def _positive_size(value: Any) -> int:
    size = parse_size(value)
    if size <= 0:
        raise ValueError(f"size must be greater than 0, got {value!r}")
    return size


Size = Annotated[int, BeforeValidator(_positive_size)]


def _any_case(fold: Callable[[str], str]) -> BeforeValidator:
    """Names written in any case (``GPU``, ``gpu``) folded to the one the field allows."""
    return BeforeValidator(lambda value: fold(value) if isinstance(value, str) else value)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DeviceConfig(_Strict):
    """One line of ``devices:``: a real local device, or ``count`` emulated ones."""

    type: Annotated[DeviceKind, _any_case(str.lower)]
    id: int | str | None = Field(
        default=None, description="real GPU: CUDA index, UUID or PCI bus id"
    )
    model: str | None = Field(default=None, description="catalog name, e.g. A100-80GB")
    emulate: bool = False
    count: int = Field(default=1, ge=1, le=MAX_DEVICES)
    speed: float | None = Field(
        default=None,
        ge=MIN_SPEED,
        le=MAX_SPEED,
        allow_inf_nan=False,
        description="relative speed (V100 = 1.0)",
    )
    memory_limit: Size | None = None
    cores: int | None = Field(default=None, ge=1)
    name: str | None = Field(default=None, min_length=1)
    node: str = Field(default="localhost", min_length=1)
    rack: str | None = Field(default=None, description="the rack of its node (unset: unknown)")
    tags: list[str] = Field(default_factory=list)

    @field_validator("model")
    @classmethod
    def _known_model(cls, value: str | None) -> str | None:
        if value is None:
            return None
        catalog = get_catalog()
        if value not in catalog:
            if split_slice_name(value) is not None:  # a MIG slice: its GPU's profiles
                raise ValueError(catalog.why_unknown(value))
            close = catalog.closest(value)
            hint = f"; closest catalog names: {', '.join(close)}" if close else ""
            raise ValueError(f"unknown model {value!r}{hint} (see `hetero catalog list`)")
        return catalog.get(value).model

    @field_validator("rack")
    @classmethod
    def _rack_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError(f"expected a rack name (left out: unknown), got {value!r}")
        return value

    @field_validator("id")
    @classmethod
    def _valid_id(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 0:
            raise ValueError(f"device index must be >= 0, got {value}")
        return value


#: The dispatcher's defaults (``DispatchOptions`` holds each one), so each is written once.
_DISPATCH = DispatchOptions()


class SchedulerConfig(_Strict):
    """The ``scheduler`` section: the strategy and its options, the batch table, the monitoring
    interval and the ``DispatchOptions`` settings (defaults from there; the constraints here
    give config-file errors). ``Dispatcher.from_config`` turns it into a dispatcher."""

    strategy: str = "tail_budget"
    max_queue_size: int = Field(default=_DISPATCH.max_queue_size, ge=1)
    timeout: float | None = Field(
        default=_DISPATCH.timeout,
        gt=0,
        le=_YEAR,
        allow_inf_nan=False,
        description="seconds per work item",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")
    max_retries: int = Field(
        default=_DISPATCH.max_retries, ge=0, description="failed attempts retried elsewhere"
    )
    preemption: bool = _DISPATCH.preemption
    stealing: bool = _DISPATCH.stealing
    queue_order: QueueOrder = Field(
        default=_DISPATCH.queue_order,
        description="within a priority: small items first (with aging), or FIFO",
    )
    aging: float = Field(
        default=_DISPATCH.aging,
        ge=0,
        allow_inf_nan=False,
        description="an item is passed over only by items arriving within aging × its service time",
    )
    max_bypass: float | None = Field(
        default=_DISPATCH.max_bypass,
        gt=0,
        le=_YEAR,
        allow_inf_nan=False,
        description="seconds: a cap on that window",
    )
    late_after: float | None = Field(
        default=_DISPATCH.late_after,
        gt=0,
        le=_YEAR,
        allow_inf_nan=False,
        description="seconds an item may wait for a device before those that have not pass it",
    )
    batch_sizes: dict[str, int] = Field(
        default_factory=dict,
        description="static per-device batch size by device id, catalog model or family "
        "(A100: every A100 variant); the most exact key wins",
    )
    monitoring_interval: float = Field(
        default=1.0, gt=0, le=_DAY, allow_inf_nan=False, description="seconds between device polls"
    )

    @field_validator("batch_sizes")
    @classmethod
    def _positive_batches(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in value.items() if v < 1}
        if bad:
            raise ValueError(f"batch sizes must be >= 1, got {bad}")
        return value

    @field_validator("strategy")
    @classmethod
    def _known_strategy(cls, value: str) -> str:
        from hetero.sched.registry import policy_class  # the registry imports the policies

        try:
            policy_class(value)
        except ConfigError as exc:
            raise ValueError(exc.problems[0][1]) from None
        return value

    @model_validator(mode="after")
    def _valid_options(self) -> SchedulerConfig:
        from hetero.sched.registry import make_policy

        try:
            make_policy(self.strategy, self.options)
        except ConfigError as exc:
            raise ValueError(
                "; ".join(f"{p.removeprefix('scheduler.')}: {m}" for p, m in exc.problems)
            ) from None
        return self


#: Seed keys that ask, with false, to turn off what hetero always does: what it does instead.
_ALWAYS_ON = {
    "heterogeneous_config.capacity_aware": (
        "under every strategy the dispatcher places an item only on a device whose free memory "
        "fits its memory (WorkItem.memory, a task's memory=); remove the key, or set "
        "scheduler.strategy: capacity_aware with options {on_no_fit: reject} to refuse such "
        "items rather than hold them"
    ),
    "heterogeneous_config.auto_adjust_batch_size": (
        "a map's batches are always sized by each device's measured speed and free memory; to "
        "fix a device's batch size set scheduler.batch_sizes (by device id, model or family, "
        "e.g. {A100: 32})"
    ),
    "scheduler.enable_monitoring": (
        "hetero always reads its devices (memory in use, utilization, hetero top); set "
        "scheduler.monitoring_interval (seconds, up to 86400) to read them less often"
    ),
}


def _always_on(alias: str) -> tuple[str, str]:
    return (alias, f"false cannot be honoured: {_ALWAYS_ON[alias]} (got False)")


#: ``(alias, scheduler key, value)``: a hetero setting an alias means.
Setting = tuple[str, str, Any]


class HeterogeneousConfig(_Strict):
    """Seed 000's ``heterogeneous_config`` block, accepted as aliases: ``parse_config`` turns it
    into ``scheduler`` settings (``mapped``) and drops it."""

    enable_weighted_routing: bool | None = Field(
        default=None, description="true: weighted (or adaptive); false: round_robin"
    )
    weight_calculation: Literal["static", "dynamic"] | None = Field(
        default=None, description="static: weighted (catalog speed); dynamic: adaptive"
    )
    monitoring_interval: float | None = Field(
        default=None,
        gt=0,
        le=_DAY,
        allow_inf_nan=False,
        description="scheduler.monitoring_interval",
    )
    capacity_aware: bool | None = Field(
        default=None, description="always on: memory is a hard limit under every strategy"
    )
    request_tiering: bool | None = Field(default=None, description="true: strategy tiered")
    auto_adjust_batch_size: bool | None = Field(
        default=None, description="always on: map batches follow speed and free memory"
    )

    def mapped(self) -> tuple[list[Setting], list[tuple[str, str]]]:
        """The ``scheduler`` settings these aliases mean, and the problems of values and
        combinations that mean nothing hetero has (each naming what hetero does instead)."""
        where = "heterogeneous_config."
        settings: list[Setting] = []
        problems: list[tuple[str, str]] = []
        weighted, weights = self.enable_weighted_routing, self.weight_calculation
        if self.request_tiering:
            # tiered balances inside a tier by expected delay: speeds the performance model
            # measures, so weighted, dynamic routing is what it does already.
            if weighted is False:
                problems.append(
                    (
                        f"{where}enable_weighted_routing",
                        "false (a uniform split) conflicts with request_tiering: true, whose "
                        "strategy tiered balances inside a tier by measured speed; remove one",
                    )
                )
            elif weights == "static":
                problems.append(
                    (
                        f"{where}weight_calculation",
                        "static conflicts with request_tiering: true, whose strategy tiered "
                        "balances inside a tier by measured (dynamic) speed; set dynamic or "
                        "remove it",
                    )
                )
            else:
                settings.append((f"{where}request_tiering", "strategy", "tiered"))
        elif weighted is False:
            if weights is not None:
                problems.append(
                    (
                        f"{where}weight_calculation",
                        f"{weights} applies to weighted routing, which "
                        "enable_weighted_routing: false turns off; remove one",
                    )
                )
            else:
                settings.append((f"{where}enable_weighted_routing", "strategy", "round_robin"))
        elif weighted or weights is not None:
            alias = "weight_calculation" if weights is not None else "enable_weighted_routing"
            strategy = "adaptive" if weights == "dynamic" else "weighted"
            settings.append((f"{where}{alias}", "strategy", strategy))
        if self.monitoring_interval is not None:
            settings.append(
                (f"{where}monitoring_interval", "monitoring_interval", self.monitoring_interval)
            )
        for name in ("capacity_aware", "auto_adjust_batch_size"):
            if getattr(self, name) is False:
                problems.append(_always_on(f"{where}{name}"))
        return settings, problems


class _SchedulerSeedKeys(_Strict):
    """Seed 001's ``scheduler_config`` keys that hetero's ``scheduler`` names otherwise."""

    enable_preemption: bool | None = None
    enable_monitoring: bool | None = None

    def mapped(self) -> tuple[list[Setting], list[tuple[str, str]]]:
        settings: list[Setting] = []
        if self.enable_preemption is not None:
            settings.append(("scheduler.enable_preemption", "preemption", self.enable_preemption))
        wrong = (
            [_always_on("scheduler.enable_monitoring")] if self.enable_monitoring is False else []
        )
        return settings, wrong


#: Alias keys per section, for "allowed keys" and "did you mean" in errors.
_SEED_KEYS: dict[str, tuple[str, ...]] = {
    "": ("heterogeneous_config",),
    "scheduler": tuple(_SchedulerSeedKeys.model_fields),
}


class CommunicationConfig(_Strict):
    """How ranks talk (read by ``hetero.comm.init``): ``rdma`` is NCCL over InfiniBand or
    RoCE, refused where this machine has no RDMA device."""

    protocol: Annotated[Literal["gloo", "nccl", "rdma", "mpi", "tcp"], _any_case(str.lower)] = (
        "gloo"
    )
    buffer_size: Size | None = Field(
        default=None,
        description="nccl and rdma: NCCL's buffer per channel (NCCL_BUFFSIZE); unset: NCCL's own",
    )


class BackendConfig(_Strict):
    """Where ``hetero.Context`` runs tasks: worker processes here, or a Ray cluster."""

    kind: Literal["local", "ray"] = "local"
    address: str | None = Field(
        default=None,
        min_length=1,
        description="ray only: 'auto', 'host:port' or 'ray://host:port'; none: join a running "
        "cluster, else start a local one",
    )

    @model_validator(mode="after")
    def _address_for_ray(self) -> BackendConfig:
        if self.address is not None and self.kind != "ray":
            raise ValueError("address applies to kind: ray only")
        return self


class LoggingConfig(_Strict):
    level: (
        Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], _any_case(str.upper)]
        | None
    ) = Field(default=None, description="set on hetero's logger when the file is loaded")


class ReplicaConfig(_Strict):
    """One line of ``replicas:``: an inference server that ``hetero serve`` routes to.

    ``url`` is enough: the router learns each replica's speed and capacity from its replies and
    its engine's published load. The rest are priors that make the start faster. ``speed`` is
    how fast one request runs there (relative, V100 = 1.0); without it, the catalog
    ``device``'s memory bandwidth gives it (decoding is bandwidth-bound). ``slots`` is how many
    requests it serves at once to start with; without it, ``hetero fit`` derives it from
    ``device`` and ``fit_model`` at ``context`` tokens, else the engine's published cap or a
    starting guess that grows while the replica keeps up.
    """

    url: str = Field(description="base URL of an OpenAI-compatible server")
    device: str | None = Field(default=None, description="catalog name of its GPU")
    speed: float | None = Field(default=None, ge=MIN_SPEED, le=MAX_SPEED, allow_inf_nan=False)
    slots: int | None = Field(default=None, ge=1, le=100_000)
    models: list[str] = Field(
        default_factory=list, description="models it serves (default: asked at /v1/models)"
    )
    name: str | None = Field(default=None, min_length=1)
    fit_model: str | None = Field(default=None, description="model shape for hetero fit")
    context: int = Field(default=4096, ge=1, description="tokens per request for hetero fit")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            hint = ""
            if "://" not in value and urlsplit(f"http://{value}").hostname:
                hint = f" (did you mean 'http://{value}'?)"
            raise ValueError(
                f"expected http://HOST[:PORT] or https://HOST[:PORT], got {value!r}{hint}"
            )
        return value.rstrip("/")

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str | None) -> str | None:
        return DeviceConfig._known_model(value)


class NicConfig(_Strict):
    """One network interface of a node: its name, fabric and link speed in Gb/s each way."""

    name: str = Field(min_length=1)
    fabric: Annotated[Literal["ethernet", "infiniband"], _any_case(str.lower)] = "ethernet"
    gbps: float = Field(gt=0, le=1_000_000, allow_inf_nan=False, description="Gb/s each way")


class NodeConfig(_Strict):
    """One entry of ``nodes:``: what a node has besides its devices (its NICs)."""

    nics: list[NicConfig] = Field(default_factory=list)

    @field_validator("nics")
    @classmethod
    def _distinct_names(cls, nics: list[NicConfig]) -> list[NicConfig]:
        names = [nic.name for nic in nics]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"NIC {twice[0]!r} is listed twice; each name once per node")
        return nics


class HeteroConfig(_Strict):
    """A whole ``hetero_config.yaml``: ``devices`` for the engine and the simulator,
    ``replicas`` for ``hetero serve`` (a file needs one or the other, unless the backend is a
    Ray cluster, whose nodes declare their own devices)."""

    devices: list[DeviceConfig] = Field(default_factory=list, min_length=1)
    nodes: dict[str, NodeConfig] = Field(default_factory=dict)
    replicas: list[ReplicaConfig] = Field(default_factory=list)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    communication: CommunicationConfig = Field(default_factory=CommunicationConfig)
    backend: BackendConfig = Field(default_factory=BackendConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


def parse_config(data: Any, source: str = "<config>") -> HeteroConfig:
    """Validate already-parsed YAML/JSON data; raises ``ConfigError`` listing every problem."""
    if not isinstance(data, dict):
        raise ConfigError(
            [("", f"{source}: expected a mapping with a 'devices' list, got {show(data)}")]
        )
    data, problems = _seed_aliases(data)
    backend = data.get("backend")
    on_ray = isinstance(backend, dict) and backend.get("kind") == "ray"
    if "devices" not in data and not data.get("replicas") and not on_ray:
        problems.append(("devices", "required field is missing"))
    config: HeteroConfig | None = None
    try:
        config = HeteroConfig.model_validate(data)
    except ValidationError as exc:
        problems += _problems(exc, data)
    # Cross-device checks run on every entry that is valid by itself, so one bad field does
    # not hide a duplicate id elsewhere.
    valid: list[tuple[int, DeviceConfig]] = []
    entries = data.get("devices")
    if isinstance(entries, list):
        for i, entry in enumerate(entries):
            with contextlib.suppress(ValidationError):  # already reported above
                valid.append((i, DeviceConfig.model_validate(entry)))
    problems += [p for p in _device_problems(valid) if p not in problems]
    problems += _node_problems(data.get("nodes"), valid)
    if config is not None:
        problems += _batch_problems(config)
    if problems:
        raise ConfigError(problems)
    assert config is not None
    return config


def _seed_aliases(data: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``data`` with the seed documents' keys replaced by the hetero settings they mean
    (``HeterogeneousConfig.mapped``, ``scheduler.enable_preemption`` → ``preemption``), and
    the problems: a bad alias value, or an alias that says one thing where the hetero key
    beside it says another (both are named; neither is applied)."""
    block = data.get("heterogeneous_config")
    if block is None:  # an empty block (YAML: a key with nothing under it) maps nothing
        block = {}
    raw_scheduler = data.get("scheduler")
    scheduler = dict(raw_scheduler) if isinstance(raw_scheduler, dict) else None
    seed = (
        {k: scheduler.pop(k) for k in _SEED_KEYS["scheduler"] if k in scheduler}
        if scheduler
        else {}
    )
    if "heterogeneous_config" not in data and not seed:
        return data, []
    out = {k: v for k, v in data.items() if k != "heterogeneous_config"}
    problems: list[tuple[str, str]] = []
    settings: list[Setting] = []
    if "heterogeneous_config" in data:
        try:
            mapped = HeterogeneousConfig.model_validate(block)
        except ValidationError as exc:
            problems += _problems(exc, block, HeterogeneousConfig, ("heterogeneous_config",))
        else:
            more, wrong = mapped.mapped()
            settings += more
            problems += wrong
    # Each independent of the other: one key's bad value hides nothing of the other.
    for key, value in seed.items():
        try:
            keys = _SchedulerSeedKeys.model_validate({key: value})
        except ValidationError as exc:
            problems += _problems(exc, {key: value}, _SchedulerSeedKeys, ("scheduler",))
        else:
            more, wrong = keys.mapped()
            settings += more
            problems += wrong
    if scheduler is None and settings:
        if raw_scheduler is not None:  # not a mapping: the model reports it
            return out, problems
        scheduler = {}
    for alias, key, value in settings:
        assert scheduler is not None
        if key not in scheduler:
            problem = _needs(alias, key, value, scheduler)
            if problem is None:
                scheduler[key] = value
            else:
                problems.append(problem)
        elif not _same(key, scheduler[key], value):
            problems.append(
                (
                    alias,
                    f"{_as_written(lookup(data, alias.split('.')))} means scheduler.{key}: "
                    f"{_as_written(value, quote=False)}, but scheduler.{key} is "
                    f"{_as_written(scheduler[key])}; remove one or make them agree",
                )
            )
    if scheduler is not None:
        out["scheduler"] = scheduler
    return out, problems


def _needs(alias: str, key: str, value: Any, scheduler: dict[str, Any]) -> tuple[str, str] | None:
    """What a strategy an alias sets needs and the file lacks: ``tiered`` has no default
    tiers (which devices are small is the user's to say)."""
    options = scheduler.get("options")
    if (key, value) == ("strategy", "tiered") and not (
        isinstance(options, dict) and {"thresholds", "tiers"} <= set(options)
    ):
        return (
            alias,
            "true means scheduler.strategy: tiered, which needs scheduler.options.thresholds "
            "(complexity bounds, e.g. prompt tokens [1024]) and scheduler.options.tiers "
            "(device selectors per tier, smallest first, e.g. [[V100-32GB], [A100-80GB]])",
        )
    return None


def _as_written(value: Any, quote: bool = True) -> str:
    """A value as YAML spells it (``true``), strings quoted unless ``quote`` is false."""
    if isinstance(value, bool):
        return str(value).lower()
    return show(value) if quote or not isinstance(value, str) else value


def _same(key: str, given: Any, value: Any) -> bool:
    """Whether the hetero key's own ``given`` value is ``value``; a value the field refuses
    counts as the same (the field's own error says what is wrong with it)."""
    annotation = SchedulerConfig.model_fields[key].annotation
    assert annotation is not None
    try:
        ours = TypeAdapter[Any](annotation).validate_python(given)
    except ValidationError:
        return True
    return bool(ours == value)


def _batch_problems(config: HeteroConfig) -> list[tuple[str, str]]:
    """Keys of ``scheduler.batch_sizes`` that name nothing, or the same model twice. A key the
    catalog does not know may be a device id: checked against the fleet where the file alone
    gives every id (emulated devices), else when the fleet is built (``PerfModel``)."""
    table = config.scheduler.batch_sizes
    unknown = [key for key in table if batch_key_kind(key) is None]
    fleet: list[Device] = []
    if unknown:
        ids_known = config.devices and all(d.emulate for d in config.devices)
        if config.backend.kind != "local" or not ids_known:
            table = {k: v for k, v in table.items() if k not in unknown}
        else:
            from hetero.devices.fleet import build_fleet

            fleet = build_fleet(config)
    try:
        BatchTable.resolve(table, fleet)
    except ConfigError as exc:
        return exc.problems
    return []


def load_config(path: str | Path) -> HeteroConfig:
    """Read and validate a fleet config file, and set hetero's log level to its
    ``logging.level`` if it has one (unless the application set a level: ``set_log_level``,
    ``hetero --log-level``)."""
    path = Path(path)
    data = read_data_file(path, "config")
    config = parse_config(data, source=str(path))
    if config.logging.level is not None:
        config_log_level(config.logging.level)
    return config


# --- error rendering ------------------------------------------------------------------------


def _fields_of(
    data: Any, loc: tuple[int | str, ...], root: type[BaseModel] | None = None
) -> list[str]:
    model: type[BaseModel] = root or HeteroConfig
    for part in loc:
        if isinstance(part, int) or str(part) not in model.model_fields:
            continue  # a list index, or a key of a mapping (``nodes.<name>``)
        annotation = model.model_fields[str(part)].annotation
        args = getattr(annotation, "__args__", ())
        nested = [
            a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if not nested:
            return []
        model = nested[0]
    return sorted(model.model_fields)


_TAGS = frozenset({"int", "str", "float", "bool"})


def _problems(
    exc: ValidationError,
    data: Any,
    root: type[BaseModel] | None = None,
    prefix: tuple[str, ...] = (),
) -> list[tuple[str, str]]:
    """Each error of ``exc`` as ``(path, message)``; ``data`` is what ``root`` (default
    ``HeteroConfig``) validated, found at ``prefix`` in the file."""
    problems: list[tuple[str, str]] = []
    for err in exc.errors():
        # Pydantic appends the tag of the union member that failed ('int', 'str',
        # 'function-before[...]'); only field names and list indices make the path.
        loc = tuple(
            p for p in err["loc"] if isinstance(p, int) or (p.isidentifier() and p not in _TAGS)
        )
        path = render_path(prefix + loc)
        kind = err["type"]
        if kind == "extra_forbidden":
            key, fields = str(loc[-1]), _fields_of(data, loc[:-1], root)
            if root is None:  # the aliases parse_config accepts there are allowed too
                fields = sorted([*fields, *_SEED_KEYS.get(render_path(loc[:-1]), ())])
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" did you mean {close[0]!r}?" if close else ""
            allowed = ", ".join(fields)
            problems.append((path, f"unknown key {key!r};{hint} allowed keys: {allowed}"))
            continue
        if kind == "missing":
            problems.append((path, "required field is missing"))
            continue
        message = str(err["msg"]).removeprefix("Value error, ")
        value = lookup(data, loc)
        if "got " in message or "unknown model" in message:
            problems.append((path, message))
        else:
            problems.append((path, f"{message} (got {show(value)})"))
    # Union members each report the same bad value; keep one line per path and message.
    return list(dict.fromkeys(problems))


def _node_problems(nodes: Any, devices: list[tuple[int, DeviceConfig]]) -> list[tuple[str, str]]:
    """A ``nodes:`` entry must name a node some device is on (a misspelt name would describe
    a node that is not there)."""
    if not isinstance(nodes, dict) or not devices:
        return []
    used = list(dict.fromkeys(dev.node for _, dev in devices))
    problems = []
    for name in nodes:
        if name not in used:
            close = difflib.get_close_matches(str(name), used, n=3)
            hint = f"; closest: {', '.join(close)}" if close else ""
            problems.append(
                (
                    f"nodes.{name}",
                    f"no device is on node {name!r}{hint}; devices are on: {', '.join(used)}",
                )
            )
    return problems


def _device_problems(devices: list[tuple[int, DeviceConfig]]) -> list[tuple[str, str]]:
    catalog = get_catalog()
    problems: list[tuple[str, str]] = []
    seen_ids: dict[tuple[str, str, str], int] = {}
    seen_names: dict[str, int] = {}
    # A node is in one rack, so every entry on it that names a rack names the same one.
    racks: dict[str, tuple[str, int]] = {}
    for i, dev in devices:
        where = f"devices[{i}]"
        if dev.rack is not None:
            rack, first = racks.setdefault(dev.node, (dev.rack, i))
            if rack != dev.rack:
                problems.append(
                    (
                        f"{where}.rack",
                        f"{dev.rack!r} contradicts devices[{first}].rack {rack!r} for node "
                        f"{dev.node!r}: a node is in one rack; allowed: {rack!r} or left out",
                    )
                )
        if dev.emulate:
            if dev.model is None:
                problems.append((f"{where}.model", "an emulated device needs a catalog model"))
            if dev.id is not None:
                problems.append((f"{where}.id", f"id {dev.id!r} applies only to real devices"))
        else:
            if dev.type not in (DeviceKind.CPU, DeviceKind.GPU):
                problems.append(
                    (
                        f"{where}.type",
                        f"a real {dev.type.value} cannot be discovered; "
                        "allowed: cpu or gpu, or set emulate: true",
                    )
                )
            if dev.count != 1:
                problems.append(
                    (f"{where}.count", f"count {dev.count} applies only to emulated devices")
                )
        if dev.cores is not None and dev.type is not DeviceKind.CPU:
            problems.append(
                (f"{where}.cores", f"cores applies only to type cpu, not {dev.type.value}")
            )
        if dev.model is not None:
            spec = catalog.get(dev.model)
            if spec.kind is not dev.type:
                problems.append(
                    (
                        f"{where}.model",
                        f"model {dev.model} is a {spec.kind.value}, not a {dev.type.value}",
                    )
                )
            if dev.memory_limit is not None and dev.memory_limit > spec.memory_bytes:
                problems.append(
                    (
                        f"{where}.memory_limit",
                        f"{format_size(dev.memory_limit)} is above the "
                        f"{format_size(spec.memory_bytes)} "
                        f"of a {spec.model}; allowed: at most {format_size(spec.memory_bytes)}",
                    )
                )
        if not dev.emulate:
            key = (dev.node, dev.type.value, str(dev.id if dev.id is not None else 0))
            if key in seen_ids:
                problems.append(
                    (
                        f"{where}.id",
                        f"duplicate id {key[2]!r} for {dev.type.value} on {dev.node} "
                        f"(also devices[{seen_ids[key]}])",
                    )
                )
            seen_ids.setdefault(key, i)
        if dev.name is not None:
            if dev.name in seen_names:
                problems.append(
                    (
                        f"{where}.name",
                        f"duplicate name {dev.name!r} (also devices[{seen_names[dev.name]}])",
                    )
                )
            seen_names.setdefault(dev.name, i)
    total = sum(dev.count for _, dev in devices)
    if total > MAX_DEVICES:
        problems.append(
            (
                "devices",
                f"{total} devices in all ({len(devices)} entries); allowed: at most {MAX_DEVICES}",
            )
        )
    return problems
