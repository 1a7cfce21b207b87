"""Reports of simulation runs: rich tables for the terminal and one self-contained HTML file.

The HTML report embeds its plots as base64 PNG (matplotlib, Agg backend) so it can be mailed or
attached as one file: the comparison table, utilization per device over time for each policy,
the latency CDF of every policy, the fleet's queue length over time, and the config and workload
that produced them. Every piece of text is escaped.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from rich.table import Table

from hetero._format import number, percent, ratio, seconds
from hetero._html import BASE_STYLE, html_table
from hetero._tables import FitTable
from hetero.sim.result import SimResult
from hetero.telemetry.measures import imbalance_grade

__all__ = ["comparison_table", "utilization_table", "write_html_report"]

#: Above this many devices, utilization is shown per model (the mean of its devices).
MAX_DEVICE_COLUMNS = 16
_CDF_POINTS = 2000

# Short headers so that the most telling columns (policy to SLO) fit in 80 columns; the legend
# under the table says what each means (and why items failed, per policy).
_COLUMNS = (
    "policy",
    "items/s",
    "mean",
    "p50",
    "p99",
    "SLO",
    "work/s",
    "balance",
    "imbalance",
    "efficiency",
    "rejected",
    "failed",
)
# On a narrow console the columns first in this order stay longest (the policy always stays):
# throughput, the tail and the SLO are what policies are compared on; work/s repeats items/s
# in work units, and the legend names the failures.
_KEEP_FIRST = (
    "items/s",
    "p99",
    "SLO",
    "mean",
    "p50",
    "imbalance",
    "cache hits",
    "failed",
    "efficiency",
    "balance",
    "rejected",
    "work/s",
)
_HINT = "--json shows every figure"


def _cached(results: Sequence[SimResult]) -> bool:
    """Whether any run modelled a prefix cache and looked prompts up in it."""
    return any(r.prefix_hit_rate is not None for r in results)


def _columns(results: Sequence[SimResult]) -> tuple[str, ...]:
    return (*_COLUMNS, "cache hits") if _cached(results) else _COLUMNS


def _rows(results: Sequence[SimResult]) -> list[list[str]]:
    cached = _cached(results)
    rows = []
    for r in results:
        m = r.metrics
        hits = r.prefix_hit_rate
        rows.append(
            [
                r.policy,
                number(m.throughput),
                seconds(m.mean),
                seconds(m.p50),
                seconds(m.p99),
                percent(r.slo_attainment) if r.slo_latency is not None else "-",
                number(m.work_throughput),
                ratio(m.load_balance_factor),
                _imbalance(m.imbalance),
                percent(m.makespan_efficiency),
                f"{r.rejected:,}",
                f"{r.failed:,}",
                *([percent(hits) if hits is not None else "-"] if cached else []),
            ]
        )
    return rows


def _imbalance(value: float) -> str:
    """``1.59 poor``: the ratio (two decimals, as the grade's bounds have) and seed 001's grade
    of it; ``idle, poor`` when a device did nothing, where the ratio is infinite (a number
    would say nothing more, and an infinite one reads as a fault of the report)."""
    grade = imbalance_grade(value)
    if grade is None:
        return "-"
    return f"idle, {grade}" if math.isinf(value) else f"{ratio(value)} {grade}"


def _slo(results: Sequence[SimResult]) -> float | None:
    return next((r.slo_latency for r in results if r.slo_latency is not None), None)


def _legend(results: Sequence[SimResult]) -> str:
    """What the comparison's short headers mean."""
    slo = _slo(results)
    within = (
        f"share of items done within {seconds(slo)}" if slo is not None else "none in the workload"
    )
    hits = (
        "; cache hits: share of prompt blocks found in the prefix cache" if _cached(results) else ""
    )
    return (
        f"mean, p50, p99: latency; SLO: {within}; balance: mean/highest device utilization "
        "(1.0: all equally busy); imbalance: highest/lowest device utilization (seed 001's "
        "load balance factor: < 1.1 excellent, < 1.2 good, > 1.5 poor; idle: a device did "
        "nothing); "
        "efficiency: ideal/actual makespan" + hits + _failures(results)
    )


def _failures(results: Sequence[SimResult]) -> str:
    """Why items failed, each reason with the policies it struck and how often:
    ``; failed: timed out after 30s (round_robin 285, weighted 41)``; empty when none did."""
    by_reason: dict[str, list[str]] = {}
    for r in results:
        for reason, n in r.failure_reasons.items():
            by_reason.setdefault(reason, []).append(f"{r.policy} {n:,}")
    return "".join(
        f"; failed: {reason} ({', '.join(counts)})" for reason, counts in by_reason.items()
    )


def comparison_table(results: list[SimResult]) -> Table:
    """One row per policy: throughput, mean/p50/p99 latency, SLO attainment, balance, imbalance,
    makespan efficiency, rejected, failed; on a narrow console the least telling columns are
    left out, and a line under the table names them."""
    table = FitTable(
        title="Policy comparison", caption=_legend(results), caption_justify="left", hint=_HINT
    )
    for i, name in enumerate(_columns(results)):
        table.add_column(
            name,
            justify="left" if i == 0 else "right",
            no_wrap=i == 0,
            priority=len(_KEEP_FIRST) - _KEEP_FIRST.index(name) if i else None,
        )
    for row in _rows(results):
        table.add_row(*row)
    return table


def _groups(results: Sequence[SimResult]) -> tuple[list[str], bool]:
    """Column names (device ids, or models when the fleet is large) and whether they are models."""
    ids: list[str] = []
    models: list[str] = []
    for r in results:
        ids.extend(d for d in r.device_ids if d not in ids)
        models.extend(m for m in r.device_models if m not in models)
    if len(ids) > MAX_DEVICE_COLUMNS:
        return models, True
    return ids, False


def _utilization(result: SimResult, columns: list[str], by_model: bool) -> list[float]:
    """Mean utilization over the run per column (device or model); NaN where absent."""
    values: dict[str, list[float]] = {}
    model_of = dict(zip(result.device_ids, result.device_models, strict=False))
    for d in result.metrics.devices:
        key = model_of.get(d.id, d.model) if by_model else d.id
        values.setdefault(key, []).append(d.utilization)
    return [float(np.mean(values[c])) if c in values else math.nan for c in columns]


def utilization_table(results: list[SimResult]) -> Table:
    """Utilization per device (or per model, mean of its devices, above 16 devices) per policy.

    On a narrow console the columns of the devices whose utilization differs least between the
    policies are left out first (a line under the table names them): those that tell the
    policies apart stay."""
    columns, by_model = _groups(results)
    title = "Utilization per model (mean of its devices)" if by_model else "Utilization per device"
    rows = [(r.policy, _utilization(r, columns, by_model)) for r in results]
    table = FitTable(title=title, caption_justify="left", hint=_HINT)
    table.add_column("policy", no_wrap=True)
    for n, c in enumerate(columns):
        table.add_column(c, justify="right", priority=_spread([u[n] for _, u in rows]))
    for policy, utilization in rows:
        table.add_row(policy, *(percent(u) for u in utilization))
    return table


def _spread(values: list[float]) -> float:
    """How far apart the policies put one device's utilization (NaN where a policy's run had no
    such device): the highest less the lowest, 0 when fewer than two have it."""
    known = [v for v in values if not math.isnan(v)]
    return max(known) - min(known) if len(known) > 1 else 0.0


# --- HTML ---------------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="" src="data:image/png;base64,{data}">'


def _series_by_column(
    result: SimResult, columns: list[str], by_model: bool
) -> list[tuple[str, npt.NDArray[np.float64]]]:
    util = result.series.utilization
    if util.ndim != 2 or util.shape[0] == 0:
        return []
    keys = result.device_models if by_model else result.device_ids
    lines = []
    for c in columns:
        index = [i for i, k in enumerate(keys) if k == c and i < util.shape[1]]
        if index:
            lines.append((c, util[:, index].mean(axis=1)))
    return lines


def _cdf(latencies: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.float64], ...]:
    values = np.sort(latencies[np.isfinite(latencies) & (latencies > 0)])
    if values.size == 0:
        return np.zeros(0), np.zeros(0)
    fraction = np.arange(1, values.size + 1) / values.size
    if values.size > _CDF_POINTS:
        pick = np.unique(np.linspace(0, values.size - 1, _CDF_POINTS).astype(np.int64))
        values, fraction = values[pick], fraction[pick]
    return values, fraction


_STYLE = (
    BASE_STYLE
    + """
img { max-width: 100%; display: block; margin: 1em 0; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.85em; }
"""
)


def write_html_report(
    results: list[SimResult],
    path: str | Path,
    title: str,
    config_text: str = "",
    workload_text: str = "",
) -> Path:
    """Write one self-contained HTML file comparing ``results``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = Path(path)
    columns, by_model = _groups(results)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<h2>Comparison</h2>",
        html_table(_columns(results), _rows(results)),
    ]
    parts.append(f'<p class="note">{html.escape(_legend(results))}</p>')
    slo = _slo(results)
    util_rows = [
        [r.policy, *(percent(u) for u in _utilization(r, columns, by_model))] for r in results
    ]
    parts += [
        "<h2>Utilization</h2>",
        f'<p class="note">{"mean per model" if by_model else "per device"}, over the run</p>',
        html_table(["policy", *columns], util_rows),
    ]

    # Utilization over time: one panel per policy, one line per device (or model).
    with_series = [r for r in results if r.series.t.size]
    if with_series:
        fig = Figure(figsize=(10, 2.6 * len(with_series)), layout="constrained")
        axes = fig.subplots(len(with_series), 1, sharex=True, squeeze=False)[:, 0]
        for ax, r in zip(axes, with_series, strict=True):
            for label, line in _series_by_column(r, columns, by_model):
                ax.plot(r.series.t[: line.size], line, label=label, linewidth=1)
            ax.set_title(r.policy)
            ax.set_ylabel("utilization")
            ax.set_ylim(-0.02, 1.05)
            if len(columns) <= MAX_DEVICE_COLUMNS:
                ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
        axes[-1].set_xlabel("simulated time (s)")
        parts += ["<h2>Utilization over time</h2>", _png(fig)]
    else:
        parts.append('<p class="note">No time series were sampled.</p>')

    # Latency CDF: every policy on one plot, log x.
    fig = Figure(figsize=(8, 4.5), layout="constrained")
    ax = fig.subplots()
    plotted = False
    for r in results:
        x, y = _cdf(r.latencies)
        if x.size:
            ax.step(x, y, where="post", label=r.policy)
            plotted = True
    if plotted:
        ax.set_xscale("log")
        ax.set_xlabel("latency (s)")
        ax.set_ylabel("fraction of completed items")
        ax.set_ylim(0, 1.01)
        if slo is not None:
            ax.axvline(slo, color="grey", linestyle="--", linewidth=1, label="SLO")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        parts += ["<h2>Latency CDF</h2>", _png(fig)]
    else:
        parts.append('<p class="note">No item completed: no latency CDF.</p>')

    # Queue length over time: every policy on one plot.
    if with_series:
        fig = Figure(figsize=(8, 4), layout="constrained")
        ax = fig.subplots()
        for r in with_series:
            n = min(r.series.t.size, r.series.queue_length.size)
            ax.plot(r.series.t[:n], r.series.queue_length[:n], label=r.policy, linewidth=1)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("items waiting")
        ax.legend()
        ax.grid(True, alpha=0.3)
        parts += ["<h2>Queue length over time</h2>", _png(fig)]

    if config_text:
        parts += ["<h2>Fleet</h2>", f"<pre>{html.escape(config_text)}</pre>"]
    if workload_text:
        parts += ["<h2>Workload</h2>", f"<pre>{html.escape(workload_text)}</pre>"]
    parts.append("</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), "utf-8")
    return path
