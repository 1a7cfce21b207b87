from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from hetero.sched.metrics import DeviceMetrics, FleetMetrics
from hetero.sim.report import comparison_table, utilization_table, write_html_report
from hetero.sim.result import SimResult, TimeSeries
from tests.rendering import assert_whole, flat, headers, render


def _result(
    policy: str,
    models: list[str],
    utilization: list[float],
    *,
    slo: float | None = 1.0,
    seed: int = 0,
) -> SimResult:
    rng = np.random.default_rng(seed)
    n = len(models)
    ids = [f"{m.lower()}:{i}" for i, m in enumerate(models)]
    devices = [
        DeviceMetrics(
            id=ids[i],
            model=models[i],
            speed=1.0 + i,
            utilization=utilization[i],
            queue_length=0,
            completed=100,
            failed=0,
            work_done=100.0 * (1 + i),
            throughput=10.0,
            p50=0.1,
            p95=0.4,
            p99=0.5,
        )
        for i in range(n)
    ]
    metrics = FleetMetrics(
        elapsed=10.0,
        completed=100 * n,
        failed=1,
        throughput=10.0 * n,
        work_throughput=123.4,
        mean=0.2,
        p50=0.1,
        p95=0.4,
        p99=0.5,
        load_balance_factor=sum(utilization) / len(utilization) / max(utilization),
        makespan_efficiency=0.9,
        devices=devices,
    )
    t = np.linspace(0, 10, 50)
    return SimResult(
        policy=policy,
        device_ids=ids,
        device_models=models,
        metrics=metrics,
        submitted=100 * n + 3,
        completed=100 * n,
        failed=1,
        rejected=2,
        slo_latency=slo,
        slo_attainment=0.95 if slo is not None else None,
        events=1000,
        wall_seconds=0.5,
        latencies=rng.lognormal(-2, 1, 100 * n),
        costs=rng.lognormal(0, 1, 100 * n),
        series=TimeSeries(
            interval=0.2,
            t=t,
            utilization=np.clip(rng.random((t.size, n)), 0, 1),
            queue_length=rng.integers(0, 20, t.size),
        ),
    )


def _pair() -> list[SimResult]:
    models = ["A100-80GB", "A100-80GB", "T4"]
    return [
        _result("round_robin", models, [0.9, 0.8, 0.3]),
        _result("adaptive", models, [0.85, 0.8, 0.75], seed=1),
    ]


def test_comparison_table_has_a_row_per_policy() -> None:
    text = render(comparison_table(_pair()), 200)
    for fragment in ("round_robin", "adaptive", "95.0%", "100 ms", "500 ms", "90.0%", "3"):
        assert fragment in text


POLICIES = ("round_robin", "shortest_expected_delay", "adaptive")
FLEET = ["A100-80GB", "A100-80GB", "V100-32GB", "V100-32GB", "T4"]
FIRST = ["policy", "items/s", "mean", "p50", "p99", "SLO"]  # what fits at 80 columns
HEADERS = [*FIRST, "work/s", "balance", "imbalance", "efficiency", "rejected", "failed"]


def _three(utilization: list[list[float]] | None = None) -> list[SimResult]:
    util = utilization or [[0.9, 0.85, 0.7, 0.7, 0.3]] * len(POLICIES)
    return [
        _result(p, FLEET, u, seed=i) for i, (p, u) in enumerate(zip(POLICIES, util, strict=True))
    ]


def test_comparison_at_80_columns_keeps_latency_and_slo_and_names_the_rest() -> None:
    text = render(comparison_table(_three()), 80)
    assert_whole(text, 80, [*POLICIES, "200 ms", "100 ms", "500 ms", "95.0%", "50"])
    assert headers(text) == [FIRST]  # one table, no "(continued)"
    assert "continued" not in text
    assert (
        "not shown at 80 columns: work/s, balance, imbalance, efficiency, rejected, failed "
        "(--json shows every figure)" in flat(text)
    )
    assert text.count("SLO: share of items done within 1 s") == 1  # the legend stays


def test_comparison_at_200_columns_shows_every_column() -> None:
    text = render(comparison_table(_three()), 200)
    assert headers(text) == [HEADERS]
    assert "continued" not in text and "not shown" not in text


def test_comparison_keeps_the_imbalance_before_the_rest_when_there_is_room() -> None:
    # Short policy names leave room for more than policy to SLO: imbalance comes next.
    results = [_result(p, FLEET, [0.9, 0.85, 0.7, 0.7, 0.3], seed=i) for i, p in enumerate("ab")]
    text = render(comparison_table(results), 80)
    (shown,) = headers(text)
    assert shown[: len(FIRST)] == FIRST and shown[len(FIRST)] == "imbalance"


IDS = ["a100-80gb:0", "a100-80gb:1", "v100-32gb:2", "v100-32gb:3", "t4:4"]


def test_utilization_at_80_columns_keeps_the_devices_that_tell_policies_apart() -> None:
    # The T4 and the first V100 differ most between the policies; the A100s not at all.
    util = [[0.9, 0.85, 0.7, 0.7, 0.3], [0.9, 0.85, 0.2, 0.7, 0.9], [0.9, 0.85, 0.5, 0.6, 0.1]]
    narrow = render(utilization_table(_three(util)), 80)
    assert_whole(narrow, 80, POLICIES)
    (shown,) = headers(narrow)
    assert shown[0] == "policy" and {"v100-32gb:2", "t4:4"} <= set(shown)
    left_out = [i for i in IDS if i not in shown]
    assert left_out and set(left_out) <= {"a100-80gb:0", "a100-80gb:1", "v100-32gb:3"}
    assert f"not shown at 80 columns: {', '.join(left_out)}" in flat(narrow)
    assert shown[1:] == [i for i in IDS if i in shown]  # in the fleet's order
    assert headers(render(utilization_table(_three(util)), 200)) == [["policy", *IDS]]


def test_comparison_table_without_slo_shows_a_dash() -> None:
    result = _result("least_loaded", ["T4"], [0.5], slo=None)
    table = comparison_table([result])
    assert "least_loaded" in render(table, 200)
    slo_column = next(c for c in table.columns if str(c.header).startswith("SLO"))
    assert list(slo_column.cells) == ["-"]


def test_utilization_table_per_device() -> None:
    text = render(utilization_table(_pair()), 200)
    for fragment in ("round_robin", "adaptive", "a100-80gb:0", "t4:2", "30.0%", "75.0%"):
        assert fragment in text


def test_utilization_table_groups_large_fleets_by_model() -> None:
    models = ["A100-80GB"] * 10 + ["T4"] * 10
    util = [0.8] * 10 + [0.4] * 10
    table = utilization_table([_result("p", models, util)])
    headers = [str(c.header) for c in table.columns]
    assert headers == ["policy", "A100-80GB", "T4"]
    text = render(table, 200)
    assert "80.0%" in text and "40.0%" in text


def test_html_report_is_self_contained_and_escaped(tmp_path: Path) -> None:
    results = _pair()
    path = write_html_report(
        results,
        tmp_path / "out" / "report.html",
        title="<script>alert(1)</script> run",
        config_text="devices: [{type: gpu}] <b>",
        workload_text="size: <fixed> & more",
    )
    assert path.exists()
    page = path.read_text("utf-8")
    assert "round_robin" in page and "adaptive" in page
    assert page.count("<img") == 3  # utilization, latency CDF, queue length
    assert "data:image/png;base64," in page
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; run" in page
    assert "&lt;b&gt;" in page and "&lt;fixed&gt; &amp; more" in page


def test_html_report_for_a_large_fleet_and_empty_runs(tmp_path: Path) -> None:
    models = ["A100-80GB"] * 12 + ["V100-32GB"] * 8
    big = _result("big<&>", models, [0.5] * 20)
    empty = _result("idle", ["T4"], [0.0 + 1e-9])
    empty.latencies = np.zeros(0)
    empty.series = TimeSeries(
        interval=1.0,
        t=np.zeros(0),
        utilization=np.zeros((0, 1)),
        queue_length=np.zeros(0, dtype=np.int64),
    )
    empty.metrics = FleetMetrics(
        elapsed=1.0,
        completed=0,
        failed=0,
        throughput=0.0,
        work_throughput=0.0,
        mean=math.nan,
        p50=math.nan,
        p95=math.nan,
        p99=math.nan,
        load_balance_factor=math.nan,
        makespan_efficiency=math.nan,
        devices=empty.metrics.devices,
    )
    page = write_html_report([big, empty], tmp_path / "r.html", title="t").read_text("utf-8")
    assert "big&lt;&amp;&gt;" in page and "idle" in page
    assert "A100-80GB" in page and "V100-32GB" in page
    assert page.count("<img") == 3
    text = render(comparison_table([big, empty]), 200)
    assert "idle" in text and "∞" not in text
