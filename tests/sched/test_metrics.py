from __future__ import annotations

import math

import pytest

from hetero.sched import FleetView, ManualClock, PerfModel
from hetero.sched.metrics import Metrics
from tests.fleets import make_devices


def _view() -> FleetView:
    devices = make_devices([2.0, 1.0])
    return FleetView(devices, PerfModel(devices), ManualClock())


def test_fleet_mean_latency_is_the_mean_of_completed_items() -> None:
    metrics = Metrics(2)
    for index, latency in ((0, 1.0), (1, 2.0), (0, 6.0)):
        metrics.record(index, latency, busy=latency, cost=1.0, now=latency)
    metrics.record_failure(1, busy=50.0, now=7.0)  # a failed item has no latency
    report = metrics.report(_view())
    assert report.mean == pytest.approx(3.0)
    assert report.p50 == pytest.approx(2.0)


def test_fleet_mean_latency_without_completions_is_nan() -> None:
    assert math.isnan(Metrics(2).report(_view()).mean)
