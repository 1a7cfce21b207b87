"""Tensor parallelism on gloo ranks over 127.0.0.1: a transformer block (grouped-query attention
and a gated MLP) split over 2 ranks, and over two pairs of 4, gives one process's output and,
after 5 SGD steps, its parameters, with half its weights on each rank; the groups sit on the
best-connected devices; bad sizes and layer kinds are refused before anything is split.

The ranks start once per world size and run every scenario in order; the tests then check what
each rank recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")

import numpy as np
import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from hetero import comm
from hetero.devices.discovery import get_device_list
from hetero.devices.fake_nvml import mixed_box, nvswitch_box, pcie_box
from hetero.devices.rings import device_bandwidth
from hetero.devices.spec import DeviceKind
from hetero.devices.topology_nvml import read_topology
from hetero.errors import ConfigError
from hetero.train.tensor_parallel import (
    BlockLayout,
    MLPLayout,
    parameter_bytes,
    tensor_parallel,
    tensor_parallel_plan,
)
from hetero.train.tensor_parallel_groups import tensor_parallel_groups, tensor_parallel_mesh
from tests.train._models import relative_difference
from tests.train._ranks import Outcome, each, recorded, run_ranks

STEPS = 5
TOLERANCE = 1e-5
WIDTH, HEADS, KV_HEADS, HIDDEN = 32, 4, 2, 64


class Attention(nn.Module):
    """Causal grouped-query attention, its heads shaped as ``(…, -1, head_dim)``."""

    def __init__(self) -> None:
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.q_proj = nn.Linear(WIDTH, HEADS * self.head_dim)
        self.k_proj = nn.Linear(WIDTH, KV_HEADS * self.head_dim)
        self.v_proj = nn.Linear(WIDTH, KV_HEADS * self.head_dim)
        self.o_proj = nn.Linear(HEADS * self.head_dim, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (
            p(x).view(batch, seq, -1, self.head_dim).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        repeat = q.size(1) // k.size(1)  # the query heads per key/value head
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        heads = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.o_proj(heads.transpose(1, 2).reshape(batch, seq, -1))
        return out


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(WIDTH, HIDDEN)
        self.up_proj = nn.Linear(WIDTH, HIDDEN)
        self.down_proj = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Block(nn.Module):
    """A pre-norm transformer block, Llama's names."""

    def __init__(self) -> None:
        super().__init__()
        self.input_norm = nn.LayerNorm(WIDTH)
        self.self_attn = Attention()
        self.post_norm = nn.LayerNorm(WIDTH)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_norm(x))
        out: torch.Tensor = x + self.mlp(self.post_norm(x))
        return out


def block() -> Block:
    """The same start on every rank."""
    torch.manual_seed(0)
    return Block()


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``STEPS`` batches of 4 sequences of 6 positions, and targets."""
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(4, 6, WIDTH, generator=generator),
            torch.randn(4, 6, WIDTH, generator=generator),
        )
        for _ in range(STEPS)
    ]


def links(world: int) -> np.ndarray:
    """GB/s between the ranks: with 4, ranks 0 and 2 share the fastest link, 1 and 3 the next."""
    matrix = np.full((world, world), 10.0)
    if world == 4:
        matrix[0, 2] = matrix[2, 0] = 300.0
        matrix[1, 3] = matrix[3, 1] = 100.0
    return matrix


def trained(model: nn.Module) -> tuple[nn.Module, list[float]]:
    """``model`` after ``STEPS`` steps of SGD with momentum on the mean squared error."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in batches():
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, losses


def full(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole (a split one gathered from the group)."""
    return {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach()
        for name, p in model.named_parameters()
    }


def _split(layers: Any) -> Callable[[int], Any]:
    """Train the block split by ``layers`` over this rank's pair and one process alike."""

    def scenario(rank: int) -> dict[str, Any]:
        mesh = tensor_parallel_mesh(tensor_parallel_groups(links(comm.world_size()), 2))
        x = batches()[0][0]
        split = tensor_parallel(block(), mesh, layers)
        output = split(x)
        expected = block()(x)
        reference, reference_losses = trained(block())
        split, losses = trained(split)
        return {
            "group": mesh.mesh.tolist(),
            "output": ((output - expected).abs().max() / expected.abs().max()).item(),
            "output_is_plain": type(output) is torch.Tensor,
            "diff": relative_difference(full(split), reference),
            "losses": losses,
            "reference_losses": reference_losses,
            "bytes": parameter_bytes(split),
        }

    return scenario


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "block": _split("block"),
    "parts": _split({"self_attn": "attention", "mlp": MLPLayout()}),
}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    path = tmp_path_factory.mktemp("tensor_parallel_2")
    run_ranks(__name__, 2, path)
    return recorded(path, 2)


@pytest.mark.parametrize("name", ["block", "parts"])
def test_a_split_block_gives_one_process_output_and_parameters(
    two_ranks: list[dict[str, Outcome]], name: str
) -> None:
    results = each(two_ranks, name)
    print(
        f"{name}: output {[r['output'] for r in results]}, after {STEPS} steps "
        f"{[r['diff'] for r in results]}"
    )
    assert all(r["group"] == [0, 1] for r in results)
    assert all(r["output_is_plain"] for r in results)
    assert max(r["output"] for r in results) <= TOLERANCE
    assert max(r["diff"] for r in results) <= TOLERANCE
    for r in results:
        np.testing.assert_allclose(r["losses"], r["reference_losses"], rtol=TOLERANCE)


def test_each_rank_holds_half_the_split_weights(two_ranks: list[dict[str, Outcome]]) -> None:
    column = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    whole = split = 0
    for name, p in block().named_parameters():
        whole += p.nbytes
        # Every projection's weight is split; a row-parallel one's bias stays whole.
        if name.endswith("_proj.weight") or name.split(".")[-2] in column:
            split += p.nbytes
    for r in each(two_ranks, "block"):
        assert r["bytes"] == whole - split // 2
        assert r["bytes"] < 0.52 * whole  # the norms and output biases are all that stay whole


@pytest.mark.slow
def test_two_pairs_of_four_ranks_split_on_their_fast_links(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    path = tmp_path_factory.mktemp("tensor_parallel_4")
    results = each(run_ranks(__name__, 4, path), "block")
    assert [r["group"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert max(r["output"] for r in results) <= TOLERANCE
    assert max(r["diff"] for r in results) <= TOLERANCE


# --- the groups: pure -----------------------------------------------------------------------


def test_the_group_takes_the_well_connected_pair() -> None:
    # Ranks on the mixed box's GPUs 0, 2, 1, 3: the A100s' NVLink pair is ranks 0 and 2, the
    # V100s' ranks 1 and 3; any other pair crosses the sockets.
    topology = read_topology(mixed_box(), environ={})
    gpus = [d for d in get_device_list(nvml=mixed_box(), environ={}) if d.kind is DeviceKind.GPU]
    ranks = [gpus[i] for i in (0, 2, 1, 3)]
    assert tensor_parallel_groups(device_bandwidth(ranks, topology), 2) == ((0, 2), (1, 3))
    # PCIe only: the pair under one switch first, then the pair behind two.
    bandwidth = read_topology(pcie_box(), environ={}).bandwidth
    assert tensor_parallel_groups(bandwidth[np.ix_([3, 0, 2, 1], [3, 0, 2, 1])], 2) == (
        (1, 3),
        (0, 2),
    )
    # NVSwitch: every link alike, so the lower ranks together.
    bandwidth = read_topology(nvswitch_box(), environ={}).bandwidth
    assert tensor_parallel_groups(bandwidth, 4) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert tensor_parallel_groups(bandwidth, 1) == tuple((r,) for r in range(8))


def test_a_degree_that_does_not_split_the_ranks_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"degree: 3 does not split the 4 ranks.*allowed: 1, 2, 4"
    ):
        tensor_parallel_groups(links(4), 3)
    with pytest.raises(ConfigError, match=r"bandwidth: must be a square matrix"):
        tensor_parallel_groups([[0.0, 1.0]], 1)


# --- the plan: pure -------------------------------------------------------------------------


def test_the_plan_splits_the_projections_megatron_style() -> None:
    plan = tensor_parallel_plan(nn.Sequential(block()), {"0": "block"}, 2)
    column = {f"0.self_attn.{p}_proj" for p in "qkv"} | {"0.mlp.gate_proj", "0.mlp.up_proj"}
    assert {k for k, s in plan.items() if isinstance(s, ColwiseParallel)} == column
    assert {k for k, s in plan.items() if isinstance(s, RowwiseParallel)} == {
        "0.self_attn.o_proj",
        "0.mlp.down_proj",
    }
    # The attention's and the MLP's inputs enter once each (one all-reduce of their gradient).
    assert set(plan) - column - {"0.self_attn.o_proj", "0.mlp.down_proj"} == {
        "0.self_attn",
        "0.mlp",
    }


def test_a_degree_that_does_not_divide_the_heads_or_hidden_size_is_refused() -> None:
    model = nn.Sequential(block())
    with pytest.raises(ConfigError) as error:
        tensor_parallel_plan(model, {"0": "block"}, 3)
    assert error.value.problems == [
        (
            "layers['0']",
            "0.self_attn: tensor-parallel degree 3 does not divide its heads (4 attention heads, "
            "2 key/value heads); allowed degrees: 1, 2",
        ),
        (
            "layers['0']",
            "0.mlp: tensor-parallel degree 3 does not divide its hidden size (64 hidden units); "
            "allowed degrees: 1, 2, 4, 8, 16, 32, 64",
        ),
    ]
    # 4 divides the query heads and the hidden size, not the 2 key/value heads.
    with pytest.raises(ConfigError, match=r"self_attn: .*degree 4 .*2 key/value heads") as error:
        tensor_parallel_plan(model, {"0": "block"}, 4)
    assert len(error.value.problems) == 1


def test_an_unknown_layer_kind_is_refused_with_the_allowed_ones() -> None:
    with pytest.raises(
        ConfigError,
        match=r"layers\['mlp'\]: unknown layer kind 'moe'; allowed: 'attention', 'block', 'mlp'",
    ):
        tensor_parallel_plan(block(), {"mlp": "moe"}, 2)
    with pytest.raises(ConfigError, match=r"layers: unknown layer kind 7"):
        tensor_parallel_plan(block(), 7, 2)  # type: ignore[arg-type]


def test_layers_that_are_not_there_or_not_linear_are_named() -> None:
    with pytest.raises(ConfigError, match=r"layers\['blocks.0'\]: Block has no submodule"):
        tensor_parallel_plan(block(), {"blocks.0": "block"}, 2)
    with pytest.raises(
        ConfigError,
        match=r"mlp: has no nn.Linear 'fc1' \(its nn.Linear "
        r"children: gate_proj, up_proj, down_proj\)",
    ):
        tensor_parallel_plan(block(), BlockLayout(mlp_layout=MLPLayout(column=("fc1",))), 2)
    fused = block()
    fused.self_attn.q_proj = nn.Conv1d(WIDTH, WIDTH, 1)  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"'q_proj' is a Conv1d, not an nn.Linear"):
        tensor_parallel_plan(fused, "block", 2)
    with pytest.raises(ConfigError, match=r"has no submodule 'attn' \(its children: "):
        tensor_parallel_plan(block(), BlockLayout(attention="attn"), 2)
    with pytest.raises(
        ConfigError, match=r"layers\['0.mlp'\]: 0.mlp: 0.mlp.gate_proj is also part "
    ):
        tensor_parallel_plan(nn.Sequential(block()), {"0": "block", "0.mlp": "mlp"}, 2)


def test_a_mesh_that_is_not_one_group_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"mesh: must be a torch DeviceMesh"):
        tensor_parallel(block(), "tp", "block")  # type: ignore[arg-type]
