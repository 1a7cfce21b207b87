"""The simulator's and the profiler's reports: one definition of efficiency and load balance,
HTML that shows its labels and numbers whole, and a ``hetero simulate`` table that says why
items failed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.sched import FleetView, ManualClock, PerfModel
from hetero.sched.metrics import Metrics
from hetero.telemetry import DeviceInfo, Profile, TaskTrace
from hetero.telemetry.measures import efficiency, ideal_makespan, load_balance
from tests.fleets import make_devices

# Five devices over a 10 s run; the last two did nothing.
SPEEDS = [4.0, 2.0, 2.0, 1.0, 1.0]
BUSY = [10.0, 8.0, 6.0, 0.0, 0.0]
WORK = [40.0, 16.0, 12.0, 0.0, 0.0]
IDEAL = 68 / 10  # Σ work / Σ speed
BALANCE = (1.0 + 0.8 + 0.6) / 5  # mean utilization / the highest, idle devices counted


def test_the_measures() -> None:
    assert ideal_makespan(68.0, SPEEDS) == pytest.approx(IDEAL)
    assert ideal_makespan(68.0, [0.0]) is None  # no speed: no ideal
    assert efficiency(IDEAL, 10.0) == pytest.approx(0.68)
    assert efficiency(None, 10.0) is None and efficiency(1.0, 0.0) is None
    assert load_balance([u / 10 for u in BUSY]) == pytest.approx(BALANCE)
    assert load_balance([0.5, 0.5]) == 1.0
    assert load_balance([0.0, 0.0]) is None and load_balance([]) is None  # nothing ran


def _simulated() -> tuple[float, float]:
    devices = make_devices(SPEEDS)
    metrics = Metrics(len(devices))
    for i, (busy, work) in enumerate(zip(BUSY, WORK, strict=True)):
        if busy:
            metrics.record(i, latency=busy, busy=busy, cost=work, now=10.0)
    report = metrics.report(FleetView(devices, PerfModel(devices), ManualClock()))
    return report.makespan_efficiency, report.load_balance_factor


def _profiled() -> tuple[float | None, float | None]:
    devices = [DeviceInfo(f"d{i}", "X", "gpu", s, True) for i, s in enumerate(SPEEDS)]
    traces = [
        TaskTrace(i, "step", f"d{i}", 1, work, 0.0, 0.0, 0.0, busy)
        for i, (busy, work) in enumerate(zip(BUSY, WORK, strict=True))
        if busy
    ]
    summary = Profile(traces, devices, 0.0, 10.0).summary()
    return summary.efficiency, summary.load_balance


def test_simulator_and_profiler_agree_and_idle_devices_count() -> None:
    assert _simulated() == pytest.approx((0.68, BALANCE))
    assert _profiled() == pytest.approx((0.68, BALANCE))


def _report(tmp_path: Path, devices: list[DeviceInfo], traces: list[TaskTrace]) -> str:
    return Profile(traces, devices, 0.0, 10.0).write_html(tmp_path / "r.html").read_text("utf-8")


def test_html_labels_fit_their_gutter(tmp_path: Path) -> None:
    name = "h100-sxm-80gb:0"
    devices = [DeviceInfo(name, "H100-SXM-80GB", "gpu", 7.9, True)]
    page = _report(tmp_path, devices, [TaskTrace(1, "f", name, 1, 1.0, 0.0, 0.0, 1.0, 2.0)])
    # Labels are monospace, 0.6 em wide per character, right-aligned at x: they start at or
    # right of 0 when x is at least their width.
    size = float(re.search(r"\.label \{[^}]*font-size: (\d+)px", page).group(1))  # type: ignore[union-attr]
    labels = re.findall(r'<text class="label" x="([\d.]+)"[^>]*>([^<]*)<', page)
    assert labels and all(label.startswith(name) for _, label in labels)
    assert all(float(x) >= len(label) * 0.6 * size for x, label in labels)


def test_html_cells_do_not_wrap_and_numbers_are_rounded(tmp_path: Path) -> None:
    devices = [DeviceInfo("gpu:0", "T4", "gpu", 0.52, True)]
    page = _report(tmp_path, devices, [TaskTrace(1, "f", "gpu:0", 1, 2.631472, 0, 0, 0, 5.06)])
    assert re.search(r"td[^{]*\{[^}]*white-space: nowrap", page)
    assert "<td>2.63</td>" in page and "2.631" not in page


runner = CliRunner()


def test_simulate_table_explains_failed_and_shows_no_infinite_balance(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        "  - {type: gpu, model: A100-80GB, emulate: true}\n"
        "  - {type: cpu, model: CPU, emulate: true}\n"  # 300x slower: left idle
        "scheduler: {timeout: 3}\n"
    )
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "requests: 400\narrivals: {process: poisson, load: 0.9}\n"
        "size: {dist: lognormal, mean: 2.0, sigma: 1.0}\nseed: 1\n"
    )
    args = ["simulate", "-c", str(fleet), "-w", str(workload), "--no-progress"]
    result = runner.invoke(
        app, [*args, "--policies", "shortest_expected_delay"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    assert "∞" not in result.stdout
    assert "cpu:0" in result.stdout and "0.0%" in result.stdout  # the idle device
    flat = " ".join(result.stdout.split())
    assert re.search(r"failed: timed out after 3s \(shortest_expected_delay \d+\)", flat)


def test_the_ideal_makespan_counts_emulated_devices_at_their_paced_speed() -> None:
    import hetero
    from hetero.testing import emulated_fleet

    devices = emulated_fleet([1.0, 4.0])
    with hetero.Context(devices=devices, time_scale=0.1) as ctx:
        infos = ctx.device_infos()
    # An emulated device runs cost × time_scale / speed seconds per task: ten times faster here.
    assert [i.speed for i in infos] == pytest.approx([10.0, 40.0])
