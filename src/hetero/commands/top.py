"""``hetero top``: the devices of a running Context, live; or a snapshot of a fleet's devices."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from hetero._cli_util import console, fail
from hetero._tables import FitTable
from hetero.config import load_config
from hetero.devices.spec import Device, DeviceKind
from hetero.errors import HeteroError

if TYPE_CHECKING:  # the runtime package is imported when the command runs, not for --help
    from hetero.runtime.device_probe import DeviceSample
    from hetero.runtime.status import DeviceStatus, StatusSnapshot

__all__ = ["register"]

_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")

# In the order shown. On a narrow console the columns of lowest priority are left out (and
# named under the table): the id stays, and names the model of an emulated device already.
_PRIORITY = {
    "health": 9,
    "speed": 8,
    "util": 7,
    "run": 6,
    "queue": 5,
    "done": 4,
    "model": 3,
    "fail": 2,
    "memory": 1,
    "temp": 0,
}
_TEXT_COLUMNS = ("id", "model", "health")
_MODEL_WIDTH = 10
_STATUS_COLUMNS = (
    *_TEXT_COLUMNS,
    "speed",
    "run",
    "queue",
    "done",
    "fail",
    "util",
    "memory",
    "temp",
)
_SNAPSHOT_COLUMNS = (*_TEXT_COLUMNS, "speed", "util", "memory", "temp")

# psutil's system CPU share is measured between two calls; the first one sets the start.
_CPU_WINDOW_S = 0.1


def register(app: typer.Typer) -> None:
    """Add ``top`` to ``app``."""
    app.command("top")(top)


def top(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Fleet config: watch the Context running it, or, when none is, show a snapshot "
            "of its devices. Default: the newest Context, else this machine's devices.",
            show_default=False,
        ),
    ] = None,
    pid: Annotated[
        int | None,
        typer.Option("--pid", help="Watch the Context of this process id.", show_default=False),
    ] = None,
    serve: Annotated[
        str | None,
        typer.Option(
            "--serve",
            metavar="URL",
            help="Watch the replicas of a running `hetero serve` at URL instead.",
            show_default=False,
        ),
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            "--admin-key",
            envvar="HETERO_ADMIN_KEY",
            help="With --serve: the router's admin key, to see what only it shows (each "
            "replica's engine, capacity and why its load is unknown).",
            show_default=False,
        ),
    ] = None,
    once: Annotated[bool, typer.Option("--once", help="Print one view and exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", metavar="SECONDS", help="Seconds between refreshes.")
    ] = 1.0,
) -> None:
    """Watch the devices of a running hetero Context, refreshed until Ctrl-C.

    Per device: health, learned and prior speed, tasks, utilization, memory and temperature.

    With --once, or when the output is not a terminal, it prints one view and exits.

    With --serve URL: a running router's replicas (state, speeds, requests, tokens/s, latency).

    Examples: `hetero top`, `hetero top --pid 4242 --once`, `hetero top -c fleet.yaml`,
    `hetero top --serve http://127.0.0.1:8080`.
    """
    from hetero.runtime.status import read_statuses

    if not (interval > 0 and math.isfinite(interval)):
        fail(f"--interval must be a positive number of seconds, got {interval:g}", code=2)
    if serve is not None:
        _top_serve(serve, once, interval, admin_key)
        return
    statuses = read_statuses()
    if pid is not None:
        chosen = _find(statuses, pid)
        if chosen is None:
            running = ", ".join(str(s["pid"]) for s in statuses) or "none"
            fail(f"--pid {pid}: no running hetero Context has that pid; running: {running}", 2)
    else:
        mine = (
            statuses if config is None else [s for s in statuses if _same_file(s["config"], config)]
        )
        chosen = mine[-1] if mine else None  # the newest
    if chosen is None:
        _snapshot(config, statuses)
    elif once or not console.is_terminal:
        console.print(_status_view(chosen, time.time()))
    else:
        _watch(console, chosen["pid"], interval)


def _top_serve(url: str, once: bool, interval: float, key: str | None) -> None:
    from hetero.commands.top_serve import fetch_status, serve_view, watch_serve

    try:
        if once or not console.is_terminal:
            console.print(serve_view(fetch_status(url, key), url))
        else:
            watch_serve(console, url, interval, key)
    except OSError as exc:
        fail(f"--serve {url}: {exc}", code=1)


def _find(statuses: list[StatusSnapshot], pid: int) -> StatusSnapshot | None:
    return next((s for s in statuses if s["pid"] == pid), None)


def _same_file(published: str | None, given: Path) -> bool:
    return published is not None and Path(published).resolve() == given.resolve()


def _watch(out: Console, pid: int, interval: float) -> None:
    """Redraw the view of Context ``pid`` every ``interval`` seconds until it ends or Ctrl-C."""
    from hetero.runtime.status import read_statuses

    try:
        with Live(console=out, auto_refresh=False) as live:
            while (status := _find(read_statuses(), pid)) is not None:
                live.update(_status_view(status, time.time()), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:  # the way to leave; not an error
        return
    out.print(f"hetero Context {pid} has ended", highlight=False)


def _snapshot(config: Path | None, others: list[StatusSnapshot]) -> None:
    """A one-off view of ``config``'s devices (this machine's without one); ``others`` are the
    running Contexts of other configs, named so that one can be picked with --pid."""
    from hetero.runtime.device_probe import sample_devices

    try:
        from hetero.devices.fleet import fleet_for

        fleet = fleet_for(load_config(config) if config is not None else None)
    except HeteroError as exc:
        fail(str(exc), code=2)
    if any(d.kind is DeviceKind.CPU and not d.emulated for d in fleet):
        time.sleep(_CPU_WINDOW_S)  # discovery started psutil's CPU window; let it measure
    samples = sample_devices((d, None) for d in fleet)
    where = str(config) if config is not None else "this machine"
    console.print(Text(f"no running hetero Context found; showing a snapshot of {where}"))
    if others:
        running = ", ".join(f"{s['pid']} ({s['config'] or 'no config file'})" for s in others)
        console.print(Text(f"other Contexts are running (watch one with --pid): {running}"))
    console.print(_snapshot_table(fleet, samples))


# --- rendering ------------------------------------------------------------------------------


def _status_view(status: StatusSnapshot, now: float) -> RenderableType:
    tasks = status["tasks"]
    head = Text(
        f"hetero Context {status['pid']} · up {_duration(now - status['started'])}"
        f" · updated {_duration(now - status['updated'])} ago\n"
        f"config: {status['config'] or 'none (built in code)'}"
    )
    totals = Text(
        f"tasks: {tasks['submitted']:,} submitted, {tasks['done']:,} done, "
        f"{tasks['failed']:,} failed, {tasks['running']:,} running, {tasks['waiting']:,} waiting"
    )
    return Group(head, totals, _status_table(status["devices"]))


def _status_table(devices: list[DeviceStatus]) -> Table:
    table = FitTable(
        caption="speed: learned / prior, work units per second of device time (time_scale "
        "taken out); util: % busy; —: not measured",
        caption_justify="left",
    )
    _add_columns(table, _STATUS_COLUMNS)
    for d in devices:
        # Ids and models come from config files: text, never rich markup.
        table.add_row(
            Text(d["id"]),
            Text(d["model"]),
            _health(d["healthy"]),
            f"{_speed(d['speed'])} / {_speed(d['prior_speed'])}",
            f"{d['running']:,}",
            f"{d['queued']:,}",
            f"{d['done']:,}",
            f"{d['failed']:,}",
            _percent(d["utilization"]),
            _memory(d["memory_used"], d["memory_total"]),
            _celsius(d["temperature"]),
        )
    return table


def _snapshot_table(fleet: list[Device], samples: list[DeviceSample]) -> Table:
    table = FitTable(
        title=f"{len(fleet)} device{'' if len(fleet) == 1 else 's'}",
        caption="speed: relative to a V100; util: % busy; —: not measured",
        caption_justify="left",
    )
    _add_columns(table, _SNAPSHOT_COLUMNS)
    for device, sample in zip(fleet, samples, strict=True):
        table.add_row(
            Text(device.id),
            Text(device.model),
            _health(sample.healthy),
            f"{device.speed:.2f}",
            _percent(sample.utilization),
            _memory(sample.memory_used, sample.memory_total),
            _celsius(sample.temperature),
        )
    return table


def _add_columns(table: FitTable, headers: tuple[str, ...]) -> None:
    for header in headers:
        if header == "model":  # a CPU's model name is long: it wraps rather than go
            table.add_wrapping_column(header, width=_MODEL_WIDTH, priority=_PRIORITY[header])
            continue
        table.add_column(
            header,
            justify="left" if header in _TEXT_COLUMNS else "right",
            priority=_PRIORITY.get(header),
        )


def _health(healthy: bool) -> str:
    return "[green]healthy[/]" if healthy else "[red]unhealthy[/]"


def _speed(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}" if value >= 0.01 else f"{value:.2g}"


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}%"


def _celsius(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}°C"


def _memory(used: int | None, total: int | None) -> str:
    """``12.5 / 80 GiB``: both in the unit of the larger, so the cell stays narrow."""
    if used is None and total is None:
        return "—"
    power, largest = 0, max(used or 0, total or 0)
    while largest >= 1024 ** (power + 1) and power < len(_BINARY_UNITS) - 1:
        power += 1
    shown = ["—" if v is None else _short(v / 1024**power) for v in (used, total)]
    return f"{shown[0]} / {shown[1]} {_BINARY_UNITS[power]}"


def _short(value: float) -> str:
    """A few digits, no exponent, no trailing zeros: ``0.49``, ``23.5``, ``80``, ``1023``."""
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _duration(seconds: float) -> str:
    """``42s``, ``5m12s``, ``3h05m``: a clock skew below zero reads as ``0s``."""
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
