"""The ``hetero`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from hetero._cli_util import (
    JsonOpt,
    ProgressBars,
    console,
    err_console,
    fail,
    parse_kinds,
    print_json,
    print_problems,
)
from hetero._version import __version__
from hetero.commands import fit, match, plan, topology
from hetero.config import load_config
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DTYPES, Device, DeviceKind
from hetero.errors import ConfigError, HeteroError
from hetero.log import LOG_LEVELS, set_log_level
from hetero.units import format_size

app = typer.Typer(
    name="hetero",
    help="Run data-parallel work on a fleet of different accelerators, each kept busy in "
    "proportion to its speed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
catalog_app = typer.Typer(
    help="The accelerator catalog: specs, prices and value for money.", no_args_is_help=True
)
config_app = typer.Typer(help="Fleet config files (hetero_config.yaml).", no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")
app.add_typer(config_app, name="config")


def _version(value: bool) -> None:
    if value:
        console.print(f"hetero {__version__}")
        raise typer.Exit()


def _log_level(value: str) -> str:
    try:
        set_log_level(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    log_level: Annotated[
        str,
        typer.Option("--log-level", callback=_log_level, help=f"One of {', '.join(LOG_LEVELS)}."),
    ] = "WARNING",
) -> None:
    """hetero: heterogeneity-aware scheduling for mixed accelerator fleets."""


@app.command()
def devices(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Fleet config; default: this machine's devices."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the devices of a fleet config, or the ones discovered on this machine."""
    try:
        if config is None:
            from hetero.devices.discovery import get_device_list

            fleet = get_device_list()
        else:
            from hetero.devices.fleet import build_fleet

            fleet = build_fleet(load_config(config))
    except HeteroError as exc:
        fail(str(exc))
    if as_json:
        print_json([d.to_dict() for d in fleet])
        return
    console.print(_device_table(fleet))


def _device_table(fleet: list[Device]) -> Table:
    table = Table(title=f"{len(fleet)} devices")
    for col in (
        "id",
        "kind",
        "model",
        "memory",
        "fp32 TFLOPS",
        "fp16 TFLOPS",
        "speed",
        "emulated",
        "health",
    ):
        table.add_column(col, justify="right" if "TFLOPS" in col or col == "speed" else "left")
    for d in fleet:
        table.add_row(
            d.id,
            d.kind.value,
            d.model,
            format_size(d.memory_bytes),
            f"{d.spec.peak_tflops('fp32'):.1f}",
            f"{d.spec.peak_tflops('fp16'):.1f}",
            f"{d.speed:.2f}",
            "yes" if d.emulated else "no",
            "[green]healthy[/]" if d.state.healthy else "[red]unhealthy[/]",
        )
    return table


def _kinds(kind: list[str] | None) -> set[DeviceKind] | None:
    if not kind:
        return None
    try:
        return parse_kinds(kind)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kind") from None


KindOpt = Annotated[list[str] | None, typer.Option("--kind", help="Only this kind (repeatable).")]


@catalog_app.command("list")
def catalog_list(kind: KindOpt = None, as_json: JsonOpt = False) -> None:
    """List every model in the catalog."""
    kinds = _kinds(kind)
    specs = [s for s in get_catalog() if not kinds or s.kind in kinds]
    if as_json:
        print_json([_spec_dict(s) for s in specs])
        return
    table = Table(title=f"{len(specs)} accelerators (prices as of {get_catalog().price_date})")
    for col in (
        "model",
        "kind",
        "vendor",
        "memory",
        "GB/s",
        "fp32",
        "bf16/fp16",
        "fp8",
        "TDP W",
        "$/h",
    ):
        table.add_column(col, justify="left" if col in ("model", "kind", "vendor") else "right")
    for s in specs:
        fp8 = s.tflops.get("fp8")
        table.add_row(
            s.model,
            s.kind.value,
            s.vendor,
            format_size(s.memory_bytes),
            f"{s.memory_bandwidth_gbs:,.0f}",
            f"{s.peak_tflops('fp32'):.1f}",
            f"{s.peak_tflops('bf16'):.1f}",
            f"{fp8:.0f}" if fp8 else "-",
            f"{s.tdp_w:.0f}",
            f"{s.price_per_hour:.2f}" if s.price_per_hour is not None else "-",
        )
    console.print(table)


def _spec_dict(spec: Any) -> dict[str, Any]:
    return {
        "model": spec.model,
        "kind": spec.kind.value,
        "vendor": spec.vendor,
        "aliases": list(spec.aliases),
        "tflops": dict(spec.tflops),
        "memory_bytes": spec.memory_bytes,
        "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
        "interconnect": spec.interconnect,
        "interconnect_gbs": spec.interconnect_gbs,
        "tdp_w": spec.tdp_w,
        "price_per_hour": spec.price_per_hour,
        "capabilities": sorted(spec.capabilities),
        "source": spec.source,
        "notes": spec.notes,
    }


@catalog_app.command("show")
def catalog_show(
    name: Annotated[str, typer.Argument(help="Canonical name or a driver-reported name.")],
    as_json: JsonOpt = False,
) -> None:
    """Show one model's full spec."""
    try:
        spec = get_catalog().get(name)
    except HeteroError as exc:
        fail(str(exc))
    data = _spec_dict(spec)
    if as_json:
        print_json(data)
        return
    table = Table(title=spec.model, show_header=False)
    table.add_column("field")
    table.add_column("value")
    for key, value in data.items():
        if key == "memory_bytes":
            value = format_size(value)
        elif isinstance(value, dict):
            value = ", ".join(f"{k} {v:g}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(value) or "-"
        table.add_row(key, str(value))
    console.print(table)


@catalog_app.command("compare")
def catalog_compare(
    dtype: Annotated[str, typer.Option(help=f"Number format: {', '.join(DTYPES)}.")] = "bf16",
    by: Annotated[
        str, typer.Option(help="Rank by tflops_per_dollar, tflops_per_watt or gb_per_tflops.")
    ] = "tflops_per_dollar",
    kind: KindOpt = None,
    models: Annotated[list[str] | None, typer.Option("--model", help="Only these models.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Rank models by TFLOPS per $/hour, TFLOPS per watt and GB of memory per TFLOPS."""
    if dtype not in DTYPES:
        raise typer.BadParameter(f"{dtype!r}; allowed: {', '.join(DTYPES)}", param_hint="--dtype")
    catalog = get_catalog()
    try:
        wanted = {catalog.get(m).model for m in models} if models else None
        rows = catalog.compare(dtype=dtype, kinds=_kinds(kind), by=by)
    except (HeteroError, ValueError) as exc:
        fail(str(exc))
    rows = [r for r in rows if wanted is None or r.model in wanted]
    if as_json:
        print_json([r.to_dict() for r in rows])
        return
    table = Table(title=f"catalog compared on {dtype}, ranked by {by}")
    for col in ("#", "model", "kind", "TFLOPS", "$/h", "TFLOPS/$", "TFLOPS/W", "GB/TFLOPS"):
        table.add_column(col, justify="left" if col in ("model", "kind") else "right")

    def fmt(v: float | None, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    for rank, r in enumerate(rows, 1):
        table.add_row(
            str(rank),
            r.model,
            r.kind,
            f"{r.tflops:g}",
            fmt(r.price_per_hour, ".2f"),
            fmt(r.tflops_per_dollar, ".1f"),
            fmt(r.tflops_per_watt, ".3f"),
            fmt(r.gb_per_tflops, ".3f"),
        )
    console.print(table)


@config_app.command("validate")
def config_validate(file: Annotated[Path, typer.Argument(help="The YAML file to check.")]) -> None:
    """Check a fleet config; print every problem (field, bad value, what is allowed) and exit 1."""
    try:
        config = load_config(file)
    except ConfigError as exc:
        err_console.print(f"[bold red]{file}: {len(exc.problems)} problem(s)[/]", highlight=False)
        print_problems(exc, "  - ")
        raise typer.Exit(1) from None
    n = sum(d.count for d in config.devices)
    console.print(
        f"[green]ok[/]: {file}: {n} devices, strategy {config.scheduler.strategy}", highlight=False
    )


def run() -> None:
    """Entry point of the ``hetero`` script."""
    app()


@app.command()
def simulate(
    workload: Annotated[Path, typer.Option("--workload", "-w", help="Workload YAML/JSON file.")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Fleet config.")] = None,
    fleet: Annotated[
        str | None,
        typer.Option(
            help="Emulated fleet from catalog names instead of --config, "
            "e.g. A100-80GB:2,V100-32GB:2."
        ),
    ] = None,
    policies: Annotated[
        str, typer.Option(help="Comma-separated policy names to compare (see `hetero policies`).")
    ] = "round_robin,shortest_expected_delay,adaptive",
    slots: Annotated[int, typer.Option(min=1, help="Items each device runs at once.")] = 1,
    as_json: JsonOpt = False,
    report: Annotated[
        Path | None, typer.Option(help="Write an HTML report with plots here.")
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
) -> None:
    """Compare policies on a fleet in virtual time: throughput, latency, SLO, balance."""
    from hetero.sim.report import comparison_table, utilization_table, write_html_report
    from hetero.sim.run import devices_from_names
    from hetero.sim.run import simulate as run_simulation
    from hetero.sim.workload import load_workload

    if (config is None) == (fleet is None):
        raise typer.BadParameter("give exactly one of --config or --fleet", param_hint="--config")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise typer.BadParameter(f"{policies!r}: no policy names", param_hint="--policies")
    try:
        spec = load_workload(workload)
        scheduler = None
        if config is not None:
            from hetero.devices.fleet import build_fleet

            fleet_config = load_config(config)
            scheduler = fleet_config.scheduler
            devices_ = build_fleet(fleet_config)
        else:
            assert fleet is not None
            devices_ = devices_from_names(fleet)
        with ProgressBars(progress and not as_json) as bars:
            results = run_simulation(
                devices_, spec, names, scheduler=scheduler, slots=slots, progress=bars
            )
    except ConfigError as exc:
        print_problems(exc, "error: ")
        raise typer.Exit(1) from None
    except HeteroError as exc:
        fail(str(exc))
    if report is not None:
        texts = [p.read_text("utf-8") for p in (config, workload) if p is not None]
        write_html_report(
            results,
            report,
            title=f"hetero simulate: {workload.name}",
            config_text=texts[0] if config else f"--fleet {fleet}",
            workload_text=texts[-1],
        )
    if as_json:
        print_json([r.summary() for r in results])
        return
    console.print(comparison_table(results))
    console.print(utilization_table(results))
    if report is not None:
        console.print(f"report: {report}")


@app.command("policies")
def list_policies() -> None:
    """List the built-in scheduling policies and when to use each."""
    from hetero.sched.registry import policy_class, policy_names

    table = Table(title="policies (scheduler.strategy)")
    table.add_column("name")
    table.add_column("when to use it")
    for name in policy_names():
        doc = (policy_class(name).__doc__ or "").strip().split("\n\n")[0]
        table.add_row(name, " ".join(doc.split()))
    console.print(table)


# The planner's commands live in modules of their own; listed after the core ones in --help.
for _command in (fit, match, plan, topology):
    _command.register(app)
