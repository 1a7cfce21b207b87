"""The calls themselves: point-to-point, broadcast, the reductions, the gathers and all-to-all.

Each checks its arguments before torch sees them (so a bad call fails alike on every rank,
before any rank waits), takes ``group=`` (see ``_groups``) and, where torch can, ``async_op``
(see ``Handle``), and is recorded for the profiler: one call of its op name, the seconds this
rank was blocked in it, the bytes of the tensors it passed.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, Literal, overload

import torch
import torch.distributed as dist

from hetero.comm._base import (
    Handle,
    check_weight,
    floating,
    reduce_op,
    run,
    skip,
    tensor_arg,
)
from hetero.comm._groups import Group, peer_arg, per_rank, rank_arg, scope
from hetero.errors import ConfigError, HeteroError

__all__ = [
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "recv",
    "reduce",
    "reduce_scatter",
    "send",
]


@overload
def send(
    tensor: torch.Tensor, dst: int, *, group: Group | None = ..., async_op: Literal[False] = ...
) -> None: ...
@overload
def send(
    tensor: torch.Tensor, dst: int, *, group: Group | None = ..., async_op: Literal[True]
) -> Handle[None]: ...
def send(
    tensor: torch.Tensor, dst: int, *, group: Group | None = None, async_op: bool = False
) -> Handle[None] | None:
    """Send ``tensor`` to rank ``dst``, which must ``recv`` a tensor of the same shape and dtype."""
    where = scope(group)
    peer_arg("dst", dst, where)
    if where.index is None:
        return skip(None, async_op)

    def issue(a: bool) -> list[dist.Work | None]:
        if a:
            return [dist.isend(tensor, dst, group=where.pg)]
        dist.send(tensor, dst, group=where.pg)
        return []

    return run(f"send to rank {dst}", "send", tensor.nbytes, async_op, issue, _none)


@overload
def recv(
    tensor: torch.Tensor, src: int, *, group: Group | None = ..., async_op: Literal[False] = ...
) -> None: ...
@overload
def recv(
    tensor: torch.Tensor, src: int, *, group: Group | None = ..., async_op: Literal[True]
) -> Handle[None]: ...
def recv(
    tensor: torch.Tensor, src: int, *, group: Group | None = None, async_op: bool = False
) -> Handle[None] | None:
    """Receive into ``tensor`` what rank ``src`` sends."""
    where = scope(group)
    peer_arg("src", src, where)
    if where.index is None:
        return skip(None, async_op)

    def issue(a: bool) -> list[dist.Work | None]:
        if a:
            return [dist.irecv(tensor, src, group=where.pg)]
        dist.recv(tensor, src, group=where.pg)
        return []

    return run(f"recv from rank {src}", "recv", tensor.nbytes, async_op, issue, _none)


@overload
def broadcast(
    tensor: torch.Tensor,
    src: int = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[False] = ...,
) -> None: ...
@overload
def broadcast(
    tensor: torch.Tensor, src: int = ..., *, group: Group | None = ..., async_op: Literal[True]
) -> Handle[None]: ...
def broadcast(
    tensor: torch.Tensor, src: int = 0, *, group: Group | None = None, async_op: bool = False
) -> Handle[None] | None:
    """Overwrite ``tensor`` on every rank with rank ``src``'s."""
    where = scope(group)
    rank_arg("src", src, where)
    if where.index is None:
        return skip(None, async_op)
    return run(
        "broadcast",
        "broadcast",
        tensor.nbytes,
        async_op,
        lambda a: [dist.broadcast(tensor, src, group=where.pg, async_op=a)],
        _none,
    )


@overload
def all_reduce(
    tensor: torch.Tensor,
    op: str = ...,
    weight: float | None = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[False] = ...,
) -> None: ...
@overload
def all_reduce(
    tensor: torch.Tensor,
    op: str = ...,
    weight: float | None = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[True],
) -> Handle[None]: ...
def all_reduce(
    tensor: torch.Tensor,
    op: str = "sum",
    weight: float | None = None,
    *,
    group: Group | None = None,
    async_op: bool = False,
) -> Handle[None] | None:
    """Reduce ``tensor`` over all ranks in place: ``op`` is sum, mean, max, min or product.

    With ``weight`` (this rank's; every rank passes one or none does) the result is
    Σ_i weight_i · tensor_i, and with ``op="mean"`` that divided by Σ_i weight_i: the mean of
    per-rank means over uneven batches, weighted by batch size, is the mean over all samples.
    """
    torch_op = reduce_op(op)
    where = scope(group)
    check_weight(op, weight)
    if op == "mean" or weight is not None:
        floating(tensor, "tensor", f"op={op!r}" if weight is None else "weight")
    if where.index is None:
        return skip(None, async_op)
    if weight is not None:
        tensor.mul_(weight)
    total = _weight_total(op, weight, tensor)

    def issue(a: bool) -> list[dist.Work | None]:
        works = [dist.all_reduce(tensor, op=torch_op, group=where.pg, async_op=a)]
        if total is not None:
            works.append(dist.all_reduce(total, group=where.pg, async_op=a))
        return works

    def finish() -> None:
        if op == "mean":
            _divide("all_reduce", tensor, total, where.size)

    return run(f"all_reduce({op})", "all_reduce", tensor.nbytes, async_op, issue, finish)


@overload
def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: str = ...,
    weight: float | None = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[False] = ...,
) -> None: ...
@overload
def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: str = ...,
    weight: float | None = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[True],
) -> Handle[None]: ...
def reduce(
    tensor: torch.Tensor,
    dst: int,
    op: str = "sum",
    weight: float | None = None,
    *,
    group: Group | None = None,
    async_op: bool = False,
) -> Handle[None] | None:
    """Reduce ``tensor`` over all ranks into rank ``dst``'s ``tensor``; ``op`` and ``weight``
    as for :func:`all_reduce`. Every other rank's ``tensor`` is left as it was.

    gloo works in every rank's buffer, so there the other ranks reduce a copy (one tensor's
    memory while the call runs); NCCL writes only ``dst``'s.
    """
    torch_op = reduce_op(op)
    where = scope(group)
    rank_arg("dst", dst, where)
    check_weight(op, weight)
    if op == "mean" or weight is not None:
        floating(tensor, "tensor", f"op={op!r}" if weight is None else "weight")
    if where.index is None:
        return skip(None, async_op)
    root = dist.get_rank() == dst
    if weight is not None:
        buf = tensor.mul_(weight) if root else tensor * weight
    elif root or dist.get_backend(where.pg) == "nccl":
        buf = tensor
    else:
        buf = tensor.clone()
    total = _weight_total(op, weight, tensor)

    def issue(a: bool) -> list[dist.Work | None]:
        works = [dist.reduce(buf, dst, op=torch_op, group=where.pg, async_op=a)]
        if total is not None:
            works.append(dist.reduce(total, dst, group=where.pg, async_op=a))
        return works

    def finish() -> None:
        if root and op == "mean":
            _divide("reduce", tensor, total, where.size)

    return run(f"reduce({op}) to rank {dst}", "reduce", tensor.nbytes, async_op, issue, finish)


@overload
def all_gather(
    tensor: torch.Tensor, *, group: Group | None = ..., async_op: Literal[False] = ...
) -> list[torch.Tensor]: ...
@overload
def all_gather(
    tensor: torch.Tensor, *, group: Group | None = ..., async_op: Literal[True]
) -> Handle[list[torch.Tensor]]: ...
def all_gather(
    tensor: torch.Tensor, *, group: Group | None = None, async_op: bool = False
) -> Handle[list[torch.Tensor]] | list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape and dtype on all), in rank order."""
    where = scope(group)
    if where.index is None:
        return skip([], async_op)
    out = [torch.empty_like(tensor) for _ in where.ranks]
    return run(
        "all_gather",
        "all_gather",
        tensor.nbytes,
        async_op,
        lambda a: [dist.all_gather(out, tensor, group=where.pg, async_op=a)],
        lambda: out,
    )


def all_gather_object(obj: Any, *, group: Group | None = None) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order (torch has no async form)."""
    where = scope(group)
    if where.index is None:
        return []
    out: list[Any] = [None] * where.size
    try:
        nbytes = len(pickle.dumps(obj))
    except Exception:  # torch pickles it too and says what is wrong
        nbytes = 0

    def issue(_: bool) -> list[dist.Work | None]:
        dist.all_gather_object(out, obj, group=where.pg)
        return []

    return run("all_gather_object", "all_gather_object", nbytes, False, issue, lambda: out)


@overload
def reduce_scatter(
    output: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    op: str = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[False] = ...,
) -> None: ...
@overload
def reduce_scatter(
    output: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    op: str = ...,
    *,
    group: Group | None = ...,
    async_op: Literal[True],
) -> Handle[None]: ...
def reduce_scatter(
    output: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    op: str = "sum",
    *,
    group: Group | None = None,
    async_op: bool = False,
) -> Handle[None] | None:
    """Reduce ``inputs[i]`` over all ranks into rank i's ``output``: one input per rank, each of
    ``output``'s shape and dtype.

    On gloo this is one all_reduce of the stacked inputs of which each rank keeps its slice:
    torch before 2.8 has no gloo reduce_scatter (and since then runs one all_reduce per rank), so
    this works on every torch, at world_size times the traffic of a true reduce-scatter.
    """
    torch_op = reduce_op(op)
    where = scope(group)
    if len(inputs) != where.size:
        raise ConfigError([("inputs", f"needs {per_rank(where)}, got {len(inputs)}")])
    for i, piece in enumerate(inputs):
        if piece.shape != output.shape or piece.dtype != output.dtype:
            raise ConfigError(
                [
                    (
                        f"inputs[{i}]",
                        f"must match output ({tuple(output.shape)}, {output.dtype}), got "
                        f"({tuple(piece.shape)}, {piece.dtype})",
                    )
                ]
            )
    if op == "mean":
        floating(output, "output", "op='mean'")
    if where.index is None:
        return skip(None, async_op)
    nbytes = sum(piece.nbytes for piece in inputs)
    index = where.index
    if dist.get_backend(where.pg) == "gloo":
        stacked = torch.stack(list(inputs))

        def issue(a: bool) -> list[dist.Work | None]:
            return [dist.all_reduce(stacked, op=torch_op, group=where.pg, async_op=a)]

        def finish() -> None:
            output.copy_(stacked[index])
            if op == "mean":
                output.div_(where.size)

    else:

        def issue(a: bool) -> list[dist.Work | None]:
            return [
                dist.reduce_scatter(output, list(inputs), op=torch_op, group=where.pg, async_op=a)
            ]

        def finish() -> None:
            if op == "mean":
                output.div_(where.size)

    return run(f"reduce_scatter({op})", "reduce_scatter", nbytes, async_op, issue, finish)


@overload
def all_to_all(
    inputs: Sequence[torch.Tensor],
    *,
    output_sizes: Sequence[int] | None = ...,
    group: Group | None = ...,
    async_op: Literal[False] = ...,
) -> list[torch.Tensor]: ...
@overload
def all_to_all(
    inputs: Sequence[torch.Tensor],
    *,
    output_sizes: Sequence[int] | None = ...,
    group: Group | None = ...,
    async_op: Literal[True],
) -> Handle[list[torch.Tensor]]: ...
def all_to_all(
    inputs: Sequence[torch.Tensor],
    *,
    output_sizes: Sequence[int] | None = None,
    group: Group | None = None,
    async_op: bool = False,
) -> Handle[list[torch.Tensor]] | list[torch.Tensor]:
    """Send ``inputs[i]`` to rank i; returns what each rank sent this one, in rank order.

    The inputs may differ in their first dimension (rows), so that ranks send each other uneven
    shares; every tensor of the call, on every rank, must have the same other dimensions,
    dtype and device. How many rows each rank sends here is exchanged first (a small
    all-to-all, within the call even with ``async_op``) unless ``output_sizes`` (rows from each
    rank) says. The results are views into one buffer.
    """
    where = scope(group)
    pieces = list(inputs)
    if len(pieces) != where.size:
        raise ConfigError([("inputs", f"needs {per_rank(where)}, got {len(pieces)}")])
    first = pieces[0]
    for i, piece in enumerate(pieces):
        tensor_arg(f"inputs[{i}]", piece)
        if piece.dim() == 0:
            raise ConfigError([(f"inputs[{i}]", "needs a first dimension (rows), got a scalar")])
        if _row_kind(piece) != _row_kind(first):
            raise ConfigError(
                [
                    (
                        f"inputs[{i}]",
                        f"must have inputs[0]'s rows ({_describe(first)}); only the number of "
                        f"rows may differ, got {_describe(piece)}",
                    )
                ]
            )
    if output_sizes is not None:
        sizes = list(output_sizes)
        if len(sizes) != where.size or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes
        ):
            raise ConfigError(
                [
                    (
                        "output_sizes",
                        f"must be {where.size} row counts (whole numbers >= 0, one per rank), "
                        f"got {sizes!r}",
                    )
                ]
            )
    if where.index is None:
        return skip([], async_op)
    rows = [int(piece.shape[0]) for piece in pieces]
    flat = torch.cat(pieces) if len(pieces) > 1 else pieces[0].contiguous()
    received: list[int] = []
    buffer: list[torch.Tensor] = []

    def issue(a: bool) -> list[dist.Work | None]:
        if output_sizes is None:
            sent = torch.tensor(rows, dtype=torch.int64, device=first.device)
            counts = torch.empty_like(sent)
            dist.all_to_all_single(counts, sent, group=where.pg)
            received.extend(int(n) for n in counts.tolist())
        else:
            received.extend(output_sizes)
        out = torch.empty((sum(received), *first.shape[1:]), dtype=first.dtype, device=first.device)
        buffer.append(out)
        return [dist.all_to_all_single(out, flat, received, rows, group=where.pg, async_op=a)]

    def finish() -> list[torch.Tensor]:
        return list(torch.split(buffer[0], received))

    nbytes = sum(piece.nbytes for piece in pieces)
    return run("all_to_all", "all_to_all", nbytes, async_op, issue, finish)


@overload
def barrier(*, group: Group | None = ..., async_op: Literal[False] = ...) -> None: ...
@overload
def barrier(*, group: Group | None = ..., async_op: Literal[True]) -> Handle[None]: ...
def barrier(*, group: Group | None = None, async_op: bool = False) -> Handle[None] | None:
    """Wait until every rank (of ``group``) has reached this call."""
    where = scope(group)
    if where.index is None:
        return skip(None, async_op)
    return run(
        "barrier",
        "barrier",
        0,
        async_op,
        lambda a: [dist.barrier(group=where.pg, async_op=a)],
        _none,
    )


def _row_kind(tensor: torch.Tensor) -> tuple[Any, ...]:
    """What all_to_all needs equal in every tensor: all but the number of rows."""
    return (tuple(tensor.shape[1:]), tensor.dtype, tensor.device)


def _describe(tensor: torch.Tensor) -> str:
    return f"shape {tuple(tensor.shape)}, {tensor.dtype} on {tensor.device}"


def _none() -> None:
    return None


def _weight_total(op: str, weight: float | None, like: torch.Tensor) -> torch.Tensor | None:
    """The tensor that sums the ranks' weights, which a weighted mean divides by."""
    if op != "mean" or weight is None:
        return None
    return torch.tensor([float(weight)], dtype=torch.float64, device=like.device)


def _divide(what: str, tensor: torch.Tensor, total: torch.Tensor | None, ranks: int) -> None:
    divisor = float(total.item()) if total is not None else ranks
    if divisor == 0.0:
        raise HeteroError(f"{what}(op='mean'): the ranks' weights sum to 0; nothing to divide")
    tensor.div_(divisor)
