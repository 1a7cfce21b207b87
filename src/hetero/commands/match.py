"""``hetero match``: rank a fleet's devices for a piece of work, with the reasons for each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hetero._cli_util import (
    JsonOpt,
    console,
    err_console,
    fail,
    parse_kinds,
    print_json,
    print_problems,
)
from hetero._format import count
from hetero._tables import FitTable
from hetero.config import load_config
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DTYPES, Device
from hetero.errors import ConfigError, HeteroError
from hetero.plan.match import (
    CRITERIA,
    DEFAULT_BANDWIDTH_EFFICIENCY,
    DEFAULT_COMPUTE_EFFICIENCY,
    Match,
    Requirements,
    ScoreWeights,
    match,
    training_flops,
)
from hetero.plan.memory import FitRequest, memory_breakdown
from hetero.plan.models import get_model
from hetero.units import parse_size

__all__ = ["register"]

# Requirements/ScoreWeights name their fields; the user typed options.
_OPTION = {
    "memory_bytes": "--memory",
    "require": "--require",
    "prefer": "--prefer",
    "dtype": "--dtype",
    "work_flops": "--flops",
    "bytes_moved": "--bytes",
    "latency_slo": "--slo",
    "min_throughput": "--min-throughput",
    "train": "--train",
    "max_price_per_hour": "--max-price",
    "compute_efficiency": "--compute-efficiency",
    "bandwidth_efficiency": "--bandwidth-efficiency",
}


def _as_options(exc: ConfigError) -> ConfigError:
    """``exc`` with field names replaced by the options the user typed."""

    def option(path: str) -> str:
        head, _, rest = path.partition(".")
        if head == "weights":
            return "--weights" + (f" ({rest})" if rest else "")
        return _OPTION.get(path, path)

    def words(message: str) -> str:
        # Only snake_case names: plain ones ("dtype") are ordinary words in messages too.
        for name, flag in _OPTION.items():
            if "_" in name:
                message = message.replace(name, flag)
        return message

    return ConfigError([(option(path), words(message)) for path, message in exc.problems])


def _names(text: str) -> frozenset[str]:
    return frozenset(filter(None, (p.strip() for p in text.split(","))))


def _catalog_devices(kinds: list[str]) -> list[Device]:
    try:
        wanted = parse_kinds(kinds)
    except ValueError as exc:
        raise ConfigError([("--kind", str(exc))]) from None
    return [
        Device(id=spec.model.lower(), spec=spec, emulated=True)
        for spec in get_catalog()
        if not wanted or spec.kind in wanted
    ]


def _devices(
    fleet: str | None, config: Path | None, catalog: bool, kinds: list[str]
) -> list[Device]:
    given = [
        name
        for name, on in (("--fleet", fleet), ("--config", config), ("--catalog", catalog))
        if on
    ]
    if len(given) != 1:
        which = f"got {' and '.join(given)}" if given else "got none"
        raise ConfigError([("", f"give exactly one of --fleet, --config or --catalog ({which})")])
    if kinds and not catalog:
        raise ConfigError([("--kind", "only applies with --catalog")])
    if catalog:
        return _catalog_devices(kinds)
    if fleet is not None:
        from hetero.sim.run import devices_from_names

        return devices_from_names(fleet)
    assert config is not None
    from hetero.devices.fleet import build_fleet

    try:
        return build_fleet(load_config(config))
    except ConfigError as exc:
        raise ConfigError(
            [
                (f"--config {config}" + (f": {path}" if path else ""), msg)
                for path, msg in exc.problems
            ]
        ) from None


def _size(option: str, text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise ConfigError([(option, str(exc))]) from None


def _work(
    memory: str | None, model: str | None, seq: int, batch: int, train: bool, flops: float | None
) -> tuple[int, float | None]:
    """Bytes each device needs and FLOPs per request (sample): as given, or with ``model``
    what ``hetero fit`` estimates (``--train``: the training fit, and 6 × parameters × seq
    FLOPs per sample unless ``flops`` is given)."""
    if model is None:
        return (0 if memory is None else _size("--memory", memory)), flops
    if memory is not None:
        raise ConfigError([("--memory", "give --memory or --model, not both")])
    shape = get_model(model)
    fit = FitRequest(seq=seq, batch=batch, train=train).resolved(shape)
    if train and flops is None:
        flops = training_flops(shape, seq)
    return sum(memory_breakdown(shape, fit).values()), flops


def _table(matches: list[Match], weights: dict[str, float]) -> Table:
    eligible = sum(m.eligible for m in matches)
    caption = "weights: " + ", ".join(f"{name} {weights[name]:.2f}" for name in CRITERIA)
    # The rank and the id always stay; on a narrow console the scores of the criteria that
    # weigh least go first, then the model (the reasons below name it), and the eligibility
    # and the total last.
    table = FitTable(
        title=f"{count(len(matches), 'device')}, {eligible} eligible",
        caption=caption,
        caption_justify="left",
        key_columns=2,
        hint="--json shows every score",
    )
    table.add_column("#", justify="right")
    table.add_column("device")
    table.add_column("model", priority=2)
    table.add_column("eligible", priority=4)
    table.add_column("total", justify="right", priority=3)
    for name in CRITERIA:
        # Weights are in [0, 1] and sum to 1: below the model's priority.
        table.add_column(name, justify="right", priority=weights[name])
    for rank, m in enumerate(matches, 1):
        table.add_row(
            str(rank),
            m.device.id,
            m.device.model,
            "[green]yes[/]" if m.eligible else "[red]no[/]",
            f"{m.total:.3f}",
            *(f"{m.scores[name]:.2f}" for name in CRITERIA),
        )
    return table


def match_command(
    fleet: Annotated[
        str | None,
        typer.Option(help="Devices by catalog name and count, e.g. --fleet A100-80GB:2,T4:4."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="A fleet config file, e.g. --config examples/mixed_fleet.yaml."
        ),
    ] = None,
    catalog: Annotated[
        bool,
        typer.Option(
            "--catalog", help="One device of every catalog model, e.g. --catalog --kind gpu."
        ),
    ] = False,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            help="With --catalog: only this kind (repeatable), e.g. --kind gpu --kind tpu."
        ),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(help="Free memory each device needs, e.g. --memory 40GB (or 40GiB)."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Instead of --memory: what this model needs at --seq and --batch, for inference "
            "or with --train for training (as `hetero fit` estimates it), e.g. --model llama-3-8b.",
        ),
    ] = None,
    seq: Annotated[
        int, typer.Option(min=1, help="With --model: context length in tokens, e.g. --seq 8192.")
    ] = 4096,
    batch: Annotated[
        int,
        typer.Option(
            min=1,
            help="With --model: sequences at once (with --train, the micro-batch per device), "
            "e.g. --batch 8.",
        ),
    ] = 1,
    train: Annotated[
        bool,
        typer.Option(
            "--train",
            help="Training work: times and throughput per sample; with --model, training memory "
            "(weights, gradients, optimizer states, activations) and 6 × parameters × --seq "
            "FLOPs per sample unless --flops is given, e.g. --train --model llama-3-8b.",
        ),
    ] = False,
    require: Annotated[
        str,
        typer.Option(
            help="Capabilities a device must have, comma-separated, e.g. --require fp8,nvlink."
        ),
    ] = "",
    prefer: Annotated[
        str,
        typer.Option(
            help="Capabilities that score but are not required, e.g. --prefer transformer_engine."
        ),
    ] = "",
    dtype: Annotated[
        str,
        typer.Option(
            help=f"Number format the work runs in ({', '.join(DTYPES)}), e.g. --dtype fp8."
        ),
    ] = "bf16",
    memory_bound: Annotated[
        bool,
        typer.Option(
            "--memory-bound",
            help="Decode-like work: 3/4 of the compute weight moves to bandwidth, "
            "e.g. --memory-bound.",
        ),
    ] = False,
    flops: Annotated[
        float | None,
        typer.Option(
            "--flops",
            help="FLOPs per request (per sample with --train), for the time estimate, "
            "e.g. --flops 2e12.",
        ),
    ] = None,
    bytes_moved: Annotated[
        str | None,
        typer.Option("--bytes", help="Bytes read from memory per request, e.g. --bytes 16GB."),
    ] = None,
    slo: Annotated[
        float | None,
        typer.Option(
            help="Reject devices whose estimated seconds per request exceed this, e.g. --slo 0.5."
        ),
    ] = None,
    min_throughput: Annotated[
        float | None,
        typer.Option(
            help="Reject devices whose estimated requests (samples with --train) per second "
            "fall below this, e.g. --min-throughput 20.",
        ),
    ] = None,
    max_price: Annotated[
        float | None,
        typer.Option(
            help="Reject devices above this $/hour (and unpriced ones), e.g. --max-price 3.0."
        ),
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option(
            help="Criterion weights; unnamed ones are 0. Default "
            "compute=0.4,bandwidth=0.3,features=0.1,cost=0.2, e.g. --weights compute=1,cost=1."
        ),
    ] = None,
    compute_efficiency: Annotated[
        float,
        typer.Option(
            help="Share of peak TFLOPS the work reaches, in (0, 1], e.g. --compute-efficiency 0.4."
        ),
    ] = DEFAULT_COMPUTE_EFFICIENCY,
    bandwidth_efficiency: Annotated[
        float,
        typer.Option(
            help="Share of peak memory bandwidth reached, in (0, 1], "
            "e.g. --bandwidth-efficiency 0.7."
        ),
    ] = DEFAULT_BANDWIDTH_EFFICIENCY,
    top: Annotated[
        int | None, typer.Option(min=1, help="Show only the N best devices, e.g. --top 3.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Rank devices for a piece of work, inference or training: filter (health, memory,
    capabilities, latency SLO, minimum throughput, price), then score (compute, bandwidth,
    features, cost), with every device's reasons.

    Examples: hetero match --fleet A100-80GB:2,T4:4 --memory 40GB --require bf16 --top 3;
    hetero match --fleet H100-SXM-80GB,A100-80GB,L4 --train --model llama-3-8b --seq 2048
    --min-throughput 5
    """
    try:
        devices = _devices(fleet, config, catalog, kind or [])
        needed, work_flops = _work(memory, model, seq, batch, train, flops)
        try:
            requirements = Requirements(
                memory_bytes=needed,
                require=_names(require),
                prefer=_names(prefer),
                dtype=dtype,
                memory_bound=memory_bound,
                work_flops=work_flops,
                bytes_moved=None if bytes_moved is None else _size("--bytes", bytes_moved),
                latency_slo=slo,
                max_price_per_hour=max_price,
                compute_efficiency=compute_efficiency,
                bandwidth_efficiency=bandwidth_efficiency,
                train=train,
                min_throughput=min_throughput,
            )
            score_weights = ScoreWeights() if weights is None else ScoreWeights.parse(weights)
        except ConfigError as exc:
            raise _as_options(exc) from None
    except ConfigError as exc:
        print_problems(exc, "error: ")
        raise typer.Exit(1) from None
    except HeteroError as exc:
        fail(str(exc))
    matches = match(devices, requirements, score_weights)[:top]
    effective = score_weights.effective(memory_bound)
    if as_json:
        print_json(
            {
                "requirements": requirements.to_dict(),
                "weights": effective,
                "matches": [m.to_dict() for m in matches],
            }
        )
        return
    console.print(_table(matches, effective))
    if not any(m.eligible for m in matches):
        err_console.print("[yellow]no device meets every requirement; see the reasons below[/]")
    for rank, m in enumerate(matches, 1):
        verdict = "eligible" if m.eligible else "rejected"
        console.print(
            f"\n{rank}. {m.device.id} ({m.device.model}): {verdict}", markup=False, highlight=False
        )
        for reason in m.reasons:
            console.print(f"   {reason}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    """Add ``match`` to ``app``."""
    app.command("match")(match_command)
