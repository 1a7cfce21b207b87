"""Will a model fit on a device? Memory for inference or training, per device, with a breakdown.

Inference holds the weights, the KV cache, one layer's activations, the logits of the position
being sampled, and runtime overhead. Training holds weights, gradients and Adam states (sharded
by ZeRO stage 1/2/3 over the data-parallel devices), every layer's activations (or, with full
checkpointing, only each layer's input plus one layer's working set) and the logits of every
position. Formulas and sources are in ``docs/memory-fit.md``.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from types import MappingProxyType
from typing import Any

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DeviceSpec
from hetero.errors import ConfigError
from hetero.plan.models import ModelShape

__all__ = [
    "DEFAULT_CONTEXT_BYTES",
    "DEFAULT_FRAGMENTATION",
    "DTYPE_BYTES",
    "MAX_TENSOR_PARALLEL",
    "FitRequest",
    "MemoryFit",
    "fit_memory",
    "kv_bytes_per_token",
    "kv_share",
    "memory_breakdown",
    "weight_bytes",
]

#: int4 weights carry a 16-bit scale and a 16-bit zero point per group of this many weights
#: (the GPTQ/AWQ default), so they cost 4.25 bits each rather than 4.
INT4_GROUP_SIZE = 128

#: Bytes per value of each storage format.
DTYPE_BYTES: Mapping[str, Fraction] = MappingProxyType(
    {
        "fp32": Fraction(4),
        "bf16": Fraction(2),
        "fp16": Fraction(2),
        "fp8": Fraction(1),
        "int8": Fraction(1),
        "int4": Fraction(1, 2) + Fraction(2 + 2, INT4_GROUP_SIZE),
    }
)
_FLOAT_DTYPES = ("fp32", "bf16", "fp16")

#: CUDA context, cuBLAS workspaces and communication buffers: a round figure; measure your stack
#: (``nvidia-smi`` with an idle process that has initialised CUDA) and pass the real one.
DEFAULT_CONTEXT_BYTES = 1024**3
#: Caching-allocator fragmentation, as a fraction of the tensors allocated and freed every step
#: (activations and logits); weights, states and the KV cache are allocated once, in big blocks.
DEFAULT_FRAGMENTATION = 0.05

#: The most devices one inference replica is split over (tensor parallel within one node).
MAX_TENSOR_PARALLEL = 8
#: Korthikanti et al. 2022, eq. (1) without the 5·a·s/h term that FlashAttention never stores:
#: a layer keeps 34·s·b·h bytes of 16-bit activations for its backward pass.
_LAYER_ACTIVATION_FACTOR = 34
#: Logits are computed in fp32 for sampling and for the cross-entropy loss.
_LOGIT_BYTES = 4


@dataclass(frozen=True, slots=True)
class FitRequest:
    """What to run: context length, batch, formats, and for training the ZeRO set-up.

    ``dtype``/``kv_dtype`` of ``None`` mean the model's own weight format and its compute format.
    ``batch`` is per device (the micro-batch when training). ``prefill_chunk`` (inference) caps
    the tokens one forward pass holds activations for, as servers that prefill in chunks do
    (vLLM's and SGLang's chunked prefill); ``None`` runs the whole ``seq × batch`` at once.
    """

    seq: int
    batch: int = 1
    dtype: str | None = None
    kv_dtype: str | None = None
    train: bool = False
    zero: int = 0
    devices: int = 1
    checkpointing: bool = False
    prefill_chunk: int | None = None
    context_bytes: int = DEFAULT_CONTEXT_BYTES
    fragmentation: float = DEFAULT_FRAGMENTATION

    def resolved(self, model: ModelShape) -> FitRequest:
        """This request checked, with the default formats filled in from ``model``.

        Raises ``ConfigError`` naming every bad field, its value and what is allowed.
        """
        problems: list[tuple[str, str]] = []
        for field_name in ("seq", "batch", "devices"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append((field_name, f"must be a positive integer, got {value!r}"))
        for field_name in ("dtype", "kv_dtype"):
            value = getattr(self, field_name)
            if value is not None and value not in DTYPE_BYTES:
                close = difflib.get_close_matches(str(value), list(DTYPE_BYTES), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                problems.append(
                    (field_name, f"unknown format {value!r}{hint}; allowed: {_allowed()}")
                )
        if self.zero not in (0, 1, 2, 3):
            problems.append(("zero", f"must be 0, 1, 2 or 3, got {self.zero!r}"))
        elif self.zero and not self.train:
            problems.append(("zero", f"ZeRO stage {self.zero} applies to training; add --train"))
        if not self.train and isinstance(self.devices, int) and self.devices > 1:
            if self.devices > MAX_TENSOR_PARALLEL:
                problems.append(
                    (
                        "devices",
                        f"got {self.devices}; inference splits a replica over 1 to "
                        f"{MAX_TENSOR_PARALLEL} devices (tensor parallel, one node)",
                    )
                )
            elif model.heads % self.devices:
                problems.append(
                    (
                        "devices",
                        f"{model.name}'s {model.heads} attention heads do not split "
                        f"{self.devices} ways (tensor parallel)",
                    )
                )
        if self.prefill_chunk is not None:
            chunk = self.prefill_chunk
            if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
                problems.append(("prefill_chunk", f"must be a positive integer, got {chunk!r}"))
            elif self.train:
                problems.append(
                    (
                        "prefill_chunk",
                        "applies to inference; training keeps every token's activations",
                    )
                )
        if self.context_bytes < 0:
            problems.append(("context_bytes", f"must be >= 0, got {self.context_bytes!r}"))
        if not 0 <= self.fragmentation < 1:
            problems.append(
                ("fragmentation", f"must be a fraction in [0, 1), got {self.fragmentation!r}")
            )
        dtype = self.dtype or _default_dtype(model, self.train)
        if self.train and dtype not in _FLOAT_DTYPES:
            problems.append(
                (
                    "dtype",
                    f"training needs {', '.join(_FLOAT_DTYPES)} weights, got {dtype!r} "
                    "(quantized fine-tuning such as QLoRA is not modelled)",
                )
            )
        if problems:
            raise ConfigError(problems)
        compute = dtype if dtype in _FLOAT_DTYPES else "bf16"
        return replace(self, dtype=dtype, kv_dtype=self.kv_dtype or compute)


def _allowed() -> str:
    return ", ".join(DTYPE_BYTES)


def _default_dtype(model: ModelShape, train: bool) -> str:
    if train and model.weights_dtype not in _FLOAT_DTYPES:
        return "bf16"
    return model.weights_dtype


def _bytes(count: int | Fraction, dtype: str) -> int:
    return math.ceil(count * DTYPE_BYTES[dtype])


def weight_bytes(model: ModelShape, dtype: str) -> int:
    """Bytes of every parameter (all experts) stored as ``dtype``."""
    return _bytes(model.params, dtype)


def _kv_values_per_layer(model: ModelShape) -> int:
    if model.is_mla:
        return model.kv_lora_rank + model.qk_rope_head_dim
    return 2 * model.kv_heads * model.head_dim


def kv_bytes_per_token(model: ModelShape, dtype: str = "bf16") -> int:
    """KV-cache bytes one token adds across all layers, as if no layer had a sliding window.

    Standard/GQA: layers × 2 (K and V) × kv_heads × head_dim × bytes. MLA caches one latent of
    kv_lora_rank plus the shared rope key of qk_rope_head_dim per layer: no ×2.
    """
    return _bytes(model.layers * _kv_values_per_layer(model), dtype)


def kv_share(model: ModelShape, devices: int) -> float:
    """The share of the KV cache one of ``devices`` tensor-parallel devices holds: its whole
    KV heads (a head is copied when there are more devices than heads); MLA's latent is not
    split, every device holds all of it."""
    if model.is_mla or devices <= 1:
        return 1.0
    return math.ceil(model.kv_heads / devices) / model.kv_heads


def _kv_cache_bytes(model: ModelShape, seq: int, batch: int, dtype: str) -> int:
    sliding = len(model.sliding_layers)
    # A sliding-window layer keeps only the last `window` tokens.
    held = (model.layers - sliding) * seq + sliding * min(seq, model.sliding_window)
    return _bytes(_kv_values_per_layer(model) * held * batch, dtype)


def memory_breakdown(model: ModelShape, request: FitRequest) -> dict[str, int]:
    """Bytes per component on one device for a ``resolved`` request."""
    dtype, kv_dtype = request.dtype, request.kv_dtype
    if dtype is None or kv_dtype is None:
        raise ValueError("memory_breakdown needs a resolved request (FitRequest.resolved)")
    s, b, h = request.seq, request.batch, model.hidden
    compute = dtype if dtype in _FLOAT_DTYPES else "bf16"
    # One layer's activations, scaled from the paper's 16-bit figure to the compute format.
    layer = _bytes(Fraction(_LAYER_ACTIVATION_FACTOR, 2) * s * b * h, compute)
    # Serving prefills at most a chunk of tokens per forward pass.
    tokens = s * b if request.prefill_chunk is None else min(s * b, request.prefill_chunk)
    parts: dict[str, int] = {}
    if request.train:
        parts.update(_training_states(model, dtype, request.zero, request.devices))
        if request.checkpointing:
            # Each layer's input is kept; one layer is recomputed at a time during backward.
            parts["activations"] = model.layers * _bytes(s * b * h, compute) + layer
        else:
            parts["activations"] = model.layers * layer
        parts["logits"] = _LOGIT_BYTES * s * b * model.vocab
    else:
        # Tensor parallel over `devices`: each holds a share of the weights, of the KV heads
        # and of the vocabulary's logits; one layer's activations are not split.
        tp = request.devices
        parts["weights"] = math.ceil(weight_bytes(model, dtype) / tp)
        parts["kv_cache"] = math.ceil(_kv_cache_bytes(model, s, b, kv_dtype) * kv_share(model, tp))
        # Nothing is kept for a backward pass, so one layer's working set is live at a time.
        parts["activations"] = _bytes(Fraction(_LAYER_ACTIVATION_FACTOR, 2) * tokens * h, compute)
        parts["logits"] = math.ceil(_LOGIT_BYTES * b * model.vocab / tp)  # the next position
    temporaries = parts["activations"] + parts["logits"]
    parts["fragmentation"] = math.ceil(temporaries * request.fragmentation)
    parts["cuda_context"] = request.context_bytes
    return parts


def _training_states(model: ModelShape, dtype: str, zero: int, devices: int) -> dict[str, int]:
    """Weights, gradients and Adam states per device.

    Mixed precision (bf16/fp16): 2 + 2 + 12 bytes per parameter (fp32 master copy, m and v);
    fp32: 4 + 4 + 8. ZeRO-1 shards the optimizer states over ``devices``, ZeRO-2 also the
    gradients, ZeRO-3 also the weights (Rajbhandari et al. 2020).
    """
    p = model.params
    width = int(DTYPE_BYTES[dtype])
    optimizer = 8 if dtype == "fp32" else 12

    def per_device(total: int, sharded: bool) -> int:
        return -(-total // devices) if sharded else total  # ceil: the last shard may be short

    return {
        "weights": per_device(p * width, zero >= 3),
        "gradients": per_device(p * width, zero >= 2),
        "optimizer": per_device(p * optimizer, zero >= 1),
    }


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """The answer: per-device breakdown, verdict, and the largest batch and context that fit."""

    model: ModelShape
    device: str
    device_bytes: int
    request: FitRequest
    breakdown: Mapping[str, int]
    max_batch: int
    max_seq: int
    notes: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(self.breakdown.values())

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.device_bytes

    @property
    def headroom_bytes(self) -> int:
        """Free bytes left on the device; negative when it does not fit."""
        return self.device_bytes - self.total_bytes

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {
            "model": self.model.name,
            "source": self.model.source,
            "params": self.model.params,
            "active_params": self.model.active_params,
            "max_positions": self.model.max_positions,
            "device": self.device,
            "device_bytes": self.device_bytes,
            "mode": "train" if r.train else "inference",
            "seq": r.seq,
            "batch": r.batch,
            "dtype": r.dtype,
            "kv_dtype": None if r.train else r.kv_dtype,
            "zero": r.zero,
            "devices": r.devices,
            "checkpointing": r.checkpointing,
            "prefill_chunk": r.prefill_chunk,
            "breakdown": dict(self.breakdown),
            "total_bytes": self.total_bytes,
            "fits": self.fits,
            "headroom_bytes": self.headroom_bytes,
            "max_batch": self.max_batch,
            "max_seq": self.max_seq,
            "notes": list(self.notes),
        }


def fit_memory(model: ModelShape, device: DeviceSpec | str, request: FitRequest) -> MemoryFit:
    """Estimate ``request`` on ``device`` (a catalog spec or name) for ``model``.

    Raises ``ConfigError`` for a bad request and ``DeviceError`` (closest names) for an unknown
    device name.
    """
    spec = get_catalog().get(device) if isinstance(device, str) else device
    request = request.resolved(model)
    capacity = spec.memory_bytes

    def fits(candidate: FitRequest) -> bool:
        return sum(memory_breakdown(model, candidate).values()) <= capacity

    return MemoryFit(
        model=model,
        device=spec.model,
        device_bytes=capacity,
        request=request,
        breakdown=MappingProxyType(memory_breakdown(model, request)),
        max_batch=_largest(lambda n: fits(replace(request, batch=n))),
        max_seq=_largest(lambda n: fits(replace(request, seq=n))),
        notes=_notes(model, request),
    )


def _largest(fits: Callable[[int], bool]) -> int:
    """The largest n >= 1 with ``fits(n)`` for a monotone ``fits``; 0 when 1 does not fit.

    Terminates because activations grow with batch and seq, so some n never fits.
    """
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def _notes(model: ModelShape, request: FitRequest) -> tuple[str, ...]:
    notes = []
    if model.max_positions and request.seq > model.max_positions:
        notes.append(
            f"seq {request.seq:,} is beyond the model's max_position_embeddings "
            f"{model.max_positions:,}"
        )
    if request.dtype == "int4" or (not request.train and request.kv_dtype == "int4"):
        notes.append(
            f"int4 counts a 16-bit scale and zero point per group of {INT4_GROUP_SIZE} values "
            "(4.25 bits each)"
        )
    if model.sliding_layers and not request.train:
        notes.append(
            f"{len(model.sliding_layers)} of {model.layers} layers keep at most "
            f"{model.sliding_window:,} tokens of KV cache (sliding window)"
        )
    if model.is_moe:
        notes.append(
            f"all {model.experts} routed experts are resident: {model.params / 1e9:.1f}B "
            f"parameters, {model.active_params / 1e9:.1f}B active per token"
        )
    return tuple(notes)
