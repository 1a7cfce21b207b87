"""``hetero plan`` for a spec that names a model: which GPUs, how many, at which tensor-parallel
degree (see ``docs/fleet-sizing.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from hetero._cli_util import console, print_json
from hetero._tables import FitTable
from hetero.commands.plan import HINT

if TYPE_CHECKING:
    from hetero.plan.serving import ServingPlan
    from hetero.plan.serving_verify import ServingVerification

__all__ = ["show_serving_plan"]


def show_serving_plan(plan: ServingPlan, checks: list[ServingVerification], as_json: bool) -> None:
    """Print ``plan`` and its simulator checks as tables (or JSON)."""
    if as_json:
        doc = plan.to_dict()
        if checks:
            doc["verification"] = [c.to_dict() for c in checks]
        print_json(doc)
        return
    console.print(_buckets(plan))
    console.print(_fleet(plan))
    console.print(_why(plan))
    if checks:
        console.print(_checks(checks))


def _checks(checks: list[ServingVerification]) -> Table:
    table = FitTable(
        title="simulator check (engine-faithful replicas, strategy slo)",
        caption="in SLO: share of requests within both TTFT and TPOT; cap: the plan's "
        "max_utilization in that round (a round that misses lowers it and plans again)",
        caption_justify="left",
        hint=HINT,
    )
    # On a narrow console the requests simulated go first, then the medians: whether the plan
    # met its SLO, at which cap, and the tails stay.
    table.add_column("round", justify="right")
    for name, priority in (
        ("cap", 8),
        ("in SLO", 10),
        ("target", 9),
        ("meets SLO", 11),
        ("TTFT p50", 3),
        ("TTFT p99", 7),
        ("TPOT p50", 2),
        ("TPOT p99", 6),
        ("failed", 5),
        ("requests", 1),
    ):
        table.add_column(
            name, justify="left" if name == "meets SLO" else "right", priority=priority
        )
    for k, c in enumerate(checks, start=1):
        verdict = "[green]yes[/]" if c.meets_slo else "[red]no[/]"
        table.add_row(
            str(k),
            f"{c.max_utilization:.0%}",
            f"{c.attainment:.2%}",
            f"{c.target:.0%}",
            verdict + (", re-planned" if not c.meets_slo and k < len(checks) else ""),
            f"{c.ttft_p50:,.2f} s",
            f"{c.ttft_p99:,.2f} s",
            f"{c.tpot_p50 * 1e3:,.1f} ms",
            f"{c.tpot_p99 * 1e3:,.1f} ms",
            str(c.failed),
            f"{c.requests:,}",
        )
    return table


def _buckets(plan: ServingPlan) -> Table:
    table = FitTable(
        title=f"{plan.model}: length buckets at {plan.rate:g} requests/s",
        caption="mean: prompt / output tokens; design: the longest prompt whose TTFT is "
        "checked / the longest request a replica must hold (within the SLO's percentile)",
        caption_justify="left",
        hint=HINT,
    )
    # On a narrow console the means go first, then the design lengths.
    for name, priority in (
        ("bucket", None),
        ("requests", 5),
        ("prompt tokens", 4),
        ("output tokens", 3),
        ("mean", 1),
        ("design", 2),
    ):
        table.add_column(name, justify="right", priority=priority)
    for b in plan.buckets:
        table.add_row(
            str(b.index),
            f"{b.probability:.1%}",
            f"{b.prompt_range[0]:,}–{b.prompt_range[1]:,}",
            f"{b.output_range[0]:,}–{b.output_range[1]:,}",
            f"{b.prompt_mean:,.0f} / {b.output_mean:,.0f}",
            f"{b.design_prompt:,.0f} / {b.design_total:,.0f}",
        )
    return table


def _fleet(plan: ServingPlan) -> Table:
    table = FitTable(
        title=f"cheapest fleet: ${plan.price_per_hour:,.2f}/hour, "
        f"${plan.price_per_million_requests:,.2f} per million requests "
        f"(solved in {plan.solve_seconds * 1000:,.0f} ms)",
        caption="TP: devices per replica (tensor parallel); util: planned load over capacity "
        "within the SLO; TPOT/TTFT: predicted at that load; buckets: those it serves",
        caption_justify="left",
        hint=HINT,
    )
    # On a narrow console the buckets go first, then the devices owned (the table of each GPU
    # below names both): what to run (GPU, TP, replicas), its price, load and latencies stay.
    table.add_column("GPU")
    for name, priority in (
        ("TP", 9),
        ("replicas", 10),
        ("owned", 2),
        ("$/hour", 8),
        ("util", 7),
        ("TPOT", 5),
        ("TTFT", 6),
    ):
        table.add_column(name, justify="right", priority=priority)
    table.add_wrapping_column("buckets", width=16, priority=1)
    for o in plan.options:
        table.add_row(
            o.option.gpu,
            str(o.option.tensor_parallel),
            str(o.replicas),
            str(o.owned_devices),
            f"{o.price:,.2f}",
            f"{o.utilization:.0%}",
            f"{o.tpot * 1e3:,.1f} ms",
            f"{o.ttft:,.2f} s",
            ", ".join(str(b) for b in o.buckets),
        )
    return table


def _why(plan: ServingPlan) -> Table:
    table = FitTable(title="each GPU", caption_justify="left", hint=HINT)
    table.add_column("GPU")
    table.add_column("alone $/hour", justify="right", priority=1)
    table.add_wrapping_column("why", width=40, priority=2)
    for gpu, why in plan.why.items():
        alone = plan.single_type.get(gpu)
        table.add_row(gpu, f"{alone:,.2f}" if isinstance(alone, float) else "-", why)
    return table
