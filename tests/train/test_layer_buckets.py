"""Gradient compression by layer type (``compression_by_layer``) on 2 gloo ranks over 127.0.0.1,
on a model of an embedding, a convolution and a linear layer: under DDP, the gradients of the
layer types left exact are exact DDP's bit for bit and the int8 ones within int8's bound, each
step and summed over steps (error feedback); the bytes sent by layer type; through the
``Trainer``, ``{"*": "none"}`` is exact DDP bit for bit, and the loss of the int8 linear layers
stays within the documented bound. In one process: the layer type each parameter counts as, a
bucket whose exact and compressed parameters alternate, and the options refused.

The two processes start once per module and run every scenario in order; the tests then check
what each rank recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import TensorDataset

from hetero.errors import ConfigError
from hetero.train import Trainer, TrainerOptions
from hetero.train.compression import CommMeter, ErrorFeedback, Int8, TopK
from hetero.train.layer_buckets import layer_route
from tests.train._models import LOSS, sgd
from tests.train._ranks import Outcome, each, run_ranks

WORLD = 2
DDP_STEPS = 8
TRAIN_STEPS = 20
MIXED = {"Embedding": "none", "Linear": "int8"}  # the convolution: not named, so exact
TOPK = {"*": "topk", "Embedding": "none"}
# The loss over the dataset after TRAIN_STEPS steps with MIXED, relative to exact DDP's on the
# same global batches (docs/training.md#gradient-compression, as int8's; measured 8.2e-7).
LOSS_BOUND = 1e-3
# Parameters by layer type: the embedding 20 × 8, the convolution 8 × 8 × 3 + 8, the linear
# layer 24 × 4 + 4.
SIZES = {"Embedding": 160, "Conv1d": 200, "Linear": 100}
DENSE = 4 * sum(SIZES.values())


class Tagger(nn.Module):
    """5 token ids → an embedding of 8 → a convolution of width 3 → a linear layer: 4 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.conv = nn.Conv1d(8, 8, 3)
        self.head = nn.Linear(24, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.conv(self.embed(tokens).transpose(1, 2)))
        return self.head(hidden.flatten(1))


def tagger() -> Tagger:
    torch.manual_seed(0)  # the same start on every rank
    return Tagger()


def tokens(n: int = 60) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randint(0, 20, (n, 5), generator=generator)
    y = torch.randint(0, 4, (n,), generator=generator)
    return TensorDataset(x, y)


def _layer(name: str) -> str:
    return {"embed": "Embedding", "conv": "Conv1d", "head": "Linear"}[name.split(".")[0]]


def _gradients(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _backward(module: nn.Module, rank: int) -> None:
    x, y = tokens()[12 * rank : 12 * (rank + 1)]  # each rank its own samples
    module.zero_grad(set_to_none=True)
    LOSS(module(x), y).backward()


def _under_ddp(by_layer: dict[str, str], topk_ratio: float) -> Callable[[int], Any]:
    """Each rank's own gradients, exact DDP's, and DDP_STEPS steps' under ``by_layer`` (on the
    same parameters and samples every step), with the bytes sent by layer type."""

    def scenario(rank: int) -> Any:
        local = tagger()
        _backward(local, rank)
        exact = tagger()
        _backward(DistributedDataParallel(exact, gradient_as_bucket_view=True), rank)
        model = tagger()
        ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
        meter = CommMeter()
        route = layer_route(model, by_layer, topk_ratio)
        assert route is not None
        ErrorFeedback(route, meter).register(ddp)
        steps, sent = [], []
        for _ in range(DDP_STEPS):
            _backward(ddp, rank)
            steps.append(_gradients(model))
            meter.take()
            sent.append(meter.taken)
        return {
            "local": _gradients(local),
            "exact": _gradients(exact),
            "steps": steps,
            "sent": sent,
        }

    return scenario


def _dataset_loss(model: nn.Module) -> float:
    x, y = tokens()[:]
    with torch.no_grad():
        return float(LOSS(model(x), y) / len(x))


def _trained(**kw: Any) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, seed=3, profile_steps=1, shares=(16, 8), **kw)
        trainer = Trainer(tagger(), sgd, LOSS, tokens(), options)
        reports = [r.to_dict() for r in trainer.train(TRAIN_STEPS, progress=False)]
        return {
            "state": {n: t.clone() for n, t in trainer.model.state_dict().items()},
            "loss": _dataset_loss(trainer.model),
            "reports": reports,
        }

    return scenario


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "ddp_mixed": _under_ddp(MIXED, 0.01),
    "ddp_topk": _under_ddp(TOPK, 0.05),
    "exact": _trained(),
    "all_none": _trained(compression_by_layer={"*": "none"}),
    "mixed": _trained(compression_by_layer=MIXED),
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 2 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("layer_buckets"))


def test_the_exact_layer_types_get_exact_ddps_gradients_bit_for_bit(
    ranks: list[dict[str, Outcome]],
) -> None:
    exact_types = {"ddp_mixed": {"Embedding", "Conv1d"}, "ddp_topk": {"Embedding"}}
    for name, types in exact_types.items():
        for result in each(ranks, name):
            for step in result["steps"]:
                for param, gradient in step.items():
                    if _layer(param) in types:
                        assert torch.equal(gradient, result["exact"][param]), (name, param)


def test_the_int8_layer_type_is_within_half_a_step_each_step_and_summed_over_steps(
    ranks: list[dict[str, Outcome]],
) -> None:
    """Int8 rounds each rank's value to within scale / 2 (scale: the part's largest magnitude
    over 127), so the mean is within the ranks' mean half-step; error feedback sends each
    step what the last one lost, so the sum over steps stays within that too (plus the
    residual's own share of the scale), instead of growing with the steps."""
    results = each(ranks, "ddp_mixed")
    heads = [p for p in results[0]["exact"] if _layer(p) == "Linear"]

    def largest(grads: dict[str, torch.Tensor]) -> float:
        return max(float(grads[p].abs().max()) for p in heads)

    half_step = sum(largest(r["local"]) for r in results) / 254 / WORLD
    exact = results[0]["exact"]
    slack = 1e-6 * largest(exact) * DDP_STEPS  # fp32 rounding of the sums
    for result in results:
        first = max(float((result["steps"][0][p] - exact[p]).abs().max()) for p in heads)
        summed = max(
            float((sum(s[p] for s in result["steps"]) - DDP_STEPS * exact[p]).abs().max())
            for p in heads
        )
        print(f"int8 linear: step 1 off by {first:.2e}, {DDP_STEPS} steps' sum by {summed:.2e}")
        print(f"bound {half_step:.2e}")
        assert 0 < first <= half_step + slack
        assert summed <= half_step * (1 + 1 / 254) + slack


def test_each_step_sends_the_bytes_of_each_layer_types_codec(
    ranks: list[dict[str, Outcome]],
) -> None:
    exact_bytes = {layer: 4 * n for layer, n in SIZES.items()}
    mixed = {**exact_bytes, "Linear": SIZES["Linear"] + 4}  # a byte a value and the scale
    topk = {**exact_bytes, "Conv1d": 10 * 8, "Linear": 5 * 8}  # ⌈5%⌉ values and indices
    for name, expected in (("ddp_mixed", mixed), ("ddp_topk", topk)):
        for result in each(ranks, name):
            assert result["sent"] == [expected] * DDP_STEPS
        print(f"{name}: {expected}, {sum(expected.values())} of {DENSE} bytes a step")
    for result in each(ranks, "mixed"):
        assert {(r["comm_bytes"], r["dense_bytes"]) for r in result["reports"]} == {
            (sum(mixed.values()), DENSE)
        }
    assert mixed["Linear"] < exact_bytes["Linear"]


def test_all_exact_is_exact_ddp(ranks: list[dict[str, Outcome]]) -> None:
    exact = each(ranks, "exact")[0]
    for result in each(ranks, "all_none"):
        assert result["state"].keys() == exact["state"].keys()
        assert all(torch.equal(t, exact["state"][n]) for n, t in result["state"].items())
        assert {r["comm_bytes"] for r in result["reports"]} == {DENSE}


def test_the_loss_stays_within_the_bound_of_exact_ddp(ranks: list[dict[str, Outcome]]) -> None:
    exact = each(ranks, "exact")[0]["loss"]
    losses = [r["loss"] for r in each(ranks, "mixed")]
    assert losses[0] == losses[1]  # every rank applied the same update
    gap = abs(losses[0] - exact) / exact
    print(f"mixed: loss after {TRAIN_STEPS} steps {losses[0]:.6f}, exact {exact:.6f}: {gap:.1e}")
    assert gap <= LOSS_BOUND


# ------------------------------------------------------------------------- one process


class _Tied(nn.Module):
    """An embedding whose weight a linear layer shares, beside an attention layer (whose output
    projection is a subclass of ``Linear``) and a frozen linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.attention = nn.MultiheadAttention(4, 1)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.frozen = nn.Linear(4, 4).requires_grad_(False)


def test_each_parameter_counts_as_its_modules_type() -> None:
    model = _Tied()
    route = layer_route(model, {"Linear": "int8", "Embedding": "none", "*": "topk"}, 0.1)
    assert route is not None
    # The tied weight: the most exact of its layer types' codecs.
    assert route(model.embed.weight) == ("Embedding", None)
    name, codec = route(model.attention.out_proj.weight)  # NonDynamicallyQuantizableLinear
    assert name == "Linear" and isinstance(codec, Int8)
    name, codec = route(model.attention.in_proj_weight)
    assert name == "MultiheadAttention" and isinstance(codec, TopK) and codec.ratio == 0.1
    with pytest.raises(KeyError):  # not trained: in no bucket
        route(model.frozen.weight)
    # Nothing to compress: DDP's own all-reduce stays.
    assert layer_route(model, {"*": "none", "Unknown": "int8"}, 0.1) is None
    assert layer_route(model, {}, 0.1) is None


def test_a_bucket_of_alternating_exact_and_compressed_parts(group: None) -> None:
    """One rank: the bucket holds the linear layer, the convolution and the embedding (in
    DDP's reverse order); the convolution in int8 between two exact types comes back within
    half a step, the others untouched, each in its place."""
    local, model = tagger(), tagger()
    _backward(local, 0)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    meter = CommMeter()
    route = layer_route(model, {"Conv1d": "int8"}, 0.01)
    assert route is not None
    ErrorFeedback(route, meter).register(ddp)
    _backward(ddp, 0)
    expected = _gradients(local)
    for param, gradient in _gradients(model).items():
        if _layer(param) == "Conv1d":
            half_step = max(float(expected[p].abs().max()) for p in expected if "conv" in p) / 254
            assert (gradient - expected[param]).abs().max() <= half_step * (1 + 1e-6)
        else:
            assert torch.equal(gradient, expected[param]), param
    assert meter.take() == 4 * 160 + 204 + 4 * 100
    assert meter.taken == {"Linear": 400, "Conv1d": 204, "Embedding": 640}


def _refused(**kw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=8, **kw)
    return str(info.value)


def test_an_unknown_codec_lists_the_allowed_ones() -> None:
    assert _refused(compression_by_layer={"Linear": "int4"}) == (
        "compression_by_layer: 'Linear': must be one of none, int8, topk, got 'int4'"
    )
    assert _refused(compression_by_layer=["Linear"]) == (
        "compression_by_layer: must be a dict from layer types (a module's class name, such as "
        "'Linear', or '*' for every type not named) to codecs (none, int8, topk) or None, "
        "got ['Linear']"
    )


def test_exactness_refuses_each_lossy_entry_by_name() -> None:
    assert _refused(
        compression_by_layer={"Embedding": "none", "Linear": "int8", "*": "topk"}, exact=True
    ) == (
        "2 problems:\n"
        "  - compression_by_layer: 'Linear': 'int8' sends an approximation of the gradient, and "
        "exact=True asks for the global batch's exact update: use 'none' or exact=False\n"
        "  - compression_by_layer: '*': 'topk' sends an approximation of the gradient, and "
        "exact=True asks for the global batch's exact update: use 'none' or exact=False"
    )
    # Unknown layer types are fine (they may not appear), and exact codecs with anything.
    TrainerOptions(global_batch=8, compression_by_layer={"Bogus": "none"}, exact=True)
    TrainerOptions(global_batch=8, compression_by_layer={"*": "none"}, sharding="fsdp")


def test_compression_and_compression_by_layer_are_not_given_together() -> None:
    assert _refused(compression="int8", compression_by_layer={"Embedding": "none"}) == (
        "compression_by_layer: is given with compression='int8': give one of them (a '*' entry "
        "sets the codec of every layer type not named)"
    )


def test_lossy_entries_are_refused_where_no_ddp_hook_runs() -> None:
    assert _refused(compression_by_layer={"Linear": "int8"}, sharding="fsdp") == (
        "compression_by_layer: {'Linear': 'int8'} compresses in a DDP communication hook: with "
        "sharding='fsdp' gradients are reduce-scattered uncompressed; use None"
    )
    assert _refused(compression_by_layer={"Linear": "topk"}, local_sgd_every=4).startswith(
        "compression_by_layer: {'Linear': 'topk'} compresses DDP's gradient all-reduce, which "
        "local_sgd_every=4 replaces"
    )
    assert "mixed_precision='fp16'" in _refused(
        compression_by_layer={"Linear": "int8"}, mixed_precision="fp16"
    )
