"""Dynamic batching: ``@hetero.task(batch=BatchOptions(max_size=…, max_wait=…))``.

Each call of a batched task is its own work item: the dispatcher places it like any task (by
speed, memory, its ``devices``), steals it, times it out, retries it. Calls coalesce on the
device, when the dispatcher starts one there (its ``Run``): the engine opens a batch on that
device, takes into it the calls of the same task queued there (``Dispatcher.join``: the calls
become one run that holds one slot), and adds those that start or queue there while it
collects. A batch goes to the device's worker once it holds the device's size or its oldest
call has waited ``max_wait`` since it was admitted; the worker calls the function once, with
each argument as a list (one element per call, as Ray Serve's ``@serve.batch`` does), and the
results, one per call and in order, go back to each caller's future.

A device's size follows its speed and memory (``batch_size``): ``max_size`` for the fastest
device the task may use, in proportion to speed for the others (at least 1), and no more calls
than the device's memory holds when the task declares ``memory`` (per call).

What this module holds: the options, the calls' arguments combined and the results checked
(``combine``, ``split``: the worker's side, light to import) and the ``Batcher``, the engine's
record of batches (pure: the dispatcher and the clock are the only inputs; the engine sends).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from hetero.errors import ConfigError

if TYPE_CHECKING:
    from hetero.sched.dispatcher import Dispatcher
    from hetero.sched.instructions import Instruction

__all__ = [
    "Batch",
    "BatchOptions",
    "BatchResultError",
    "Batcher",
    "batch_size",
    "combine",
    "split",
]


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """How the calls of a task coalesce: at most ``max_size`` calls per batch (on the fastest
    device; slower devices take fewer), sent once full or once its oldest call has waited
    ``max_wait`` seconds (0: at once, with whatever is queued on the device). The defaults are
    Ray Serve's ``@serve.batch`` ones."""

    max_size: int = 10
    max_wait: float = 0.01

    def __post_init__(self) -> None:
        problems: list[tuple[str, str]] = []
        size = self.max_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            problems.append(("batch.max_size", f"must be an integer >= 1, got {size!r}"))
        wait = self.max_wait
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
            problems.append(("batch.max_wait", f"must be a number of seconds >= 0, got {wait!r}"))
        if problems:
            raise ConfigError(problems)


class BatchResultError(Exception):
    """A batched function did not return one result per call."""


# --------------------------------------------------------------------------- worker side


def combine(
    calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]],
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of one call for a batch of ``calls`` (each ``(args, kwargs)``, all of one
    shape: the engine batches only calls with the same number of arguments and keywords):
    each positional argument and each keyword becomes the list of its values, in call order."""
    args, kwargs = calls[0]
    batched_args = tuple([call[0][k] for call in calls] for k in range(len(args)))
    batched_kwargs = {name: [call[1][name] for call in calls] for name in kwargs}
    return batched_args, batched_kwargs


def split(name: str, result: Any, calls: int) -> list[Any]:
    """``result`` of a batch of ``calls`` calls of task ``name`` as one result per call
    (a list, a tuple, an array or tensor whose first dimension is the batch…), or
    ``BatchResultError`` saying what it got instead."""
    batch = f"a batch of {calls} call{'' if calls == 1 else 's'}"
    if isinstance(result, (str, bytes, dict)) or not hasattr(result, "__len__"):
        raise BatchResultError(
            f"{name} returned {type(result).__name__} for {batch}; a batched task returns one "
            "result per call, in order (a list, or an array of that length)"
        )
    got = len(result)
    if got != calls:
        raise BatchResultError(
            f"{name} returned {got} result{'' if got == 1 else 's'} for {batch}; a batched "
            "task returns one result per call, in order"
        )
    return list(result)


# --------------------------------------------------------------------------- driver side


def batch_size(
    options: BatchOptions, speed: float, fastest: float, memory_total: int, memory: int
) -> int:
    """The calls a batch may hold on a device of relative ``speed`` (``fastest``: of the
    devices the task may use): ``max_size`` scaled by ``speed / fastest``, rounded, at least
    1; and no more than ``memory_total`` bytes hold at ``memory`` bytes per call. A batch then
    takes about as long on every device, and a slow one does not hold many callers."""
    size = options.max_size
    if 0 <= speed < fastest:
        size = max(1, min(size, round(size * speed / fastest)))
    if memory > 0:
        size = max(1, min(size, memory_total // memory))
    return size


class Call(Protocol):
    """What the batcher reads and writes of a call (the engine's ``Task``): its id, which calls
    it may share a batch with (``batch_key``: equal keys) and the batch it is in."""

    id: int
    batch_key: Hashable | None
    in_batch: Batch[Any] | None


C = TypeVar("C", bound=Call)


@dataclass(slots=True, eq=False)
class Batch(Generic[C]):
    """Calls of one task on one device, run as one call of the function. ``calls`` is the
    order of their arguments; a call that left a batch already sent stays in it with
    ``in_batch`` cleared (its result is dropped). ``order`` is the engine's number of the order
    that carried it out."""

    id: int
    key: Hashable
    device: int
    size: int
    due: float
    calls: list[C] = field(default_factory=list)
    sent: bool = False
    order: int = 0

    def live(self) -> list[tuple[int, C]]:
        """The calls still waiting on this batch, with their positions in it."""
        return [(k, c) for k, c in enumerate(self.calls) if c.in_batch is self]


class Batcher(Generic[C]):
    """The batches a dispatcher's calls form, per batch key and device: those collecting calls
    (one at most per key and device), and those sent, by id. ``calls`` are the calls by id (the
    engine's tasks). It does what coalescing asks of the ``dispatcher`` (``join``) and returns
    the instructions that follow; sending is the caller's (``take`` marks a batch sent)."""

    def __init__(
        self, dispatcher: Dispatcher, calls: Mapping[int, C], new_id: Callable[[], int]
    ) -> None:
        self._dispatcher = dispatcher
        self._calls = calls
        self._new_id = new_id
        self.collecting: dict[tuple[Hashable, int], Batch[C]] = {}
        self.sent: dict[int, Batch[C]] = {}

    def started(
        self, call: C, device: int, size: Callable[[], int], max_wait: float
    ) -> tuple[list[Instruction], Batch[C], list[C]]:
        """The dispatcher started ``call`` on ``device``: it joins the batch of its key
        collecting there, or opens one of ``size()`` calls, which takes the calls of that key
        queued there, in the order they would start. Returns the instructions that follow,
        the batch and the calls that joined it (``call`` included)."""
        key = call.batch_key
        dispatcher = self._dispatcher
        batch = self.collecting.get((key, device))
        if batch is not None:
            out = dispatcher.join(call.id, batch.calls[0].id)
            self._add(batch, call, max_wait)
            return out, batch, [call]
        batch = Batch(self._new_id(), key, device, size(), math.inf)
        self.collecting[(key, device)] = batch
        self._add(batch, call, max_wait)
        joined = [call]
        for item in dispatcher.queued_items(dispatcher.view.ids[device]):
            if len(batch.calls) >= batch.size:
                break
            other = self._calls.get(item.id)  # type: ignore[arg-type]
            if other is not None and other.batch_key == key:
                dispatcher.join(other.id, call.id)  # queued: it frees no slot
                self._add(batch, other, max_wait)
                joined.append(other)
        return [], batch, joined

    def queued(self, call: C, device: int, max_wait: float) -> Batch[C] | None:
        """``call`` was placed in ``device``'s queue: it joins the batch of its key collecting
        there, if one has room (returned); else the next batch to open there takes it."""
        batch = self.collecting.get((call.batch_key, device))
        if batch is None or len(batch.calls) >= batch.size:
            return None
        self._dispatcher.join(call.id, batch.calls[0].id)
        self._add(batch, call, max_wait)
        return batch

    def ready(self, batch: Batch[C], now: float) -> bool:
        """Whether ``batch`` should go now: full, or its oldest call has waited enough."""
        return len(batch.calls) >= batch.size or batch.due <= now

    def due(self, now: float) -> list[Batch[C]]:
        return [b for b in self.collecting.values() if b.due <= now]

    def next_due(self) -> float:
        """When the earliest collecting batch is due (``inf``: none collects)."""
        return min((b.due for b in self.collecting.values()), default=math.inf)

    def take(self, batch: Batch[C]) -> list[C]:
        """``batch`` is being sent: its calls, in order."""
        del self.collecting[(batch.key, batch.device)]
        batch.sent = True
        self.sent[batch.id] = batch
        return batch.calls

    def drop(self, batch: Batch[C]) -> list[C]:
        """``batch`` will not be sent (its device cannot take it now): its calls leave it."""
        del self.collecting[(batch.key, batch.device)]
        for c in batch.calls:
            c.in_batch = None
        return batch.calls

    def leave(self, call: C) -> Batch[C] | None:
        """``call`` was stopped: it leaves its batch. Returns that batch if it was sent and no
        call waits on it any more (its order may be stopped)."""
        batch = call.in_batch
        if batch is None:
            return None
        call.in_batch = None
        if not batch.sent:
            batch.calls.remove(call)
            if not batch.calls:
                del self.collecting[(batch.key, batch.device)]
            return None
        if any(c.in_batch is batch for c in batch.calls):
            return None
        del self.sent[batch.id]
        return batch

    def finished(self, batch_id: int, device: int) -> tuple[Batch[C], list[tuple[int, C]]] | None:
        """The worker of ``device`` answered the order ``batch_id``: the batch and the calls
        still waiting on it, with their positions, which leave it (``None``: not a batch sent
        there, or nothing waits on it any more)."""
        batch = self.sent.get(batch_id)
        if batch is None or batch.device != device:
            return None
        del self.sent[batch_id]
        live = batch.live()
        for _, c in live:
            c.in_batch = None
        return batch, live

    def lost(self, device: int) -> None:
        """The worker of ``device`` is gone, with the batches sent to it (their calls end or
        are placed again by the dispatcher, one by one)."""
        for batch in [b for b in self.sent.values() if b.device == device]:
            del self.sent[batch.id]
            for c in batch.calls:
                if c.in_batch is batch:
                    c.in_batch = None

    def _add(self, batch: Batch[C], call: C, max_wait: float) -> None:
        batch.calls.append(call)
        call.in_batch = batch
        submitted = self._dispatcher.records[call.id].submitted
        batch.due = min(batch.due, submitted + max_wait)
