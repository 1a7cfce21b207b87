"""Work items and their life: one state machine with one transition table.

::

    pending ──► queued ──► running ──► done
       │          │  ▲        │ ├────► failed            (terminal: done, failed, cancelled)
       │          │  │        │ ├────► retrying ──► pending | queued | failed
       │          │  └────────┼─┴────► preempted ──► pending | queued | cancelled
       └──────────┴───────────┴──────► cancelled | failed

``queued`` means placed in one device's queue (a steal moves it to another: queued → queued);
``pending`` means waiting in the dispatcher's central queue for a device. An attempt that fails
with retries left goes running → retrying, never through the terminal ``failed``.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from hetero.errors import ConfigError, InvalidItem, InvalidTransition
from hetero.sched.prefix import Prefix

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "MAX_COST",
    "TERMINAL",
    "TRANSITIONS",
    "Cause",
    "CostModel",
    "ItemRecord",
    "ItemState",
    "SharedRun",
    "Tokens",
    "WorkItem",
]


class ItemState(str, Enum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    RETRYING = "retrying"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"

    # Filled in below from TRANSITIONS: bit flags make ``move`` one integer test, where a set
    # look-up would hash two enum members through Python code on every move.
    bit: int
    allowed: int

    def __str__(self) -> str:
        return str(self.value)


class Cause(str, Enum):
    """Why an item's attempt was stopped or the item ended. Executors map it to their own
    terms (an HTTP code, a trace status) by value; the ``reason`` beside it is for people and
    may be reworded."""

    DONE = "done"
    FAILED = "failed"  # its attempts failed; the executor's reason says how
    CANCELLED = "cancelled"
    TIMED_OUT = "timed out"
    PREEMPTED = "preempted"  # stopped for a higher-priority item, and placed again
    DEVICE_LOST = "device lost"  # its device went down
    DEVICE_REMOVED = "device removed"  # its device left the fleet; placed again
    REJECTED = "rejected"  # no device could ever run it
    ABANDONED = "abandoned"  # nothing is left that could run it

    def __str__(self) -> str:
        return str(self.value)


P, Q, R = ItemState.PENDING, ItemState.QUEUED, ItemState.RUNNING
D, F, X = ItemState.DONE, ItemState.FAILED, ItemState.CANCELLED
RT, PE = ItemState.RETRYING, ItemState.PREEMPTED

#: Every allowed ``(start, finish)`` move. Anything else raises ``InvalidTransition``.
TRANSITIONS: frozenset[tuple[ItemState, ItemState]] = frozenset(
    {
        (P, Q), (P, X), (P, F),
        (Q, R), (Q, Q), (Q, P), (Q, X), (Q, F), (Q, RT),
        (R, D), (R, F), (R, RT), (R, PE), (R, X),
        (RT, P), (RT, Q), (RT, F),
        (PE, P), (PE, Q), (PE, X),
    }
)  # fmt: skip
TERMINAL: frozenset[ItemState] = frozenset({D, F, X})
for _n, _state in enumerate(ItemState):
    _state.bit = 1 << _n
for _state in ItemState:
    _state.allowed = sum(finish.bit for start, finish in TRANSITIONS if start is _state)

_ids = itertools.count()

#: The largest cost an item may have: far above any real job (a 1e12-parameter model trained on
#: 1e6 tokens is about 6e18 FLOPs), and low enough that sums of costs over speeds stay finite, so
#: a policy never sees an infinite expected delay on a usable device.
MAX_COST = 1e30


def _integral(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class CostModel:
    """Work units of an LLM request: prompt tokens × ``prefill`` + max new tokens × ``decode``."""

    prefill: float = 0.5
    decode: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill", "decode"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"CostModel.{name} must be >= 0, got {value!r}")

    def cost(self, prompt_tokens: int, max_new_tokens: float) -> float:
        return prompt_tokens * self.prefill + max_new_tokens * self.decode


@dataclass(frozen=True, slots=True)
class Tokens:
    """An LLM request's size: its prompt tokens and the output tokens expected of it (what a
    policy that predicts an engine's latencies, ``slo``, needs)."""

    prompt: int
    output: float


@dataclass(slots=True)
class WorkItem:
    """One unit of work to place on a device.

    ``cost`` is in work units (FLOPs, tokens, a user's estimate): a device of speed ``s`` takes
    ``cost / s`` seconds. ``memory`` is the bytes the item holds on its device while placed there.
    Higher ``priority`` runs first. ``complexity`` selects a tier for the ``tiered`` policy
    (defaults to ``cost``; a task's ``complexity=`` option, a routed request's prompt tokens),
    ``tags`` bind it to devices for ``affinity``, and ``deadline`` is an
    absolute clock time after which it fails with a timeout. ``batch`` marks an item of a
    closed batch (a map, a task graph) whose measure is the batch's makespan, not its own
    latency: policies that trade latency for the tail place it where it finishes soonest.
    ``prefix`` is what its prompt shares with others (``hetero.sched.prefix``), for
    ``prefix_affinity``. ``tokens`` is its size as an LLM request, for ``slo``.
    """

    cost: float = 1.0
    kind: str = "default"
    memory: int = 0
    priority: int = 0
    complexity: float | None = None
    tags: frozenset[str] = frozenset()
    deadline: float | None = None
    id: int | str = field(default_factory=lambda: next(_ids))
    batch: bool = False
    prefix: Prefix | None = None
    tokens: Tokens | None = None

    def __post_init__(self) -> None:
        # Refused here, not at submit: an infinite cost or deadline would leave the item waiting
        # forever with no device ever good enough for it.
        cost = self.cost
        if not (type(cost) is float or _real(cost)) or not 0 <= cost <= MAX_COST:
            raise InvalidItem(
                f"WorkItem.cost must be a number from 0 to {MAX_COST:g} work units, "
                f"got {self.cost!r}"
            )
        memory, priority = self.memory, self.priority
        if not (type(memory) is int or _integral(memory)) or memory < 0:
            raise InvalidItem(f"WorkItem.memory must be an integer >= 0 bytes, got {memory!r}")
        if not (type(priority) is int or _integral(priority)):
            raise InvalidItem(
                f"WorkItem.priority must be an integer (higher runs first), got {priority!r}"
            )
        for name, value in (("complexity", self.complexity), ("deadline", self.deadline)):
            # A float or an int first: the ABC check (_real) is most of an item's cost to make.
            if value is not None and not (
                (type(value) is float or type(value) is int or _real(value))
                and math.isfinite(value)
            ):
                raise InvalidItem(f"WorkItem.{name} must be a finite number or None, got {value!r}")

    @classmethod
    def llm(
        cls,
        prompt_tokens: int,
        max_new_tokens: int,
        cost_model: CostModel = CostModel(),
        **kwargs: object,
    ) -> WorkItem:
        """An LLM request, costed by ``cost_model`` (default: prompt × 0.5 + new tokens × 1.0)."""
        if prompt_tokens < 0 or max_new_tokens < 0:
            raise InvalidItem(
                f"token counts must be >= 0, got prompt_tokens={prompt_tokens}, "
                f"max_new_tokens={max_new_tokens}"
            )
        return cls(cost=cost_model.cost(prompt_tokens, max_new_tokens), **kwargs)  # type: ignore[arg-type]

    @property
    def tier_key(self) -> float:
        return self.cost if self.complexity is None else self.complexity


class SharedRun:
    """Running items that share one slot of a device as one run (a batch: the executor calls
    the task once for all of them; ``Dispatcher.join``). The slot is held from ``started``
    until the last of its ``members`` ends."""

    __slots__ = ("members", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.members = 1


@dataclass(slots=True, eq=False)
class ItemRecord:
    """The dispatcher's book-keeping for one admitted item. Only ``move`` changes ``state``."""

    item: WorkItem
    submitted: float
    state: ItemState = ItemState.PENDING
    device: int = -1
    seq: int = -1
    attempts: int = 0
    failures: int = 0
    started: float = 0.0
    finished: float = 0.0
    reason: str = ""
    excluded: set[int] | None = None
    only: npt.NDArray[np.bool_] | None = (
        None  # bool mask of the devices the item may use (None: any), from submit
    )
    retries: int = -1  # failed attempts retried before the item fails (-1: the dispatcher's)
    size_class: int = -1  # the item's class in size-ordered queues, once it has been queued
    run: SharedRun | None = None  # the run it shares a slot with (Dispatcher.join), if any
    history: list[ItemState] = field(default_factory=lambda: [ItemState.PENDING])

    def move(self, finish: ItemState) -> None:
        if not self.state.allowed & finish.bit:
            raise InvalidTransition(
                self.item.id, self.state.value, finish.value, [s.value for s in self.history]
            )
        self.state = finish
        self.history.append(finish)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL
