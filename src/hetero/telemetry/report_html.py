"""The profile as one self-contained HTML file: headline numbers, a per-device timeline, a table
and a utilization chart, and each rank's time in collectives where the profile has it, drawn as
inline SVG so the file needs no network, script or plotting library. Every string from the run
(task names, device ids and models, op names) is escaped.
"""

from __future__ import annotations

import html
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hetero._format import number, percent, ratio, seconds
from hetero._html import BASE_STYLE, html_table
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.telemetry.collectives import RankCollectives
    from hetero.telemetry.profile import DeviceSummary, Profile, ProfileSummary
    from hetero.telemetry.trace import DeviceInfo, TaskTrace

__all__ = ["render_html"]

# Size caps, so that a run of 100k attempts renders fast and stays small. Within a device row,
# an attempt joins the rect of same-status attempts before it when it starts within MERGE_PX of
# that rect's start, or when it touches the rect (a gap under MERGE_PX) while it or the attempt
# before it is narrower than MERGE_PX: attempts too small to see merge, wide ones keep their own
# rect and tooltip. Rect starts are then at least MERGE_PX apart, so a row holds at most
# PLOT_W / MERGE_PX + 1 rects per status however many attempts it ran. The timeline and the
# utilization chart draw the first MAX_ROWS devices; the table lists every device.
MERGE_PX = 1.0
MAX_ROWS = 200

PLOT_W = 800
ROW_H = 18
BAR_H = 12
TOP = 18  # room above the rows for the "ideal" and "end" labels
AXIS_H = 22
UTIL_W = 400
# Device labels are monospace, so the gutter left of the rows is sized to the longest one; a
# label longer than MAX_LABEL characters ends in "…" (its tooltip has the whole), which keeps
# the timeline within the page's 1,100 px.
LABEL_PX = 11
CHAR_W = 0.6 * LABEL_PX
MAX_LABEL = 36

_COLOURS = {"done": "#4e79a7", "cancelled": "#a0a0a0", "retried": "#f28e2b", "failed": "#e15759"}
_OTHER_COLOUR = "#76b7b2"
# Drawn in this order, so failures lie on top of the work around them.
_DRAW_ORDER = {"done": 0, "cancelled": 1, "retried": 2, "failed": 3}

_STYLE = (
    BASE_STYLE
    + """
svg { display: block; margin: 1em 0; font-size: 11px; }
.key { display: inline-block; width: 0.9em; height: 0.9em; margin: 0 0.3em 0 1em;
       vertical-align: middle; }
"""
    + f".label {{ font-family: ui-monospace, Menlo, monospace; font-size: {LABEL_PX}px; }}"
)


def render_html(profile: Profile, summary: ProfileSummary) -> str:
    """The whole report for ``profile`` (whose ``summary()`` is ``summary``)."""
    title = f"hetero profile: {profile.name}"
    rows = profile.rows()
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
    ]
    if not rows and summary.collectives:  # ranks' collectives alone: no fleet to chart
        return "\n".join(
            [
                *head,
                html_table(None, _collective_headline(summary)),
                _collectives(summary.collectives),
                "</body></html>",
            ]
        )
    gutter = _gutter([_label(info.id, info.model) for info, _ in rows[:MAX_ROWS]])
    parts = [
        *head,
        html_table(None, _headline(summary) + _collective_headline(summary)[1:]),
        "<h2>Timeline</h2>",
        _legend([t for _, traces in rows for t in traces]),
        _timeline(profile, summary, rows[:MAX_ROWS], gutter),
    ]
    if len(rows) > MAX_ROWS:
        parts.append(
            f'<p class="note">The charts show the first {MAX_ROWS} of {len(rows)} devices; '
            "the table lists all of them.</p>"
        )
    parts += [
        "<h2>Devices</h2>",
        html_table(
            [
                "device",
                "model",
                "speed (units/s)",
                "tasks",
                "attempts",
                "busy",
                "utilization",
                "compute",
                "transfer",
                "mean wait",
                "bytes in",
                "bytes out",
            ],
            [_device_row(d) for d in summary.devices],
        ),
        '<p class="note">busy: time running at least one attempt; compute: the sum of the '
        "attempts' run times; transfer: packing and unpacking arguments and results; mean wait: "
        "from hand-off to the engine to start, per attempt.</p>",
        "<h2>Utilization</h2>",
        _utilization(summary.devices[:MAX_ROWS], gutter),
    ]
    if summary.collectives:
        parts.append(_collectives(summary.collectives))
    parts.append("</body></html>")
    return "\n".join(parts)


def _headline(s: ProfileSummary) -> list[list[str]]:
    return [
        ["makespan", seconds(s.makespan)],
        ["ideal makespan (work / total speed)", seconds(s.ideal_makespan)],
        ["efficiency (ideal / makespan)", percent(s.efficiency)],
        ["load balance (mean utilization / highest)", ratio(s.load_balance)],
        [
            "imbalance (highest utilization / lowest; < 1.1 excellent, > 1.5 poor)",
            "a device idle" if s.imbalance == math.inf else ratio(s.imbalance),
        ],
        ["work done (cost units)", number(s.work)],
        ["tasks done", f"{s.done:,}"],
        ["tasks failed", f"{s.failed:,}"],
        ["attempts retried", f"{s.retried:,}"],
        ["attempts cancelled", f"{s.cancelled:,}"],
        ["devices", f"{len(s.devices):,}"],
    ]


def _collective_headline(s: ProfileSummary) -> list[list[str]]:
    """The window, then (when ranks made collectives) their time in them: the mean rank and the
    one that spent the most."""
    out = [["window", seconds(s.makespan)]]
    if s.collectives:
        most = max(s.collectives, key=lambda r: r.seconds)
        mean = sum(r.seconds for r in s.collectives) / len(s.collectives)
        out += [
            ["ranks with collectives (hetero.comm)", f"{len(s.collectives):,}"],
            [
                "time in collectives, mean rank / most",
                f"{seconds(mean)} / {seconds(most.seconds)} (rank {most.rank}, "
                f"{percent(most.share)} of its time)",
            ],
        ]
    return out


def _collectives(ranks: Sequence[RankCollectives]) -> str:
    """Per rank: its time in collectives, in all and by op (the slowest first), and a bar of
    the share of its time that was."""
    rows: list[list[str]] = []
    for r in ranks:
        span = r.ended - r.started
        rows.append(
            [
                str(r.rank),
                "all",
                f"{r.calls:,}",
                seconds(r.seconds),
                percent(r.share),
                seconds(r.seconds / r.calls if r.calls else None),
                format_size(r.bytes),
            ]
        )
        for name, op in sorted(r.ops.items(), key=lambda kv: (-kv[1].seconds, kv[0])):
            rows.append(
                [
                    "",
                    name,
                    f"{op.count:,}",
                    seconds(op.seconds),
                    percent(op.seconds / span if span > 0 else None),
                    seconds(op.seconds / op.count if op.count else None),
                    format_size(op.bytes),
                ]
            )
    shown = ranks[:MAX_ROWS]
    gutter = _gutter([f"rank {r.rank}" for r in shown])
    bars = [_svg_open(gutter + UTIL_W + 60, len(shown) * ROW_H + 4)]
    for i, r in enumerate(shown):
        y = i * ROW_H
        share = r.share or 0.0
        bars += [
            f'<text class="label" x="{gutter - 6:.1f}" y="{y + ROW_H - 5}" text-anchor="end">'
            f"rank {r.rank}</text>",
            f'<rect x="{gutter:.1f}" y="{y + 3}" width="{UTIL_W}" height="{BAR_H}" fill="#eee"/>',
            f'<rect x="{gutter:.1f}" y="{y + 3}" width="{max(0.0, min(share, 1.0)) * UTIL_W:.1f}" '
            f'height="{BAR_H}" fill="{_COLOURS["retried"]}"/>',
            f'<text x="{gutter + UTIL_W + 6:.1f}" y="{y + ROW_H - 5}">{percent(r.share)}</text>',
        ]
    bars.append("</svg>")
    return "\n".join(
        [
            "<h2>Collective communication</h2>",
            html_table(
                ["rank", "op", "calls", "time", "share of its time", "per call", "bytes"],
                rows,
            ),
            '<p class="note">time: what the rank spent blocked in hetero.comm calls (an '
            "async call: issuing it and its wait()); share: of the rank's profiled time; "
            "bytes: the tensors it passed. Communication inside DDP or FSDP (the Trainer's "
            "gradient reduction) is not made through hetero.comm and is not counted here.</p>",
            "<h3>Share of each rank's time in collectives</h3>",
            "\n".join(bars),
        ]
    )


def _device_row(d: DeviceSummary) -> list[str]:
    return [
        d.id,
        d.model,
        number(d.speed),
        f"{d.tasks:,}",
        f"{d.attempts:,}",
        seconds(d.busy),
        percent(d.utilization),
        seconds(d.compute),
        seconds(d.transfer),
        seconds(d.wait),
        format_size(d.bytes_in),
        format_size(d.bytes_out),
    ]


def _legend(traces: list[TaskTrace]) -> str:
    counts = Counter(t.status for t in traces)
    keys = "".join(
        f'<span class="key" style="background:{_colour(status)}"></span>'
        f"{html.escape(status)} ({n:,})"
        for status, n in sorted(counts.items(), key=lambda kv: _order(kv[0]))
    )
    return f'<p class="note">One row per device, one bar per attempt:{keys}</p>'


def _label(device_id: str, model: str) -> str:
    """A device's label: its id, then its model unless the id already names it
    (``h100-sxm-80gb:0``, ``cpu:0 AMD EPYC``), cut to ``MAX_LABEL`` characters."""
    text = device_id if model.casefold() in device_id.casefold() else f"{device_id} {model}"
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _gutter(labels: Sequence[str]) -> float:
    """The width left of the rows: the longest label and a margin."""
    return max((len(label) for label in labels), default=0) * CHAR_W + 12


def _label_svg(device_id: str, model: str, right: float, y: float) -> str:
    """The label of a row, right-aligned at ``right``; its tooltip names device and model."""
    return (
        f'<text class="label" x="{right:.1f}" y="{y}" text-anchor="end">'
        f"{html.escape(_label(device_id, model))}"
        f"<title>{html.escape(device_id)} {html.escape(model)}</title></text>"
    )


def _timeline(
    profile: Profile,
    s: ProfileSummary,
    rows: list[tuple[DeviceInfo, list[TaskTrace]]],
    gutter: float,
) -> str:
    origin, _ = profile.window()
    last = max((t.ended - origin for t in profile.traces), default=0.0)
    span = max(s.makespan, s.ideal_makespan or 0.0, last)
    span = span if span > 0 else 1.0

    def x(t: float) -> float:
        return gutter + (t - origin) / span * PLOT_W

    height = TOP + len(rows) * ROW_H + AXIS_H
    out = [_svg_open(gutter + PLOT_W + 40, height)]
    for i, (info, traces) in enumerate(rows):
        y = TOP + i * ROW_H
        if i % 2:
            out.append(
                f'<rect x="{gutter:.1f}" y="{y}" width="{PLOT_W}" height="{ROW_H}" fill="#f6f6f6"/>'
            )
        out.append(_label_svg(info.id, info.model, gutter - 6, y + ROW_H - 5))
        out += _rects(traces, x, y + (ROW_H - BAR_H) / 2)
    bottom = TOP + len(rows) * ROW_H
    for i in range(5):
        tx = gutter + PLOT_W * i / 4
        out.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="#444"/>'
        )
        out.append(
            f'<text x="{tx:.1f}" y="{bottom + 16}" text-anchor="middle">'
            f"{seconds(span * i / 4)}</text>"
        )
    out.append(
        f'<line x1="{gutter:.1f}" x2="{gutter + PLOT_W:.1f}" y1="{bottom}" y2="{bottom}" '
        'stroke="#444"/>'
    )
    # "ideal" to the left of its line and "end" to the right of its own, so both stay legible
    # when the two nearly coincide.
    if s.ideal_makespan is not None:
        out.append(_marker(x(origin + s.ideal_makespan), bottom, "ideal", "end", "#2a9d3f"))
    out.append(_marker(x(origin + s.makespan), bottom, "end", "start", "#222"))
    out.append("</svg>")
    return "\n".join(out)


def _rects(traces: list[TaskTrace], x: Callable[[float], float], y: float) -> list[str]:
    """The rects of one device row, attempts merged as the ``MERGE_PX`` comment says."""
    by_status: dict[str, list[TaskTrace]] = {}
    for t in traces:
        by_status.setdefault(t.status, []).append(t)
    out: list[str] = []
    for status in sorted(by_status, key=_order):
        run: list[TaskTrace] = []
        x0 = x1 = last_width = 0.0
        for t in sorted(by_status[status], key=lambda t: t.started):
            left, right = x(t.started), x(max(t.ended, t.started))
            small = min(right - left, last_width) < MERGE_PX
            if run and (left - x0 < MERGE_PX or (left - x1 < MERGE_PX and small)):
                run.append(t)
                x1, last_width = max(x1, right), right - left
                continue
            if run:
                out.append(_rect(run, x0, x1, y))
            run, x0, x1, last_width = [t], left, right, right - left
        if run:
            out.append(_rect(run, x0, x1, y))
    return out


def _rect(run: list[TaskTrace], x0: float, x1: float, y: float) -> str:
    first = run[0]
    if len(run) == 1:
        tip = (
            f"{first.name} (task {first.task_id}, attempt {first.attempt}, {first.status}): "
            f"{seconds(first.ended - first.started)}" + (f" — {first.error}" if first.error else "")
        )
    else:
        tip = f"{len(run):,} {first.status} attempts"
    return (
        f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 1.0):.1f}" height="{BAR_H}" '
        f'fill="{_colour(first.status)}"><title>{html.escape(tip)}</title></rect>'
    )


def _marker(at: float, bottom: float, label: str, anchor: str, colour: str) -> str:
    dx = -3 if anchor == "end" else 3
    return (
        f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{TOP - 4}" y2="{bottom}" stroke="{colour}" '
        f'stroke-dasharray="4 3"/>'
        f'<text x="{at + dx:.1f}" y="{TOP - 6}" text-anchor="{anchor}" fill="{colour}">'
        f"{label}</text>"
    )


def _utilization(devices: Sequence[DeviceSummary], gutter: float) -> str:
    out = [_svg_open(gutter + UTIL_W + 60, len(devices) * ROW_H + 4)]
    for i, d in enumerate(devices):
        y = i * ROW_H
        width = max(0.0, min(d.utilization, 1.0)) * UTIL_W
        out += [
            _label_svg(d.id, d.model, gutter - 6, y + ROW_H - 5),
            f'<rect x="{gutter:.1f}" y="{y + 3}" width="{UTIL_W}" height="{BAR_H}" fill="#eee"/>',
            f'<rect x="{gutter:.1f}" y="{y + 3}" width="{width:.1f}" height="{BAR_H}" '
            f'fill="{_COLOURS["done"]}"/>',
            f'<text x="{gutter + UTIL_W + 6:.1f}" y="{y + ROW_H - 5}">'
            f"{percent(d.utilization)}</text>",
        ]
    out.append("</svg>")
    return "\n".join(out)


def _svg_open(width: float, height: float) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">'
    )


def _order(status: str) -> float:
    return _DRAW_ORDER.get(status, 1.5)


def _colour(status: str) -> str:
    return _COLOURS.get(status, _OTHER_COLOUR)
