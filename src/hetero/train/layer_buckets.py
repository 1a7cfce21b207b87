"""Gradient compression by layer type (``TrainerOptions.compression_by_layer``): each
parameter's gradient is sent with the codec its layer type is given, the embeddings exactly
and the linear layers in int8, say.

A parameter's layer type is the class of the module that holds it (``Linear`` for a
``Linear``'s weight and bias), matched by name: the first class of its MRO the map names, so
``"Linear"`` also covers ``NonDynamicallyQuantizableLinear``; a type the map does not name gets
the ``"*"`` entry's codec, or none without one. A parameter held by modules of several types
(tied embeddings) gets the most exact of their codecs.

DDP keeps its buckets (it offers no public way to group parameters otherwise); inside each one,
``compression.ErrorFeedback`` sends every layer type's gradients with that type's codec, its
own int8 scale or Top-K budget and its own residuals, and all-reduces the exact ones as DDP
would. ``layer_route`` gives it the part of each parameter.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn

from hetero.train.compression import Codec, Int8, Part, Route, TopK

__all__ = ["ANY_LAYER", "LAYER_CODECS", "layer_route", "lossy_layers"]

# Most exact first: a parameter held by several layer types gets the first of their codecs.
LAYER_CODECS = ("none", "int8", "topk")
ANY_LAYER = "*"


def lossy_layers(by_layer: Mapping[str, str] | None) -> list[tuple[str, str]]:
    """The entries of ``by_layer`` (layer type, codec) that send an approximation."""
    return [(layer, codec) for layer, codec in (by_layer or {}).items() if codec != "none"]


def layer_route(model: nn.Module, by_layer: Mapping[str, str], topk_ratio: float) -> Route | None:
    """Each of ``model``'s trained parameters' part in its bucket: its layer type and that
    type's codec (``None``: exact); ``None`` when every gradient is exact (DDP's own all-reduce
    is then the hook to keep)."""
    codecs: dict[str, Codec | None] = {"none": None, "int8": Int8(), "topk": TopK(topk_ratio)}
    # By parameter id: (the codec's place in LAYER_CODECS, the layer type, the codec's name).
    chosen: dict[int, tuple[int, str, str]] = {}
    for module in model.modules():
        layer, codec = _entry(type(module), by_layer)
        choice = (LAYER_CODECS.index(codec), layer, codec)
        for p in module.parameters(recurse=False):
            if p.requires_grad:
                chosen[id(p)] = min(chosen.get(id(p), choice), choice)
    if all(codec == "none" for _, _, codec in chosen.values()):
        return None
    parts: dict[int, Part] = {
        key: (layer, codecs[codec]) for key, (_, layer, codec) in chosen.items()
    }

    def route(parameter: torch.Tensor) -> Part:
        return parts[id(parameter)]

    return route


def _entry(module_type: type[nn.Module], by_layer: Mapping[str, str]) -> tuple[str, str]:
    """The layer type a module of ``module_type`` counts as, and its codec."""
    for cls in module_type.__mro__:
        if cls.__name__ in by_layer:
            return cls.__name__, by_layer[cls.__name__]
    return module_type.__name__, by_layer.get(ANY_LAYER, "none")
