"""Replicas as the scheduling core sees them: a ``Device`` each, with its slots.

A replica is its URL. Its GPU, ``speed`` and ``slots`` are optional *priors*: the router learns
each replica's per-request speed from its replies and its capacity (the requests it takes at
once) from its replies and its engine's published load (``hetero.sched.capacity``).

A replica's ``speed`` is how fast *one* request runs there; the core's speed is a device's
throughput with every slot busy (``Dispatcher`` runs each item at ``speed / slots``), so the
replica becomes a device of speed ``per-request speed × slots``.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pydantic import ValidationError

from hetero.config import ReplicaConfig
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device, DeviceKind, DeviceSpec
from hetero.errors import ConfigError
from hetero.sched.engine_fit import EnginePrior
from hetero.sched.perf import REFERENCE_BANDWIDTH_GBS

__all__ = ["UNKNOWN_SPEED", "Replica", "parse_replica_flag", "replica_from_config"]

#: Per-request speed assumed, until replies tell, of a replica whose GPU and speed are not given.
UNKNOWN_SPEED = 1.0

# A replica known only by its measured speed: no catalog figures, no memory limit to enforce.
_UNKNOWN_GPU = DeviceSpec(
    model="replica",
    kind=DeviceKind.GPU,
    vendor="unknown",
    tflops={},
    memory_bytes=0,
    memory_bandwidth_gbs=0.0,
)

_FLAG_KEYS = ("slots", "models", "name", "fit_model", "context", "speed", "device")


@dataclass(slots=True)
class Replica:
    """One replica: where it is, what it serves, and what was declared of it (priors)."""

    name: str
    url: str
    speed: float | None  # declared (or from its GPU) relative speed of one request, V100 = 1.0
    slots: int | None  # declared requests at once (or from `hetero fit`)
    models: set[str]
    declared_models: bool  # models from the config/flag; else learned from /v1/models
    device_model: str | None = None
    # The engine model of its GPU and model shape, where both were declared: where the slo
    # strategy's fit starts (else a generic guess scaled by its speed).
    prior: EnginePrior | None = None

    def engine_prior(self) -> EnginePrior:
        return self.prior or EnginePrior.generic(self.speed)

    def device(self, slots: int) -> Device:
        """The replica as a device of the core running ``slots`` requests at once."""
        spec = get_catalog().get(self.device_model) if self.device_model else _UNKNOWN_GPU
        speed = UNKNOWN_SPEED if self.speed is None else self.speed
        return Device(
            id=self.name,
            spec=spec,
            node=urlsplit(self.url).hostname or "localhost",
            emulated=True,  # the router never touches the GPU itself
            speed_override=speed * slots,
        )


def _fit_slots(config: ReplicaConfig) -> int | None:
    if config.device is None or config.fit_model is None:
        return None
    from hetero.plan.memory import FitRequest, fit_memory
    from hetero.plan.models import get_model

    fit = fit_memory(get_model(config.fit_model), config.device, FitRequest(seq=config.context))
    if fit.max_batch < 1:
        raise ConfigError(
            [
                (
                    "fit_model",
                    f"{config.fit_model} does not fit on a {config.device} at {config.context} "
                    "tokens (see `hetero fit`); declare slots or pick a larger device",
                )
            ]
        )
    return fit.max_batch


def replica_from_config(config: ReplicaConfig) -> Replica:
    """The replica a ``replicas:`` entry describes: its URL, and as priors its speed (declared,
    or from its GPU's memory bandwidth) and slots (declared, or from ``hetero fit``)."""
    speed = config.speed
    if speed is None and config.device is not None:
        speed = get_catalog().get(config.device).memory_bandwidth_gbs / REFERENCE_BANDWIDTH_GBS
    slots = config.slots or _fit_slots(config)
    parts = urlsplit(config.url)
    prior = None
    if config.device is not None and config.fit_model is not None:
        from hetero.serve.engine_model import engine_spec

        prior = engine_spec(config.fit_model, config.device).prior()
    return Replica(
        name=config.name or f"{parts.hostname}:{parts.port or 80}",
        url=config.url,
        speed=speed,
        slots=slots,
        models=set(config.models),
        declared_models=bool(config.models),
        device_model=config.device,
        prior=prior,
    )


def parse_replica_flag(text: str) -> ReplicaConfig:
    """``URL[=WHAT][,key=value...]`` from ``hetero serve --replica``.

    The URL alone is enough. ``WHAT`` is a catalog GPU name (``A100-80GB``) or ``speed:2.5``;
    keys: ``slots``, ``models`` (``a|b``), ``name``, ``fit_model``, ``context``, ``speed``,
    ``device``. Raises ``ConfigError`` on field ``--replica`` naming the bad part.
    """
    url, sep, rest = text.partition("=")
    if sep and not rest:
        raise ConfigError(
            [("--replica", f"expected URL or URL=GPU or URL=speed:N[,slots=N,...], got {text!r}")]
        )
    data: dict[str, object] = {"url": url}
    options: list[str] = []
    if rest:
        what, *options = rest.split(",")
        if what.startswith("speed:"):
            data["speed"] = what.removeprefix("speed:")
        elif "=" in what:
            options.insert(0, what)  # URL=slots=4: no GPU, only options
        else:
            data["device"] = what
    for option in options:
        key, eq, value = option.partition("=")
        if not eq or key not in _FLAG_KEYS:
            raise ConfigError(
                [
                    (
                        "--replica",
                        f"bad option {option!r} in {text!r}; allowed: "
                        + ", ".join(f"{k}=..." for k in _FLAG_KEYS),
                    )
                ]
            )
        data[key] = value.split("|") if key == "models" else value
    try:
        return ReplicaConfig.model_validate(data)
    except ValidationError as exc:
        problems = [
            (
                "--replica",
                f"{text!r}: {'.'.join(str(p) for p in err['loc']) or 'value'}: "
                + str(err["msg"]).removeprefix("Value error, "),
            )
            for err in exc.errors()
        ]
        raise ConfigError(problems) from None
