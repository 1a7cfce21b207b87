"""An emulated device's backward, spread over the time that device would take for it.

A rank that emulates a slower device (``speed``, ``emulate_sample_time``) runs the real passes,
which take less time than the device's, and waits out the difference. Waiting it all out before
the last micro-batch's backward would let the real backward make every gradient ready at once,
at the end: the gradient reduction would then overlap far less than on the device, whose
backward makes the last layers' gradients ready first and the first layers' last, as DDP's
buckets and FSDP's units expect. So the emulated backward is paced as it goes: before the
backward reaches a module that holds parameters, ``BackwardPacer`` holds it until the emulated
device would have finished the backward of the modules after it and of this one, its time
shared out by their parameter counts (a layer's backward costs about in proportion to its
weights). Each module's gradients are then ready when the emulated device would make them.

Passes run back to back are paced from where the previous one was due to end (``paced_from``),
not from their own start, so the overshoot of each sleep is made up.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn

from hetero.train.tensors import named_tensors

__all__ = ["BACKWARD_SHARE", "BackwardPacer", "PassPacer", "paced_from"]

# The part of a micro-batch's time that is its backward (a backward costs about two forwards).
BACKWARD_SHARE = 2 / 3
# A pass that starts within this long after the previous one was due to end follows it back to
# back (as hetero's emulated workers pace their tasks).
_PACE_SLACK = 0.002


def paced_from(started: float, due: float) -> float:
    """Where a pass that started at ``started`` is paced from: ``due``, where the previous pass
    was due to end, when it started just after that (the sleep's overshoot is the host's
    delay, not the emulated device's), else its own start."""
    return due if 0 <= started - due < _PACE_SLACK else started


class BackwardPacer:
    """Forward hooks on every module of ``model`` that holds parameters. A forward inside
    ``watching()`` marks where its backward reaches each of them; a backward inside
    ``spread(start, end)`` is then held at each mark so that it ends no sooner than ``end``,
    each module's gradients ready at its share of the way from ``start``."""

    def __init__(self, model: nn.Module) -> None:
        self._watching = False
        self._window: tuple[float, float] | None = None
        self._total = 0  # parameters of the modules marked in the watched forward
        self._done = 0  # of those, the backward has reached
        for module in model.modules():
            size = sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
            if size:
                module.register_forward_hook(self._hook(size))

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Mark the modules of the forward run inside this."""
        self._watching, self._total = True, 0
        try:
            yield
        finally:
            self._watching = False

    @contextlib.contextmanager
    def spread(self, start: float, end: float) -> Iterator[None]:
        """Pace the backward of the watched forward, run inside this, from ``start`` to
        ``end`` (``perf_counter`` instants)."""
        self._window, self._done = (start, max(0.0, end - start)), 0
        try:
            yield
        finally:
            self._window = None

    def _hook(self, size: int) -> Any:
        def forward_hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not self._watching or not torch.is_grad_enabled():
                return
            for _, tensor in named_tensors(output):
                if tensor.requires_grad:
                    self._total += size
                    tensor.register_hook(lambda grad: self._reached(size))  # type: ignore[no-untyped-call]
                    return

        return forward_hook

    def _reached(self, size: int) -> None:
        """The backward reached a module of ``size`` parameters: hold it until the emulated
        device would have computed that module's gradients too."""
        if self._window is None or not self._total:
            return
        start, seconds = self._window
        self._done += size
        delay = start + seconds * self._done / self._total - time.perf_counter()
        if delay > 0:
            time.sleep(delay)


class PassPacer:
    """Holds a pass (a forward or a backward: its ``share`` of a micro-batch's time) of ``n``
    samples until ``n × seconds × share`` after it started, as a device of ``seconds`` a sample
    would take, and counts the time passes took (real when not emulating)."""

    def __init__(self, seconds_per_sample: float | None) -> None:
        self._seconds = seconds_per_sample
        self._due = -1.0
        self.total = 0.0

    def run(self, started: float, samples: int, share: float) -> None:
        now = time.perf_counter()
        if self._seconds is None:
            self.total += now - started
            return
        base = paced_from(started, self._due)
        self._due = base + samples * self._seconds * share
        if self._due > now:
            time.sleep(self._due - now)
        self.total += max(self._due, now) - base
