"""Fleet sizing: the MILP on cases solvable by hand, infeasibility messages, spec validation,
the simulator check and the ``hetero plan`` command."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hetero.commands.plan import register
from hetero.errors import AllocationError, ConfigError
from hetero.plan import verification as verify_module
from hetero.plan.buckets import make_buckets
from hetero.plan.sizing import FleetPlan, InfeasiblePlan, capacity_table, plan_fleet
from hetero.plan.sizing_spec import PlanSpec, load_plan, parse_plan
from hetero.plan.verification import TIGHTEN, Verification, plan_verified, verify
from tests.cli_apps import command_app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plan.yaml"


def spec_of(
    devices: list[dict[str, Any]],
    *,
    rate: float = 25.0,
    output: Any = 99,
    prompt: Any = 2,
    latency: float = 100.0,
    **extra: Any,
) -> PlanSpec:
    """A spec whose requests all cost 2 × 0.5 + 99 = 100 work units unless told otherwise.

    With a 100 s SLO the queueing rule never binds, so every cap is ``max_utilization`` (0.8)
    and the plan can be checked by hand.
    """
    return parse_plan(
        {
            "workload": {"rate": rate, "prompt_tokens": prompt, "output_tokens": output},
            "slo": {"latency": latency},
            "devices": devices,
            **extra,
        }
    )


def measured(model: str, throughput: float, price: float, **extra: Any) -> dict[str, Any]:
    return {"model": model, "tokens_per_second": throughput, "price": price, **extra}


# --- the MILP on small cases ------------------------------------------------------------------


def test_one_type_rounds_the_load_up_to_whole_devices() -> None:
    # 25 req/s × 100 units = 2,500 units/s; 1,000 units/s at 80 % carries 800: 3.125 → 4.
    plan = plan_fleet(spec_of([measured("T4", 1000, 1.0)]))
    assert plan.mix == {"T4": 4}
    assert plan.price_per_hour == pytest.approx(4.0)
    assert plan.load == pytest.approx(2500)
    assert plan.types[0].utilization == pytest.approx(2500 / 4000)
    assert len(plan.buckets) == 1  # fixed lengths: one bucket, not ten equal ones
    # 25 req/s × 101 tokens × 3600 s = 9.09 M tokens per hour.
    assert plan.tokens_per_hour == pytest.approx(9.09e6)
    assert plan.price_per_million_tokens == pytest.approx(4.0 / 9.09)


def test_mix_fills_the_rounding_gap_with_a_small_type() -> None:
    # Per unit the big type is cheaper (2.5/3000 < 1/1000), but two of them ($5) are more than
    # one big plus one small ($3.50); four small alone cost $4.
    plan = plan_fleet(spec_of([measured("T4", 1000, 1.0), measured("L4", 3000, 2.5)]))
    assert plan.mix == {"T4": 1, "L4": 1}
    assert plan.price_per_hour == pytest.approx(3.5)
    singles = {s.model: s.price_per_hour for s in plan.single_type}
    assert singles == {"T4": pytest.approx(4.0), "L4": pytest.approx(5.0)}


def test_equal_price_prefers_fewer_devices() -> None:
    # 1,600 units/s: two small ($2) or one big ($2); the tie goes to one device.
    plan = plan_fleet(spec_of([measured("T4", 1000, 1.0), measured("L4", 2000, 2.0)], rate=16))
    assert plan.mix == {"L4": 1}


def test_budget_within_reach_changes_nothing() -> None:
    plan = plan_fleet(spec_of([measured("T4", 1000, 1.0)], max_price_per_hour=4.0))
    assert plan.mix == {"T4": 4}


def test_long_requests_go_only_where_they_meet_the_slo() -> None:
    # Half the requests cost 100, half 1,000 (uniform prompt 0..1800 gives a spread). With a
    # 1 s SLO the slow type (1,000 units/s) may serve only design requests up to 500 units.
    spec = spec_of(
        [measured("T4", 1000, 0.1), measured("L4", 10_000, 5.0)],
        prompt={"dist": "uniform", "low": 0, "high": 1800},
        latency=1.0,
        rate=2,
    )
    plan = plan_fleet(spec)
    slow = next(t for t in plan.types if t.model == "T4")
    for index in slow.buckets:
        assert plan.buckets[index - 1].design_cost / 1000 <= 0.5
    for bucket in plan.buckets:
        served = sum(t.buckets.get(bucket.index, 0.0) for t in plan.types)
        assert served == pytest.approx(1.0)


@settings(max_examples=15, deadline=None)
@given(
    rate=st.floats(1, 200),
    speeds=st.lists(st.floats(500, 20_000), min_size=2, max_size=3),
    prices=st.lists(st.floats(0.2, 5.0), min_size=3, max_size=3),
)
def test_mix_is_never_dearer_than_any_single_type(
    rate: float, speeds: list[float], prices: list[float]
) -> None:
    models = ["T4", "L4", "A100-80GB"]
    menu = [measured(m, s, p) for m, s, p in zip(models, speeds, prices, strict=False)]
    spec = spec_of(menu, rate=rate, prompt={"dist": "lognormal", "mean": 500, "sigma": 0.8})
    plan = plan_fleet(spec)
    for single in plan.single_type:
        if single.price_per_hour is not None:
            assert plan.price_per_hour <= single.price_per_hour + 1e-6
    for t in plan.types:  # the planned load fits under every cap
        if t.count:
            assert t.utilization <= t.utilization_cap + 1e-6
    load = sum(
        b.probability * b.mean_cost * t.buckets.get(b.index, 0.0) * spec.workload.rate
        for t in plan.types
        for b in plan.buckets
    )
    assert load == pytest.approx(plan.load, rel=1e-6)


def test_capacity_table_grows_with_pooling_and_respects_the_ceiling() -> None:
    table = capacity_table(1000.0, 0.5, 1.0, 50, 2.0, 0.005, 0.8)
    per_device = table[1:] / np.arange(1, 51)
    assert table[0] == 0
    assert (np.diff(table) > 0).all()
    assert (np.diff(per_device) >= -1e-9).all()  # pooling never hurts
    assert per_device.max() <= 800 + 1e-9


def test_capacity_of_one_device_is_the_mm1_tail() -> None:
    # M/M/1: P(W > w) = rho × exp(-(1 - rho) w / S); the table's rho makes it equal the budget.
    service, latency, miss = 0.5, 4.0, 0.005
    rho = capacity_table(1.0, service, 1.0, 1, latency, miss, 0.99)[1]
    assert rho * math.exp(-(1 - rho) * (latency / 2) / service) == pytest.approx(miss, rel=1e-6)


def test_buckets_split_the_distribution_by_probability() -> None:
    spec = parse_plan(json.loads(json.dumps(load_plan(EXAMPLE).model_dump())))
    buckets = make_buckets(spec.workload, spec.slo)
    assert len(buckets) == 10
    assert sum(b.probability for b in buckets) == pytest.approx(1.0)
    assert all(b.low <= b.mean_cost <= b.high for b in buckets)
    assert [b.high for b in buckets] == sorted(b.high for b in buckets)
    # The top bucket's design request is the 99.5th percentile, not its (huge) maximum.
    assert buckets[-1].low < buckets[-1].design_cost < buckets[-1].high


# --- impossible plans name the binding constraint ---------------------------------------------


def test_a_bucket_too_slow_everywhere_names_the_bucket_and_the_fastest_type() -> None:
    spec = spec_of([measured("T4", 1000, 1.0), measured("L4", 2000, 2.0)], latency=0.05)
    with pytest.raises(InfeasiblePlan) as info:
        plan_fleet(spec)
    assert info.value.constraint == "slo"
    message = str(info.value)
    assert "bucket 1" in message and "L4" in message and "0.05 s SLO" in message
    assert isinstance(info.value, AllocationError)


def test_max_count_names_the_capacity_and_the_need() -> None:
    spec = spec_of([measured("T4", 1000, 1.0, max_count=2)])
    with pytest.raises(InfeasiblePlan) as info:
        plan_fleet(spec)
    assert info.value.constraint == "max_count"
    assert "1,600 work units/s" in str(info.value) and "needs 2,500" in str(info.value)


def test_max_count_on_the_only_fast_type_names_the_long_buckets() -> None:
    spec = spec_of(
        [measured("T4", 1000, 0.1), measured("L4", 10_000, 5.0, max_count=0)],
        prompt={"dist": "uniform", "low": 0, "high": 1800},
        latency=1.0,
        rate=2,
    )
    with pytest.raises(InfeasiblePlan) as info:
        plan_fleet(spec)
    # The fast type is capped at zero, so the long buckets have nowhere to go.
    assert info.value.constraint == "max_count"
    assert str(info.value).startswith("max_count caps L4 at 0 work units/s")
    assert "buckets 5–10, which only it can serve in half the 1 s SLO" in str(info.value)


def test_budget_names_the_cheapest_price() -> None:
    with pytest.raises(InfeasiblePlan) as info:
        plan_fleet(spec_of([measured("T4", 1000, 1.0)], max_price_per_hour=3.0))
    assert info.value.constraint == "max_price_per_hour"
    assert "$4.00/hour" in str(info.value) and "$3.00" in str(info.value)


def test_single_type_that_cannot_serve_says_why() -> None:
    spec = load_plan(EXAMPLE)
    plan = plan_fleet(spec)
    reasons = {s.model: s.reason for s in plan.single_type}
    assert reasons["A100-80GB"] is None
    assert "bucket 10" in (reasons["L4"] or "")
    assert "max_count caps" in (reasons["H100-SXM-80GB"] or "")


# --- spec validation --------------------------------------------------------------------------


def problems_of(data: Any) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        parse_plan(data)
    return dict(info.value.problems)


BASE: dict[str, Any] = {
    "workload": {"rate": 10, "prompt_tokens": 100, "output_tokens": 10},
    "slo": {"latency": 1},
    "devices": [{"model": "A100-80GB"}],
}


def test_unknown_model_suggests_closest_names() -> None:
    problems = problems_of({**BASE, "devices": [{"model": "A100-80"}]})
    assert "unknown device model 'A100-80'" in problems["devices[0].model"]
    assert "A100-80GB" in problems["devices[0].model"]


def test_every_problem_is_reported_at_once_with_its_path() -> None:
    problems = problems_of(
        {
            "workload": {
                "rate": -1,
                "prompt_tokens": {"dist": "normal", "mean": 5},
                "output_tokens": {"dist": "lognormal", "mean": 0},
            },
            "slo": {"latency": 1, "percentile": 100},
            "devices": [{"model": "A30"}, {"model": "A100-80GB", "prise": 1}],
            "max_utilisation": 0.9,
        }
    )
    assert "got -1" in problems["workload.rate"]
    assert "unknown dist 'normal'" in problems["workload.prompt_tokens.dist"]
    assert "workload.output_tokens.mean" in problems
    assert "slo.percentile" in problems
    assert "no price in the catalog" in problems["devices[0].price"]
    assert "did you mean 'price'" in problems["devices[1].prise"]
    assert "did you mean 'max_utilization'" in problems["max_utilisation"]


def test_duplicate_types_and_missing_sections() -> None:
    problems = problems_of({"devices": [{"model": "L4"}, {"model": "l4"}]})
    assert problems["workload"] == "required field is missing"
    assert problems["slo"] == "required field is missing"
    assert "already on the menu" in problems["devices[1].model"]


def test_load_plan_reads_json_and_applies_overrides(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(BASE))
    spec = load_plan(path, {"workload": {"rate": 80}, "slo": {"latency": 2}})
    assert spec.workload.rate == 80 and spec.workload.prompt_tokens.dist == "fixed"
    assert spec.slo.latency == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload: [")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_plan(bad)


# --- the simulator check ----------------------------------------------------------------------


def test_the_example_plan_meets_its_slo_in_the_simulator() -> None:
    spec = load_plan(EXAMPLE)
    plan = plan_fleet(spec)
    check = verify(plan, spec, requests=3000, seed=1)
    assert check.meets_slo
    assert check.attainment >= 0.99 and check.latency_at_percentile <= spec.slo.latency
    assert set(check.utilization) == set(plan.mix)


def test_a_failed_check_tightens_the_caps_and_re_solves(monkeypatch: pytest.MonkeyPatch) -> None:
    scales: list[float] = []

    def fake_verify(plan: FleetPlan, spec: Any, **_: Any) -> Verification:
        scales.append(plan.cap_scale)
        attainment = 0.95 if len(scales) == 1 else 0.995
        return Verification(100, attainment, 0.99, 1.0, 0.1, 1.0, {}, 0)

    monkeypatch.setattr(verify_module, "verify", fake_verify)
    plan, checks = plan_verified(spec_of([measured("T4", 1000, 1.0)]))
    assert scales == [1.0, TIGHTEN]
    assert [c.meets_slo for c in checks] == [False, True]
    # A lower cap needs more devices: 2,500 / (1,000 × 0.8 × 0.85) = 3.7 → still 4; fine, but
    # never fewer.
    assert plan.devices >= 4 and plan.cap_scale == TIGHTEN


# --- the CLI ----------------------------------------------------------------------------------


def cli(*args: str) -> Any:
    return CliRunner().invoke(command_app(register), ["plan", *args])


def test_cli_prints_the_mix_and_the_comparison() -> None:
    result = cli(str(EXAMPLE))
    assert result.exit_code == 0, result.output
    assert "cheapest mix: $17.33/hour" in result.output
    assert "each type alone" in result.output


def test_cli_json_with_verify() -> None:
    result = cli(str(EXAMPLE), "--verify", "--requests", "2000", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["mix"] == {"A100-80GB": 3, "H100-SXM-80GB": 4}
    assert doc["verification"][-1]["meets_slo"] is True


def test_cli_overrides_and_help() -> None:
    result = cli(str(EXAMPLE), "--devices", "A100-80GB,T4", "--slo", "3", "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["mix"]) <= {"A100-80GB", "T4"}
    help_text = cli("--help").output
    for option in ("--verify", "--requests", "--rate", "--slo", "--devices", "--json"):
        assert option in help_text


def test_cli_errors_are_one_clear_line() -> None:
    result = cli(str(EXAMPLE), "--devices", "A100-80,L4")
    assert result.exit_code == 1
    assert "closest: A100-80GB" in result.output
    result = cli(str(EXAMPLE), "--slo", "0.01")
    assert result.exit_code == 1
    assert "no fleet meets the SLO: bucket" in result.output
    assert "Traceback" not in result.output
