"""``hetero mock-model DIR``: a tiny Llama that transformers loads, its tokenizer with a chat
template, and the printed command that a real vLLM CPU engine starts from (that last test runs
the engine, as the other ``vllm`` tests do)."""

from __future__ import annotations

import json
import os
import re
import shlex
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.commands.launch import free_port
from hetero.serve.emulator.tiny_llama import parameter_count
from tests.vllm_engine import VllmReplica, models_dir, vllm_available

runner = CliRunner()
ENGINE = "-m vllm.entrypoints.openai.api_server"


def _printed_command(output: str) -> tuple[dict[str, str], list[str]]:
    """The environment and arguments of the vLLM command ``hetero mock-model`` printed."""
    line = next(line for line in output.splitlines() if ENGINE in line)
    words = shlex.split(line)
    env = {}
    while re.fullmatch(r"[A-Z_]+=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    return env, words


def _make(directory: Path, *args: str) -> str:
    result = runner.invoke(app, ["mock-model", str(directory), *args], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_mock_model_writes_a_model_and_tokenizer_transformers_load(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    directory = tmp_path / "tiny"
    output = _make(directory, "--name", "tiny", "--port", "8123")

    config = transformers.AutoConfig.from_pretrained(directory)
    assert config.model_type == "llama"
    assert (config.num_hidden_layers, config.hidden_size) == (6, 128)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    assert config.vocab_size == len(tokenizer)
    text = "Hello, who are you? 42 tokens."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert chat == "<s><|user|>\nhi</s>\n<|assistant|>\n"
    model = transformers.AutoModelForCausalLM.from_pretrained(directory)
    assert sum(p.numel() for p in model.parameters()) == parameter_count("small")

    env, args = _printed_command(output)
    assert env["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_OMP_THREADS_BIND" not in env
    assert args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert args[args.index("--model") + 1] == str(directory.resolve())
    assert args[args.index("--served-model-name") + 1] == "tiny"
    assert args[args.index("--port") + 1] == "8123"
    assert "hetero serve -r http://127.0.0.1:8123" in output
    assert "2,623,104 random parameters" in output


def test_a_second_run_reuses_the_model_and_other_files_are_never_overwritten(
    tmp_path: Path,
) -> None:
    pytest.importorskip("transformers")
    directory = tmp_path / "tiny"
    _make(directory)
    weights = directory / "model.safetensors"
    before = weights.stat().st_mtime_ns
    _make(directory, "--core", "1")  # the same size and seed: nothing rebuilt
    assert weights.stat().st_mtime_ns == before

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = runner.invoke(app, ["mock-model", str(mine)], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert f"error: DIR: '{mine}' is not an empty folder nor a model" in result.output
    assert (mine / "notes.txt").read_text() == "keep me" and len(list(mine.iterdir())) == 1


def test_an_unknown_size_is_refused_naming_the_sizes(tmp_path: Path) -> None:
    result = runner.invoke(app, ["mock-model", str(tmp_path / "x"), "--size", "huge"])
    assert result.exit_code == 1
    assert "error: --size: unknown size 'huge'; allowed: small, large" in result.output
    assert not (tmp_path / "x").exists()


@dataclass
class _Printed(VllmReplica):
    """A vLLM replica started exactly as ``hetero mock-model`` printed it."""

    argv: Sequence[str] = ()
    extra_env: dict[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        return list(self.argv)

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.extra_env}

    def tail(self, chars: int = 3000) -> str:
        # An engine that fails says why far above its log's last lines (a traceback of the API
        # server follows): its error lines first.
        text = super().tail(10**7)
        errors = [line for line in text.splitlines() if "Error" in line and "File " not in line]
        return "\n".join(errors[-20:]) + "\n...\n" + text[-chars:]


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(1000)
def test_the_printed_command_starts_a_vllm_engine_that_answers(tmp_path: Path) -> None:
    reason = vllm_available()
    if reason is not None:
        pytest.skip(reason)
    port = free_port()
    core = (os.cpu_count() or 1) - 1  # beside the session's engines on cores 0 and 1
    # The session fleet's small model is this one (the same shape and seed; the command reuses
    # it), and vLLM's compile cache, keyed partly by the model's path, is warm there.
    directory = models_dir() / "small"
    output = _make(directory, "--port", str(port), "--core", str(core))
    env, args = _printed_command(output)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == str(core)
    replica = _Printed(
        directory, "tiny-llama", port=port, log_dir=tmp_path, argv=args, extra_env=env
    )
    replica.start()
    try:
        # A first start compiles for minutes on a loaded machine; only its answer is tested.
        replica.wait(timeout=700)
        body = {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 8,
            "ignore_eos": True,
        }
        request = urllib.request.Request(
            replica.url + "/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            answer = json.loads(reply.read())
    finally:
        replica.stop()
    assert answer["model"] == "tiny-llama"
    assert answer["usage"]["completion_tokens"] == 8
