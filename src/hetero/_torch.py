"""PyTorch is an optional extra: modules that need it say so in one clear line."""

from __future__ import annotations

__all__ = ["torch_missing"]


def torch_missing(module: str) -> ImportError:
    """The error to raise when ``module`` cannot import torch: how to install it."""
    return ImportError(
        f"{module} needs PyTorch, an optional extra: pip install -e '.[torch]' in the hetero "
        "checkout (the CPU build alone: pip install torch --index-url "
        "https://download.pytorch.org/whl/cpu)"
    )
