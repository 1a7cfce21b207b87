"""Local SGD (``local_sgd_every=K``): each rank steps its own replica on its own share, with no
gradient communication, and every K steps the ranks replace their parameters by their mean
weighted by the samples each trained on since the last average.

With uneven shares a plain mean would weigh a rank of 3 samples a step like one of 14; weighted
by samples, one step of plain SGD from a common start averages to exactly the global batch's
update (Σ_i (b_i/B)(θ − η·ḡ_i) = θ − η·g), which is why K = 1 is exact for plain SGD. With K > 1
the replicas drift apart between averages, each following its own share's gradients; the
optimizers' state (momentum, Adam's moments) stays each rank's own.

Floating-point buffers (BatchNorm's running statistics) are averaged alike; integer ones (its
batch counts) become rank 0's, as DDP's buffer broadcast would make them.
"""

from __future__ import annotations

from collections import defaultdict

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn

from hetero import comm

__all__ = ["ParameterAverager"]


class ParameterAverager:
    """The weighted averaging of ``model``'s replicas over the ranks, every ``every`` steps."""

    def __init__(self, model: nn.Module, every: int) -> None:
        self.every = every
        tensors = [*model.parameters(), *model.buffers()]
        groups: dict[torch.dtype, list[torch.Tensor]] = defaultdict(list)
        for t in tensors:
            if t.is_floating_point():
                groups[t.dtype].append(t)
        self._groups = list(groups.values())  # one flat all-reduce per dtype
        self._counters = [t for t in model.buffers() if not t.is_floating_point()]
        self._samples = 0  # this rank's since the last average
        #: What one average hands to the collectives (the weights' sums aside).
        self.average_bytes = sum(t.numel() * t.element_size() for g in self._groups for t in g)

    def broadcast(self) -> None:
        """Every rank starts from rank 0's parameters and buffers, as under DDP."""
        with torch.no_grad():
            for group in self._groups:
                flat = _flat(group)
                comm.broadcast(flat, src=0)
                _unflat(flat, group)
            for counter in self._counters:
                comm.broadcast(counter, src=0)

    def end_step(self, samples: int, steps: int, force: bool) -> int:
        """After a step's update of ``samples`` samples on this rank, ``steps`` steps done:
        average when ``every`` divides ``steps`` or ``force`` (a checkpoint's step). Returns the
        bytes handed to the collectives (0 on a step without an average)."""
        self._samples += samples
        if steps % self.every and not force:
            return 0
        with torch.no_grad():
            for group in self._groups:
                flat = _flat(group)
                comm.all_reduce(flat, op="mean", weight=float(self._samples))
                _unflat(flat, group)
            for counter in self._counters:
                comm.broadcast(counter, src=0)
        self._samples = 0
        return self.average_bytes


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def _unflat(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
