"""Nested tensor trees (a collated batch, a state dict): every tensor named by its path, a
function applied to each, a batch moved to a device or emptied of its samples."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc

__all__ = ["map_tensors", "named_tensors", "take_none", "to_device"]


def named_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``obj`` (nested mappings and sequences), named by its dotted path."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from named_tensors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from named_tensors(value, f"{prefix}.{i}" if prefix else str(i))


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` (a collated batch) with ``fn`` applied to every tensor in it."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(x, fn) for x in obj)
    if isinstance(obj, dict):
        return {k: map_tensors(v, fn) for k, v in obj.items()}
    return obj


def to_device(obj: Any, device: torch.device) -> Any:
    """``obj`` (a collated batch) with every tensor in it on ``device``."""
    return map_tensors(obj, lambda t: t.to(device, non_blocking=True))


def take_none(obj: Any) -> Any:
    """A batch of no samples shaped like ``obj`` (a collated batch)."""
    return map_tensors(obj, lambda t: t[:0])
