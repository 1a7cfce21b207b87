"""Replicas as the scheduling core sees them: a ``Device`` each, with its slots.

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
from hetero.sched.perf import REFERENCE_BANDWIDTH_GBS

__all__ = ["DEFAULT_SLOTS", "Replica", "parse_replica_flag", "replica_from_config"]

#: Requests at once on a replica whose slots are neither declared nor derivable.
DEFAULT_SLOTS = 8

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
    """One replica: where it is, what it serves and how fast one request runs there."""

    name: str
    url: str
    speed: float  # relative speed of one request (V100 = 1.0)
    slots: int
    models: set[str]
    declared_models: bool  # models from the config/flag; else learned from /v1/models
    device_model: str | None = None

    def device(self) -> Device:
        spec = get_catalog().get(self.device_model) if self.device_model else _UNKNOWN_GPU
        return Device(
            id=self.name,
            spec=spec,
            node=urlsplit(self.url).hostname or "localhost",
            emulated=True,  # the router never touches the GPU itself
            speed_override=self.speed * self.slots,
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
    """The replica a ``replicas:`` entry describes (slots declared, from ``hetero fit``, or 8)."""
    if config.speed is not None:
        speed = config.speed
    else:
        assert config.device is not None  # the config requires one of the two
        speed = get_catalog().get(config.device).memory_bandwidth_gbs / REFERENCE_BANDWIDTH_GBS
    slots = config.slots or _fit_slots(config) or DEFAULT_SLOTS
    parts = urlsplit(config.url)
    return Replica(
        name=config.name or f"{parts.hostname}:{parts.port or 80}",
        url=config.url,
        speed=speed,
        slots=slots,
        models=set(config.models),
        declared_models=bool(config.models),
        device_model=config.device,
    )


def parse_replica_flag(text: str) -> ReplicaConfig:
    """``URL=WHAT[,key=value...]`` from ``hetero serve --replica``.

    ``WHAT`` is a catalog GPU name (``A100-80GB``) or ``speed:2.5``; keys: ``slots``, ``models``
    (``a|b``), ``name``, ``fit_model``, ``context``. Raises ``ConfigError`` on field
    ``--replica`` naming the bad part.
    """
    url, sep, rest = text.partition("=")
    if not sep or not rest:
        raise ConfigError(
            [("--replica", f"expected URL=GPU or URL=speed:N[,slots=N,...], got {text!r}")]
        )
    what, *options = rest.split(",")
    data: dict[str, object] = {"url": url}
    if what.startswith("speed:"):
        data["speed"] = what.removeprefix("speed:")
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
