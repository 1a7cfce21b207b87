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
from collections.abc import Sequence
from typing import Any, Protocol

from hetero.devices.spec import Device
from hetero.runtime.monitor import DeviceSample
from hetero.runtime.serialize import remove_segments
from hetero.runtime.worker import TaskOrder

__all__ = ["Backend", "BackendEvents"]


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
