"""Gradient compression with error feedback, as DDP communication hooks: ``compression="int8"``
(each value quantised to 8 bits with one scale per bucket) and ``compression="topk"`` (only the
``topk_ratio`` largest values of each bucket, with their indices); and, with a ``Route``, a
codec per part of each bucket (``compression_by_layer``, ``hetero.train.layer_buckets``).

Each rank adds the residual it kept from the previous step to its bucket's gradient, encodes
the sum, keeps what the encoding lost as the next residual (error feedback: the part not sent
is sent later, so nothing is lost for good, only delayed), and all-gathers the encoded payload.
Every rank then decodes every rank's payload, sums them and divides by the world size, as DDP's
all-reduce of the mean would. Payloads are all-gathered, not all-reduced: int8 values of
different scales, or values at different indices, do not add up in transit.

With a ``Route``, a bucket's parameters fall into parts, each with its own codec (and so its
own int8 scale or Top-K budget) and its own residuals; the parts without a codec are
all-reduced exactly, as DDP would, in one all-reduce per bucket, and the payloads of the others
are all-gathered together, in one all-gather per bucket.

A residual belongs to parameters, not to a bucket's number: DDP rebuilds its buckets once,
after the first backward, in the order the gradients became ready, and the residuals follow
their parameters into the new buckets.

``CommMeter`` counts the bytes each rank hands to the gradient reduction's collectives, in all
and by part, to set beside the dense all-reduce's in the step report.
"""

from __future__ import annotations

import abc
import itertools
import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:
    from torch._C._distributed_c10d import GradBucket

__all__ = ["Codec", "CommMeter", "ErrorFeedback", "Int8", "Part", "Route", "TopK", "dense_bytes"]


class Codec(abc.ABC):
    """How a flat gradient becomes a payload of bytes and back. A payload's size depends on the
    gradient's size alone, so every rank's payload for a bucket is the same size."""

    @abc.abstractmethod
    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (1-D, floating) as a 1-D ``uint8`` payload."""

    @abc.abstractmethod
    def add_decoded(self, out: torch.Tensor, payload: torch.Tensor) -> None:
        """Add the values ``payload`` stands for into ``out`` (1-D, the encoded dtype)."""


class Int8(Codec):
    """Each value rounded to the nearest of 255 levels spread over ±(largest magnitude):
    ``round(v / scale)`` as int8, with ``scale = max|v| / 127`` sent beside them (n + one value
    bytes for n values; a quarter of fp32's). The rounding error is at most scale / 2."""

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        largest = values.abs().max()
        scale = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
        levels = torch.round(values / scale).clamp_(-127, 127).to(torch.int8)
        return torch.cat([levels.view(torch.uint8), _bytes(scale.reshape(1))])

    def add_decoded(self, out: torch.Tensor, payload: torch.Tensor) -> None:
        n = out.numel()
        scale = _values(payload[n:], out.dtype)
        out.add_(payload[:n].view(torch.int8).to(out.dtype) * scale)


class TopK(Codec):
    """The ``ratio`` × n values of largest magnitude (at least one), with their int32 indices:
    ``k × (4 + value bytes)`` bytes, 2 % of fp32's at a ratio of 1 %."""

    def __init__(self, ratio: float) -> None:
        self.ratio = ratio

    def k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.ratio * n)))

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        indices = torch.topk(values.abs(), self.k(values.numel()), sorted=False).indices
        return torch.cat([_bytes(indices.to(torch.int32)), _bytes(values[indices])])

    def add_decoded(self, out: torch.Tensor, payload: torch.Tensor) -> None:
        k = self.k(out.numel())
        indices = _values(payload[: 4 * k], torch.int32).long()
        out.index_add_(0, indices, _values(payload[4 * k :], out.dtype))


class CommMeter:
    """Bytes this rank handed to the gradient reduction's collectives since the last ``take``;
    ``taken``: those ``take`` last returned, by part (a layer type under
    ``compression_by_layer``, ``"*"`` for a single codec's whole buckets)."""

    def __init__(self) -> None:
        self._bytes: Counter[str] = Counter()
        self.taken: dict[str, int] = {}

    def add(self, count: int, part: str = "*") -> None:
        self._bytes[part] += count

    def take(self) -> int:
        self.taken, self._bytes = dict(self._bytes), Counter()
        return sum(self.taken.values())


Part: TypeAlias = tuple[str, Codec | None]
Route: TypeAlias = Callable[[torch.Tensor], Part]
"""The part of its bucket a parameter's gradient belongs to: the part's name (what its bytes are
counted under) and its codec, ``None`` for an exact all-reduce. The same for every parameter
on every rank."""


class ErrorFeedback:
    """The DDP communication hook of a ``Codec`` (every gradient in one part) or of a ``Route``
    (a codec per part of each bucket): ``register(ddp)``. Keeps each parameter's residual, and
    counts the bytes handed to the collectives in ``meter``, by part."""

    def __init__(self, codec: Codec | Route, meter: CommMeter) -> None:
        self.route: Route = _whole(codec) if isinstance(codec, Codec) else codec
        self.meter = meter
        # Flat residuals by the ids of their part's parameters, in the bucket's order, with
        # each parameter's size.
        self._residuals: dict[tuple[int, ...], tuple[torch.Tensor, list[int]]] = {}
        # Per-parameter residuals of the buckets DDP replaced, until their new buckets take them.
        self._loose: dict[int, torch.Tensor] = {}

    def register(self, ddp: DistributedDataParallel) -> None:
        # DDP compares a hook's annotations with the classes, which postponed annotations
        # (strings here) are not: the hook it gets is a lambda, without any.
        ddp.register_comm_hook(self, lambda state, bucket: state.reduce(bucket))

    def reduce(self, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The bucket's mean over the ranks, as DDP's all-reduce would give it: its exact parts
        all-reduced, the others from every rank's encoded gradient plus residual (this rank's
        new residual is what its encoding lost)."""
        buffer, parameters = bucket.buffer(), bucket.parameters()
        slices = _slices(parameters)
        world = dist.get_world_size()
        exact: list[int] = []  # the parameters (their places in the bucket) reduced exactly
        lossy: dict[tuple[str, Codec], list[int]] = {}
        for i, p in enumerate(parameters):
            name, codec = self.route(p)
            if codec is None:
                exact.append(i)
                self.meter.add(p.numel() * buffer.element_size(), name)
            else:
                lossy.setdefault((name, codec), []).append(i)

        futures: list[torch.futures.Future[Any]] = []
        if exact:
            # Divided before the sum, as DDP's all-reduce does.
            values = _flat(buffer, slices, exact).div_(world)
            futures.append(_future(dist.all_reduce(values, async_op=True)))
        payloads = [self._encode(buffer, slices, parameters, part) for part in lossy.items()]
        if payloads:
            payload = torch.cat(payloads)
            gathered = torch.empty(world * payload.numel(), dtype=torch.uint8, device=buffer.device)
            pieces = list(gathered.chunk(world))
            futures.append(_future(dist.all_gather(pieces, payload, async_op=True)))

        def finish(_: Any) -> torch.Tensor:
            if exact:
                _put(buffer, slices, exact, values)
            start = 0
            for ((_, codec), places), sent in zip(lossy.items(), payloads, strict=True):
                end = start + sent.numel()
                size = sum(_size(slices[i]) for i in places)
                total = torch.zeros(size, dtype=buffer.dtype, device=buffer.device)
                for piece in pieces:
                    codec.add_decoded(total, piece[start:end])
                _put(buffer, slices, places, total.div_(world))
                start = end
            return buffer

        reduced: torch.futures.Future[torch.Tensor] = torch.futures.collect_all(futures).then(
            finish
        )
        return reduced

    def _encode(
        self,
        buffer: torch.Tensor,
        slices: list[slice],
        parameters: list[torch.Tensor],
        part: tuple[tuple[str, Codec], list[int]],
    ) -> torch.Tensor:
        """The payload of one part of the bucket: its gradient plus residual, encoded; keeps
        what the encoding lost as the part's next residual and counts the payload's bytes."""
        (name, codec), places = part
        members = [parameters[i] for i in places]
        corrected = _flat(buffer, slices, places) + self._residual(members, buffer)
        payload = codec.encode(corrected)
        sent = torch.zeros_like(corrected)
        codec.add_decoded(sent, payload)
        self._residuals[_key(members)] = (corrected.sub_(sent), [p.numel() for p in members])
        self.meter.add(payload.numel(), name)
        return payload

    def _residual(self, parameters: list[torch.Tensor], buffer: torch.Tensor) -> torch.Tensor:
        """What the part of ``parameters`` kept from the previous step (zeros at first)."""
        key = _key(parameters)
        if key in self._residuals:
            return self._residuals[key][0]
        # A new part (DDP's rebuild): split the old ones that held its parameters by
        # parameter, for it and the other new parts to take.
        wanted = set(key)
        for old in [old for old in self._residuals if wanted.intersection(old)]:
            flat, sizes = self._residuals.pop(old)
            self._loose.update(zip(old, torch.split(flat, sizes), strict=True))
        pieces = [
            self._loose.pop(id(p), torch.zeros(p.numel(), dtype=buffer.dtype, device=buffer.device))
            for p in parameters
        ]
        return torch.cat(pieces) if pieces else torch.zeros_like(buffer)


def dense_bytes(model: nn.Module) -> int:
    """What one uncompressed all-reduce of ``model``'s gradients hands to the collectives."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _key(parameters: list[torch.Tensor]) -> tuple[int, ...]:
    return tuple(id(p) for p in parameters)


def _whole(codec: Codec) -> Route:
    """Every gradient in one part, encoded with ``codec``."""
    part: Part = ("*", codec)
    return lambda _: part


def _slices(parameters: list[torch.Tensor]) -> list[slice]:
    """Where each parameter's gradient lies in its bucket's flat buffer: one after the other,
    in the bucket's order."""
    ends = list(itertools.accumulate(p.numel() for p in parameters))
    return [slice(end - p.numel(), end) for p, end in zip(parameters, ends, strict=True)]


def _size(place: slice) -> int:
    return int(place.stop) - int(place.start)


def _flat(buffer: torch.Tensor, slices: list[slice], places: list[int]) -> torch.Tensor:
    """The gradients of the parameters at ``places`` (in order), one after the other: the
    buffer itself when they are all of it, else a copy."""
    if len(places) == len(slices):
        return buffer
    return torch.cat([buffer[slices[i]] for i in places])


def _put(
    buffer: torch.Tensor, slices: list[slice], places: list[int], values: torch.Tensor
) -> None:
    """``values`` (as ``_flat`` laid them out) back into the buffer."""
    if values is buffer:
        return
    if len(places) == len(slices):
        buffer.copy_(values)
        return
    for i, piece in zip(
        places, torch.split(values, [_size(slices[i]) for i in places]), strict=True
    ):
        buffer[slices[i]].copy_(piece)


def _future(work: dist.Work | None) -> torch.futures.Future[Any]:
    assert work is not None  # async_op=True always returns one
    return work.get_future()


def _bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)


def _values(payload: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A copy: a slice of the payload may start where ``dtype`` is not aligned.
    return payload.clone().view(dtype)
