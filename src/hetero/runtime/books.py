"""The engine's books: the task table and the per-device tables and counters that the engine
and its parts (the backend's sink, task graphs, batched calls, the fleet monitor) read and
write, always with the engine's lock held.

The engine owns one ``EngineBooks`` and hands it to each part, so that a part reaches these
through the books rather than through the engine's attributes, and what the parts share is
written down in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero.runtime.events import new_breaker
from hetero.runtime.futures import Ending
from hetero.runtime.task_record import Task
from hetero.sched.health import Breaker

__all__ = ["EngineBooks"]


@dataclass(slots=True, eq=False)
class EngineBooks:
    """What the engine has in hand. Lists indexed by device grow as devices join
    (``add_device``)."""

    tasks: dict[int, Task] = field(default_factory=dict)
    """Every task not ended yet: waiting on parents, in the backlog, or the dispatcher's."""
    on_device: list[set[int]] = field(default_factory=list)
    """Per device, the tasks sent to its worker that it has not answered."""
    breakers: list[Breaker] = field(default_factory=list)
    """Per device, its circuit breaker, judged by its lost workers (as replicas are)."""
    stops: list[int] = field(default_factory=list)
    """Per device, orders cancelled there whose end the worker has not confirmed."""
    holding: dict[int, set[int]] = field(default_factory=dict)
    """Devices whose worker was told to stop the task it runs: the tasks stopped there that
    the worker has not yet let go of. Such a device takes no work until it has, or is gone."""
    stats: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("submitted", "done", "failed", "cancelled", "retried"), 0
        )
    )
    """Tasks ``submitted``, ``done``, ``failed``, ``cancelled``, and attempts ``retried``."""
    endings: list[Ending] = field(default_factory=list)
    """Futures of the tasks that ended, completed by ``settle`` once the lock is released."""

    @classmethod
    def for_devices(cls, n: int) -> EngineBooks:
        """Empty books for a fleet of ``n`` devices."""
        books = cls()
        for _ in range(n):
            books.add_device()
        return books

    def add_device(self) -> None:
        """One more device, with nothing sent to it yet and its circuit closed."""
        self.on_device.append(set())
        self.breakers.append(new_breaker())
        self.stops.append(0)
