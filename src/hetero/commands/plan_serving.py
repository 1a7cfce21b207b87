"""``hetero plan`` for a spec that names a model: which GPUs, how many, at which tensor-parallel
degree (see ``docs/fleet-sizing.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from hetero._cli_util import console, print_json
from hetero._tables import SplitTable

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
    table = SplitTable(
        title="simulator check (engine-faithful replicas, strategy slo)",
        caption="in SLO: share of requests within both TTFT and TPOT; cap: the plan's "
        "max_utilization in that round (a round that misses lowers it and plans again)",
        caption_justify="left",
    )
    for name in ("round", "cap", "in SLO", "target", "meets SLO"):
        table.add_column(name, justify="left" if name == "meets SLO" else "right")
    for name in ("TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "failed", "requests"):
        table.add_column(name, justify="right")
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
    table = SplitTable(
        title=f"{plan.model}: length buckets at {plan.rate:g} requests/s",
        caption="mean: prompt / output tokens; design: the longest prompt whose TTFT is "
        "checked / the longest request a replica must hold (within the SLO's percentile)",
        caption_justify="left",
    )
    for name in ("bucket", "requests", "prompt tokens", "output tokens", "mean", "design"):
        table.add_column(name, justify="right")
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
    table = SplitTable(
        title=f"cheapest fleet: ${plan.price_per_hour:,.2f}/hour, "
        f"${plan.price_per_million_requests:,.2f} per million requests "
        f"(solved in {plan.solve_seconds * 1000:,.0f} ms)",
        caption="TP: devices per replica (tensor parallel); util: planned load over capacity "
        "within the SLO; TPOT/TTFT: predicted at that load; buckets: those it serves",
        caption_justify="left",
    )
    for name in ("GPU", "TP", "replicas", "owned", "$/hour", "util", "TPOT", "TTFT"):
        table.add_column(name, justify="left" if name == "GPU" else "right")
    table.add_wrapping_column("buckets", width=16)
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
    table = SplitTable(title="each GPU")
    table.add_column("GPU")
    table.add_column("alone $/hour", justify="right")
    table.add_wrapping_column("why", width=40)
    for gpu, why in plan.why.items():
        alone = plan.single_type.get(gpu)
        table.add_row(gpu, f"{alone:,.2f}" if isinstance(alone, float) else "-", why)
    return table
