"""What every call of ``hetero.comm`` shares: the argument checks made before torch sees them,
torch's failures as :class:`~hetero.errors.BackendError`, the handle of an ``async_op=True``
call, and the time each call blocks, recorded for the profiler."""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast, overload

import torch
import torch.distributed as dist

from hetero.errors import BackendError, ConfigError, HeteroError
from hetero.telemetry.collectives import RECORDER

__all__ = ["Handle"]

T = TypeVar("T")

OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # then divided here: gloo has no AVG
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}


@dataclass(slots=True)
class State:
    """What ``init`` and ``destroy`` leave for the calls after them."""

    # init's timeout, which new groups get too (torch would give them its 30-minute default);
    # None when the process group was made by torch directly.
    timeout: datetime.timedelta | None = None
    # destroy() counts up, so that a group of an earlier process group is refused, not used.
    generation: int = 0


STATE = State()


class Handle(Generic[T]):
    """A call made with ``async_op=True``, in flight.

    ``wait()`` blocks until it has completed on this rank and returns what the call would have
    returned without ``async_op`` (``None`` for the in-place ones, the list for ``all_gather``
    and ``all_to_all``); a second ``wait()`` returns the same at once. The tensors given to the
    call must be neither read nor changed until then. ``is_completed()`` asks without blocking.
    """

    __slots__ = ("_done", "_finish", "_op", "_result", "_what", "_works")

    def __init__(
        self, what: str, op: str, works: Sequence[dist.Work], finish: Callable[[], T]
    ) -> None:
        self._what, self._op = what, op
        self._works = list(works)
        self._finish = finish
        self._done = False
        self._result: T | None = None

    @classmethod
    def completed(cls, result: T) -> Handle[T]:
        """A handle with nothing in flight (a rank outside the call's group)."""
        handle = cls("", "", [], lambda: result)
        handle._done, handle._result = True, result
        return handle

    def is_completed(self) -> bool:
        return self._done or all(work.is_completed() for work in self._works)

    def wait(self) -> T:
        if self._done:
            return cast(T, self._result)
        start = time.perf_counter()
        try:
            for work in self._works:
                work.wait()
            self._result = self._finish()
        except RuntimeError as exc:
            raise BackendError(f"{self._what} failed: {exc}") from exc
        finally:
            # The call was counted when it was made; this is more of its blocked time.
            RECORDER.record(self._op, time.perf_counter() - start, 0, calls=0)
        self._done = True
        return self._result

    def __repr__(self) -> str:
        state = "completed" if self._done else "in flight"
        return f"<hetero.comm.Handle {self._what or 'no-op'} {state}>"


@overload
def run(
    what: str,
    op: str,
    nbytes: int,
    async_op: Literal[False],
    issue: Callable[[bool], Sequence[dist.Work | None]],
    finish: Callable[[], T],
) -> T: ...
@overload
def run(
    what: str,
    op: str,
    nbytes: int,
    async_op: bool,
    issue: Callable[[bool], Sequence[dist.Work | None]],
    finish: Callable[[], T],
) -> T | Handle[T]: ...
def run(
    what: str,
    op: str,
    nbytes: int,
    async_op: bool,
    issue: Callable[[bool], Sequence[dist.Work | None]],
    finish: Callable[[], T],
) -> T | Handle[T]:
    """Make one call: ``issue(async_op)`` starts torch's part and returns its works;
    ``finish()`` turns their outcome into the call's result, now or at ``Handle.wait()``. The
    call and the seconds it blocks here are recorded as ``op`` of ``nbytes``."""
    start = time.perf_counter()
    try:
        works = issue(async_op)
        if not async_op:
            return finish()
    except RuntimeError as exc:
        raise BackendError(f"{what} failed: {exc}") from exc
    finally:
        RECORDER.record(op, time.perf_counter() - start, nbytes)
    return Handle(what, op, [w for w in works if w is not None], finish)


def skip(result: T, async_op: bool) -> T | Handle[T]:
    """What a call returns on a rank outside its group, which takes no part."""
    return Handle.completed(result) if async_op else result


def require() -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise HeteroError("the process group is not initialised; call hetero.comm.init() first")
    # The recorder learns whose calls it counts from the group, however that was made.
    RECORDER.join(dist.get_rank(), dist.get_world_size())


def reduce_op(op: str) -> dist.ReduceOp.RedOpType:
    if op not in OPS:
        raise ConfigError([("op", f"unknown op {op!r}; expected one of {', '.join(sorted(OPS))}")])
    return OPS[op]


def check_weight(op: str, weight: float | None) -> None:
    if weight is None:
        return
    if op not in ("sum", "mean"):
        raise ConfigError([("weight", f"applies to op 'sum' or 'mean', not {op!r}")])
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise ConfigError([("weight", f"must be a number, got {weight!r}")])
    if not math.isfinite(weight):
        raise ConfigError([("weight", f"must be finite, got {weight!r}")])


def floating(tensor: torch.Tensor, name: str, why: str) -> None:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        raise ConfigError(
            [(name, f"{why} needs a floating-point tensor, got dtype {tensor.dtype}")]
        )


def tensor_arg(name: str, value: Any) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ConfigError([(name, f"must be a torch.Tensor, got {type(value).__name__}")])
    return value


@contextmanager
def boundary(what: str) -> Iterator[None]:
    """torch's failures (a peer gone, a timeout, mismatched shapes) as BackendError."""
    try:
        yield
    except RuntimeError as exc:
        raise BackendError(f"{what} failed: {exc}") from exc
