from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.devices.catalog import get_catalog
from hetero.errors import ConfigError, DeviceError
from hetero.plan.memory import (
    DTYPE_BYTES,
    FitRequest,
    fit_memory,
    kv_bytes_per_token,
    memory_breakdown,
    weight_bytes,
)
from hetero.plan.models import ModelShape, builtin_models, get_model

KIB = 1024
GIB = 1024**3


def within_5_percent(computed: float, published: float) -> bool:
    return abs(computed - published) <= 0.05 * published


# -- The figure: every built-in model against its published numbers ------------------------------
# params: the total the model card / Hub page gives; weights: that count × 2 bytes (bf16, the
# format every checkpoint but DeepSeek-V3's ships in) or × 1 byte (fp8); KV per token: the cache
# the model's published architecture implies at 2 bytes per value.
@pytest.mark.parametrize(
    ("name", "params", "active", "weight_dtype", "kv_per_token"),
    [
        # Meta Llama 3 model card (github.com/meta-llama/llama3/blob/main/MODEL_CARD.md) and the
        # Hub page of meta-llama/Meta-Llama-3-8B: 8.03B params, 16.06 GB of bf16 safetensors;
        # GQA with 8 KV heads of 128 over 32 layers: 32×2×8×128×2 B = 128 KiB/token in fp16.
        pytest.param("llama-3-8b", 8.03e9, 8.03e9, "bf16", 128 * KIB, id="llama-3-8b"),
        # Hub page of meta-llama/Meta-Llama-3-70B: 70.6B params (141 GB bf16); 80 layers × 8 KV
        # heads × 128: 320 KiB/token in fp16.
        pytest.param("llama-3-70b", 70.6e9, 70.6e9, "bf16", 320 * KIB, id="llama-3-70b"),
        # Hub page of mistralai/Mistral-7B-v0.1: 7.24B params; Jiang et al. 2023, "Mistral 7B"
        # (arXiv:2310.06825) Table 1: 32 layers, 8 KV heads, head_dim 128: 128 KiB/token.
        pytest.param("mistral-7b", 7.24e9, 7.24e9, "bf16", 128 * KIB, id="mistral-7b"),
        # Qwen2.5-7B model card (huggingface.co/Qwen/Qwen2.5-7B): 7.61B params, 28 layers,
        # GQA 28 Q / 4 KV heads of 128: 28×2×4×128×2 B = 56 KiB/token.
        pytest.param("qwen2.5-7b", 7.61e9, 7.61e9, "bf16", 56 * KIB, id="qwen2.5-7b"),
        # Qwen2.5-72B model card (huggingface.co/Qwen/Qwen2.5-72B): 72.7B params, 80 layers,
        # GQA 64 Q / 8 KV heads of 128: 320 KiB/token.
        pytest.param("qwen2.5-72b", 72.7e9, 72.7e9, "bf16", 320 * KIB, id="qwen2.5-72b"),
        # DeepSeek-AI 2024, "DeepSeek-V3 Technical Report" (arXiv:2412.19437), abstract:
        # 671B total / 37B activated; §2.1.1: MLA caches only the latent c_KV (d_c = 512) and
        # the rope key (d_h^R = 64) per layer, 61 layers: (512 + 64) × 61 × 2 B = 68.6 KiB/token
        # in bf16. The Hub checkpoint's weights are fp8 (quantization_config in config.json).
        pytest.param("deepseek-v3", 671e9, 37e9, "fp8", 70_272, id="deepseek-v3"),
    ],
)
def test_published_figures(
    name: str, params: float, active: float, weight_dtype: str, kv_per_token: int
) -> None:
    model = get_model(name)
    assert model.weights_dtype == weight_dtype
    assert within_5_percent(model.params, params)
    assert within_5_percent(model.active_params, active)
    published_weights = params * float(DTYPE_BYTES[weight_dtype])
    assert within_5_percent(weight_bytes(model, weight_dtype), published_weights)
    assert within_5_percent(kv_bytes_per_token(model, "fp16"), kv_per_token)


def test_kv_formulas_exactly() -> None:
    llama = get_model("llama-3-8b")
    assert kv_bytes_per_token(llama, "bf16") == 32 * 2 * 8 * 128 * 2
    assert kv_bytes_per_token(llama, "fp8") == 32 * 2 * 8 * 128
    # MLA: one latent and one rope key per layer, no ×2 for K and V.
    assert kv_bytes_per_token(get_model("deepseek-v3"), "bf16") == 61 * (512 + 64) * 2


def resolved(model: ModelShape, **kw: object) -> FitRequest:
    return FitRequest(**kw).resolved(model)  # type: ignore[arg-type]


def test_int4_counts_group_scales() -> None:
    model = get_model("llama-3-8b")
    # 4 bits + (16-bit scale + 16-bit zero) / 128 = 4.25 bits per weight.
    assert weight_bytes(model, "int4") == -(-model.params * 17 // 32)
    result = fit_memory(model, "A100-80GB", FitRequest(seq=1024, dtype="int4"))
    assert any("4.25 bits" in note for note in result.notes)
    assert result.request.kv_dtype == "bf16"  # quantized weights still compute in 16-bit


def test_inference_breakdown() -> None:
    model = get_model("llama-3-8b")
    request = resolved(model, seq=8192, batch=16, context_bytes=GIB, fragmentation=0.05)
    parts = memory_breakdown(model, request)
    s, b, h = 8192, 16, 4096
    assert parts["weights"] == 2 * model.params
    assert parts["kv_cache"] == b * s * 128 * KIB
    assert parts["activations"] == 34 * s * b * h
    assert parts["logits"] == 4 * b * model.vocab
    assert parts["fragmentation"] == -(-(parts["activations"] + parts["logits"]) * 5 // 100)
    assert parts["cuda_context"] == GIB


def test_chunked_prefill_caps_inference_activations() -> None:
    model = get_model("llama-3-8b")
    h = 4096
    chunked = memory_breakdown(model, resolved(model, seq=8192, batch=16, prefill_chunk=2048))
    assert chunked["activations"] == 34 * 2048 * h
    small = memory_breakdown(model, resolved(model, seq=512, batch=2, prefill_chunk=2048))
    assert small["activations"] == 34 * 512 * 2 * h  # fewer tokens than a chunk: all at once
    # Serving engines that chunk prefill hold about twice the sequences at 8k on an A100-80GB:
    # the KV cache, not the prompt's activations, then bounds the batch.
    plain = fit_memory(model, "A100-80GB", FitRequest(seq=8192, batch=16))
    served = fit_memory(model, "A100-80GB", FitRequest(seq=8192, batch=16, prefill_chunk=8192))
    assert served.max_batch > 1.9 * plain.max_batch
    kv_bound = (served.device_bytes - 2 * model.params - GIB) // (8192 * 128 * KIB)
    assert kv_bound - 2 <= served.max_batch <= kv_bound
    with pytest.raises(ConfigError, match="prefill_chunk: must be a positive integer, got 0"):
        resolved(model, seq=16, prefill_chunk=0)
    with pytest.raises(ConfigError, match="prefill_chunk: applies to inference"):
        resolved(model, seq=16, train=True, prefill_chunk=512)


def test_sliding_window_caps_the_cache() -> None:
    mistral = get_model("mistral-7b")

    def kv(seq: int, model: ModelShape = mistral) -> int:
        return memory_breakdown(model, resolved(model, seq=seq))["kv_cache"]

    assert kv(4096) == 4096 * 128 * KIB
    assert kv(32768) == kv(4096)  # every layer holds at most the 4096-token window
    assert kv(1000) == 1000 * 128 * KIB
    half = dataclasses.replace(mistral, sliding_layers=tuple(range(16)))
    assert kv(32768, half) == 16 * 2 * 8 * 128 * 2 * (32768 + 4096)


def test_training_zero_stages_shard_states() -> None:
    model = get_model("llama-3-8b")
    p, n = model.params, 8

    def states(zero: int, dtype: str = "bf16") -> tuple[int, int, int]:
        parts = memory_breakdown(
            model, resolved(model, seq=2048, train=True, zero=zero, devices=n, dtype=dtype)
        )
        return parts["weights"], parts["gradients"], parts["optimizer"]

    def ceil(x: Fraction) -> int:
        return -(-x.numerator // x.denominator)

    assert sum(states(0)) == 16 * p  # 2 weights + 2 grads + 12 fp32 master/m/v
    assert states(0) == (2 * p, 2 * p, 12 * p)
    assert states(1) == (2 * p, 2 * p, ceil(Fraction(12 * p, n)))
    assert states(2) == (2 * p, ceil(Fraction(2 * p, n)), ceil(Fraction(12 * p, n)))
    assert states(3) == (
        ceil(Fraction(2 * p, n)),
        ceil(Fraction(2 * p, n)),
        ceil(Fraction(12 * p, n)),
    )
    assert states(0, "fp32") == (4 * p, 4 * p, 8 * p)  # fp32 Adam: weights, grads, m, v


def test_checkpointing_reduces_activations() -> None:
    model = get_model("llama-3-70b")
    s, b, h, layers = 4096, 2, 8192, 80
    plain = memory_breakdown(model, resolved(model, seq=s, batch=b, train=True))
    ckpt = memory_breakdown(model, resolved(model, seq=s, batch=b, train=True, checkpointing=True))
    assert plain["activations"] == layers * 34 * s * b * h
    assert ckpt["activations"] == layers * 2 * s * b * h + 34 * s * b * h
    assert ckpt["activations"] < plain["activations"] / 10
    assert plain["logits"] == ckpt["logits"] == 4 * s * b * model.vocab


def test_training_defaults_to_bf16_for_fp8_checkpoints() -> None:
    model = get_model("deepseek-v3")
    assert resolved(model, seq=16, train=True).dtype == "bf16"
    assert resolved(model, seq=16).dtype == "fp8"


CASES = [
    ("llama-3-8b", "A100-80GB", {"seq": 8192, "batch": 16}),
    ("mistral-7b", "T4", {"seq": 4096, "dtype": "int4"}),
    ("qwen2.5-72b", "H100-SXM-80GB", {"seq": 4096, "dtype": "fp8", "kv_dtype": "fp8"}),
    (
        "llama-3-8b",
        "A100-80GB",
        {"seq": 8192, "train": True, "zero": 3, "devices": 8, "checkpointing": True},
    ),
    ("qwen2.5-7b", "A100-80GB", {"seq": 2048, "batch": 4, "train": True, "zero": 1, "devices": 4}),
]


@pytest.mark.parametrize(("name", "device", "kw"), CASES)
def test_max_batch_and_max_seq_are_the_boundary(
    name: str, device: str, kw: dict[str, object]
) -> None:
    model = get_model(name)
    result = fit_memory(model, device, FitRequest(**kw))  # type: ignore[arg-type]
    capacity = get_catalog().get(device).memory_bytes

    def total(**change: int) -> int:
        return sum(memory_breakdown(model, dataclasses.replace(result.request, **change)).values())

    assert result.max_batch >= 1 and result.max_seq >= 1
    assert total(batch=result.max_batch) <= capacity < total(batch=result.max_batch + 1)
    assert total(seq=result.max_seq) <= capacity < total(seq=result.max_seq + 1)
    assert result.fits == (result.request.batch <= result.max_batch)
    assert result.fits == (result.request.seq <= result.max_seq)


def test_nothing_fits_gives_zero() -> None:
    result = fit_memory(get_model("deepseek-v3"), "A100-80GB", FitRequest(seq=1024))
    assert not result.fits and result.headroom_bytes < 0
    assert result.max_batch == 0 and result.max_seq == 0


def test_result_totals_and_json() -> None:
    spec = get_catalog().get("A100-80GB")
    result = fit_memory(get_model("llama-3-8b"), spec, FitRequest(seq=10_000, batch=8))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["device"] == "A100-80GB" and data["device_bytes"] == 80 * GIB
    assert data["total_bytes"] == sum(data["breakdown"].values()) == result.total_bytes
    assert data["headroom_bytes"] == 80 * GIB - result.total_bytes
    assert data["fits"] is True and data["mode"] == "inference"
    assert data["max_batch"] == result.max_batch and data["max_seq"] == result.max_seq
    assert any("max_position_embeddings 8,192" in note for note in data["notes"])
    with pytest.raises(TypeError):
        result.breakdown["weights"] = 0  # type: ignore[index]


def test_unknown_device_suggests_closest() -> None:
    with pytest.raises(DeviceError, match="closest: A100-80GB"):
        fit_memory(get_model("llama-3-8b"), "A100-80G", FitRequest(seq=1024))


@pytest.mark.parametrize(
    ("kw", "field", "text"),
    [
        ({"seq": 0}, "seq", "positive integer, got 0"),
        ({"seq": 16, "batch": -1}, "batch", "positive integer, got -1"),
        ({"seq": 16, "dtype": "bf61"}, "dtype", "did you mean bf16"),
        ({"seq": 16, "kv_dtype": "fp9"}, "kv_dtype", "allowed: fp32, bf16"),
        ({"seq": 16, "train": True, "zero": 4}, "zero", "0, 1, 2 or 3, got 4"),
        ({"seq": 16, "zero": 2}, "zero", "add --train"),
        ({"seq": 16, "devices": 16}, "devices", "1 to 8 devices (tensor parallel"),
        ({"seq": 16, "devices": 3}, "devices", "32 attention heads do not split 3 ways"),
        ({"seq": 16, "train": True, "dtype": "int4"}, "dtype", "QLoRA"),
        ({"seq": 16, "fragmentation": 1.5}, "fragmentation", "[0, 1), got 1.5"),
        ({"seq": 16, "context_bytes": -1}, "context_bytes", ">= 0"),
    ],
)
def test_bad_requests_name_the_field(kw: dict[str, object], field: str, text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        fit_memory(get_model("llama-3-8b"), "A100-80GB", FitRequest(**kw))  # type: ignore[arg-type]
    [(path, message)] = exc.value.problems
    assert path == field and text in message


def test_inference_over_devices_splits_weights_kv_and_logits() -> None:
    model = get_model("llama-3-70b")  # 8 KV heads
    one = fit_memory(model, "A100-80GB", FitRequest(seq=4096, batch=4)).breakdown
    four = fit_memory(model, "A100-80GB", FitRequest(seq=4096, batch=4, devices=4)).breakdown
    assert four["weights"] == -(-one["weights"] // 4)
    assert four["kv_cache"] == -(-one["kv_cache"] // 4)  # two of the eight KV heads each
    assert four["activations"] == one["activations"]  # one layer's, not split
    # Sixteen ways would leave half a KV head each: a head is copied, not split.
    eight = fit_memory(model, "A100-80GB", FitRequest(seq=4096, batch=4, devices=8)).breakdown
    assert eight["kv_cache"] == -(-one["kv_cache"] // 8)
    assert not fit_memory(model, "A100-80GB", FitRequest(seq=4096)).fits
    assert fit_memory(model, "A100-80GB", FitRequest(seq=4096, devices=2)).fits


def test_breakdown_needs_a_resolved_request() -> None:
    with pytest.raises(ValueError, match="resolved"):
        memory_breakdown(get_model("llama-3-8b"), FitRequest(seq=16))


requests = st.builds(
    dict,
    model=st.sampled_from(builtin_models()),
    seq=st.integers(1, 200_000),
    batch=st.integers(1, 256),
    step=st.integers(1, 5_000),
    train=st.booleans(),
    zero=st.integers(0, 3),
    checkpointing=st.booleans(),
    dtype=st.sampled_from(list(DTYPE_BYTES)),
)


@settings(max_examples=150, deadline=None)
@given(requests)
def test_memory_is_monotone_in_batch_and_seq(case: dict[str, object]) -> None:
    model = case["model"]
    assert isinstance(model, ModelShape)
    train = bool(case["train"])
    dtype = str(case["dtype"])
    base = resolved(
        model,
        seq=case["seq"],
        batch=case["batch"],
        train=train,
        zero=case["zero"] if train else 0,
        devices=8 if train else 1,
        checkpointing=case["checkpointing"],
        dtype=dtype if not train or dtype in ("fp32", "bf16", "fp16") else "bf16",
        kv_dtype=None if train else dtype,
    )
    step = int(str(case["step"]))

    def total(request: FitRequest) -> int:
        return sum(memory_breakdown(model, request).values())

    assert total(base) <= total(dataclasses.replace(base, seq=base.seq + step))
    assert total(base) <= total(dataclasses.replace(base, batch=base.batch + step))
