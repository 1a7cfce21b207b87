"""Replicas as the scheduling core sees them: a ``Device`` each, with its slots.

A replica is its URL. Its GPU, ``speed`` and ``slots`` are optional *priors*: the router learns
each replica's per-request speed from its replies and its capacity (the requests it takes at
once) from its replies and its engine's published load (``hetero.sched.capacity``).

A replica's ``speed`` is how fast *one* request runs there; the core's speed is a device's
throughput with every slot busy (``Dispatcher`` runs each item at ``speed / slots``), so the
replica becomes a device of speed ``per-request speed × slots``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from hetero._errors_render import show, validation_problems
from hetero.config import ReplicaConfig
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device, DeviceKind, DeviceSpec
from hetero.errors import ConfigError
from hetero.sched.engine_fit import EnginePrior
from hetero.sched.perf import REFERENCE_BANDWIDTH_GBS

__all__ = [
    "REPLICA_GRAMMAR",
    "UNKNOWN_SPEED",
    "Replica",
    "parse_replica_flag",
    "replica_config",
    "replica_from_config",
    "same_engine",
]

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

#: What ``hetero serve --replica`` accepts, and an example of it: every error of the flag ends
#: with them, since a misplaced ``=`` or ``,`` otherwise reads as some other part gone wrong.
REPLICA_GRAMMAR = (
    "URL or URL=GPU or URL=speed:N, then any of ,key=value (keys: "
    + ", ".join(_FLAG_KEYS)
    + "), e.g. http://10.0.0.5:8000=A100-80GB,slots=8 or http://10.0.0.6:8000,slots=8"
)


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
    try:
        slots = config.slots or _fit_slots(config)
        prior = None
        if config.device is not None and config.fit_model is not None:
            from hetero.serve.engine_model import engine_spec

            prior = engine_spec(config.fit_model, config.device).prior()
    except ConfigError as exc:  # hetero fit's own field is "model": here it is fit_model
        raise ConfigError(
            [("fit_model" if field == "model" else field, why) for field, why in exc.problems]
        ) from None
    parts = urlsplit(config.url)
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


#: The fields of a replica's config, as the admin API and a ``replicas:`` entry take them.
_FIELDS = tuple(ReplicaConfig.model_fields)


def replica_config(data: Any) -> ReplicaConfig:
    """``data`` (a JSON object: the admin API's body) as a replica's config; ``ConfigError``
    names each bad field with its value and what is allowed."""
    if not isinstance(data, dict):
        raise ConfigError(
            [
                (
                    "",
                    f"expected a JSON object of a replica's fields ({', '.join(_FIELDS)}; url "
                    f'required, e.g. {{"url": "http://10.0.0.5:8000", "slots": 8}}), '
                    f"got {show(data)}",
                )
            ]
        )
    # Pydantic reads true as 1: a flag where a count belongs is a mistake, not one slot.
    problems = [
        (key, f"must be a number, not true or false (got {show(value)})")
        for key, value in data.items()
        if key in ("speed", "slots", "context") and isinstance(value, bool)
    ]
    try:
        config = ReplicaConfig.model_validate(data)
    except ValidationError as exc:
        problems += [
            (path, _allowed(path, message))
            for path, message in validation_problems(exc, data, ReplicaConfig, {})
        ]
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return config


def _allowed(path: str, message: str) -> str:
    """A problem's message saying what is allowed: for an unknown field, the fields (the
    closest first); for a missing URL, what one looks like."""
    if path == "url" and message == "required field is missing":
        return "required: the replica's base URL, e.g. http://10.0.0.5:8000"
    if not message.startswith("unknown key"):
        return message
    close = difflib.get_close_matches(path, _FIELDS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown field {path!r}; {hint}allowed: {', '.join(_FIELDS)}"


def _address(url: str) -> tuple[str, str, int, str]:
    """What identifies the server behind a base URL: scheme, host (any case), port (the
    scheme's default when none is written) and path, so ``http://H`` and ``http://h:80/`` are
    one engine."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port, parts.path.rstrip("/")


def same_engine(url: str, replicas: Iterable[Replica]) -> Replica | None:
    """The replica of ``replicas`` at the same address as ``url``, if one is: a second replica
    there would count one engine twice (twice its share of requests, half its speed learned
    per replica)."""
    address = _address(url)
    return next((r for r in replicas if _address(r.url) == address), None)


def parse_replica_flag(text: str) -> ReplicaConfig:
    """``URL[=WHAT][,key=value...]`` from ``hetero serve --replica``.

    The URL alone is enough; it ends at the first ``=`` or ``,``. ``WHAT`` is a catalog GPU name
    (``A100-80GB``) or ``speed:2.5``; keys: ``slots``, ``models`` (``a|b``), ``name``,
    ``fit_model``, ``context``, ``speed``, ``device``. Raises ``ConfigError`` on field
    ``--replica`` naming the bad part and ending with what the flag accepts
    (``REPLICA_GRAMMAR``).
    """

    def bad(*whys: str) -> ConfigError:
        *first, last = whys
        lines = [*first, f"{last}; expected {REPLICA_GRAMMAR}"]
        return ConfigError([("--replica", f"{text!r}: {why}") for why in lines])

    cut = min((i for i in (text.find("="), text.find(",")) if i >= 0), default=len(text))
    url, sep, rest = text[:cut], text[cut : cut + 1], text[cut + 1 :]
    data: dict[str, object] = {"url": url}
    options = rest.split(",") if sep else []
    if sep == "=":
        what = options.pop(0)
        if not what:
            raise ConfigError(
                [("--replica", f"expected {REPLICA_GRAMMAR}; got {text!r}, nothing after '='")]
            )
        if what.startswith("speed:"):
            data["speed"] = what.removeprefix("speed:")
        elif "=" in what:
            options.insert(0, what)  # URL=slots=4: no GPU, only options
        elif what.partition(":")[0] in _FLAG_KEYS:  # URL=slots:8
            key, _, value = what.partition(":")
            raise bad(
                f"{what!r} is neither a GPU nor speed:N; options are key=value after a comma, "
                f"as in URL,{key}={value or 'N'}"
            )
        else:
            data["device"] = what
    for option in options:
        key, eq, value = option.partition("=")
        if not option:
            raise bad("an empty option (two commas in a row, or one at the end)")
        if not eq or key not in _FLAG_KEYS:
            close = difflib.get_close_matches(key, _FLAG_KEYS, n=1)
            hint = f" (did you mean {close[0]}=...?)" if close and key != close[0] else ""
            why = "not key=value" if not eq else f"unknown key {key!r}"
            raise bad(f"bad option {option!r}: {why}{hint}")
        if key in data:
            raise bad(f"{key} is given twice")
        data[key] = value.split("|") if key == "models" else value
    try:
        return ReplicaConfig.model_validate(data)
    except ValidationError as exc:
        raise bad(
            *(f"{path}: {why}" for path, why in validation_problems(exc, data, ReplicaConfig, {}))
        ) from None
