"""``DispatchOptions``: the dispatcher's settings, each with its one default, validated once.

``SchedulerConfig`` (the config file's ``scheduler`` section) takes its defaults from here, and
``Dispatcher`` reads its settings from here, so a default is written in one place. This module
imports nothing of the config (``hetero.config`` imports it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

from hetero.errors import ConfigError

__all__ = ["DEFAULT_MAX_QUEUE_SIZE", "QUEUE_ORDERS", "DispatchOptions", "QueueOrder"]

#: Items a dispatcher holds waiting (pending and queued) before it refuses more: one default
#: for the config, the ``Dispatcher`` and the router (the simulator admits everything).
DEFAULT_MAX_QUEUE_SIZE = 1000

#: How a device queue orders items of one priority: aged size (small first) or arrival.
QueueOrder = Literal["size", "fifo"]
QUEUE_ORDERS: tuple[QueueOrder, ...] = get_args(QueueOrder)


@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchOptions:
    """How a ``Dispatcher`` queues, retries, times out, preempts and steals.

    Every problem is reported at once, as one ``ConfigError`` of ``(field, message)`` problems,
    when the options are built.

    Args:
        max_queue_size: items waiting (pending + queued) before ``submit`` raises ``QueueFull``.
        timeout: seconds from submit after which an unfinished item fails (``None``: never);
            an item's own ``deadline`` wins.
        max_retries: failed attempts retried on another device before the item fails.
        preemption: let a higher-priority item stop the lowest-priority running item when no
            slot is free; the stopped item is re-queued, never lost.
        stealing: let an idle device take queued work from the most-loaded device when it would
            finish it sooner.
        queue_order: ``"size"`` (small items first within a priority, with aging) or ``"fifo"``.
        aging: with size order, an item can be passed over only by items that arrive within
            ``aging`` × its service time on the fastest usable device after it (its key is
            arrival time plus that window); 0 is FIFO, large values approach shortest-first.
            Timed on the fastest device, not its own, so that an item placed on a slow device
            to spare the fast ones is not passed over for longer than it would be there.
        max_bypass: seconds that cap the window for every item (``None``: no cap), bounding how
            long even the largest item can be passed over.
        late_after: seconds after which an item still waiting for a device is *late*: it
            goes behind every waiting item that is not (``None``: never). Under a latency
            target that is the target itself: once it has passed, serving the late item first
            would make every item behind it late too (an overloaded router's FIFO queue
            otherwise misses every request's target).
        keep_finished: keep records of finished items (for inspection and ``validate_state``);
            long simulations turn this off to bound memory.
    """

    max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE
    timeout: float | None = None
    max_retries: int = 2
    preemption: bool = False
    stealing: bool = True
    queue_order: QueueOrder = "size"
    aging: float = 10.0
    max_bypass: float | None = None
    late_after: float | None = None
    keep_finished: bool = True

    def __post_init__(self) -> None:
        problems = []
        if self.max_queue_size < 1:
            problems.append(("max_queue_size", f"must be >= 1, got {self.max_queue_size}"))
        if self.timeout is not None and not 0 < self.timeout < math.inf:
            # An infinite timeout is None: a timer cannot wait that long (OverflowError).
            problems.append(
                ("timeout", f"must be finite seconds > 0 or None, got {self.timeout!r}")
            )
        if self.late_after is not None and not 0 < self.late_after < math.inf:
            problems.append(
                ("late_after", f"must be finite seconds > 0 or None, got {self.late_after!r}")
            )
        if self.max_retries < 0:
            problems.append(("max_retries", f"must be >= 0, got {self.max_retries}"))
        if self.queue_order not in QUEUE_ORDERS:
            problems.append(
                (
                    "queue_order",
                    f"unknown order {self.queue_order!r}; allowed: {', '.join(QUEUE_ORDERS)}",
                )
            )
        if not 0 <= self.aging < math.inf:
            problems.append(("aging", f"must be a finite number >= 0, got {self.aging!r}"))
        if self.max_bypass is not None and not 0 < self.max_bypass < math.inf:
            problems.append(("max_bypass", f"must be > 0 seconds or None, got {self.max_bypass!r}"))
        if problems:
            raise ConfigError(problems)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The settings' names, in declaration order."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def build(cls, base: DispatchOptions | None = None, **settings: Any) -> DispatchOptions:
        """``base`` (default: the defaults) with ``settings`` replaced; a name that is no
        setting is a ``ConfigError`` naming it and listing the settings."""
        allowed = cls.names()
        unknown = [name for name in settings if name not in allowed]
        if unknown:
            raise ConfigError(
                [
                    (name, f"unknown dispatcher setting; allowed: {', '.join(allowed)}")
                    for name in unknown
                ]
            )
        if base is None:
            return cls(**settings)
        return replace(base, **settings) if settings else base
