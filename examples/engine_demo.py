"""The execution engine on an emulated mixed fleet: round robin against the default strategy.

Multiplies matrices of mixed sizes with ``ctx.map`` on ``examples/emulated_fleet.yaml`` (an H100,
two A100s, a V100 and a T4, all emulated, so it runs on any machine), once with
``strategy="round_robin"`` and once with the default (``tail_budget``), profiles both
runs and prints one table: makespan against the ideal, efficiency, load balance and each
device's utilization. The profiler's reports (HTML and a Perfetto trace) go to ``--out``.

Each task declares its cost from the matrix size, so emulated devices pace it to
cost / speed × time_scale seconds; the real compute is kept small beside that, so the numbers
measure placement, not this machine.

    python examples/engine_demo.py                     # about 30 s on 2 cores
    python examples/engine_demo.py --items 800 --time-scale 0.05
    python examples/engine_demo.py --no-stealing       # round robin without idle devices stealing
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

import hetero

FLEET = Path(__file__).resolve().parent / "emulated_fleet.yaml"
SIZES = (192, 256, 320, 384, 448)  # matrix sides; a 256×256 multiply is 1 work unit
STRATEGIES = ("round_robin", "tail_budget")


def cost_of(job: tuple[int, int]) -> float:
    """Work units of one multiply: its flops relative to a 256×256 one."""
    _, n = job
    return (n / 256) ** 3


@hetero.task(cost=cost_of)
def multiply(job: tuple[int, int]) -> float:
    """Multiply two seeded random n×n matrices; return the largest entry of the product."""
    seed, n = job
    rng = np.random.default_rng(seed)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    return float((a @ b).max())


@dataclass
class Run:
    """One strategy's run: the profile's summary, the report's paths, what went wrong."""

    summary: hetero.ProfileSummary
    paths: tuple[Path, ...]
    saturated: list[str]
    checked: bool


class _Saturation(logging.Handler):
    """Keeps the engine's "emulation saturated" warnings (and shows every warning as usual)."""

    def __init__(self, console: Console) -> None:
        super().__init__(logging.WARNING)
        self.console = console
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if "emulation saturated" in text:
            self.messages.append(text)
        self.console.print(f"[yellow]warning:[/] {text}", highlight=False)


def run_once(
    strategy: str,
    config: hetero.HeteroConfig,
    jobs: list[tuple[int, int]],
    args: argparse.Namespace,
    console: Console,
    saturation: _Saturation,
) -> Run:
    """Map ``multiply`` over ``jobs`` with ``strategy``; the profile's numbers and paths."""
    warned = len(saturation.messages)
    t0 = time.monotonic()
    with hetero.Context(config, strategy=strategy, time_scale=args.time_scale) as ctx:
        # Start every device's worker first (a process each: a few seconds on 2 cores), so that
        # the profiled window measures placement, not process start-up. Each warm-up call is
        # paced to 0.25 s, which covers numpy's first-call costs; kind="warmup" keeps these
        # calls out of the speeds the scheduler learns for the real work.
        warm = [
            ctx.submit(
                multiply.with_options(
                    kind="warmup", devices=[d.id], cost=0.25 * d.speed / args.time_scale
                ),
                (0, SIZES[0]),
            )
            for d in ctx.devices
        ]
        for f in warm:
            f.result()
        started = time.monotonic() - t0
        for name in (f"{strategy}.html", f"{strategy}.trace.json"):  # replace an earlier run's
            (args.out / name).unlink(missing_ok=True)
        with ctx.profile(strategy, args.out) as prof:
            results = list(ctx.map(multiply, jobs, progress=args.progress))
    checked = all(np.isclose(results[i], multiply(jobs[i])) for i in range(0, len(jobs), 97))
    summary = prof.profile.summary()
    console.print(
        f"  {strategy}: {len(results)} multiplies in {summary.makespan:.2f} s "
        f"(workers started in {started:.1f} s, not counted); results checked against numpy: "
        f"{'ok' if checked else 'MISMATCH'}",
        highlight=False,
    )
    return Run(summary, prof.paths, saturation.messages[warned:], checked)


def percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def number(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=200, help="matrix multiplies (default 200)")
    parser.add_argument(
        "--time-scale",
        type=float,
        default=0.2,
        help="emulated durations × this (default 0.2: a V100 does 5 work units per second)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("hetero-profile"),
        help="where the profiler's reports go (default ./hetero-profile)",
    )
    parser.add_argument(
        "--no-stealing",
        action="store_true",
        help="turn work stealing off (idle devices then cannot take queued work from others)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the matrix sizes (default 0)")
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    args = parser.parse_args()
    if args.items < 1 or not args.time_scale > 0:
        parser.error("--items must be >= 1 and --time-scale > 0")

    console = Console()
    saturation = _Saturation(console)
    logging.getLogger("hetero").addHandler(saturation)

    config = hetero.load_config(FLEET)
    if args.no_stealing:
        scheduler = config.scheduler.model_copy(update={"stealing": False})
        config = config.model_copy(update={"scheduler": scheduler})
    rng = np.random.default_rng(args.seed)
    jobs = [(i, int(n)) for i, n in enumerate(rng.choice(SIZES, size=args.items))]
    work = sum(cost_of(j) for j in jobs)
    fleet = hetero.build_fleet(config)
    total_speed = sum(d.speed for d in fleet)
    catalog_ideal = work * args.time_scale / total_speed

    console.print(
        f"[bold]{len(jobs)} matrix multiplies[/] ({min(SIZES)}-{max(SIZES)} square, "
        f"{work:.0f} work units) on {len(fleet)} emulated devices "
        f"({', '.join(f'{d.model} {d.speed:.2f}' for d in fleet)}; speed relative to a V100), "
        f"time_scale {args.time_scale:g}" + ("; work stealing off" if args.no_stealing else ""),
        highlight=False,
    )
    runs = {s: run_once(s, config, jobs, args, console, saturation) for s in STRATEGIES}

    table = Table(title="round robin against the default strategy", title_justify="left")
    table.add_column("")
    for s in STRATEGIES:
        table.add_column(s, justify="right")
    sums = [runs[s].summary for s in STRATEGIES]
    table.add_row("makespan", *(f"{x.makespan:.2f} s" for x in sums))
    table.add_row("ideal makespan", *(seconds(x.ideal_makespan) for x in sums))
    table.add_row("efficiency", *(percent(x.efficiency) for x in sums))
    table.add_row("load balance factor", *(number(x.load_balance) for x in sums))
    for i, device in enumerate(fleet):
        table.add_row(
            f"utilization {device.id}",
            *(f"{x.devices[i].utilization:.0%} ({x.devices[i].tasks} batches)" for x in sums),
        )
    table.add_row(
        "emulation kept pace", *("no" if runs[s].saturated else "yes" for s in STRATEGIES)
    )
    console.print(table)
    console.print(
        f"ideal makespan (the profiler's): work done / the fleet's speed, declared for emulated "
        f"devices: Σ cost × time_scale / Σ speed = {work:.1f} × {args.time_scale:g} / "
        f"{total_speed:.2f} = {catalog_ideal:.2f} s. Efficiency = ideal / makespan; load "
        "balance factor = mean busy time / the busiest device's (1.0: all busy to the end). "
        "Round robin places blindly; "
        + (
            "with work stealing off, nothing evens it out."
            if args.no_stealing
            else "idle devices steal work still queued elsewhere (scheduler.stealing, on by "
            "default), which rescues much of it: try --no-stealing."
        ),
        highlight=False,
    )
    for s in STRATEGIES:
        trace, html = runs[s].paths
        console.print(f"{s}: report {html} (open in a browser), trace {trace} (ui.perfetto.dev)")
    for s in STRATEGIES:
        for text in runs[s].saturated:
            console.print(f"[yellow]{s}: {text}[/]", highlight=False)
    return 0 if all(runs[s].checked for s in STRATEGIES) else 1


if __name__ == "__main__":
    raise SystemExit(main())
