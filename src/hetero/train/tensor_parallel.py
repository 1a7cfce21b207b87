"""Tensor parallelism, Megatron-style, for the layers that need it: each attention's heads and
each MLP's hidden units split over the ranks of a tensor-parallel group, with torch's DTensor
(``torch.distributed.tensor.parallel``).

What is split (``degree`` ranks, the size of the group's ``DeviceMesh``):

- *Attention*: the query, key and value projections by output column (``ColwiseParallel``:
  each rank computes ``heads / degree`` whole heads, and ``key/value heads / degree`` under
  grouped-query attention), the output projection by input row (``RowwiseParallel``: each rank
  multiplies its heads' part and an all-reduce sums them).
- *MLP*: its input projections (``up``, and ``gate`` where there is one) by column, its output
  projection by row.
- *Block*: both of a transformer block's; its norms and residuals stay whole on every rank.

So each rank holds ``1 / degree`` of those weights (and of their gradients and optimizer state),
and a block costs two all-reduces of its activations forward (one after each row-parallel
projection) and two backward. The second pair needs the layer's input to enter as one
replicated DTensor (``_ReplicatedInput``): otherwise each column-parallel projection would
all-reduce its own input gradient in the backward, three for attention instead of one.

Layers are found by name (``AttentionLayout``, ``MLPLayout``, ``BlockLayout``); the default
names are Llama's, as transformers writes it (``self_attn.q_proj`` … ``mlp.down_proj``), so
its ``LlamaDecoderLayer`` is a ``"block"`` as it is (the benchmark splits one; Mistral's and
Qwen2's use the same names). An attention's forward must
shape its heads as ``(…, -1, head_dim)`` (the heads a rank has are fewer than the model's), and
its input must feed only its projections (it arrives as a DTensor).

torch 2.13's DTensor redistributes over gloo on the CPU (the all-reduces here, and
reduce-scatters), so there is no hand-written fallback: the same code is meant for NCCL (only
gloo is tested here).
``tensor_parallel_plan`` is pure (the sizes checked before anything is split);
``tensor_parallel`` splits the model on every rank of the group at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from hetero._checks import is_integer
from hetero.comm._base import boundary
from hetero.errors import ConfigError, HeteroError

__all__ = [
    "LAYER_KINDS",
    "AttentionLayout",
    "BlockLayout",
    "Layer",
    "MLPLayout",
    "parameter_bytes",
    "tensor_parallel",
    "tensor_parallel_plan",
]


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """Where an attention module keeps its projections (``nn.Linear`` children, by name) and
    the width of one head (an attribute, by name)."""

    query: str = "q_proj"
    key: str = "k_proj"
    value: str = "v_proj"
    output: str = "o_proj"
    head_dim: str = "head_dim"
    # The keyword the module's input comes as when it is not passed by position.
    input: str = "hidden_states"


@dataclass(frozen=True, slots=True)
class MLPLayout:
    """An MLP's input projections (split by column) and output projection (split by row)."""

    column: tuple[str, ...] = ("gate_proj", "up_proj")
    row: str = "down_proj"
    input: str = "x"


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """A transformer block: its attention and MLP children, by name, and their layouts."""

    attention: str = "self_attn"
    mlp: str = "mlp"
    attention_layout: AttentionLayout = field(default_factory=AttentionLayout)
    mlp_layout: MLPLayout = field(default_factory=MLPLayout)


#: A layer kind by name (its default layout) or a layout naming its parts.
Layer = str | AttentionLayout | MLPLayout | BlockLayout

#: The layer kinds by name, and the layout each stands for.
LAYER_KINDS: Mapping[str, AttentionLayout | MLPLayout | BlockLayout] = {
    "attention": AttentionLayout(),
    "block": BlockLayout(),
    "mlp": MLPLayout(),
}


def tensor_parallel(
    model: nn.Module, mesh: DeviceMesh, layers: Layer | Mapping[str, Layer]
) -> nn.Module:
    """Split ``model``'s ``layers`` over ``mesh`` (in place) and return it.

    ``layers`` is a kind (``"attention"``, ``"block"``, ``"mlp"``) or layout when ``model`` is
    that layer itself, or ``{submodule path: kind or layout}`` (``{"layers.0": "block", …}``).
    ``mesh`` is the tensor-parallel group's one-dimensional ``DeviceMesh``
    (``tensor_parallel_mesh``). Every rank of the group must call it with the same model: the
    weights are scattered from the group's first rank. Afterwards the split weights are
    ``DTensor`` parameters (``full_tensor()`` gathers one), the layers' outputs plain tensors,
    the same on every rank of the group; any optimizer steps them as it would the whole ones.
    ``ConfigError`` (nothing split) for a layer that is not there, of an unknown kind, or whose
    heads or hidden size the group's size does not divide.
    """
    if not isinstance(mesh, DeviceMesh):
        raise ConfigError(
            [
                (
                    "mesh",
                    f"must be a torch DeviceMesh (tensor_parallel_mesh), got {type(mesh).__name__}",
                )
            ]
        )
    if mesh.ndim != 1:
        raise ConfigError(
            [
                (
                    "mesh",
                    f"has {mesh.ndim} dimensions {mesh.mesh_dim_names or ''}; pass its "
                    "tensor-parallel dimension alone (mesh['tp'])",
                )
            ]
        )
    plan = tensor_parallel_plan(model, layers, mesh.size())
    with boundary(f"splitting {len(plan)} modules over the ranks {mesh.mesh.tolist()}"):
        # One module at a time: a plan's key must name a child, and "" is the model itself.
        for path, style in plan.items():
            parallelize_module(model.get_submodule(path), mesh, style)
    return model


def tensor_parallel_plan(
    model: nn.Module, layers: Layer | Mapping[str, Layer], degree: int
) -> dict[str, ParallelStyle]:
    """The ``parallelize_module`` plan that splits ``model``'s ``layers`` ``degree`` ways
    (see ``tensor_parallel``), every layer's sizes checked first: ``ConfigError`` listing every
    problem found."""
    if not is_integer(degree) or degree < 1:
        raise ConfigError([("degree", f"must be a whole number of ranks, 1 or more: {degree!r}")])
    named = layers.items() if isinstance(layers, Mapping) else [("", layers)]
    plan: dict[str, ParallelStyle] = {}
    problems: list[tuple[str, str]] = []
    for path, kind in named:
        where = f"layers[{path!r}]" if isinstance(layers, Mapping) else "layers"
        layout = LAYER_KINDS.get(kind) if isinstance(kind, str) else kind
        if not isinstance(layout, AttentionLayout | MLPLayout | BlockLayout):
            allowed = ", ".join(repr(k) for k in LAYER_KINDS)
            problems.append(
                (
                    where,
                    f"unknown layer kind {kind!r}; allowed: {allowed}, or an AttentionLayout, "
                    "MLPLayout or BlockLayout naming its parts",
                )
            )
            continue
        try:
            module = model.get_submodule(path)
        except AttributeError:
            problems.append((where, f"{type(model).__name__} has no submodule {path!r}"))
            continue
        _plan_layer(_Layer(where, path, module, degree, plan, problems), layout)
    if problems:
        raise ConfigError(problems)
    return plan


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of ``model``'s parameters on this rank: of a split one, its own part."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).nbytes for p in model.parameters())


@dataclass(slots=True)
class _Layer:
    """One layer being planned: where it is named, its module, and what the plan collects."""

    where: str
    path: str
    module: nn.Module
    degree: int
    plan: dict[str, ParallelStyle]
    problems: list[tuple[str, str]]

    def child(self, name: str) -> _Layer | None:
        """The layer of child ``name``, or None (a problem noted) where there is none."""
        found = getattr(self.module, name, None) if name else None
        if not isinstance(found, nn.Module):
            children = ", ".join(n for n, _ in self.module.named_children()) or "none"
            self.problem(f"has no submodule {name!r} (its children: {children})")
            return None
        path = f"{self.path}.{name}" if self.path else name
        return _Layer(self.where, path, found, self.degree, self.plan, self.problems)

    def linear(self, name: str) -> nn.Linear | None:
        """Child ``name`` as an ``nn.Linear``, or None (a problem noted)."""
        found = getattr(self.module, name, None) if name else None
        if isinstance(found, nn.Linear) and isinstance(found.weight, DTensor):
            self.problem(f"{name!r} is split already")
            return None
        if isinstance(found, nn.Linear):
            return found
        linears = ", ".join(n for n, m in self.module.named_children() if isinstance(m, nn.Linear))
        if found is None:
            self.problem(
                f"has no nn.Linear {name!r} (its nn.Linear children: {linears or 'none'}); name "
                "its projections with a layout"
            )
        else:
            self.problem(
                f"{name!r} is a {type(found).__name__}, not an nn.Linear: a fused or Conv1D "
                "projection (GPT-2's c_attn) cannot be split by head"
            )
        return None

    def split(self, columns: Sequence[str], row: str, keyword: str) -> None:
        """Plan ``columns`` split by column, ``row`` by row, and the layer's input (its first
        positional argument, else keyword ``keyword``) entering once."""
        styles: dict[str, ParallelStyle] = {name: ColwiseParallel() for name in columns}
        styles[row] = RowwiseParallel()
        entries = {f"{self.path}.{n}" if self.path else n: style for n, style in styles.items()}
        entries[self.path] = _ReplicatedInput(keyword)
        twice = [path or "the model" for path in entries if path in self.plan]
        if twice:
            self.problem(f"{twice[0]} is also part of another layer listed; list each once")
        else:
            self.plan.update(entries)

    def problem(self, message: str) -> None:
        self.problems.append((self.where, f"{self.path or 'the model'}: {message}"))

    def divides(self, what: str, sizes: Mapping[str, int]) -> bool:
        """Whether the degree divides every one of ``sizes`` (else a problem naming them and
        the degrees that would)."""
        if all(size % self.degree == 0 for size in sizes.values()):
            return True
        allowed = [
            d for d in range(1, min(sizes.values()) + 1) if all(s % d == 0 for s in sizes.values())
        ]
        listed = ", ".join(f"{size} {name}" for name, size in sizes.items())
        self.problem(
            f"tensor-parallel degree {self.degree} does not divide its {what} ({listed}); "
            f"allowed degrees: {', '.join(map(str, allowed))}"
        )
        return False


def _plan_layer(layer: _Layer, layout: AttentionLayout | MLPLayout | BlockLayout) -> None:
    if isinstance(layout, BlockLayout):
        for name, part in (
            (layout.attention, layout.attention_layout),
            (layout.mlp, layout.mlp_layout),
        ):
            child = layer.child(name)
            if child is not None:
                _plan_layer(child, part)
    elif isinstance(layout, AttentionLayout):
        _plan_attention(layer, layout)
    else:
        _plan_mlp(layer, layout)


def _plan_attention(layer: _Layer, layout: AttentionLayout) -> None:
    q, k, v, o = (
        layer.linear(name) for name in (layout.query, layout.key, layout.value, layout.output)
    )
    if q is None or k is None or v is None or o is None:
        return
    found: object = getattr(layer.module, layout.head_dim, None)
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        layer.problem(
            f"has no whole positive {layout.head_dim!r} (the width of one head, got "
            f"{found!r}); name it with AttentionLayout(head_dim=...)"
        )
        return
    head_dim = found
    shapes = {
        f"{layout.query} output": q.out_features,
        f"{layout.key} output": k.out_features,
        f"{layout.value} output": v.out_features,
        f"{layout.output} input": o.in_features,
    }
    if (
        q.out_features != o.in_features
        or k.out_features != v.out_features
        or any(size % head_dim for size in shapes.values())
    ):
        listed = ", ".join(f"{name} {size}" for name, size in shapes.items())
        layer.problem(
            f"its projections do not make whole heads of {layout.head_dim} {head_dim} "
            f"({listed}): the query's output and the output's input must be equal, and the "
            "key's and value's, each a multiple of the head width"
        )
        return
    sizes = {
        "attention heads": q.out_features // head_dim,
        "key/value heads": k.out_features // head_dim,
    }
    if layer.divides("heads", sizes):
        layer.split((layout.query, layout.key, layout.value), layout.output, layout.input)


def _plan_mlp(layer: _Layer, layout: MLPLayout) -> None:
    if not layout.column:
        layer.problem("its MLPLayout names no input projection (column=())")
        return
    found = [layer.linear(name) for name in layout.column]
    columns = [c for c in found if c is not None]
    row = layer.linear(layout.row)
    if row is None or len(columns) != len(found):
        return
    widths = {
        f"{name} output": c.out_features for name, c in zip(layout.column, columns, strict=True)
    }
    widths[f"{layout.row} input"] = row.in_features
    if len(set(widths.values())) != 1:
        listed = ", ".join(f"{name} {size}" for name, size in widths.items())
        layer.problem(f"its projections disagree on the hidden size ({listed})")
        return
    if layer.divides("hidden size", {"hidden units": row.in_features}):
        layer.split(layout.column, layout.row, layout.input)


class _ReplicatedInput(ParallelStyle):
    """A layer's input as one replicated DTensor, so that the gradients its column-parallel
    projections send back add up (partial sums all) and are all-reduced once, where the
    layer's input came in, rather than once per projection.

    The input is the forward's first positional argument, else its keyword ``keyword``."""

    def __init__(self, keyword: str) -> None:
        super().__init__()
        self.keyword = keyword

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def replicate(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
                return DTensor.from_local(value, device_mesh, [Replicate()], run_check=False)
            return value

        def hook(
            layer: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if args:
                return (replicate(args[0]), *args[1:]), kwargs
            if self.keyword in kwargs:
                return args, {**kwargs, self.keyword: replicate(kwargs[self.keyword])}
            raise HeteroError(
                f"{type(layer).__name__} was called without its input: no positional argument "
                f"and no keyword {self.keyword!r}; name the keyword in its layout (input=...)"
            )

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module
