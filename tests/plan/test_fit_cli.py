from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.commands.fit import register
from hetero.plan.memory import FitRequest, fit_memory
from hetero.plan.models import get_model, model_names
from tests.cli_apps import command_app

app = command_app(register)


runner = CliRunner()
WIDE = {"COLUMNS": "160"}


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["fit", *args], env=WIDE)
    return result.exit_code, result.stdout, result.stderr


def test_table_with_verdict_and_limits() -> None:
    code, out, _ = invoke("llama-3-8b", "--device", "A100-80GB", "--seq", "8192", "--batch", "16")
    assert code == 0, out
    expected = fit_memory(get_model("llama-3-8b"), "A100-80GB", FitRequest(seq=8192, batch=16))
    for component in ("weights", "kv cache", "activations", "logits", "cuda context", "total"):
        assert component in out
    assert "fits:" in out and "free" in out
    assert f"largest batch at seq 8,192: {expected.max_batch}" in out
    assert f"longest context at batch 16: {expected.max_seq:,} tokens" in out


def test_json_matches_the_library() -> None:
    args = ["llama-3-8b", "-d", "A100-80GB", "--seq", "8192", "--train", "--zero", "2"]
    code, out, _ = invoke(*args, "--devices", "8", "--checkpointing", "--json")
    assert code == 0, out
    data = json.loads(out)
    request = FitRequest(seq=8192, train=True, zero=2, devices=8, checkpointing=True)
    expected = fit_memory(get_model("llama-3-8b"), "A100-80GB", request).to_dict()
    assert data == expected
    assert set(data["breakdown"]) >= {"weights", "gradients", "optimizer", "activations"}


def test_does_not_fit_still_exits_zero() -> None:
    code, out, _ = invoke("deepseek-v3", "--device", "A100-80GB", "--seq", "1024")
    assert code == 0
    assert "does not fit" in out and "short" in out
    assert "largest batch at seq 1,024: 0" in out
    assert "256 routed experts are resident" in out


def test_options_reach_the_estimate() -> None:
    args = ["mistral-7b", "-d", "T4", "--seq", "32768", "--dtype", "int4", "--kv-dtype", "fp8"]
    code, out, _ = invoke(*args, "--context-memory", "600MiB", "--fragmentation", "0", "--json")
    assert code == 0, out
    data = json.loads(out)
    assert data["dtype"] == "int4" and data["kv_dtype"] == "fp8"
    assert data["breakdown"]["cuda_context"] == 600 * 1024**2
    assert data["breakdown"]["fragmentation"] == 0
    assert data["breakdown"]["kv_cache"] == 4096 * 32 * 2 * 8 * 128  # window-capped, 1 B/value


def test_list_models() -> None:
    code, out, _ = invoke("--list")
    assert code == 0
    for name in model_names():
        assert name in out
    code, out, _ = invoke("--list", "--json")
    rows = json.loads(out)
    assert [r["name"] for r in rows] == model_names()
    deepseek = rows[-1]
    assert deepseek["attention"] == "mla" and deepseek["kv_bytes_per_token_bf16"] == 70_272


def test_local_config_json(tmp_path: Path) -> None:
    config = {
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = invoke("--config", str(tmp_path), "-d", "L4", "--seq", "4096", "--json")
    assert code == 0, out
    data = json.loads(out)
    # Llama-3.2-1B's shape: 1.24B parameters (huggingface.co/meta-llama/Llama-3.2-1B).
    assert data["params"] == pytest.approx(1.24e9, rel=0.01)
    assert data["fits"] is True


def test_malformed_config_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": "big"}')
    code, out, err = invoke("--config", str(path), "-d", "A100-80GB")
    assert code == 1 and out == ""
    assert f"error: {path}:hidden_size: must be a positive integer, got 'big'" in err
    assert "num_hidden_layers: missing" in err


def test_unknown_model() -> None:
    code, _, err = invoke("lama-3-70", "--device", "A100-80GB")
    assert code == 1
    assert "unknown model 'lama-3-70'" in err and "closest: llama-3-70b" in err
    assert "--config" in err


def test_unknown_device() -> None:
    code, _, err = invoke("llama-3-8b", "--device", "H100-SMX")
    assert code == 1
    assert "unknown device model 'H100-SMX'" in err and "closest:" in err and "H100" in err


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (["llama-3-8b"], "--device: required"),
        (["-d", "A100-80GB"], "give a built-in model name or --config"),
        (["llama-3-8b", "--config", "x.json", "-d", "A100-80GB"], "not both"),
        (["llama-3-8b", "-d", "A100-80GB", "--batch", "0"], "batch: must be a positive integer"),
        (["llama-3-8b", "-d", "A100-80GB", "--zero", "3"], "zero: ZeRO stage 3 applies"),
        (["llama-3-8b", "-d", "A100-80GB", "--dtype", "fp4"], "dtype: unknown format 'fp4'"),
        (["llama-3-8b", "-d", "A100-80GB", "--context-memory", "1 lb"], "--context-memory:"),
    ],
)
def test_bad_input_exits_one(args: list[str], text: str) -> None:
    code, out, err = invoke(*args)
    assert code == 1 and out == ""
    assert text in err


def test_help_gives_an_example_for_every_option() -> None:
    result = runner.invoke(app, ["fit", "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if "│ --" in line]
    options = [line for line in lines if not line.startswith(("│ --json", "│ --help"))]
    assert len(options) == 15
    assert all("e.g." in line for line in options)
