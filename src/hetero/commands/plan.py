"""``hetero plan``: the cheapest device mix for a workload and its SLO, optionally verified in the
simulator (see ``docs/fleet-sizing.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from hetero._cli_util import (
    JsonOpt,
    ProgressBars,
    console,
    fail,
    print_json,
    print_problems,
)
from hetero._tables import FitTable
from hetero.errors import ConfigError, HeteroError

if TYPE_CHECKING:
    from hetero.plan.serving_verify import ServingVerification
    from hetero.plan.sizing import FleetPlan
    from hetero.plan.verification import Verification

__all__ = ["register"]

_EPILOG = (
    "Examples:\n\n"
    "  hetero plan examples/plan.yaml\n\n"
    "  hetero plan examples/plan.yaml --verify --requests 20000\n\n"
    "  hetero plan examples/plan.yaml --rate 60 --slo 2 --devices A100-80GB,L4,T4 --json\n\n"
    "  hetero plan examples/plan_model.yaml --verify\n\n"
    "  hetero plan examples/plan_model.yaml --model 8B --ttft 1 --tpot 0.05 --rate 20"
)

# A share of a bucket above this is the whole bucket (the solver's shares are floats).
_WHOLE = 0.999

#: Under a table that leaves columns out on a narrow console.
HINT = "--json shows every field"


def plan(
    spec_file: Annotated[
        Path, typer.Argument(metavar="SPEC", help="Plan spec, YAML or JSON (examples/plan.yaml).")
    ],
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Replay the plan in the simulator (shortest_expected_delay; a plan with a model: "
            "engine-faithful replicas under the slo strategy) and report SLO attainment; if it "
            "misses, tighten the utilisation caps and re-solve. E.g. --verify.",
        ),
    ] = False,
    requests: Annotated[
        int | None,
        typer.Option(
            help="Requests to simulate with --verify (default 20,000; 5,000 for a plan with a "
            "model), e.g. --requests 50000.",
            min=1,
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the --verify workload, e.g. --seed 7.")] = 0,
    rate: Annotated[
        float | None,
        typer.Option(min=1e-9, help="Override workload.rate (requests/s), e.g. --rate 80."),
    ] = None,
    slo: Annotated[
        float | None,
        typer.Option(min=1e-9, help="Override slo.latency (seconds), e.g. --slo 1.5."),
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            help="Replace the menu with catalog types (catalog price and speed), "
            "e.g. --devices A100-80GB,L4,T4."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Override the spec's model (a plan with a model): a built-in name, a Hugging "
            "Face id, a config.json or a parameter count, e.g. --model llama-3.1-70b or 70B.",
        ),
    ] = None,
    ttft: Annotated[
        float | None,
        typer.Option(min=1e-9, help="Override slo.ttft (seconds) of a plan with a model."),
    ] = None,
    tpot: Annotated[
        float | None,
        typer.Option(min=1e-9, help="Override slo.tpot (seconds) of a plan with a model."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Size a fleet: the cheapest integer mix of device types meeting the SLO (scipy MILP).

    A spec with a model (examples/plan_model.yaml) plans replicas of that model per GPU type
    and tensor-parallel degree within a TTFT/TPOT SLO; one without plans work units within a
    latency SLO (examples/plan.yaml)."""
    from hetero._data_files import read_data_file
    from hetero.plan.serving_spec import is_serving_spec
    from hetero.plan.sizing import InfeasiblePlan, plan_fleet
    from hetero.plan.sizing_spec import merge_overrides, parse_plan
    from hetero.plan.verification import plan_verified

    overrides: dict[str, Any] = {}
    if rate is not None:
        overrides["workload"] = {"rate": rate}
    if devices is not None:
        names = [n.strip() for n in devices.split(",") if n.strip()]
        if not names:
            raise typer.BadParameter(f"{devices!r}: no device names", param_hint="--devices")
        overrides["devices"] = [{"model": n} for n in names]
    try:
        data = read_data_file(spec_file, "plan spec")
        if is_serving_spec(data) or model is not None:
            if slo is not None:
                raise typer.BadParameter(
                    "a plan with a model has a TTFT and a TPOT SLO: use --ttft and --tpot",
                    param_hint="--slo",
                )
            model_checks = _plan_model(
                spec_file,
                data,
                overrides,
                (model, ttft, tpot),
                verify,
                requests or 5_000,
                seed,
                as_json,
            )
            if model_checks and not model_checks[-1].meets_slo:
                raise typer.Exit(1)
            return
        for flag, value in (("--ttft", ttft), ("--tpot", tpot)):
            if value is not None:
                raise typer.BadParameter(
                    "applies to a plan with a model (give model: in the spec, or --model)",
                    param_hint=flag,
                )
        if slo is not None:
            overrides["slo"] = {"latency": slo}
        if overrides and isinstance(data, dict):
            data = merge_overrides(data, overrides)
        spec = parse_plan(data, source=str(spec_file))
        if verify:
            with ProgressBars(not as_json) as bar:
                result, checks = plan_verified(
                    spec, requests=requests or 20_000, seed=seed, progress=bar
                )
        else:
            result, checks = plan_fleet(spec), []
    except ConfigError as exc:
        print_problems(exc, "error: ")
        raise typer.Exit(1) from None
    except InfeasiblePlan as exc:
        fail(f"no fleet meets the SLO: {exc}")
    except HeteroError as exc:
        fail(str(exc))
    if as_json:
        doc = result.to_dict()
        if verify:
            doc["verification"] = [c.to_dict() for c in checks]
        print_json(doc)
        return
    console.print(_bucket_table(result))
    console.print(_mix_table(result))
    console.print(_single_table(result))
    if checks:
        console.print(_verify_table(checks))
    if checks and not checks[-1].meets_slo:
        raise typer.Exit(1)


def _plan_model(
    spec_file: Path,
    data: Any,
    overrides: dict[str, Any],
    model_slo: tuple[str | None, float | None, float | None],
    verify: bool,
    requests: int,
    seed: int,
    as_json: bool,
) -> list[ServingVerification]:
    """Plan replicas of a model (``hetero.plan.serving``), check it in the engine-faithful
    simulator with ``verify``, print it and return the checks."""
    from hetero.commands.plan_serving import show_serving_plan
    from hetero.plan.serving import plan_serving
    from hetero.plan.serving_spec import parse_serving_plan
    from hetero.plan.serving_verify import serving_plan_verified
    from hetero.plan.sizing_spec import merge_overrides

    model, ttft, tpot = model_slo
    if model is not None:
        overrides["model"] = model
    slo = {k: v for k, v in (("ttft", ttft), ("tpot", tpot)) if v is not None}
    if slo:
        overrides["slo"] = slo
    if overrides and isinstance(data, dict):
        data = merge_overrides(data, overrides)
    spec = parse_serving_plan(data, source=str(spec_file), base_dir=spec_file.parent)
    if verify:
        with ProgressBars(not as_json) as bar:
            plan, checks = serving_plan_verified(spec, requests=requests, seed=seed, progress=bar)
    else:
        plan, checks = plan_serving(spec), []
    show_serving_plan(plan, checks, as_json)
    return checks


def _bucket_table(result: FleetPlan) -> Table:
    table = FitTable(
        title=f"length buckets: {result.load:,.0f} work units/s "
        f"({result.tokens_per_hour / 3600:,.0f} tokens/s)",
        caption_justify="left",
        hint=HINT,
    )
    # On a narrow console the mean tokens go first, then the design request.
    for name, priority in (
        ("bucket", None),
        ("requests", 4),
        ("work units", 3),
        ("mean tokens", 1),
        ("design request", 2),
    ):
        table.add_column(name, justify="right", priority=priority)
    for b in result.buckets:
        table.add_row(
            str(b.index),
            f"{b.probability:.1%}",
            f"{b.low:,.0f}–{b.high:,.0f}",
            f"{b.mean_tokens:,.0f}",
            f"{b.design_cost:,.0f}",
        )
    return table


def _served(buckets: Mapping[int, float]) -> str:
    """The buckets a type serves, with its share of those it splits; consecutive buckets it
    serves whole as a range: "1–9, 10 (41%)"."""
    runs: list[tuple[int, int, float]] = []  # (first, last, share)
    for b, share in buckets.items():
        if runs and share > _WHOLE and runs[-1][2] > _WHOLE and runs[-1][1] == b - 1:
            runs[-1] = (runs[-1][0], b, share)
        else:
            runs.append((b, b, share))
    cells: list[str] = []
    for first, last, share in runs:
        cell = f"{first}–{last}" if last > first else f"{first}"
        cells.append(cell if share > _WHOLE else f"{cell} ({share:.0%})")
    return ", ".join(cells)


def _mix_table(result: FleetPlan) -> Table:
    table = FitTable(
        title=f"cheapest mix: ${result.price_per_hour:,.2f}/hour, "
        f"${result.price_per_million_tokens:,.4f} per million tokens "
        f"(solved in {result.solve_seconds * 1000:,.0f} ms)",
        caption="units/s: work units per second of one, * where measured (else the catalog's); "
        "util: planned utilisation, at most cap; buckets: the length buckets it serves (its "
        "share of one it splits)",
        caption_justify="left",
        hint=HINT,
    )
    # On a narrow console the cap goes first, then the throughput and the price of one: the
    # count, the utilisation and the buckets served are the plan.
    table.add_column("type")
    for name, priority in (("count", 6), ("$/h each", 3), ("units/s", 2), ("util", 4), ("cap", 1)):
        table.add_column(name, justify="right", priority=priority)
    table.add_wrapping_column("buckets", width=16, priority=5)
    for t in result.types:
        table.add_row(
            t.model,
            str(t.count),
            f"{t.price:,.2f}",
            f"{t.throughput:,.0f}" + ("*" if t.measured else ""),
            f"{t.utilization:.0%}" if t.count else "-",
            f"{t.utilization_cap:.0%}" if t.count else "-",
            _served(t.buckets) or "-",
        )
    return table


def _single_table(result: FleetPlan) -> Table:
    table = FitTable(title="each type alone", caption_justify="left", hint=HINT)
    # On a narrow console the price per million tokens goes first (it follows from the price per
    # hour), then the price per hour: how many it takes, its cost against the mix and why a type
    # cannot do it alone stay.
    table.add_column("type")
    for name, priority in (("count", 5), ("$/hour", 2), ("$/M tokens", 1), ("vs mix", 3)):
        table.add_column(name, justify="right", priority=priority)
    table.add_wrapping_column("why not", width=30, priority=4)
    for s in result.single_type:
        if s.count is None:
            table.add_row(s.model, "-", "-", "-", "-", s.reason)
        else:
            assert s.price_per_hour is not None and s.price_per_million_tokens is not None
            ratio = s.price_per_hour / result.price_per_hour if result.price_per_hour else 1.0
            table.add_row(
                s.model,
                str(s.count),
                f"{s.price_per_hour:,.2f}",
                f"{s.price_per_million_tokens:,.4f}",
                f"{ratio:.2f}×",
                "",
            )
    return table


def _verify_table(checks: list[Verification]) -> Table:
    resolved = "re-solved: caps tightened and the plan solved again; " if len(checks) > 1 else ""
    table = FitTable(
        title="simulator check (shortest_expected_delay)",
        caption="in SLO: share of requests within the SLO latency; at target: latency at the "
        f"SLO percentile; {resolved}util: mean utilisation of each type",
        caption_justify="left",
        hint=HINT,
    )
    # On a narrow console the requests simulated go first, then p50, p99 and the utilisation:
    # whether the plan met its SLO, and by how much, stay.
    table.add_column("round", justify="right")
    for name, priority in (
        ("in SLO", 7),
        ("target", 6),
        ("meets SLO", 8),
        ("at target", 5),
        ("p50", 2),
        ("p99", 3),
    ):
        table.add_column(
            name, justify="left" if name == "meets SLO" else "right", priority=priority
        )
    table.add_wrapping_column("util", width=20, priority=4)
    table.add_column("requests", justify="right", priority=1)
    for k, c in enumerate(checks, start=1):
        table.add_row(
            str(k),
            f"{c.attainment:.2%}",
            f"{c.target:.0%}",
            "[green]yes[/]"
            if c.meets_slo
            else "[red]no[/], re-solved"
            if k < len(checks)
            else "[red]no[/]",
            f"{c.latency_at_percentile:.3f} s",
            f"{c.p50:.3f} s",
            f"{c.p99:.3f} s",
            ", ".join(f"{m} {u:.0%}" for m, u in c.utilization.items()),
            f"{c.requests:,}",
        )
    return table


def register(app: typer.Typer) -> None:
    """Add ``plan`` to ``app``."""
    app.command("plan", epilog=_EPILOG)(plan)
