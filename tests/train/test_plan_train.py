"""``hetero plan-train``: a catalog model's per-layer training costs (parameters against the
catalog's count, FLOPs against seq, memory against ``hetero fit``), a fleet's devices as
ranks, and the command — a layout for a model no device holds, its explanation, its JSON, and
clear refusals of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.commands.plan_train import register
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import REFERENCE_TFLOPS, Device
from hetero.errors import ConfigError
from hetero.plan.match import DEFAULT_COMPUTE_EFFICIENCY
from hetero.plan.memory import DEFAULT_CONTEXT_BYTES, FitRequest, fit_memory
from hetero.plan.models import get_model
from hetero.sim.run import devices_from_names
from hetero.train.fleet_layout import choose_layout
from hetero.train.fleet_ranks import (
    NETWORK_BANDWIDTH,
    default_bandwidth,
    dtype_fallbacks,
    pipeline_ranks,
)
from hetero.train.model_costs import (
    training_layer_costs,
    training_layer_flops,
    training_layer_params,
)
from tests.cli_apps import command_app

app = command_app(register)
runner = CliRunner()
WIDE = {"COLUMNS": "200"}
# Two A100s and two V100s: llama-3-8b's 120 GiB of state fits none of them alone.
MIXED = "A100-80GB:2,V100-32GB:2"


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["plan-train", *args], env=WIDE)
    return result.exit_code, result.stdout, result.stderr


# -- the model's layers -------------------------------------------------------------------------


def test_layers_hold_the_catalogs_parameters_and_bytes() -> None:
    model = get_model("llama-3-8b")
    params = training_layer_params(model)
    assert len(params) == model.layers + 2  # embedding, 32 blocks, norm + LM head
    blocks = sum(count for count, _ in params[1:-1])
    embeddings = 2 * model.vocab * model.hidden + model.hidden  # both ends and the final norm
    assert blocks == pytest.approx(model.params - embeddings, rel=0.01)
    assert sum(count for count, _ in params) == model.params == 8_030_261_248
    costs = training_layer_costs(model, seq=4096)
    assert sum(c.parameter_bytes or 0 for c in costs) == 2 * model.params  # bf16 gradients
    # Mixed-precision AdamW: 2 + 2 bytes of weights and gradients, 12 of fp32 master and moments.
    assert [c.state_bytes for c in costs] == [16 * count for count, _ in params]


def test_a_mixture_of_experts_counts_every_expert_and_the_active_ones() -> None:
    model = get_model("deepseek-v3")  # 3 dense blocks, then 58 of 256 routed experts
    params = training_layer_params(model)
    assert sum(count for count, _ in params) == model.params
    assert sum(active for _, active in params) == model.active_params
    assert params[1] == params[3] != params[4]
    assert params[4][1] < params[4][0]


def test_tied_embeddings_are_held_at_both_ends() -> None:
    model = get_model("llama-3.2-1b")
    params = training_layer_params(model)
    assert sum(count for count, _ in params) == model.params + model.vocab * model.hidden


def test_a_blocks_flops_are_6_per_parameter_and_token_plus_causal_attention() -> None:
    model = get_model("llama-3-8b")
    block = training_layer_params(model)[1][1]
    for seq in (1024, 2048, 4096):
        attention = 3 * 2 * (seq * (seq + 1) // 2) * model.heads * 2 * model.head_dim
        flops = training_layer_flops(model, seq)
        assert flops[1] == 6 * block * seq + attention
        assert flops[0] == 0  # the embedding is a lookup
    short, long = training_layer_flops(model, 2048)[1], training_layer_flops(model, 4096)[1]
    assert 2 * short < long < 4 * short  # linear in the parameters, quadratic in attention


def test_a_sliding_window_caps_the_keys_each_token_attends_to() -> None:
    model = get_model("mistral-7b")  # every layer attends to the last 4,096 tokens
    window = model.sliding_window
    pairs = window * (window + 1) // 2 + (8192 - window) * window
    block = training_layer_params(model)[1][1]
    attention = 3 * 2 * pairs * model.heads * 2 * model.head_dim
    assert training_layer_flops(model, 8192)[1] == 6 * block * 8192 + attention


def test_seconds_are_flops_at_the_reference_device() -> None:
    model = get_model("llama-3-8b")
    costs = training_layer_costs(model, seq=2048, compute_efficiency=0.25)
    rate = REFERENCE_TFLOPS * 1e12 * 0.25
    for cost, flops in zip(costs, training_layer_flops(model, 2048), strict=True):
        assert cost.seconds == pytest.approx(flops / rate, rel=1e-12)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_memory_is_hetero_fits_for_one_sequence(dtype: str) -> None:
    model = get_model("llama-3-8b")
    costs = training_layer_costs(model, seq=4096, dtype=dtype)
    fit = fit_memory(model, "A100-80GB", FitRequest(seq=4096, train=True, dtype=dtype))
    held = sum(c.state_bytes + c.activation_bytes for c in costs) + DEFAULT_CONTEXT_BYTES
    assert abs(held - fit.total_bytes) <= len(costs)  # each layer's fragmentation rounded up
    assert costs[-1].activation_bytes == pytest.approx(
        fit.breakdown["logits"] * (1 + FitRequest(seq=1).fragmentation), abs=1
    )


def test_bad_costs_are_refused_by_name() -> None:
    model = get_model("llama-3-8b")
    with pytest.raises(ConfigError, match=r"seq: must be a whole number of tokens >= 1, got 0"):
        training_layer_costs(model, seq=0)
    with pytest.raises(ConfigError, match=r"compute_efficiency: .*\(0, 1\], got 1.5"):
        training_layer_costs(model, seq=128, compute_efficiency=1.5)
    with pytest.raises(ConfigError, match=r"dtype: training needs"):
        training_layer_costs(model, seq=128, dtype="int4")


# -- the fleet's ranks --------------------------------------------------------------------------


def test_ranks_take_catalog_speeds_and_memory_less_the_context() -> None:
    devices = devices_from_names("A100-80GB,T4")
    ranks = pipeline_ranks(devices, dtype="bf16")
    catalog = get_catalog()
    assert [r.rank for r in ranks] == [0, 1]
    assert ranks[0].speed == 312 / REFERENCE_TFLOPS
    assert ranks[1].speed == 65 / REFERENCE_TFLOPS  # no bf16 on a T4: its fp16 stands in
    assert ranks[1].memory == catalog.get("T4").memory_bytes - DEFAULT_CONTEXT_BYTES
    assert dtype_fallbacks(devices, "bf16") == ["T4"]
    assert dtype_fallbacks(devices, "fp16") == []
    given = Device(id="slow", spec=catalog.get("A100-80GB"), speed_override=0.5)
    assert pipeline_ranks([given], dtype="bf16")[0].speed == 0.5


def test_default_bandwidth_is_pcie_in_a_node_and_the_network_across_nodes() -> None:
    mixed = devices_from_names("A100-80GB,T4")  # a T4 is PCIe Gen3: 32 GB/s, half across sockets
    assert default_bandwidth(mixed)[0] == 8e9
    l4 = get_catalog().get("L4")  # PCIe Gen4: 16 GB/s one way across sockets
    one_node = [Device(id=f"l4:{i}", spec=l4) for i in range(2)]
    assert default_bandwidth(one_node)[0] == 16e9
    two_nodes = [Device(id=f"l4:{i}", spec=l4, node=f"n{i}") for i in range(2)]
    assert default_bandwidth(two_nodes) == (NETWORK_BANDWIDTH, "a 100 Gb/s network between nodes")


# -- the command --------------------------------------------------------------------------------


def test_a_model_no_device_holds_is_laid_out_as_a_pipeline_and_explained() -> None:
    code, out, err = invoke("llama-3-8b", "--fleet", MIXED, "--seq", "2048", "--global-batch", "16")
    assert code == 0, err
    assert "llama-3-8b (8.03B parameters, 34 layers)" in out
    assert "chose 1 × 4 (blocks)" in out and "4 stage(s)" in out
    # Every layout tried, and why it lost: one device does not hold the model.
    assert "4 × 1 (dealt): does not fit: the replica of ranks 0: memory: no split" in out
    assert "2 × 2 (dealt): does not fit" in out and "2 × 2 (blocks): does not fit" in out
    assert "1 × 4 (blocks): chosen" in out
    assert "a100-80gb:0 (A100-80GB)" in out and "v100-32gb:1 (V100-32GB)" in out
    assert "hetero's default, PCIe Gen3 between sockets" in out
    assert "V100-32GB: no bf16 TFLOPS in the catalog" in out


def test_json_is_the_planners_layout() -> None:
    args = ["llama-3-8b", "--fleet", MIXED, "--seq", "2048", "--global-batch", "16"]
    code, out, err = invoke(*args, "--micro-batch", "2", "--bandwidth", "12.5", "--json")
    assert code == 0, err
    data = json.loads(out)
    model = get_model("llama-3-8b")
    costs = training_layer_costs(model, seq=2048, compute_efficiency=DEFAULT_COMPUTE_EFFICIENCY)
    ranks = pipeline_ranks(devices_from_names(MIXED), dtype="bf16")
    layout = choose_layout(costs, ranks, global_batch=16, micro_batch_size=2, bandwidth=12.5e9)
    assert data["layout"] == json.loads(json.dumps(layout.to_dict()))
    assert len(data["layout"]["replicas"][0]["plan"]["stages"]) > 1
    assert data["model"]["params"] == model.params
    assert [r["model"] for r in data["ranks"]] == ["A100-80GB"] * 2 + ["V100-32GB"] * 2
    assert data["bandwidth_source"] == "--bandwidth"
    assert len(data["layers"]) == model.layers + 2


def test_a_fleet_file_gives_nodes_speeds_and_memory(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "devices:\n"
        "  - {type: gpu, model: L4, emulate: true, count: 2, node: a}\n"
        "  - {type: gpu, model: L4, emulate: true, count: 2, node: b, speed: 1.5}\n"
    )
    code, out, err = invoke("llama-3.2-1b", "--fleet", str(fleet), "--seq", "1024", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [r["node"] for r in data["ranks"]] == ["a", "a", "b", "b"]
    assert [r["speed"] for r in data["ranks"]][2:] == [1.5, 1.5]
    assert data["layout"]["bandwidth"] == NETWORK_BANDWIDTH
    assert data["bandwidth_source"] == "a 100 Gb/s network between nodes"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["llama-3-9b"], 1, "MODEL: unknown model 'llama-3-9b'; closest: llama-3-8b"),
        (["500M"], 1, "MODEL: a parameter count must be from 1B to 10T"),
        (["llama-3-8b", "-c", "x.json"], 1, "MODEL: give a built-in model name"),
        (["--fleet", "T4"], 1, "MODEL: give a built-in model name"),
        (["llama-3-8b", "--fleet", "T5:2"], 1, "--fleet: unknown device model 'T5'; closest:"),
        (["llama-3-8b", "--fleet", "missing.yaml"], 1, "--fleet missing.yaml: cannot read"),
        (
            ["llama-3-8b", "--global-batch", "10", "--micro-batch", "4"],
            1,
            "--global-batch: 10 is not a whole number of micro-batches of 4",
        ),
        (["llama-3-8b", "--schedule", "zb"], 1, "--schedule: must be one of 'gpipe', '1f1b'"),
        (["llama-3-8b", "--dtype", "int8"], 1, "--dtype: training needs fp32, bf16, fp16"),
        (["llama-3-8b", "--compute-efficiency", "0"], 1, "--compute-efficiency: must be a share"),
        (["llama-3-8b", "--global-batch", "0"], 2, "--global-batch"),
        (["llama-3-8b", "--bandwidth", "0"], 2, "--bandwidth"),
        (["llama-3-8b", "--seq", "0"], 2, "--seq"),
    ],
)
def test_bad_input_is_refused_clearly(args: list[str], code: int, message: str) -> None:
    if "--fleet" not in args:
        args = [*args, "--fleet", MIXED]
    got, out, err = invoke(*args)
    assert got == code, out
    assert message in " ".join(err.split()), err
    assert "Traceback" not in out + err


def test_a_layer_no_device_holds_is_named() -> None:
    code, _, err = invoke("llama-3.1-405b", "--fleet", "T4:2")
    assert code == 1
    assert "error: memory: layer 0 ('embedding') needs" in err
    assert "more than the largest rank, rank 0 with 16,106,127,360 bytes (15 GiB)" in err


def test_a_fleet_too_small_for_the_model_gets_every_layouts_reason() -> None:
    code, _, err = invoke("llama-3-8b", "--fleet", "T4:2")
    assert code == 1
    text = " ".join(err.split())
    assert "error: --fleet: no data × pipeline layout of the 2 ranks works" in text
    assert "1 deep, dealt: left out" in text and "2 deep, blocks: left out" in text
