"""``hetero plan`` for a spec that names a model: which GPUs, how many, at which tensor-parallel
degree (see ``docs/fleet-sizing.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from hetero._cli_util import console, print_json
from hetero._tables import SplitTable

if TYPE_CHECKING:
    from hetero.plan.serving import ServingPlan

__all__ = ["show_serving_plan"]


def show_serving_plan(plan: ServingPlan, as_json: bool) -> None:
    """Print ``plan`` as tables (or JSON)."""
    if as_json:
        print_json(plan.to_dict())
        return
    console.print(_buckets(plan))
    console.print(_fleet(plan))
    console.print(_why(plan))


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
