"""The model-aware serving planner: replica options per GPU and tensor-parallel degree, their
capacity within a TTFT/TPOT SLO, and the cheapest fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hetero.errors import ConfigError, InfeasiblePlan
from hetero.plan.replica_capacity import replica_capacity
from hetero.plan.serving import length_buckets, plan_serving, replica_options
from hetero.plan.serving_spec import parse_serving_plan
from hetero.serve.engine_model import engine_spec
from tests.rendering import flat, headers, render

ROOT = Path(__file__).resolve().parents[2]


def _spec(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model": "llama-3-8b",
        "workload": {
            "rate": 20,
            "prompt_tokens": {"dist": "lognormal", "mean": 600, "sigma": 0.8},
            "output_tokens": {"dist": "lognormal", "mean": 200, "sigma": 0.8},
        },
        "slo": {"ttft": 1.0, "tpot": 0.1},
        "devices": [{"model": "A100-80GB"}, {"model": "L4"}, {"model": "H100-SXM-80GB"}],
    }
    base.update(over)
    return base


def test_capacity_grows_with_the_tpot_budget_and_stops_at_what_binds() -> None:
    engine = engine_spec("llama-3-8b", "A100-80GB")
    tight = replica_capacity(engine, 500, 200, ttft=1.0, tpot=0.03)
    loose = replica_capacity(engine, 500, 200, ttft=1.0, tpot=0.1)
    assert tight.eligible and loose.eligible
    assert loose.rate > tight.rate and loose.batch > tight.batch
    assert tight.limit == "tpot" and tight.tpot <= 0.03
    assert loose.tpot <= 0.1 and loose.ttft <= 1.0


def test_capacity_is_none_when_one_request_alone_misses_the_slo() -> None:
    engine = engine_spec("llama-3-8b", "L4")
    alone = replica_capacity(engine, 500, 200, ttft=1.0, tpot=0.01)
    assert not alone.eligible and alone.rate == 0
    assert alone.reason is not None and "TPOT alone" in alone.reason


def test_capacity_is_none_for_a_request_longer_than_the_context() -> None:
    engine = engine_spec("llama-3-8b", "A100-80GB")  # 8,192 positions
    over = replica_capacity(engine, 8000, 300, ttft=5.0, tpot=0.1)
    assert not over.eligible and over.reason is not None and "longer than" in over.reason


def test_tensor_parallel_splits_the_weights_and_adds_the_link() -> None:
    one = engine_spec("llama-3-8b", "A100-80GB")
    two = engine_spec("llama-3-8b", "A100-80GB", tensor_parallel=2)
    assert two.kv_tokens > 2 * one.kv_tokens  # half the weights each: far more room
    assert two.cost.allreduce_s > 0 and one.cost.allreduce_s == 0
    # Decoding alone reads half the weights per device: faster, less than twice.
    assert one.cost.time(1, 500) / 2 < two.cost.time(1, 500) < one.cost.time(1, 500)
    with pytest.raises(ConfigError, match="does not fit on 2 × L4"):
        engine_spec("llama-3-70b", "L4", tensor_parallel=2)
    with pytest.raises(ConfigError, match="do not split 3 ways"):
        engine_spec("llama-3-8b", "A100-80GB", tensor_parallel=3)
    with pytest.raises(ConfigError, match="no device-to-device link"):
        engine_spec("llama-3.2-1b", "Graviton3", tensor_parallel=2)


def test_options_say_why_a_degree_cannot_serve() -> None:
    spec = parse_serving_plan(
        _spec(model="llama-3-70b", devices=[{"model": "A100-80GB", "max_count": 4}])
    )
    options = {o.tensor_parallel: o for o in replica_options(spec)}
    assert set(options) == {1, 2, 4}  # 8 exceeds max_count
    assert options[1].engine is None and "does not fit" in (options[1].reason or "")
    assert options[4].engine is not None and options[4].price == 4 * options[4].device_price


def test_buckets_cover_every_request_once() -> None:
    spec = parse_serving_plan(_spec())
    buckets = length_buckets(spec)
    assert sum(b.probability for b in buckets) == pytest.approx(1.0)
    assert len(buckets) <= 20
    for b in buckets:
        assert b.prompt_range[0] <= b.prompt_mean <= b.prompt_range[1]
        assert b.design_prompt <= b.prompt_range[1]


def test_plan_meets_every_bucket_within_the_utilisation_cap() -> None:
    plan = plan_serving(parse_serving_plan(_spec()))
    assert plan.options
    for o in plan.options:
        assert 0 < o.utilization <= 0.8 + 1e-6
        assert o.tpot <= 0.1 and o.ttft <= 1.0
    served: dict[int, float] = {}
    for o in plan.options:
        for b, share in o.buckets.items():
            served[b] = served.get(b, 0.0) + share
    assert all(share == pytest.approx(1.0, abs=1e-6) for share in served.values())
    assert set(served) == {b.index for b in plan.buckets}
    # The mix costs no more than any one GPU alone.
    for alone in plan.single_type.values():
        if isinstance(alone, float):
            assert plan.price_per_hour <= alone + 1e-6


def test_owned_devices_are_free_up_to_their_count() -> None:
    paid = plan_serving(parse_serving_plan(_spec()))
    owned = plan_serving(
        parse_serving_plan(
            _spec(devices=[{"model": "A100-80GB", "owned": 2}, {"model": "H100-SXM-80GB"}])
        )
    )
    a100 = [o for o in owned.options if o.option.gpu == "A100-80GB"]
    assert a100 and sum(o.owned_devices for o in a100) <= 2
    assert owned.price_per_hour < paid.price_per_hour or paid.price_per_hour == 0


def test_max_count_caps_devices_across_degrees() -> None:
    plan = plan_serving(
        parse_serving_plan(
            _spec(
                workload={"rate": 40, "prompt_tokens": 500, "output_tokens": 200},
                devices=[{"model": "H100-SXM-80GB", "max_count": 1}, {"model": "A100-80GB"}],
            )
        )
    )
    assert plan.devices.get("H100-SXM-80GB", 0) <= 1
    assert "A100-80GB" in plan.devices


def test_a_tight_tpot_moves_the_plan_to_faster_gpus() -> None:
    low = {"rate": 2, "prompt_tokens": 500, "output_tokens": 200}
    loose = plan_serving(parse_serving_plan(_spec(workload=low, slo={"ttft": 2, "tpot": 0.2})))
    tight = plan_serving(parse_serving_plan(_spec(workload=low, slo={"ttft": 2, "tpot": 0.04})))
    assert loose.devices == {"L4": 1}  # cheap and slow is cheapest when time allows
    assert "L4" not in tight.devices  # L4 alone takes ~70 ms a token
    assert tight.why["L4"].startswith("not chosen")  # TP 4 meets it, at a higher price


def test_a_model_that_fits_nowhere_names_the_smallest_fit() -> None:
    spec = parse_serving_plan(_spec(model="llama-3.1-405b", devices=[{"model": "L4"}]))
    with pytest.raises(InfeasiblePlan, match="smallest fit in the catalog is 8 × "):
        plan_serving(spec)


def test_an_slo_nothing_meets_names_the_best_achievable() -> None:
    spec = parse_serving_plan(_spec(slo={"ttft": 1.0, "tpot": 0.001}))
    with pytest.raises(InfeasiblePlan, match=r"best achievable is TPOT [\d.]+ ms \(H100"):
        plan_serving(spec)


def test_a_budget_below_the_cheapest_plan_says_what_it_costs() -> None:
    spec = parse_serving_plan(_spec(max_price_per_hour=0.5))
    with pytest.raises(InfeasiblePlan, match=r"costs \$[\d.,]+/h, above max_price_per_hour"):
        plan_serving(spec)


def test_models_by_hf_id_and_by_parameter_count() -> None:
    by_id = parse_serving_plan(_spec(model="meta-llama/Llama-3.1-8B-Instruct"))
    assert by_id.shape.name == "llama-3.1-8b"
    by_count = parse_serving_plan(_spec(model="70B"))
    assert abs(by_count.shape.params / 70e9 - 1) < 0.03
    assert parse_serving_plan(_spec(model=13e9)).shape.params == pytest.approx(13e9, rel=0.03)


def test_a_trace_of_lengths_replaces_the_distributions(tmp_path: Path) -> None:
    trace = tmp_path / "lengths.csv"
    trace.write_text(
        "prompt_tokens,max_new_tokens\n" + "".join(f"{100 + 10 * i},{20 + i}\n" for i in range(200))
    )
    spec = parse_serving_plan(
        _spec(workload={"rate": 5, "trace": "lengths.csv"}), base_dir=tmp_path
    )
    buckets = length_buckets(spec)
    assert min(b.prompt_range[0] for b in buckets) == 100
    assert max(b.output_range[1] for b in buckets) == 219
    costs = tmp_path / "costs.csv"
    costs.write_text("cost\n5\n")
    with pytest.raises(ConfigError, match="needs 'prompt_tokens' and 'max_new_tokens'"):
        parse_serving_plan(_spec(workload={"rate": 5, "trace": str(costs)}))


def test_bad_specs_name_every_field() -> None:
    with pytest.raises(ConfigError) as info:
        parse_serving_plan(
            _spec(
                model="llama-3-8bb",
                slo={"ttft": 1, "tpot": 0.05, "latency": 2},
                devices=[
                    {"model": "L4", "owned": 5, "max_count": 2},
                    {"model": "A100-80GB", "price": -1},
                    {"model": "X100"},
                    {"model": "T4", "tensor_parallel": [0, 16]},
                ],
            )
        )
    fields = {field for field, _ in info.value.problems}
    assert {
        "model",
        "slo.latency",
        "devices[0].owned",
        "devices[1].price",
        "devices[2].model",
        "devices[3].tensor_parallel",
    } <= fields
    message = str(info.value)
    assert "llama-3-8b" in message and "parameter count" in message


def _hetero(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hetero", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_plan_command_with_a_model_in_a_real_process() -> None:
    proc = _hetero("plan", "examples/plan_model.yaml", "--json")
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["model"] == "llama-3.1-70b" and plan["price_per_hour"] > 0
    assert {o["gpu"] for o in plan["options"]} <= {"A100-80GB", "H100-SXM-80GB", "L40S", "L4"}
    assert all(o["tensor_parallel"] >= 2 for o in plan["options"])  # 70B fits no one card
    assert set(plan["why"]) == {"A100-80GB", "H100-SXM-80GB", "L40S", "L4"}
    # Overrides: a smaller model by its size and a looser TPOT need fewer dollars.
    small = _hetero("plan", "examples/plan_model.yaml", "--model", "8B", "--tpot", "0.1", "--json")
    assert small.returncode == 0, small.stderr
    assert json.loads(small.stdout)["price_per_hour"] < plan["price_per_hour"]
    wrong = _hetero("plan", "examples/plan_model.yaml", "--slo", "2")
    assert wrong.returncode != 0 and "--ttft and --tpot" in wrong.stderr
    unit = _hetero("plan", "examples/plan.yaml", "--tpot", "0.05")
    assert unit.returncode != 0 and "applies to a plan with a model" in unit.stderr


def test_verify_runs_the_plan_on_engine_replicas_until_it_meets_the_slo() -> None:
    from hetero.plan.serving_verify import serving_plan_verified, verify_serving

    spec = parse_serving_plan(
        _spec(
            workload={"rate": 6, "prompt_tokens": 400, "output_tokens": 100},
            devices=[{"model": "A100-80GB", "tensor_parallel": [1]}],
        )
    )
    plan = plan_serving(spec)
    check = verify_serving(plan, spec, requests=400, seed=3)
    assert check.requests == 400 and check.failed == 0
    assert check.tpot_p50 <= 0.1 and check.ttft_p50 <= 1.0
    assert verify_serving(plan, spec, requests=400, seed=3) == check  # deterministic
    final, checks = serving_plan_verified(spec, requests=400, seed=3)
    assert checks[-1].meets_slo
    # Each round that missed planned again with a lower cap.
    caps = [c.max_utilization for c in checks]
    assert caps == sorted(caps, reverse=True) and len(set(caps)) == len(caps)
    assert final.price_per_hour >= plan.price_per_hour


def test_a_measured_profile_replaces_the_catalog_calibration(tmp_path: Path) -> None:
    from hetero.serve.engine_model import Calibration
    from tests.plan.profiles import save_profile

    def profile(device: str, calibration: Calibration) -> str:
        return save_profile(tmp_path / f"{device}.json", "llama-3-8b", device, calibration).name

    low = {"rate": 2, "prompt_tokens": 500, "output_tokens": 200}
    base = _spec(workload=low, slo={"ttft": 2, "tpot": 0.2}, devices=[{"model": "L4"}])
    slow = Calibration(compute_efficiency=0.1, bandwidth_efficiency=0.2, step_overhead=0.01)
    measured = _spec(**{**base, "devices": [{"model": "L4", "profile": profile("L4", slow)}]})
    catalog_plan = plan_serving(parse_serving_plan(base))
    measured_plan = plan_serving(parse_serving_plan(measured, base_dir=tmp_path))
    catalog_l4 = catalog_plan.capacity["L4"][0]
    assert measured_plan.capacity["L4"][0] < catalog_l4 / 2  # a quarter of the bandwidth
    wrong = _spec(**{**base, "devices": [{"model": "L4", "profile": profile("T4", slow)}]})
    with pytest.raises(ConfigError, match=r"devices\[0\]\.profile: T4\.json profiles a T4"):
        parse_serving_plan(wrong, base_dir=tmp_path)


def _headers_at(columns: int, *args: str) -> tuple[list[list[str]], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "hetero", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": str(columns)},
        check=True,
    )
    return headers(proc.stdout), proc.stdout


BUCKETS = ["bucket", "requests", "prompt tokens", "output tokens", "mean", "design"]
FLEET = ["GPU", "TP", "replicas", "owned", "$/hour", "util", "TPOT", "TTFT", "buckets"]


def test_plan_tables_with_a_model_at_80_and_200_columns() -> None:
    narrow, text = _headers_at(80, "plan", "examples/plan_model.yaml")
    # One table each, no "(continued)": what to run (GPU, TP, replicas), its price, load and
    # latencies stay; the buckets served (which the table of each GPU names) are left out, and
    # named.
    assert narrow == [
        [c for c in BUCKETS if c != "mean"],
        [c for c in FLEET if c != "buckets"],
        ["GPU", "alone $/hour", "why"],
    ]
    assert "continued" not in text and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    note = "not shown at 80 columns: {} (--json shows every field)"
    assert note.format("mean") in flat(text) and note.format("buckets") in flat(text)
    wide, text = _headers_at(200, "plan", "examples/plan_model.yaml")
    assert wide == [BUCKETS, FLEET, ["GPU", "alone $/hour", "why"]]
    assert "not shown" not in text


def test_the_simulator_check_at_80_columns_keeps_the_verdict_and_the_tails() -> None:
    from hetero.commands.plan_serving import _checks
    from hetero.plan.serving_verify import ServingVerification

    def check(attainment: float, cap: float) -> ServingVerification:
        return ServingVerification(
            requests=5_000,
            attainment=attainment,
            target=0.99,
            ttft_p50=0.31,
            ttft_p99=1.97,
            tpot_p50=0.0412,
            tpot_p99=0.0883,
            failed=0,
            utilization={"H100-SXM-80GB tp4": 0.42},
            max_utilization=cap,
            seed=0,
        )

    table = _checks([check(0.9144, 0.8), check(0.9982, 0.68)])
    narrow = render(table, 80)
    assert headers(narrow) == [
        ["round", "cap", "in SLO", "target", "meets SLO", "TTFT p99", "TPOT p99"]
    ]
    assert "no, re-planned" in narrow and "1.97 s" in narrow and "88.3 ms" in narrow
    assert (
        "not shown at 80 columns: TTFT p50, TPOT p50, failed, requests (--json shows every field)"
        in flat(narrow)
    )
    wide = render(table, 200)
    every = ["round", "cap", "in SLO", "target", "meets SLO", "TTFT p50", "TTFT p99"]
    assert headers(wide) == [[*every, "TPOT p50", "TPOT p99", "failed", "requests"]]
