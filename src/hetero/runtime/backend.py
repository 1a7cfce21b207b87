"""The boundary between the engine and what runs tasks: worker processes on this machine
(``LocalBackend``) or actors on the nodes of a Ray cluster (``RayBackend``).

The engine owns placement (through ``hetero.sched.Dispatcher``), futures, retries and
checkpoints; a backend only starts one worker per device, delivers ``TaskOrder``s to them and
reports back through ``BackendEvents``, from a thread of its own. Nothing about placement lives
behind this boundary, so every backend reuses all of it. A backend that knows the fleet better
than a config does (a cluster's nodes) says so through ``discover`` and reports devices that
join or leave while it runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from hetero.devices.spec import Device
from hetero.runtime.device_probe import DeviceSample
from hetero.runtime.serialize import remove_segments
from hetero.runtime.worker import TaskOrder

__all__ = [
    "STOP_GRACE_S",
    "Backend",
    "BackendEvents",
    "Stopping",
    "killed_for_overrun",
    "overdue",
    "stops_over",
]

#: Seconds a worker has to end a task it was told to stop before the backend kills it: a task
#: in C code holding the GIL cannot be interrupted by any thread of its worker.
STOP_GRACE_S = 1.0


class BackendEvents(Protocol):
    """What a backend tells the engine (called from the backend's own thread)."""

    def replies(self, device: int, messages: list[tuple[Any, ...]]) -> None:
        """Messages from the worker of ``device``, as they arrived together: ``("done",
        TaskReply)``, ``("error", TaskReply)``, ``("dropped", task_id)`` (a cancelled order
        that never started), ``("warn", text)``, ``("ready", pid)``."""

    def worker_lost(self, device: int, reason: str) -> None:
        """The worker of ``device`` is gone; every order it held is lost."""

    def device_added(self, device: Device) -> int:
        """A device joined (its node joined the cluster); returns its index, which is the
        number of devices reported before it."""

    def device_gone(self, device: int, reason: str) -> None:
        """``device`` left for good (its node left): what it held runs elsewhere."""


class Backend(ABC):
    """One worker per device; orders in, events out."""

    #: Whether workers map the driver's shared memory (the same machine): else arguments and
    #: results travel inside the messages.
    shared_memory: bool = True
    #: Emulated durations are multiplied by it (the Context's ``time_scale``).
    time_scale: float = 1.0

    def discover(self) -> list[Device] | None:
        """The fleet, where the backend knows it (a cluster: every node's devices); ``None``:
        the engine's config says."""
        return None

    @abstractmethod
    def start(self, devices: Sequence[Device], events: BackendEvents) -> None:
        """Get ready to run on ``devices`` (workers may start lazily, on their first order)."""

    @abstractmethod
    def send(self, device: int, order: TaskOrder, function: tuple[str, bytes]) -> None:
        """Deliver ``order`` to the worker of ``device`` without blocking; ``function`` is the
        task's ``(key, cloudpickled bytes)``, shipped once per worker."""

    @abstractmethod
    def warm(self, timeout: float | None) -> None:
        """Start every worker that is not running and wait until all are ready (``BackendError``
        naming those that are not, after ``timeout`` seconds; ``None``: do not wait)."""

    @abstractmethod
    def flush(self) -> None:
        """Send the orders queued by ``send`` (the engine calls it after each burst, outside its
        lock, so a burst of orders travels as one message per worker)."""

    def recycle(self, name: str, size: int) -> None:
        """The driver no longer maps a result file a worker wrote (called by a finalizer, in any
        thread, so it must only queue): by default the file is removed; a backend whose workers
        reuse their files hands it back at the next flush."""
        remove_segments([(name, size, True)])

    @abstractmethod
    def cancel(self, device: int, task_id: int) -> None:
        """Stop ``task_id`` on ``device``: dropped if not started, else its worker is ended
        (then ``worker_lost`` follows and the engine restarts it)."""

    @abstractmethod
    def restart(self, device: int) -> None:
        """End the worker of ``device`` (if any); the next order starts a fresh one."""

    @abstractmethod
    def pids(self) -> list[int | None]:
        """The worker process of each device, where one runs (for monitoring)."""

    def on_this_machine(self) -> list[bool]:
        """Per device, whether it is on this machine (the engine reads those itself)."""
        return [True] * len(self.pids())

    def remote_samples(self) -> list[DeviceSample]:
        """Readings of the devices on other machines, taken where they are (by their
        workers); called by the engine's monitor thread once per round."""
        return []

    @abstractmethod
    def close(self, timeout: float = 5.0) -> None:
        """End every worker and release what the backend holds; idempotent."""


class Stopping(Protocol):
    """A worker as its backend follows the tasks it told it to stop: task id -> when the worker
    is killed if it has not let go of the task by then."""

    stopping: dict[int, float]


S = TypeVar("S", bound=Stopping)


def overdue(workers: Iterable[S], now: float) -> tuple[list[S], float | None]:
    """Of ``workers``, those holding a task past its stop's deadline at ``now`` (their stops are
    forgotten: they are to be killed), and the seconds until the others' next deadline
    (``None``: none)."""
    late: list[S] = []
    due: list[float] = []
    for worker in workers:
        if not worker.stopping:
            continue
        first = min(worker.stopping.values())
        if first > now:
            due.append(first)
        else:
            worker.stopping.clear()
            late.append(worker)
    return late, (max(0.0, min(due) - now) if due else None)


def stops_over(messages: list[tuple[Any, ...]]) -> Iterator[int]:
    """The tasks that a worker's ``messages`` show it no longer runs: ended (a reply) or dropped
    before they began."""
    for msg in messages:
        tag = msg[0]
        if tag == "dropped":
            yield msg[1]
        elif tag == "done" or tag == "error":
            yield msg[1].task_id


def killed_for_overrun(worker: str, grace: float) -> str:
    """Why ``worker`` (``"worker of d0"``) was lost when the backend killed it for a task it was
    told to stop that still ran ``grace`` seconds later."""
    return (
        f"{worker} was killed: a task it was told to stop was still running {grace:g} s later "
        "(C code holding the GIL cannot be interrupted)"
    )
