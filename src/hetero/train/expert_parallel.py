"""Expert parallelism: a mixture-of-experts layer whose experts live on different ranks.

``MixtureOfExperts`` is the layer in one process: a gate (a linear map to one logit per
expert) picks each token's ``top_k`` experts, each an MLP, and the token's output is their
outputs weighted by the gate (top-1: the expert's softmax probability; top-k: the k
probabilities renormalised to sum to 1). ``ExpertParallelMoE`` is the same layer built from it
on every rank of the process group, each rank keeping the experts an ``ExpertPlacement``
(``expert_placement.py``) gives it, as many as its speed and memory warrant.

A forward on a rank's tokens: the gate routes them; each (token, expert) pair goes to the rank
holding that expert, grouped by rank and expert, with ``hetero.comm.all_to_all`` (the expert
ids first, whose call exchanges how many rows each rank sends; then the tokens, their sizes
known); each rank runs its experts on what it received and sends the outputs back the way
they came (a second all-to-all), where they are weighted by the gate and summed per token.
Both token exchanges are autograd functions whose backward is the reverse all-to-all, so the
gradients of the tokens' inputs come back to their ranks and each expert's gradient sums the
contributions of every rank's tokens: exactly the gradient one process would compute on the
whole batch, when each rank's loss is its tokens' summed loss over the *global* batch size.
The gate and every other parameter outside the experts are replicated: after the backward,
``reduce_dense_gradients`` sums their gradients over the ranks (data parallelism).

Every rank must call the layer, and the backward, the same number of times in the same order
(the exchanges are collectives), and its inputs must need gradients on every rank or on none
(whether the backward sends the tokens' gradients back depends on it).

With ``emulate_token_seconds`` (one expert's forward and backward of one token at speed 1) a
rank emulates a device of its placement speed: its experts' forward of n token rows takes
``n × seconds / speed × (1 − BACKWARD_SHARE)`` and their backward the rest, the real compute
counted toward it (``pacing.py``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn

from hetero import comm
from hetero._checks import is_integer, is_positive
from hetero.errors import ConfigError
from hetero.train.expert_placement import ExpertPlacement
from hetero.train.pacing import BACKWARD_SHARE, PassPacer

__all__ = [
    "ExpertParallelMoE",
    "MixtureOfExperts",
    "reduce_dense_gradients",
    "route",
]


def route(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's ``top_k`` experts from the gate's ``logits`` (tokens × experts) and their
    weights: the softmax probability alone for top-1, the k probabilities renormalised to sum
    to 1 otherwise. Both tokens × ``top_k``."""
    probabilities = torch.softmax(logits, dim=-1)
    weights, experts = torch.topk(probabilities, top_k, dim=-1)
    if top_k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def expert_mlp(dim: int, hidden: int) -> nn.Module:
    """One expert: ``dim`` → ``hidden`` → ``dim`` with a GELU between."""
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class MixtureOfExperts(nn.Module):
    """``experts`` MLPs of ``dim`` → ``hidden`` → ``dim`` behind a gate that sends each token to
    its ``top_k`` of them, in one process. Inputs are ``(..., dim)``; every expert runs each
    forward (on no tokens when none chose it), so each has a gradient after every backward."""

    def __init__(self, dim: int, hidden: int, experts: int, *, top_k: int = 1) -> None:
        super().__init__()
        problems = [
            (name, f"must be a whole number >= 1, got {value!r}")
            for name, value in (("dim", dim), ("hidden", hidden), ("experts", experts))
            if not is_integer(value) or value < 1
        ]
        if not problems and not (is_integer(top_k) and 1 <= top_k <= experts):
            problems.append(("top_k", f"must be in [1, {experts}] (the experts), got {top_k!r}"))
        if problems:
            raise ConfigError(problems)
        self.dim, self.top_k = dim, top_k
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(expert_mlp(dim, hidden) for _ in range(experts))

    def expert_state_bytes(self, copies: int = 4) -> list[int]:
        """Each expert's state: its parameters' bytes times ``copies`` (4: the parameters,
        their gradients and Adam's two moments), for ``place_experts``."""
        return [
            copies * sum(p.numel() * p.element_size() for p in expert.parameters())
            for expert in self.experts
        ]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, self.dim)
        weights, chosen = route(self.gate(tokens), self.top_k)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)
            out = out.index_add(0, token, expert(tokens[token]) * weights[token, slot, None])
        return out.reshape(x.shape)


class ExpertParallelMoE(nn.Module):
    """``moe`` (built alike on every rank) with only this rank's experts of ``placement``; the
    gate replicated. Parameter names are ``moe``'s (``experts.3.0.weight`` on expert 3's rank).
    ``sent`` and ``received`` are the token rows the last forward sent to and received from
    each rank (to itself included)."""

    def __init__(
        self,
        moe: MixtureOfExperts,
        placement: ExpertPlacement,
        *,
        emulate_token_seconds: float | None = None,
    ) -> None:
        super().__init__()
        world = comm.world_size() if comm.is_initialized() else 0
        ranks = [r.rank for r in placement.ranks]
        if ranks != list(range(world)):
            raise ConfigError(
                [
                    (
                        "placement",
                        f"places experts on ranks {ranks}, but the process group has {world} "
                        "ranks: place them on each rank 0 .. world size - 1 (call comm.init "
                        "first)",
                    )
                ]
            )
        if len(placement.owners) != len(moe.experts):
            raise ConfigError(
                [
                    (
                        "placement",
                        f"places {len(placement.owners)} experts, the layer has {len(moe.experts)}",
                    )
                ]
            )
        if emulate_token_seconds is not None and not is_positive(emulate_token_seconds):
            raise ConfigError(
                [
                    (
                        "emulate_token_seconds",
                        f"must be seconds > 0 or None, got {emulate_token_seconds!r}",
                    )
                ]
            )
        self.rank = comm.rank()
        self.placement = placement
        self.dim, self.top_k = moe.dim, moe.top_k
        self.gate = moe.gate
        self.local = placement.experts_of(self.rank)
        self.experts = nn.ModuleDict({str(e): moe.experts[e] for e in self.local})
        self._owners = torch.tensor(placement.owners, dtype=torch.int64)
        self._local_index = torch.full((len(placement.owners),), -1, dtype=torch.int64)
        self._local_index[list(self.local)] = torch.arange(len(self.local))
        speed = placement.ranks[self.rank].speed
        seconds = None if emulate_token_seconds is None else emulate_token_seconds / speed
        self._pace = PassPacer(seconds)
        self._emulating = seconds is not None
        self.sent: tuple[int, ...] = ()
        self.received: tuple[int, ...] = ()

    @property
    def compute_seconds(self) -> float:
        """This rank's time in its experts' forward and backward so far (paced when
        emulating)."""
        return self._pace.total

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, self.dim)
        weights, chosen = route(self.gate(tokens), self.top_k)
        expert = chosen.reshape(-1)
        token = torch.arange(len(tokens), device=x.device).repeat_interleave(self.top_k)
        owner = self._owners.to(x.device)[expert]
        # Grouped by destination rank, then by expert within it.
        order = torch.argsort(owner * len(self._owners) + expert, stable=True)
        world = len(self.placement.ranks)
        sent = [int(n) for n in torch.bincount(owner, minlength=world).tolist()]
        ids = comm.all_to_all(torch.split(expert[order], sent))
        received = [len(piece) for piece in ids]
        rows = _exchange(tokens[token[order]], sent, received)
        outputs = self._run_local(rows, torch.cat(ids))
        back = _exchange(outputs, received, sent)
        self.sent, self.received = tuple(sent), tuple(received)
        weighted = back * weights.reshape(-1)[order, None]
        return torch.zeros_like(tokens).index_add(0, token[order], weighted).reshape(x.shape)

    def _run_local(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's experts on the ``rows`` received (``ids``: each row's expert), in the
        rows' order. Every local expert runs, on no rows when none came for it."""
        started = time.perf_counter()
        local = self._local_index.to(rows.device)[ids]
        order = torch.argsort(local, stable=True)
        counts = torch.bincount(local, minlength=len(self.local)).tolist()
        marks = _Marks()
        if self._emulating:
            # The input must need a gradient for the backward to reach its mark.
            if not rows.requires_grad:
                rows = rows.detach().requires_grad_()
            rows = _identity(_BackwardEnds, rows, self._pace, marks)
        pieces = torch.split(rows[order], counts)
        outs = [self.experts[str(e)](piece) for e, piece in zip(self.local, pieces, strict=True)]
        grouped = torch.cat(outs)
        out = torch.empty_like(grouped).index_copy(0, order, grouped)
        if self._emulating:
            out = _identity(_BackwardStarts, out, marks)
        self._pace.run(started, len(rows), 1 - BACKWARD_SHARE)
        return out


def reduce_dense_gradients(model: nn.Module) -> None:
    """Sum over the ranks the gradients of ``model``'s parameters outside the experts of its
    ``ExpertParallelMoE`` layers (replicated, data parallel), in one all-reduce. Call it after
    the backward, before the optimizer's step."""
    experts = {
        id(p)
        for module in model.modules()
        if isinstance(module, ExpertParallelMoE)
        for p in module.experts.parameters()
    }
    dense = [p for p in model.parameters() if p.requires_grad and id(p) not in experts]
    if not dense:
        return
    # A parameter no forward used has no gradient on this rank; it may on another.
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in dense]
    flat = torch.cat([g.reshape(-1) for g in grads])
    comm.all_reduce(flat)
    for p, piece in zip(dense, torch.split(flat, [p.numel() for p in dense]), strict=True):
        p.grad = piece.view_as(p).clone()


def _all_to_all(rows: torch.Tensor, send: Sequence[int], receive: Sequence[int]) -> torch.Tensor:
    """``rows`` split ``send`` to the ranks, and the rows they send here, ``receive`` from each,
    in rank order."""
    return torch.cat(comm.all_to_all(torch.split(rows, list(send)), output_sizes=list(receive)))


def _exchange(rows: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
    """``_all_to_all`` as autograd sees it: its backward is the reverse exchange."""
    out: torch.Tensor = _Exchange.apply(rows, send, receive)  # type: ignore[no-untyped-call]
    return out


def _identity(mark: type[torch.autograd.Function], rows: torch.Tensor, *args: Any) -> torch.Tensor:
    """``rows`` through the marking function ``mark`` (``_BackwardStarts``, ``_BackwardEnds``)."""
    out: torch.Tensor = mark.apply(rows, *args)  # type: ignore[no-untyped-call]
    return out


class _Exchange(torch.autograd.Function):
    """An all-to-all of rows whose backward sends the rows' gradients back where they came
    from."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, send: list[int], receive: list[int]) -> torch.Tensor:
        ctx.sizes = (send, receive)
        return _all_to_all(rows, send, receive)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        send, receive = ctx.sizes
        return _all_to_all(grad.contiguous(), receive, send), None, None


class _Marks:
    """When this forward's experts began their backward."""

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started = 0.0


class _BackwardStarts(torch.autograd.Function):
    """At the experts' outputs: the identity, whose backward notes when the experts' begins."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, marks: _Marks) -> torch.Tensor:
        ctx.marks = marks
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.marks.started = time.perf_counter()
        return grad, None


class _BackwardEnds(torch.autograd.Function):
    """At the experts' inputs: the identity, whose backward holds the experts' backward until
    the emulated device would have finished it."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, pace: PassPacer, marks: _Marks) -> torch.Tensor:
        ctx.pace, ctx.marks, ctx.rows = pace, marks, len(rows)
        return rows.view_as(rows)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.pace.run(ctx.marks.started, ctx.rows, BACKWARD_SHARE)
        return grad, None, None
