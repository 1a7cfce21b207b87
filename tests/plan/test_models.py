from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hetero.errors import ConfigError, HeteroError
from hetero.plan.models import ModelShape, builtin_models, get_model, load_hf_config, model_names

# The memory-relevant keys of each model's official config.json on the Hugging Face Hub
# (huggingface.co/<repo>/blob/main/config.json), copied verbatim.
OFFICIAL_CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {  # meta-llama/Meta-Llama-3-8B
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 128256,
        "attention_bias": False,
    },
    "llama-3-70b": {  # meta-llama/Meta-Llama-3-70B
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "max_position_embeddings": 8192,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 128256,
        "attention_bias": False,
    },
    "mistral-7b": {  # mistralai/Mistral-7B-v0.1
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    },
    "qwen2.5-7b": {  # Qwen/Qwen2.5-7B
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
    "qwen2.5-72b": {  # Qwen/Qwen2.5-72B
        "model_type": "qwen2",
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "max_position_embeddings": 131072,
        "max_window_layers": 80,
        "num_attention_heads": 64,
        "num_hidden_layers": 80,
        "num_key_value_heads": 8,
        "sliding_window": 131072,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 152064,
    },
    "deepseek-v3": {  # deepseek-ai/DeepSeek-V3
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "first_k_dense_replace": 3,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 2048,
        "moe_layer_freq": 1,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_attention_heads": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 61,
        "num_key_value_heads": 128,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "quantization_config": {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": [128, 128],
        },
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 129280,
    },
}


def write_config(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, "utf-8")
    return path


def problems(exc: pytest.ExceptionInfo[ConfigError]) -> dict[str, str]:
    return {path.rsplit(":", 1)[-1]: message for path, message in exc.value.problems}


@pytest.mark.parametrize("name", sorted(OFFICIAL_CONFIGS))
def test_table_is_the_official_config(tmp_path: Path, name: str) -> None:
    loaded = load_hf_config(write_config(tmp_path, OFFICIAL_CONFIGS[name]))
    builtin = get_model(name)
    for field in dataclasses.fields(ModelShape):
        if field.name not in ("name", "source"):
            assert getattr(loaded, field.name) == getattr(builtin, field.name), field.name


def test_table_covers_the_issue_models() -> None:
    assert model_names() == [
        "llama-3-8b",
        "llama-3-70b",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "mistral-7b",
        "qwen2.5-7b",
        "qwen2.5-14b",
        "qwen2.5-32b",
        "qwen2.5-72b",
        "deepseek-v3",
    ]
    assert [m.name for m in builtin_models()] == model_names()


def test_exact_parameter_counts() -> None:
    # The safetensors totals the Hub shows for these checkpoints.
    assert get_model("llama-3-8b").params == 8_030_261_248
    assert get_model("mistral-7b").params == 7_241_732_096


def test_newer_models_by_their_hub_ids_and_totals() -> None:
    # The parameter totals the Hub shows for these checkpoints.
    totals = {
        "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
        "meta-llama/Llama-3.2-1B": 1_235_814_400,
        "meta-llama/Llama-3.2-3B-Instruct": 3_212_749_824,
        "Qwen/Qwen2.5-14B-Instruct": 14_770_033_664,
        "Qwen/Qwen2.5-32B": 32_763_876_352,
    }
    for hub_id, total in totals.items():
        assert get_model(hub_id).params == total, hub_id


def test_a_bare_parameter_count_makes_a_llama_shaped_model() -> None:
    from hetero.plan.models import parse_params, shape_for_params

    assert parse_params("70B") == 70e9 and parse_params("1.5b") == 1.5e9
    assert parse_params("7e9") == 7e9 and parse_params("llama") is None
    for count in (1e9, 8e9, 70e9, 405e9, 1e12):
        shape = shape_for_params(count)
        assert abs(shape.params / count - 1) < 0.03
        assert 64 <= shape.hidden / shape.layers <= 256  # Llama-like proportions
    with pytest.raises(ConfigError, match="from 1B to 10T"):
        shape_for_params(5e8)


def test_active_parameters() -> None:
    dense = get_model("qwen2.5-72b")
    assert dense.active_params == dense.params and not dense.is_moe
    moe = get_model("deepseek-v3")
    assert moe.is_moe and moe.moe_layers == 58
    assert moe.active_params < moe.params / 10


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-70B", "llama-3-70b"),
        ("Meta-Llama-3-8B-Instruct", "llama-3-8b"),
        ("llama3_70b", "llama-3-70b"),
        ("Qwen/Qwen2.5-7B", "qwen2.5-7b"),
        ("qwen25-72b", "qwen2.5-72b"),
        ("MISTRAL 7B", "mistral-7b"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
    ],
)
def test_lookup_by_alias_and_any_case(alias: str, name: str) -> None:
    assert get_model(alias).name == name


def test_unknown_model_suggests_closest_and_config() -> None:
    with pytest.raises(ConfigError) as exc:
        get_model("lama-3-80b")
    assert isinstance(exc.value, HeteroError)
    path, message = exc.value.problems[0]
    assert path == "model"
    assert "'lama-3-80b'" in message and "closest: llama-3-8b" in message
    assert "--config" in message


def test_directory_holding_config_json(tmp_path: Path) -> None:
    write_config(tmp_path, OFFICIAL_CONFIGS["llama-3-8b"])
    shape = load_hf_config(tmp_path)
    assert shape.params == 8_030_261_248
    assert shape.source == str(tmp_path / "config.json")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path / "nope.json")


def test_bad_json_names_file_and_position(tmp_path: Path) -> None:
    path = write_config(tmp_path, '{"hidden_size": 4096,\n "num_hidden_layers": }')
    with pytest.raises(ConfigError) as exc:
        load_hf_config(path)
    [(where, message)] = exc.value.problems
    assert where == str(path)
    assert "not valid JSON" in message and "line 2" in message


def test_json_that_is_not_an_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="JSON object, got list"):
        load_hf_config(write_config(tmp_path, [1, 2]))


def test_every_bad_key_is_reported_at_once(tmp_path: Path) -> None:
    data = dict(OFFICIAL_CONFIGS["llama-3-8b"])
    del data["vocab_size"]
    data["hidden_size"] = -4096
    data["num_hidden_layers"] = "32"
    data["num_key_value_heads"] = 8.0
    data["tie_word_embeddings"] = "no"
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as exc:
        load_hf_config(path)
    found = problems(exc)
    assert set(found) == {
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_key_value_heads",
        "tie_word_embeddings",
    }
    assert "missing" in found["vocab_size"]
    assert "positive integer, got -4096" in found["hidden_size"]
    assert "got '32'" in found["num_hidden_layers"]
    assert "got 8.0" in found["num_key_value_heads"]
    assert "true or false" in found["tie_word_embeddings"]
    assert all(path.startswith(str(tmp_path)) for path, _ in exc.value.problems)


def test_bool_is_not_a_count(tmp_path: Path) -> None:
    data = {**OFFICIAL_CONFIGS["llama-3-8b"], "num_attention_heads": True}
    with pytest.raises(ConfigError) as exc:
        load_hf_config(write_config(tmp_path, data))
    assert "num_attention_heads" in problems(exc)


def test_head_dim_needed_when_hidden_is_not_divisible(tmp_path: Path) -> None:
    data = {**OFFICIAL_CONFIGS["llama-3-8b"], "num_attention_heads": 30}
    with pytest.raises(ConfigError) as exc:
        load_hf_config(write_config(tmp_path, data))
    assert "not divisible" in problems(exc)["head_dim"]
    shape = load_hf_config(write_config(tmp_path, {**data, "head_dim": 128}))
    assert shape.head_dim == 128


def test_mla_needs_its_head_dims(tmp_path: Path) -> None:
    data = dict(OFFICIAL_CONFIGS["deepseek-v3"])
    del data["qk_rope_head_dim"]
    with pytest.raises(ConfigError) as exc:
        load_hf_config(write_config(tmp_path, data))
    assert set(problems(exc)) == {"qk_rope_head_dim"}


def test_moe_needs_experts_per_token(tmp_path: Path) -> None:
    data = dict(OFFICIAL_CONFIGS["deepseek-v3"])
    del data["num_experts_per_tok"]
    with pytest.raises(ConfigError) as exc:
        load_hf_config(write_config(tmp_path, data))
    assert "missing" in problems(exc)["num_experts_per_tok"]


def test_mixtral_style_experts(tmp_path: Path) -> None:
    data = {
        **OFFICIAL_CONFIGS["mistral-7b"],
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": None,
    }
    shape = load_hf_config(write_config(tmp_path, data))
    assert shape.experts == 8 and shape.moe_intermediate == 14336
    assert shape.moe_layers == 32 and shape.sliding_layers == ()
    # Mixtral-8x7B: 46.7B parameters, 12.9B active (mistral.ai/news/mixtral-of-experts).
    assert shape.params == pytest.approx(46.7e9, rel=0.01)
    assert shape.active_params == pytest.approx(12.9e9, rel=0.01)


def test_sliding_window_layers(tmp_path: Path) -> None:
    mistral = load_hf_config(write_config(tmp_path, OFFICIAL_CONFIGS["mistral-7b"]))
    assert mistral.sliding_window == 4096 and mistral.sliding_layers == tuple(range(32))
    qwen = {**OFFICIAL_CONFIGS["qwen2.5-7b"], "use_sliding_window": True, "max_window_layers": 20}
    shape = load_hf_config(write_config(tmp_path, qwen))
    assert shape.sliding_layers == tuple(range(20, 28))
    typed = {
        **OFFICIAL_CONFIGS["llama-3-8b"],
        "sliding_window": 1024,
        "layer_types": ["sliding_attention", "full_attention"] * 16,
    }
    shape = load_hf_config(write_config(tmp_path, typed))
    assert shape.sliding_layers == tuple(range(0, 32, 2))
    bad = {**typed, "layer_types": ["sliding_attention"]}
    with pytest.raises(ConfigError) as exc:
        load_hf_config(write_config(tmp_path, bad))
    assert "list of 32" in problems(exc)["layer_types"]


@pytest.mark.parametrize(
    ("extra", "dtype"),
    [
        ({"torch_dtype": "float16"}, "fp16"),
        ({"torch_dtype": "float32"}, "fp32"),
        ({"dtype": "bfloat16"}, "bf16"),
        ({"quantization_config": {"quant_method": "awq", "bits": 4}}, "int4"),
        ({"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}}, "int8"),
        ({"quantization_config": {"quant_method": "fp8"}}, "fp8"),
    ],
)
def test_weight_format_from_config(tmp_path: Path, extra: dict[str, Any], dtype: str) -> None:
    data = {**OFFICIAL_CONFIGS["llama-3-8b"], **extra}
    assert load_hf_config(write_config(tmp_path, data)).weights_dtype == dtype


def test_qwen2_counts_qkv_biases(tmp_path: Path) -> None:
    with_bias = load_hf_config(write_config(tmp_path, OFFICIAL_CONFIGS["qwen2.5-7b"]))
    llama_style = {**OFFICIAL_CONFIGS["qwen2.5-7b"], "model_type": "llama"}
    without = load_hf_config(write_config(tmp_path, llama_style))
    kv_width = 4 * 128
    assert with_bias.params - without.params == 28 * (3584 + 2 * kv_width)
