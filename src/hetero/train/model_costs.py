"""A catalog model's layers as the pipeline planners see them: a ``LayerCost`` for the
embedding, for each transformer block and for the final norm with the LM head, for training
on sequences of ``seq`` tokens.

Time is FLOPs at speed 1, a device of ``REFERENCE_TFLOPS`` (``hetero.devices.spec``) running
at ``compute_efficiency`` of its peak, so a rank's ``PipelineRank.speed`` is its peak TFLOPS
for the dtype over that reference. A block's forward and backward of one sample take 6 ×
its parameters × tokens FLOPs (2 forward, 4 backward; ``TRAINING_FLOPS_PER_PARAMETER``, the
active experts' only in a mixture of experts), plus attention's own: 2 × the (query, key)
pairs × heads × (query-key width + value width) forward and twice that backward, the pairs
causal (each token and those before it, or within its sliding window). The embedding is a
lookup (no FLOPs counted); the LM head is 6 × its parameters × tokens.

Memory is ``hetero fit``'s training arithmetic (``hetero.plan.memory``) for one sample of
``seq`` tokens, with no ZeRO sharding, shared out by layer: each layer's state is its
parameters × the bytes per parameter of weights, gradients and AdamW's states (16 with mixed
precision: bf16/fp16 weights and gradients, an fp32 master copy and two fp32 moments; 16 in
fp32 too: 4 + 4 + 8); each block's activations are fit's per layer (34 × seq × hidden bytes at
16 bits) and the LM head's the fp32 logits of every position; activations carry fit's
allocator ``fragmentation`` on top. A rank's CUDA context is not a layer's: take it off the
rank's memory (``hetero.train.fleet_ranks``). Pure code: no torch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from hetero._checks import is_integer, is_number
from hetero.devices.spec import REFERENCE_TFLOPS
from hetero.errors import ConfigError
from hetero.plan.match import DEFAULT_COMPUTE_EFFICIENCY, TRAINING_FLOPS_PER_PARAMETER
from hetero.plan.memory import DEFAULT_FRAGMENTATION, DTYPE_BYTES, FitRequest, memory_breakdown
from hetero.plan.models import ModelShape
from hetero.train.stages import LayerCost

__all__ = ["training_layer_costs", "training_layer_flops", "training_layer_params"]

#: Attention's backward costs twice its forward, as a matmul's does.
_FORWARD_AND_BACKWARD = 3


def training_layer_params(model: ModelShape) -> list[tuple[int, int]]:
    """(parameters, active parameters) of each layer: the embedding, each block, then the
    final norm with the LM head. Tied embeddings are held at both ends of a pipeline (as
    Megatron-LM keeps them), so their parameters count twice."""
    embedding = model.vocab * model.hidden
    none = replace(model, layers=0)
    # A block's count is the catalog's own formula: the model with one such layer, less none.
    dense = _one_block(model, moe=False)
    moe = _one_block(model, moe=True) if model.is_moe else dense
    blocks = [moe if model.is_moe_layer(i) else dense for i in range(model.layers)]
    head = none.params - (0 if model.tie_embeddings else embedding)
    return [(embedding, embedding), *blocks, (head, head)]


def _one_block(model: ModelShape, *, moe: bool) -> tuple[int, int]:
    """(parameters, active parameters) of one dense or one mixture-of-experts block."""
    none = replace(model, layers=0)
    one = replace(model, layers=1, first_dense_layers=0 if moe else 1, moe_layer_freq=1)
    return one.params - none.params, one.active_params - none.active_params


def training_layer_flops(model: ModelShape, seq: int) -> list[float]:
    """FLOPs of each layer's forward and backward of one sample of ``seq`` tokens, in the
    order of ``training_layer_params``."""
    _check_seq(seq)
    per_token = TRAINING_FLOPS_PER_PARAMETER * seq
    params = training_layer_params(model)
    flops = [0.0]  # the embedding: a lookup
    for i, (_, active) in enumerate(params[1:-1]):
        window = model.sliding_window if i in model.sliding_layers else 0
        flops.append(float(per_token * active + _attention_flops(model, seq, window)))
    flops.append(float(per_token * params[-1][1]))
    return flops


def _attention_flops(model: ModelShape, seq: int, window: int) -> int:
    """Scores and weighted values of every causal (query, key) pair, forward and backward."""
    if window <= 0 or window >= seq:
        pairs = seq * (seq + 1) // 2
    else:
        pairs = window * (window + 1) // 2 + (seq - window) * window
    widths = model.head_dim + (model.v_head_dim or model.head_dim)
    return _FORWARD_AND_BACKWARD * 2 * pairs * model.heads * widths


def training_layer_costs(
    model: ModelShape,
    *,
    seq: int,
    dtype: str | None = None,
    compute_efficiency: float = DEFAULT_COMPUTE_EFFICIENCY,
    fragmentation: float = DEFAULT_FRAGMENTATION,
) -> list[LayerCost]:
    """Each layer's ``LayerCost`` for training ``model`` on sequences of ``seq`` tokens with
    ``dtype`` weights (None: the model's own float format, bf16 for a quantized one), in
    seconds at speed 1 (``REFERENCE_TFLOPS`` at ``compute_efficiency`` of peak)."""
    if not (is_number(compute_efficiency) and 0 < compute_efficiency <= 1):
        raise ConfigError(
            [
                (
                    "compute_efficiency",
                    f"must be a share of peak in (0, 1], got {compute_efficiency!r}",
                )
            ]
        )
    _check_seq(seq)
    request = FitRequest(
        seq=seq, batch=1, dtype=dtype, train=True, context_bytes=0, fragmentation=fragmentation
    ).resolved(model)
    parts = memory_breakdown(model, request)
    per_parameter = Fraction(parts["weights"] + parts["gradients"] + parts["optimizer"])
    per_parameter /= model.params
    block = parts["activations"] // model.layers
    held = (0, *([block] * model.layers), parts["logits"])
    # Gradients are all-reduced in the weights' format.
    width = int(DTYPE_BYTES[str(request.dtype)])
    rate = REFERENCE_TFLOPS * 1e12 * compute_efficiency
    names = ("embedding", *(f"block {i}" for i in range(model.layers)), "norm + lm_head")
    costs = []
    for name, (count, _), flops, activations in zip(
        names, training_layer_params(model), training_layer_flops(model, seq), held, strict=True
    ):
        costs.append(
            LayerCost(
                name=name,
                seconds=flops / rate,
                state_bytes=math.ceil(count * per_parameter),
                activation_bytes=math.ceil(activations * (1 + request.fragmentation)),
                parameter_bytes=count * width,
            )
        )
    return costs


def _check_seq(seq: int) -> None:
    if not is_integer(seq) or seq < 1:
        raise ConfigError([("seq", f"must be a whole number of tokens >= 1, got {seq!r}")])
