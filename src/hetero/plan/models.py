"""Model shapes for memory planning: a built-in table of popular LLMs and a ``config.json`` reader.

A :class:`ModelShape` holds the numbers of a decoder-only transformer that decide its memory:
layers, widths, attention heads (GQA, or MLA's compressed latent), MoE experts and sliding-window
layers. Parameter counts are computed from the shape, never typed in, so the table can be
checked against the published figures (``tests/plan/test_memory.py``).

Every row of the built-in table copies the model's official Hugging Face ``config.json``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero.errors import ConfigError

__all__ = [
    "ModelShape",
    "builtin_models",
    "get_model",
    "load_hf_config",
    "model_names",
    "parse_params",
    "shape_for_params",
]


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The memory-relevant shape of a decoder-only transformer with gated (SwiGLU) MLPs.

    ``experts == 0`` means a dense model; ``kv_lora_rank == 0`` means standard multi-head/GQA
    attention rather than DeepSeek's multi-head latent attention (MLA); ``sliding_window == 0``
    means every layer attends to the whole context.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int  # query/key width per head; for MLA qk_nope_head_dim + qk_rope_head_dim
    intermediate: int
    vocab: int
    max_positions: int
    tie_embeddings: bool = False
    weights_dtype: str = "bf16"
    qkv_bias: bool = False
    o_bias: bool = False
    # Mixture of experts: which layers are MoE follows DeepSeek's rule
    # (index >= first_dense_layers and index % moe_layer_freq == 0).
    experts: int = 0
    shared_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0
    first_dense_layers: int = 0
    moe_layer_freq: int = 1
    # Multi-head latent attention (DeepSeek-V2/V3); q_lora_rank 0 = queries not compressed.
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    sliding_layers: tuple[int, ...] = ()
    source: str = ""

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, index: int) -> bool:
        return self.is_moe and index >= self.first_dense_layers and index % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.layers))

    @property
    def params(self) -> int:
        """Every parameter, all experts included (what has to be resident)."""
        return self._count(self.experts)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: the routed experts it picks, not all of them."""
        return self._count(self.experts_per_token)

    def _count(self, routed_experts: int) -> int:
        h = self.hidden
        embeddings = self.vocab * h * (1 if self.tie_embeddings else 2)
        norms = 2 * h  # input and post-attention RMSNorm weights
        dense_mlp = 3 * h * self.intermediate  # gate, up and down projections
        expert = 3 * h * self.moe_intermediate
        moe_mlp = (routed_experts + self.shared_experts) * expert + h * self.experts  # + router
        per_layer = self._attention_params() + norms
        total = embeddings + h  # + final norm
        for i in range(self.layers):
            total += per_layer + (moe_mlp if self.is_moe_layer(i) else dense_mlp)
        return total

    def _attention_params(self) -> int:
        h, heads = self.hidden, self.heads
        if self.is_mla:
            qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * heads * qk_dim
            else:
                q = h * heads * qk_dim
            kv = (
                h * (self.kv_lora_rank + self.qk_rope_head_dim)  # latent + shared rope key
                + self.kv_lora_rank  # latent RMSNorm
                + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
            )
            return q + kv + heads * self.v_head_dim * h
        q_out = heads * self.head_dim
        kv_out = self.kv_heads * self.head_dim
        bias = (q_out + 2 * kv_out) * self.qkv_bias + h * self.o_bias
        return h * (q_out + 2 * kv_out) + q_out * h + bias


# fmt: off
_TABLE: tuple[tuple[ModelShape, tuple[str, ...]], ...] = (
    (ModelShape(
        name="llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
        intermediate=14336, vocab=128256, max_positions=8192,
        source="meta-llama/Meta-Llama-3-8B",
    ), ("llama3-8b", "meta-llama-3-8b", "llama-3-8b-instruct", "meta-llama-3-8b-instruct")),
    (ModelShape(
        name="llama-3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
        intermediate=28672, vocab=128256, max_positions=8192,
        source="meta-llama/Meta-Llama-3-70B",
    ), ("llama3-70b", "meta-llama-3-70b", "llama-3-70b-instruct", "meta-llama-3-70b-instruct")),
    (ModelShape(
        name="llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
        intermediate=14336, vocab=128256, max_positions=131072,
        source="meta-llama/Llama-3.1-8B",
    ), ("llama-3.1-8b-instruct", "meta-llama-3.1-8b", "meta-llama-3.1-8b-instruct")),
    (ModelShape(
        name="llama-3.1-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
        intermediate=28672, vocab=128256, max_positions=131072,
        source="meta-llama/Llama-3.1-70B",
    ), ("llama-3.1-70b-instruct", "meta-llama-3.1-70b", "meta-llama-3.1-70b-instruct")),
    (ModelShape(
        name="llama-3.1-405b", layers=126, hidden=16384, heads=128, kv_heads=8, head_dim=128,
        intermediate=53248, vocab=128256, max_positions=131072,
        source="meta-llama/Llama-3.1-405B",
    ), ("llama-3.1-405b-instruct", "meta-llama-3.1-405b", "meta-llama-3.1-405b-instruct")),
    (ModelShape(
        name="llama-3.2-1b", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64,
        intermediate=8192, vocab=128256, max_positions=131072, tie_embeddings=True,
        source="meta-llama/Llama-3.2-1B",
    ), ("llama-3.2-1b-instruct",)),
    (ModelShape(
        name="llama-3.2-3b", layers=28, hidden=3072, heads=24, kv_heads=8, head_dim=128,
        intermediate=8192, vocab=128256, max_positions=131072, tie_embeddings=True,
        source="meta-llama/Llama-3.2-3B",
    ), ("llama-3.2-3b-instruct",)),
    (ModelShape(
        name="mistral-7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
        intermediate=14336, vocab=32000, max_positions=32768,
        sliding_window=4096, sliding_layers=tuple(range(32)),
        source="mistralai/Mistral-7B-v0.1",
    ), ("mistral-7b-v0.1",)),
    (ModelShape(
        name="qwen2.5-7b", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
        intermediate=18944, vocab=152064, max_positions=131072, qkv_bias=True,
        source="Qwen/Qwen2.5-7B",
    ), ("qwen2.5-7b-instruct", "qwen-2.5-7b")),
    (ModelShape(
        name="qwen2.5-14b", layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128,
        intermediate=13824, vocab=152064, max_positions=131072, qkv_bias=True,
        source="Qwen/Qwen2.5-14B",
    ), ("qwen2.5-14b-instruct", "qwen-2.5-14b")),
    (ModelShape(
        name="qwen2.5-32b", layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128,
        intermediate=27648, vocab=152064, max_positions=131072, qkv_bias=True,
        source="Qwen/Qwen2.5-32B",
    ), ("qwen2.5-32b-instruct", "qwen-2.5-32b")),
    (ModelShape(
        name="qwen2.5-72b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
        intermediate=29568, vocab=152064, max_positions=131072, qkv_bias=True,
        source="Qwen/Qwen2.5-72B",
    ), ("qwen2.5-72b-instruct", "qwen-2.5-72b")),
    (ModelShape(
        name="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128, head_dim=192,
        intermediate=18432, vocab=129280, max_positions=163840, weights_dtype="fp8",
        experts=256, shared_experts=1, experts_per_token=8, moe_intermediate=2048,
        first_dense_layers=3, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        qk_nope_head_dim=128, v_head_dim=128,
        source="deepseek-ai/DeepSeek-V3",
    ), ("deepseek-v3-base", "deepseekv3")),
)
# fmt: on


def _normalize(name: str) -> str:
    return re.sub(r"[\s_\-.]+", "", name.casefold())


def _build_index() -> dict[str, ModelShape]:
    index: dict[str, ModelShape] = {}
    for shape, aliases in _TABLE:
        repo_name = shape.source.split("/")[-1]
        for name in (shape.name, shape.source, repo_name, *aliases):
            index[_normalize(name)] = shape
    return index


_INDEX = _build_index()


def builtin_models() -> list[ModelShape]:
    """The built-in table, in a stable order."""
    return [shape for shape, _ in _TABLE]


def model_names() -> list[str]:
    return [shape.name for shape, _ in _TABLE]


def get_model(name: str) -> ModelShape:
    """The built-in shape called ``name`` (canonical, alias or Hugging Face id; any case).

    Raises ``ConfigError`` on field ``model`` with the closest names and the hint to pass a local
    ``config.json`` instead.
    """
    # A Hugging Face id names the repository after its owner: "meta-llama/Llama-3.1-8B".
    shape = _INDEX.get(_normalize(name)) or _INDEX.get(_normalize(name.rsplit("/", 1)[-1]))
    if shape is not None:
        return shape
    close = difflib.get_close_matches(_normalize(name), list(_INDEX), n=6, cutoff=0.5)
    suggestions = list(dict.fromkeys(_INDEX[key].name for key in close))[:3]
    hint = f"closest: {', '.join(suggestions)}; " if suggestions else ""
    raise ConfigError(
        [
            (
                "model",
                f"unknown model {name!r}; {hint}built-in: {', '.join(model_names())}; "
                "or pass the model's config.json with --config",
            )
        ]
    )


_PARAMS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmbt]?)\s*$", re.IGNORECASE)
_PARAM_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}
#: The smallest and largest bare parameter counts a shape is made for.
MIN_PARAMS, MAX_PARAMS = 1e9, 1e13


def parse_params(text: str) -> float | None:
    """A bare parameter count ("70B", "1.5b", "500M", "7e9"), or None if ``text`` is not one."""
    match = _PARAMS.match(text)
    if match:
        return float(match[1]) * _PARAM_SCALE[match[2].lower()]
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def shape_for_params(count: float) -> ModelShape:
    """A dense Llama-style shape of about ``count`` parameters, for a model known only by its
    size: layers and width grow together as in Llama 3 (96–128 wide per layer, 128-wide
    heads, 8 KV heads, an MLP 3.5× the width, a 128k vocabulary). Memory and speed follow the
    parameter count closely; the KV cache per token (set by layers × KV heads) only roughly."""
    if not MIN_PARAMS <= count <= MAX_PARAMS:
        raise ConfigError(
            [("model", f"a parameter count must be from 1B to 10T, got {count:,.0f}")]
        )
    vocab = 128256
    best: tuple[tuple[bool, float], ModelShape] | None = None
    for hidden in range(1024, 65537, 256):
        intermediate = int(hidden * 3.5) // 256 * 256
        # Per layer: q and o (h²), k and v (8 heads of 128 each), the MLP, two norms.
        per_layer = 2 * hidden * hidden + 2 * hidden * 8 * 128 + 3 * hidden * intermediate
        per_layer += 2 * hidden
        layers = round((count - 2 * vocab * hidden - hidden) / per_layer)
        if layers < 8:
            continue
        shape = ModelShape(
            name=f"dense-{_short(count)}",
            layers=layers,
            hidden=hidden,
            heads=hidden // 128,
            kv_heads=8,
            head_dim=128,
            intermediate=intermediate,
            vocab=vocab,
            max_positions=131072,
            source=f"a dense Llama-style shape of {_short(count)} parameters",
        )
        # Within 3 % of the count, the most Llama-like proportions (about 110 wide per layer).
        key = (abs(shape.params / count - 1) > 0.03, abs(math.log(hidden / layers / 110)))
        if best is None or key < best[0]:
            best = (key, shape)
    assert best is not None  # every count in range has a width whose layers fit
    return best[1]


def _short(count: float) -> str:
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return f"{count:.0f}"


# -- Hugging Face config.json -------------------------------------------------------------------

_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


class _Reader:
    """Typed access to one config.json that collects every problem before raising."""

    def __init__(self, data: Mapping[str, Any], file: Path) -> None:
        self.data = data
        self.file = file
        self.problems: list[tuple[str, str]] = []

    def problem(self, key: str, message: str) -> None:
        self.problems.append((f"{self.file}:{key}", message))

    def positive(self, key: str, default: int | None = None, zero_ok: bool = False) -> int:
        value = self.data.get(key)
        if value is None:
            if default is None:
                self.problem(key, "missing (a required key)")
                return 1
            return default
        smallest = 0 if zero_ok else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
            what = "a non-negative integer" if zero_ok else "a positive integer"
            self.problem(key, f"must be {what}, got {value!r}")
            return 1
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.problem(key, f"must be true or false, got {value!r}")
            return default
        return value


def load_hf_config(path: str | Path) -> ModelShape:
    """Read a Hugging Face ``config.json`` (the file, or a directory holding one).

    Understands the keys of the llama, mistral, qwen2, mixtral and deepseek_v2/v3 architectures
    and any model that uses the same standard keys. Raises ``ConfigError`` listing every missing
    or bad key with the file it came from.
    """
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        text = file.read_text("utf-8")
    except OSError as exc:
        raise ConfigError([(str(file), f"cannot read: {exc.strerror or exc}")]) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            [(str(file), f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})")]
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError([(str(file), f"must hold a JSON object, got {type(data).__name__}")])
    return _shape_from_config(_Reader(data, file))


def _shape_from_config(r: _Reader) -> ModelShape:
    model_type = str(r.data.get("model_type", ""))
    layers = r.positive("num_hidden_layers")
    known = len(r.problems)
    hidden = r.positive("hidden_size")
    heads = r.positive("num_attention_heads")
    widths_ok = len(r.problems) == known
    kv_heads = r.positive("num_key_value_heads", default=heads)
    is_mla = r.data.get("kv_lora_rank") is not None
    mla_dim = None if is_mla else 0  # required for MLA, absent otherwise
    rope_dim = r.positive("qk_rope_head_dim", default=mla_dim)
    nope_dim = r.positive("qk_nope_head_dim", default=mla_dim)
    if is_mla:
        head_dim = nope_dim + rope_dim  # MLA's query/key heads; its KV cache is the latent
    else:
        if "head_dim" not in r.data and widths_ok and hidden % heads:
            r.problem(
                "head_dim", f"missing, and hidden_size {hidden} is not divisible by {heads} heads"
            )
        head_dim = r.positive("head_dim", default=max(hidden // heads, 1))
    experts = _experts(r)
    moe = experts > 0
    intermediate = r.positive("intermediate_size", default=0 if moe else None, zero_ok=moe)
    attention_bias = r.flag("attention_bias", False)
    window, sliding = _sliding_layers(r, layers)
    shape = ModelShape(
        name=str(r.data.get("_name_or_path") or r.file.parent.name or model_type or "model"),
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab=r.positive("vocab_size"),
        max_positions=r.positive("max_position_embeddings", default=0, zero_ok=True),
        tie_embeddings=r.flag("tie_word_embeddings", False),
        weights_dtype=_weights_dtype(r),
        # Qwen2 hard-codes q/k/v biases; llama-style configs switch every projection's bias.
        qkv_bias=model_type.startswith("qwen2") or attention_bias,
        o_bias=attention_bias,
        experts=experts,
        shared_experts=r.positive("n_shared_experts", default=0, zero_ok=True),
        experts_per_token=r.positive("num_experts_per_tok", default=None if moe else 0),
        moe_intermediate=r.positive("moe_intermediate_size", default=intermediate if moe else 0),
        first_dense_layers=r.positive("first_k_dense_replace", default=0, zero_ok=True),
        moe_layer_freq=r.positive("moe_layer_freq", default=1),
        kv_lora_rank=r.positive("kv_lora_rank", default=0),
        q_lora_rank=r.positive("q_lora_rank", default=0),
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=nope_dim,
        v_head_dim=r.positive("v_head_dim", default=mla_dim),
        sliding_window=window,
        sliding_layers=sliding,
        source=str(r.file),
    )
    if r.problems:
        raise ConfigError(r.problems)
    return shape


def _experts(r: _Reader) -> int:
    # DeepSeek, Mixtral and Qwen-MoE name the routed-expert count differently.
    for key in ("n_routed_experts", "num_local_experts", "num_experts"):
        if r.data.get(key) is not None:
            return r.positive(key, zero_ok=True)
    return 0


def _weights_dtype(r: _Reader) -> str:
    quant = r.data.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method", "")).lower()
        if method == "fp8":
            return "fp8"
        if quant.get("load_in_4bit") or quant.get("bits") == 4:
            return "int4"
        if quant.get("load_in_8bit") or quant.get("bits") == 8:
            return "int8"
    # Newer transformers write "dtype", older "torch_dtype"; an unknown value means bf16.
    torch_dtype = r.data.get("dtype", r.data.get("torch_dtype"))
    return _TORCH_DTYPES.get(str(torch_dtype), "bf16")


def _sliding_layers(r: _Reader, layers: int) -> tuple[int, tuple[int, ...]]:
    if r.data.get("sliding_window") is None or not r.flag("use_sliding_window", True):
        return 0, ()
    window = r.positive("sliding_window")
    layer_types = r.data.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != layers:
            r.problem("layer_types", f"must be a list of {layers} strings, got {layer_types!r}")
            return window, ()
        return window, tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    # Qwen2: layers from max_window_layers on use the window; Mistral: every layer does.
    first = r.positive("max_window_layers", default=0, zero_ok=True)
    return window, tuple(range(min(first, layers), layers))
