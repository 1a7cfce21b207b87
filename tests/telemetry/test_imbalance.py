"""Seed 001's load balance factor, max/min utilization, reported as ``imbalance`` with its grade
beside hetero's ``load_balance`` (mean/max), by the measures, the simulator's metrics, its
summary and its comparison table."""

from __future__ import annotations

import math

import pytest

from hetero.sched import FleetView, ManualClock, PerfModel
from hetero.sched.metrics import Metrics
from hetero.sim.report import comparison_table
from hetero.sim.run import simulate
from hetero.sim.workload import parse_workload
from hetero.telemetry.measures import imbalance, imbalance_grade, load_balance
from tests.fleets import make_devices
from tests.rendering import flat, headers, render


def test_imbalance_is_the_busiest_over_the_least_busy() -> None:
    assert imbalance([0.9, 0.6, 0.75]) == pytest.approx(1.5)
    assert imbalance([0.5, 0.5]) == 1.0
    # The same run read the other way round by load_balance: mean over highest.
    assert load_balance([0.9, 0.6, 0.75]) == pytest.approx(0.75 / 0.9)


def test_an_idle_device_makes_it_infinite_and_an_idle_fleet_undefined() -> None:
    assert imbalance([0.8, 0.0]) == math.inf
    assert imbalance([0.0, 0.0]) is None and imbalance([]) is None


@pytest.mark.parametrize(
    ("value", "grade"),
    [
        (1.0, "excellent"),
        (1.099, "excellent"),
        (1.1, "good"),
        (1.199, "good"),
        (1.2, "fair"),
        (1.5, "fair"),
        (1.501, "poor"),
        (math.inf, "poor"),
        (None, None),
        (math.nan, None),
    ],
)
def test_grades_follow_the_seed(value: float | None, grade: str | None) -> None:
    assert imbalance_grade(value) == grade


def test_fleet_metrics_report_both_over_usable_devices() -> None:
    devices = make_devices([4.0, 2.0, 1.0])
    metrics = Metrics(len(devices))
    for i, busy in enumerate([9.0, 6.0, 7.5]):
        metrics.record(i, latency=busy, busy=busy, cost=busy, now=10.0)
    report = metrics.report(FleetView(devices, PerfModel(devices), ManualClock()))
    assert report.imbalance == pytest.approx(1.5)
    assert report.load_balance_factor == pytest.approx(0.75 / 0.9)
    assert report.to_dict()["imbalance"] == pytest.approx(1.5)


def test_a_simulated_run_reports_the_seeds_measure_with_its_grade() -> None:
    workload = parse_workload(
        {
            "requests": 2000,
            "seed": 3,
            "size": {"dist": "lognormal", "mean": 1.0, "sigma": 1.0},
            "arrivals": {"process": "poisson", "load": 0.85},
        }
    )
    results = simulate(make_devices([1.0, 1.0, 2.5, 6.0]), workload, ["round_robin", "tail_budget"])
    for r in results:
        util = [d.utilization for d in r.metrics.devices]
        assert r.metrics.imbalance == pytest.approx(max(util) / min(util))
        summary = r.summary()
        assert summary["imbalance"] == r.metrics.imbalance
        assert summary["imbalance_grade"] == imbalance_grade(r.metrics.imbalance)
    text = render(comparison_table(results), 200)
    assert headers(text)[0][7:9] == ["balance", "imbalance"]
    for r in results:
        cell = f"{r.metrics.imbalance:.2f} {imbalance_grade(r.metrics.imbalance)}"
        assert cell in text
    assert "highest/lowest device utilization" in flat(text)  # the legend says which is which


def test_an_idle_device_reads_idle_and_poor_in_the_table() -> None:
    # A device a thousand times slower than the other is never the quicker one: left idle.
    workload = parse_workload(
        {
            "requests": 200,
            "seed": 1,
            "size": {"dist": "fixed", "value": 1.0},
            "arrivals": {"process": "poisson", "load": 0.3},
        }
    )
    (result,) = simulate(make_devices([1.0, 0.001]), workload, ["shortest_expected_delay"])
    assert result.metrics.devices[1].utilization == 0.0
    assert result.metrics.imbalance == math.inf and result.summary()["imbalance_grade"] == "poor"
    text = render(comparison_table([result]), 200)
    assert "idle, poor" in text and "∞" not in text
