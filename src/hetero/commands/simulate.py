"""``hetero simulate``: compare scheduling policies on a fleet in virtual time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hetero._cli_util import JsonOpt, ProgressBars, console, fail, print_json, print_problems
from hetero.config import load_config
from hetero.errors import ConfigError, HeteroError
from hetero.sched.prefix import DEFAULT_CAPACITY_BLOCKS

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add ``simulate`` to ``app``."""
    app.command("simulate")(simulate)


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
    ] = "round_robin,shortest_expected_delay,tail_budget",
    slots: Annotated[int, typer.Option(min=1, help="Items each device runs at once.")] = 1,
    cache_blocks: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Each device's prefix (KV) cache in prompt blocks, for workloads with prompts "
            f"(default {DEFAULT_CAPACITY_BLOCKS}).",
        ),
    ] = None,
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
            devices = build_fleet(fleet_config)
        else:
            assert fleet is not None
            devices = devices_from_names(fleet)
        with ProgressBars(progress and not as_json) as bars:
            results = run_simulation(
                devices,
                spec,
                names,
                scheduler=scheduler,
                slots=slots,
                progress=bars,
                cache_blocks=cache_blocks,
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
