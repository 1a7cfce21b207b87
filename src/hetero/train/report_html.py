"""A training run's step reports as one self-contained HTML file, in the simulator's report style
(``hetero simulate --report``): tables, and plots embedded as base64 PNG (matplotlib, Agg), so the
file can be mailed or attached alone. It shows how every rank spent each step — compute, data,
exposed communication, idle — as stacked bars over the steps, one panel per rank on one time
scale, and the loss over the global batch (with the learning rate and the gradient norm when they
were recorded). Every piece of text is escaped. Plain data: no torch needed.
"""

from __future__ import annotations

import base64
import html
import io
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetero._html import BASE_STYLE, html_table
from hetero.errors import ConfigError
from hetero.train.report import StepReport

__all__ = ["write_training_report"]

#: Above this many steps the bars show consecutive steps in bins (each bin's mean per step), so
#: a long run draws as fast as a short one; the loss curve keeps every step.
MAX_BARS = 200
#: The steps table lists at most this many steps, evenly spread (the first and the last among
#: them); the loss of every step is in the list below it.
MAX_TABLE_ROWS = 100

# The parts of a rank's step, in stacking order, and their colours (the profiler's palette).
_PARTS = (
    ("compute", "compute_seconds", "#4e79a7"),
    ("data", "data_seconds", "#76b7b2"),
    ("comm", "comm_seconds", "#f28e2b"),
    ("idle", "idle_seconds", "#bab0ac"),
)

_STYLE = (
    BASE_STYLE
    + """
img { max-width: 100%; display: block; margin: 1em 0; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.85em; max-height: 20em; }
"""
)


def write_training_report(
    reports: Sequence[StepReport],
    path: str | Path,
    *,
    title: str = "hetero training run",
    labels: Sequence[str] | None = None,
) -> Path:
    """Write one self-contained HTML file of ``reports`` (a run's ``StepReport``s, in step
    order: ``Trainer.reports``, or ``StepReport.from_dict`` of each line of ``report_path``);
    returns its path. ``labels`` names the ranks (one each, e.g. the device a rank emulates);
    by default ``rank 0``, ``rank 1``, ..."""
    if not reports:
        raise ConfigError([("reports", "must hold at least one step report, got none")])
    world = len(reports[0].ranks)
    if labels is None:
        labels = [f"rank {i}" for i in range(world)]
    elif len(labels) != world:
        raise ConfigError(
            [("labels", f"must name each of the {world} ranks once, got {list(labels)!r}")]
        )
    path = Path(path)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        html_table(*_headline(reports)),
        "<h2>Ranks</h2>",
        html_table(*_rank_rows(reports, labels)),
        '<p class="note">Means per step. compute: forward and backward (and emulated pacing); '
        "data: waiting for micro-batches; comm: the gradient reduction the last backward did not "
        "hide; idle: waiting for the slowest rank.</p>",
        "<h2>Time per step, by rank</h2>",
        _png(_time_figure(reports, labels)),
    ]
    if any(r.loss is not None for r in reports):
        parts += ["<h2>Loss</h2>", _png(_loss_figure(reports))]
    parts += ["<h2>Steps</h2>", html_table(*_step_rows(reports))]
    losses = [r for r in reports if r.loss is not None]
    if losses:
        lines = "\n".join(f"{r.step} {_float(r.loss)}" for r in losses)
        parts += [
            "<details><summary>The loss at every step (step, mean loss over the global batch)"
            f"</summary><pre>{html.escape(lines)}</pre></details>"
        ]
    parts.append("</body></html>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), "utf-8")
    return path


# --- tables -------------------------------------------------------------------------------------


def _float(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _headline(reports: Sequence[StepReport]) -> tuple[list[str], list[list[str]]]:
    step = statistics.median(r.step_seconds for r in reports)
    ideal = statistics.median(r.ideal_seconds for r in reports)
    losses = [r.loss for r in reports if r.loss is not None]
    loss = f"{_float(losses[0])} → {_float(losses[-1])}" if losses else "-"
    row = [
        f"{reports[0].step}–{reports[-1].step}",
        str(len(reports[0].ranks)),
        "/".join(map(str, reports[-1].shares)),
        _ms(step),
        _ms(ideal),
        f"{ideal / step:.0%}" if step > 0 else "-",
        str(sum(r.rebalanced for r in reports)),
        loss,
    ]
    header = [
        "steps",
        "ranks",
        "last shares",
        "median step ms",
        "ideal ms",
        "efficiency",
        "rebalances",
        "loss, first → last",
    ]
    return header, [row]


def _rank_rows(
    reports: Sequence[StepReport], labels: Sequence[str]
) -> tuple[list[str], list[list[str]]]:
    rows = []
    for i, label in enumerate(labels):
        mine = [r.ranks[i] for r in reports]
        compute = sum(x.compute_seconds for x in mine)
        rows.append(
            [
                label,
                str(reports[-1].shares[i]),
                f"{sum(x.samples for x in mine) / compute:.1f}" if compute > 0 else "-",
                *(_ms(statistics.mean(getattr(x, key) for x in mine)) for _, key, _ in _PARTS),
                _ms(statistics.mean(x.step_seconds for x in mine)),
            ]
        )
    header = ["rank", "last share", "samples/s", "compute ms", "data ms", "comm ms", "idle ms"]
    return [*header, "step ms"], rows


def _step_rows(reports: Sequence[StepReport]) -> tuple[list[str], list[list[str]]]:
    if len(reports) > MAX_TABLE_ROWS:
        last = len(reports) - 1
        picks = {round(k * last / (MAX_TABLE_ROWS - 1)) for k in range(MAX_TABLE_ROWS)}
        shown = [reports[k] for k in sorted(picks)]
    else:
        shown = list(reports)
    rows = [
        [
            str(r.step),
            str(r.epoch),
            "/".join(map(str, r.shares)),
            _float(r.loss),
            _float(r.lr),
            _float(r.grad_norm),
            _ms(r.step_seconds),
            _ms(r.ideal_seconds),
            f"{r.efficiency:.0%}",
            "/".join(map(str, r.next_shares)) if r.rebalanced else "",
        ]
        for r in shown
    ]
    header = ["step", "epoch", "shares", "loss", "lr", "grad norm", "step ms", "ideal ms"]
    return [*header, "efficiency", "rebalanced to"], rows


# --- plots --------------------------------------------------------------------------------------


def _figure(height: float) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(10, height), layout="constrained")


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="" src="data:image/png;base64,{data}">'


def _bins(reports: Sequence[StepReport]) -> list[Sequence[StepReport]]:
    """Consecutive steps in at most ``MAX_BARS`` bins of near-equal length."""
    count = min(len(reports), MAX_BARS)
    size, extra = divmod(len(reports), count)
    out, start = [], 0
    for k in range(count):
        end = start + size + (k < extra)
        out.append(reports[start:end])
        start = end
    return out


def _time_figure(reports: Sequence[StepReport], labels: Sequence[str]) -> Any:
    """One panel per rank, sharing both axes: each step's (or bin's mean) time, stacked."""
    bins = _bins(reports)
    x = [b[0].step + (b[-1].step - b[0].step) / 2 for b in bins]
    width = [0.8 * (b[-1].step - b[0].step + 1) for b in bins]
    fig = _figure(1.2 + 1.6 * len(labels))
    axes = fig.subplots(len(labels), 1, sharex=True, sharey=True, squeeze=False)[:, 0]
    for i, (ax, label) in enumerate(zip(axes, labels, strict=True)):
        bottom = [0.0] * len(bins)
        for name, key, colour in _PARTS:
            heights = [1e3 * statistics.mean(getattr(r.ranks[i], key) for r in b) for b in bins]
            ax.bar(x, heights, width, bottom=bottom, color=colour, label=name)
            bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
        ax.set_title(label, loc="left", fontsize="medium")
        ax.set_ylabel("ms")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
    binned = len(bins) < len(reports)
    axes[-1].set_xlabel("step" + (" (bars: the mean step of each bin of steps)" if binned else ""))
    return fig


def _loss_figure(reports: Sequence[StepReport]) -> Any:
    """The loss over the steps; below it the learning rate when it changed and the gradient
    norm when it was recorded."""
    series = [("mean loss over the global batch", [r.loss for r in reports])]
    rates = {r.lr for r in reports if r.lr is not None}
    if len(rates) > 1:
        series.append(("learning rate", [r.lr for r in reports]))
    if any(r.grad_norm is not None for r in reports):
        series.append(("gradient norm (before clipping)", [r.grad_norm for r in reports]))
    fig = _figure(0.6 + 2.4 * len(series))
    axes = fig.subplots(len(series), 1, sharex=True, squeeze=False)[:, 0]
    steps = [r.step for r in reports]
    for ax, (name, values) in zip(axes, series, strict=True):
        ys = [math.nan if v is None else v for v in values]
        ax.plot(steps, ys, linewidth=1, marker="." if len(steps) <= 50 else None)
        ax.set_ylabel(name, fontsize="small")
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    return fig
