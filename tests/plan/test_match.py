"""Matching: filters reject with reasons, scores are normalised and weighted, the CLI reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hetero.commands.match import register
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device, DeviceKind, DeviceSpec, DeviceState
from hetero.errors import ConfigError
from hetero.plan.match import (
    CRITERIA,
    MEMORY_BOUND_SHIFT,
    TRAINING_FLOPS_PER_PARAMETER,
    Requirements,
    ScoreWeights,
    known_capabilities,
    match,
    training_flops,
)
from hetero.plan.memory import FitRequest, memory_breakdown
from hetero.plan.models import get_model

GIB = 2**30
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mixed_fleet.yaml"


def spec(
    model: str = "X",
    tflops: float = 100.0,
    bandwidth: float = 1000.0,
    price: float | None = 1.0,
    caps: tuple[str, ...] = (),
    memory_gib: int = 80,
) -> DeviceSpec:
    return DeviceSpec(
        model=model,
        kind=DeviceKind.GPU,
        vendor="test",
        tflops={"bf16": tflops},
        memory_bytes=memory_gib * GIB,
        memory_bandwidth_gbs=bandwidth,
        price_per_hour=price,
        capabilities=frozenset(caps),
    )


def device(id: str, s: DeviceSpec | None = None, healthy: bool = True, used_gib: int = 0) -> Device:
    return Device(
        id=id, spec=s or spec(), state=DeviceState(healthy=healthy, memory_used=used_gib * GIB)
    )


def by_id(matches: list) -> dict:
    return {m.device.id: m for m in matches}


# --- filters ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requirements", "rejected", "kept", "filter_name", "reason"),
    [
        (
            Requirements(),
            device("a", healthy=False),
            device("b"),
            "health",
            "health: unhealthy: rejected",
        ),
        (
            Requirements(memory_bytes=40 * GIB),
            device("a", spec(memory_gib=24)),
            device("b"),
            "memory",
            "memory: needs 40 GiB, has 24 GiB free: rejected",
        ),
        (
            Requirements(memory_bytes=40 * GIB),
            device("a", used_gib=50),  # 80 GiB card with 50 GiB in use: free memory counts
            device("b", used_gib=10),
            "memory",
            "memory: needs 40 GiB, has 30 GiB free: rejected",
        ),
        (
            Requirements(require=frozenset({"fp8", "nvlink"})),
            device("a", spec(caps=("fp8",))),
            device("b", spec(caps=("fp8", "nvlink", "mig"))),
            "capabilities",
            "capabilities: missing nvlink: rejected",
        ),
        (
            # 1e12 FLOPs at 10 TFLOPS x 0.5 = 0.2 s; at 100 TFLOPS x 0.5 = 0.02 s.
            Requirements(work_flops=1e12, latency_slo=0.1),
            device("a", spec(tflops=10)),
            device("b"),
            "latency",
            "latency: est. 0.2 s per request (compute-bound), over SLO 0.1 s: rejected",
        ),
        (
            # 1e12 FLOPs at 10 TFLOPS x 0.5: 5 requests/s; at 100 TFLOPS x 0.5: 50.
            Requirements(work_flops=1e12, min_throughput=20),
            device("a", spec(tflops=10)),
            device("b"),
            "throughput",
            "throughput: est. 5 requests/s, below 20/s: rejected",
        ),
        (
            Requirements(max_price_per_hour=2.0),
            device("a", spec(price=2.5)),
            device("b", spec(price=2.0)),
            "price",
            "price: $2.50/h, over $2.00/h: rejected",
        ),
        (
            Requirements(max_price_per_hour=2.0),
            device("a", spec(price=None)),
            device("b"),
            "price",
            "price: no price, cannot check $2.00/h: rejected",
        ),
    ],
)
def test_each_filter_rejects_with_its_reason(
    requirements: Requirements, rejected: Device, kept: Device, filter_name: str, reason: str
) -> None:
    result = by_id(match([rejected, kept], requirements))
    bad, good = result[rejected.id], result[kept.id]
    assert not bad.eligible and good.eligible
    assert reason in bad.reasons
    assert [f.name for f in bad.filters if not f.passed] == [filter_name]
    assert all(f.passed for f in good.filters)
    assert match([rejected, kept], requirements)[0].device.id == kept.id


def test_every_device_gets_a_reason_per_filter_and_criterion() -> None:
    result = match([device("a", healthy=False), device("b")], Requirements(memory_bytes=GIB))
    for m in result:
        assert [r.split(":")[0] for r in m.reasons] == [
            "health",
            "memory",
            "capabilities",
            "latency",
            "throughput",
            "price",
            *CRITERIA,
        ]


def test_latency_estimate_is_the_slower_of_compute_and_memory() -> None:
    # 1e12 FLOPs / (100e12 x 0.5) = 0.02 s; 8e9 bytes / (1000e9 x 0.8) = 0.01 s.
    req = Requirements(work_flops=1e12, bytes_moved=8e9)
    assert req.estimate(spec()) == pytest.approx((0.02, "compute"))
    assert req.estimate(spec(bandwidth=200)) == pytest.approx((0.05, "memory"))
    half = Requirements(work_flops=1e12, compute_efficiency=0.25)
    assert half.estimate(spec()) == pytest.approx((0.04, "compute"))
    assert Requirements().estimate(spec()) is None
    assert Requirements(work_flops=1e12).estimate(spec(tflops=0)) == (math.inf, "compute")


# --- scores -------------------------------------------------------------------------------------


def test_scores_are_divided_by_the_best_eligible_device() -> None:
    fast = device("fast", spec(tflops=400, bandwidth=2000, caps=("fp8", "nvlink")))
    slow = device("slow", spec(tflops=100, bandwidth=1000, caps=("fp8",)))
    faster_but_sick = device("sick", spec(tflops=800), healthy=False)
    result = by_id(
        match([slow, fast, faster_but_sick], Requirements(prefer=frozenset({"fp8", "nvlink"})))
    )
    assert result["fast"].scores["compute"] == 1.0
    assert result["slow"].scores["compute"] == pytest.approx(0.25)
    assert result["slow"].scores["bandwidth"] == pytest.approx(0.5)
    assert result["slow"].scores["features"] == pytest.approx(0.5)
    assert "compute: 100 TFLOPS bf16, 0.25 of the best" in result["slow"].reasons
    assert "features: 1 of 2 preferred (fp8), 0.50 of the best" in result["slow"].reasons
    # An ineligible device better than every eligible one is capped at 1 and says so.
    assert result["sick"].scores["compute"] == 1.0
    assert "above the best eligible" in result["sick"].criteria[0].reason


def test_cost_weight_puts_the_cheapest_eligible_first() -> None:
    devices = [
        device("big", spec(tflops=400, price=4.0)),
        device("cheap", spec(tflops=100, price=0.5)),  # 200 TFLOPS per $/h, the best value
        device("cheaper-but-small", spec(tflops=100, price=0.1, memory_gib=8)),
    ]
    req = Requirements(memory_bytes=16 * GIB)
    assert match(devices, req)[0].device.id == "big"
    ranked = match(devices, req, ScoreWeights.parse("cost=1"))
    assert [m.device.id for m in ranked] == ["cheap", "big", "cheaper-but-small"]
    assert "cost: 200 bf16 TFLOPS per $/h at $0.50/h, 1.00 of the best" in ranked[0].reasons


def test_memory_bound_puts_the_high_bandwidth_card_first() -> None:
    devices = [
        device("flops", spec(tflops=400, bandwidth=1000)),
        device("bandwidth", spec(tflops=200, bandwidth=3000)),
    ]
    weights = ScoreWeights(compute=0.5, bandwidth=0.3, features=0.0, cost=0.2)
    assert match(devices, Requirements(), weights)[0].device.id == "flops"
    assert match(devices, Requirements(memory_bound=True), weights)[0].device.id == "bandwidth"


def test_memory_bound_rule_moves_three_quarters_of_compute_weight() -> None:
    weights = ScoreWeights(compute=0.4, bandwidth=0.3, features=0.1, cost=0.2)
    assert weights.effective() == pytest.approx(weights.to_dict())
    shifted = weights.effective(memory_bound=True)
    assert shifted["compute"] == pytest.approx(0.4 * (1 - MEMORY_BOUND_SHIFT))
    assert shifted["bandwidth"] == pytest.approx(0.3 + 0.4 * MEMORY_BOUND_SHIFT)
    assert sum(shifted.values()) == pytest.approx(1.0)
    assert ScoreWeights(1, 1, 1, 1).effective() == pytest.approx(dict.fromkeys(CRITERIA, 0.25))


def test_no_price_scores_zero_cost_and_free_scores_one() -> None:
    result = by_id(
        match(
            [device("priced"), device("unpriced", spec(price=None)), device("free", spec(price=0))],
            Requirements(),
        )
    )
    assert result["unpriced"].scores["cost"] == 0.0
    assert "cost: no price, 0.00 of the best" in result["unpriced"].reasons
    assert result["free"].scores["cost"] == 1.0
    assert result["priced"].scores["cost"] == 0.0
    assert json.dumps(result["free"].to_dict(), allow_nan=False)
    assert result["free"].to_dict()["values"]["cost"] is None


def test_cost_uses_requests_per_dollar_when_work_size_is_known() -> None:
    # 1e12 FLOPs at 100 TFLOPS x 0.5: 0.02 s a request, 180,000 requests per hour, at $2/h.
    m = match([device("a", spec(price=2.0))], Requirements(work_flops=1e12))[0]
    assert m.criteria[3].value == pytest.approx(90_000)
    assert "cost: 90,000 requests per $ at $2.00/h, 1.00 of the best" in m.reasons


def test_training_counts_samples_and_judges_throughput() -> None:
    # 6 x 8e9 parameters x 2048 tokens ≈ 9.8e13 FLOPs a sample: 0.98 s at 200 TFLOPS x 0.5.
    req = Requirements(work_flops=9.8e13, train=True, min_throughput=2, max_price_per_hour=10)
    assert req.unit == "sample"
    result = by_id(match([device("fast", spec(tflops=800)), device("slow", spec(tflops=200))], req))
    fast, slow = result["fast"], result["slow"]
    assert fast.eligible and not slow.eligible
    assert fast.estimated_throughput == pytest.approx(800e12 * 0.5 / 9.8e13)
    assert "latency: est. 0.98 s per sample (compute-bound), no SLO" in slow.reasons
    assert "throughput: est. 1.02 samples/s, below 2/s: rejected" in slow.reasons
    assert "throughput: est. 4.08 samples/s, at least 2/s" in fast.reasons
    assert any(r.startswith("cost: 14,694 samples per $") for r in fast.reasons)


def test_training_flops_are_six_per_parameter_and_token() -> None:
    shape = get_model("llama-3-8b")
    assert training_flops(shape, 2048) == 6 * shape.active_params * 2048
    assert TRAINING_FLOPS_PER_PARAMETER == 6


def test_ties_are_broken_by_device_id_whatever_the_input_order() -> None:
    devices = [device(name) for name in ("c", "a", "b")]
    expected = ["a", "b", "c"]
    assert [m.device.id for m in match(devices, Requirements())] == expected
    assert [m.device.id for m in match(devices[::-1], Requirements())] == expected


def test_when_nothing_is_eligible_scores_compare_with_the_best_of_all() -> None:
    devices = [
        device("a", spec(tflops=50, memory_gib=8)),
        device("b", spec(tflops=100, memory_gib=16)),
    ]
    result = match(devices, Requirements(memory_bytes=40 * GIB))
    assert not any(m.eligible for m in result)
    assert [m.device.id for m in result] == ["b", "a"]
    assert result[1].scores["compute"] == pytest.approx(0.5)


def test_to_dict_is_json() -> None:
    m = match([device("a")], Requirements(work_flops=1e12, latency_slo=1))[0]
    data = json.loads(json.dumps(m.to_dict(), allow_nan=False))
    assert data["device"] == "a" and data["eligible"] is True
    assert data["filters"] == dict.fromkeys(
        ["health", "memory", "capabilities", "latency", "throughput", "price"], True
    )
    assert data["estimated_throughput"] == pytest.approx(50)
    assert set(data["scores"]) == set(CRITERIA)
    assert data["estimated_seconds"] == pytest.approx(0.02)
    assert Requirements(require=frozenset({"fp8"})).to_dict()["require"] == ["fp8"]


# --- property -----------------------------------------------------------------------------------

CATALOG = list(get_catalog())
CAPS = sorted(known_capabilities())


@st.composite
def fleets(draw: st.DrawFn) -> list[Device]:
    specs = draw(st.lists(st.sampled_from(CATALOG), min_size=1, max_size=8))
    return [
        Device(
            id=f"d{i}",
            spec=s,
            state=DeviceState(
                healthy=draw(st.booleans()),
                memory_used=draw(st.integers(0, s.memory_bytes)),
            ),
        )
        for i, s in enumerate(specs)
    ]


requirements = st.builds(
    Requirements,
    memory_bytes=st.integers(0, 200 * GIB),
    require=st.frozensets(st.sampled_from(CAPS), max_size=2),
    prefer=st.frozensets(st.sampled_from(CAPS), max_size=3),
    dtype=st.sampled_from(["fp32", "bf16", "fp8", "int8"]),
    memory_bound=st.booleans(),
    work_flops=st.none() | st.floats(1e9, 1e15),
    bytes_moved=st.none() | st.floats(1e6, 1e12),
    max_price_per_hour=st.none() | st.floats(0, 10),
    train=st.booleans(),
)
weights = (
    st.tuples(*[st.floats(0, 10) for _ in CRITERIA])
    .filter(lambda values: sum(values) > 0)
    .map(lambda values: ScoreWeights(*values))
)


@settings(max_examples=150, deadline=None)
@given(fleet=fleets(), req=requirements, w=weights)
def test_scores_are_normalised_ranked_and_summed(
    fleet: list[Device], req: Requirements, w: ScoreWeights
) -> None:
    result = match(fleet, req, w)
    assert sorted(m.device.id for m in result) == sorted(d.id for d in fleet)
    effective = w.effective(req.memory_bound)
    for m in result:
        assert all(0.0 <= s <= 1.0 for s in m.scores.values())
        assert m.total == pytest.approx(sum(effective[c] * m.scores[c] for c in CRITERIA))
        assert m.eligible == all(f.passed for f in m.filters)
        assert len(m.reasons) == 6 + len(CRITERIA)
    flags = [m.eligible for m in result]
    assert flags == sorted(flags, reverse=True)  # no ineligible device above an eligible one
    for group in (True, False):
        totals = [m.total for m in result if m.eligible is group]
        assert totals == sorted(totals, reverse=True)
    if any(flags):
        for c in CRITERIA:
            assert max(m.scores[c] for m in result if m.eligible) in (0.0, 1.0)


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "text"),
    [
        (
            {"require": frozenset({"nvlnk"})},
            "require",
            "unknown capability 'nvlnk'; closest: nvlink",
        ),
        ({"prefer": frozenset({"fp9"})}, "prefer", "known: amx"),
        ({"require": "fp8"}, "require", "got the string 'fp8'; expected a set of names"),
        ({"dtype": "bf8"}, "dtype", "unknown dtype 'bf8'; closest: fp8, bf16; allowed: fp64"),
        ({"memory_bytes": -1}, "memory_bytes", "got -1; expected a number >= 0"),
        ({"memory_bytes": 1.5}, "memory_bytes", "expected an int >= 0"),
        ({"work_flops": 0.0}, "work_flops", "got 0.0; expected a number > 0"),
        ({"bytes_moved": math.nan}, "bytes_moved", "expected a number > 0"),
        ({"latency_slo": 1.0}, "latency_slo", "needs work_flops or bytes_moved"),
        ({"min_throughput": 1.0}, "min_throughput", "needs work_flops or bytes_moved"),
        ({"min_throughput": -2, "work_flops": 1e9}, "min_throughput", "expected a number > 0"),
        ({"train": "yes"}, "train", "got 'yes'; expected true or false"),
        (
            {"train": True, "work_flops": 1e12, "latency_slo": 1.0},
            "latency_slo",
            "applies to inference requests; training is judged by its throughput",
        ),
        ({"max_price_per_hour": -1.0}, "max_price_per_hour", "expected a number >= 0"),
        ({"compute_efficiency": 1.5}, "compute_efficiency", "expected a number > 0 and <= 1"),
        ({"bandwidth_efficiency": 0.0}, "bandwidth_efficiency", "expected a number > 0 and <= 1"),
    ],
)
def test_bad_requirements_name_the_field_value_and_allowed(
    kwargs: dict, field: str, text: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Requirements(**kwargs)
    assert [path for path, _ in info.value.problems] == [field]
    assert text in str(info.value)


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        Requirements(require=frozenset({"fp9"}), dtype="x", memory_bytes=-1)
    assert {path for path, _ in info.value.problems} == {"require", "dtype", "memory_bytes"}


def test_weights_parse_and_errors() -> None:
    assert ScoreWeights.parse(" compute=2, cost=1 ") == ScoreWeights(2, 0, 0, 1)
    cases = {
        "compute:1": "cannot read 'compute:1'; expected NAME=NUMBER",
        "bandwith=1": "unknown criterion 'bandwith'; closest: bandwidth; allowed: compute",
        "cost=cheap": "cost='cheap' is not a number",
        "cost=1,cost=2": "'cost' is given twice",
        ",": "no weights in ','",
        "cost=0": "all weights are 0",
        "cost=-1": "weights.cost: got -1.0; expected a number >= 0",
    }
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            ScoreWeights.parse(text)


# --- CLI ----------------------------------------------------------------------------------------

runner = CliRunner()


def cli(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    register(app)
    result = runner.invoke(app, list(args), env={"COLUMNS": "200"})
    return result.exit_code, result.stdout, result.stderr


def test_cli_table_and_reasons() -> None:
    code, out, _ = cli("--fleet", "A100-80GB:2,T4", "--memory", "40GB", "--require", "bf16")
    assert code == 0, out
    assert "3 devices, 2 eligible" in out
    assert "1. a100-80gb:0 (A100-80GB): eligible" in out
    assert "3. t4:0 (T4): rejected" in out
    assert "memory: needs 37.25 GiB, has 16 GiB free: rejected" in out
    assert "capabilities: missing bf16: rejected" in out
    assert "weights: compute 0.40, bandwidth 0.30, features 0.10, cost 0.20" in out


def test_cli_json_top_and_weights() -> None:
    code, out, _ = cli(
        "--fleet", "H100-SXM-80GB,A100-80GB,T4", "--weights", "cost=1", "--top", "2", "--json"
    )
    assert code == 0, out
    data = json.loads(out)
    assert data["weights"] == {"compute": 0.0, "bandwidth": 0.0, "features": 0.0, "cost": 1.0}
    assert [m["model"] for m in data["matches"]] == ["H100-SXM-80GB", "T4"]


def test_cli_memory_bound_latency_and_price() -> None:
    code, out, _ = cli(
        "--fleet",
        "H200-141GB,A100-80GB,L4",
        "--memory-bound",
        "--bytes",
        "16GB",
        "--slo",
        "0.02",
        "--max-price",
        "3.0",
        "--json",
    )
    assert code == 0, out
    result = {m["model"]: m for m in json.loads(out)["matches"]}
    assert result["H200-141GB"]["filters"]["price"] is False
    assert result["L4"]["filters"]["latency"] is False
    assert result["A100-80GB"]["eligible"] is True
    assert json.loads(out)["requirements"]["bytes_moved"] == 16 * 10**9


def test_cli_config_and_catalog_sources() -> None:
    code, out, _ = cli("--config", str(EXAMPLE), "--json")
    assert code == 0, out
    assert len(json.loads(out)["matches"]) == 5
    code, out, _ = cli("--catalog", "--kind", "tpu", "--json")
    assert code == 0, out
    assert {m["model"] for m in json.loads(out)["matches"]} == {
        s.model for s in get_catalog() if s.kind is DeviceKind.TPU
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fleet", "A100-80G:2"], "--fleet: unknown device model 'A100-80G'; closest: A100-80GB"),
        (
            ["--fleet", "T4", "--catalog"],
            "give exactly one of --fleet, --config or --catalog (got --fleet and --catalog)",
        ),
        ([], "give exactly one of --fleet, --config or --catalog (got none)"),
        (["--fleet", "T4", "--kind", "gpu"], "--kind: only applies with --catalog"),
        (["--catalog", "--kind", "gpx"], "--kind: unknown kind 'gpx'; closest: gpu"),
        (["--config", "missing.yaml"], "--config missing.yaml: cannot read config"),
        (["--fleet", "T4", "--weights", "compute:1"], "--weights: cannot read 'compute:1'"),
        (["--fleet", "T4", "--weights", "speed=1"], "--weights: unknown criterion 'speed'"),
        (
            ["--fleet", "T4", "--require", "fp8,nvlnk"],
            "--require: unknown capability 'nvlnk'; closest: nvlink",
        ),
        (["--fleet", "T4", "--memory", "4XB"], "--memory: invalid size '4XB'"),
        (["--fleet", "T4", "--slo", "1"], "--slo: needs --flops or --bytes"),
        (["--fleet", "T4", "--dtype", "bf8"], "--dtype: unknown dtype 'bf8'"),
    ],
)
def test_cli_errors_name_the_option(args: list[str], message: str) -> None:
    code, out, err = cli(*args)
    assert code == 1
    assert message in err
    assert "Traceback" not in out + err


def test_cli_help_gives_an_example_for_every_option() -> None:
    code, out, _ = cli("--help")
    assert code == 0
    text = " ".join(out.split())
    for option in (
        "--fleet",
        "--config",
        "--catalog",
        "--kind",
        "--memory",
        "--require",
        "--prefer",
        "--dtype",
        "--memory-bound",
        "--flops",
        "--bytes",
        "--slo",
        "--train",
        "--min-throughput",
        "--max-price",
        "--weights",
        "--compute-efficiency",
        "--bandwidth-efficiency",
        "--top",
    ):
        assert f"e.g. {option}" in text


def test_model_option_needs_what_hetero_fit_estimates() -> None:
    # llama-3-8b at 8k x 16 needs about 50 GiB: an A100-80GB holds it, an L4 (24 GB) does not.
    code, out, _ = cli(
        "--fleet", "A100-80GB,L4", "--model", "llama-3-8b", "--seq", "8192", "--batch", "16",
        "--json",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    shape = get_model("llama-3-8b")
    request = FitRequest(seq=8192, batch=16).resolved(shape)
    assert doc["requirements"]["memory_bytes"] == sum(memory_breakdown(shape, request).values())
    eligible = {m["model"]: m["eligible"] for m in doc["matches"]}
    assert eligible == {"A100-80GB": True, "L4": False}


def test_train_with_a_model_needs_the_training_fit_and_six_flops_per_parameter() -> None:
    # Training llama-3-8b needs about 126 GiB (16 bytes a parameter and activations): the
    # B200 and H200 hold it; the B200 alone trains 15 samples of 1,024 tokens a second.
    code, out, _ = cli(
        "--fleet", "B200,H200-141GB,A100-80GB", "--train", "--model", "llama-3-8b",
        "--seq", "1024", "--min-throughput", "15", "--json",
    )  # fmt: skip
    assert code == 0, out
    doc = json.loads(out)
    shape = get_model("llama-3-8b")
    fit = FitRequest(seq=1024, batch=1, train=True).resolved(shape)
    requirements = doc["requirements"]
    assert requirements["memory_bytes"] == sum(memory_breakdown(shape, fit).values())
    assert requirements["work_flops"] == training_flops(shape, 1024)
    assert requirements["train"] is True and requirements["min_throughput"] == 15
    by_model = {m["model"]: m for m in doc["matches"]}
    assert by_model["B200"]["eligible"] is True
    assert by_model["H200-141GB"]["filters"] == {
        "health": True,
        "memory": True,
        "capabilities": True,
        "latency": True,
        "throughput": False,
        "price": True,
    }
    assert by_model["A100-80GB"]["filters"]["memory"] is False
    assert "samples/s, below 15/s: rejected" in by_model["H200-141GB"]["reasons"][4]
    # --flops wins over the 6N rule; --slo is for inference.
    code, out, _ = cli("--fleet", "L4", "--train", "--flops", "1e12", "--json")
    assert json.loads(out)["requirements"]["work_flops"] == 1e12
    code, _, err = cli("--fleet", "L4", "--train", "--flops", "1e12", "--slo", "1")
    assert code == 1
    assert "--slo: applies to inference requests" in err and "--min-throughput" in err


def test_min_throughput_needs_a_work_size() -> None:
    code, _, err = cli("--fleet", "L4", "--min-throughput", "5")
    assert code == 1 and "--min-throughput: needs --flops or --bytes" in err


def test_model_and_memory_together_is_an_error() -> None:
    code, _, err = cli("--fleet", "L4", "--model", "llama-3-8b", "--memory", "10GB")
    assert code == 1 and "--memory" in err and "not both" in err
    code, _, err = cli("--fleet", "L4", "--model", "llama-4-8b")
    assert code == 1 and "llama-3-8b" in err
