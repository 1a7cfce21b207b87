"""The one exception hierarchy of hetero.

Every error the library raises on purpose derives from :class:`HeteroError`, so callers can catch
``HeteroError`` alone. Errors from third-party code are mapped at the boundary with
``raise X from exc`` so the original cause stays attached.
"""

from __future__ import annotations

__all__ = [
    "AllocationError",
    "BackendError",
    "ConfigError",
    "DeviceError",
    "DuplicateItem",
    "HeteroError",
    "InfeasiblePlan",
    "InvalidItem",
    "InvalidTransition",
    "ItemNotRunning",
    "NoCapableDevice",
    "NoReplica",
    "ProviderError",
    "QueueFull",
    "Rejected",
    "TaskFailed",
    "UnknownDevice",
    "UnknownItem",
    "UnknownModel",
]


class HeteroError(Exception):
    """Base of every error hetero raises on purpose."""


class ConfigError(HeteroError, ValueError):
    """A configuration value is invalid.

    ``problems`` lists every problem found (``(field path, message)``), so a whole file can be
    reported at once instead of one error per run.
    """

    def __init__(self, problems: list[tuple[str, str]] | str) -> None:
        if isinstance(problems, str):
            problems = [("", problems)]
        self.problems: list[tuple[str, str]] = list(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [f"{path}: {msg}" if path else msg for path, msg in self.problems]
        if len(lines) == 1:
            return lines[0]
        return f"{len(lines)} problems:\n" + "\n".join(f"  - {line}" for line in lines)


class DeviceError(HeteroError):
    """A device is missing, unhealthy or unusable."""


class UnknownDevice(DeviceError, KeyError):
    """A device id that the fleet does not have (also a ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class AllocationError(HeteroError):
    """Devices could not be allocated as requested."""


class InfeasiblePlan(AllocationError):
    """No fleet from the menu meets the SLO (``hetero.plan.plan_fleet``); ``constraint`` names
    what binds: ``"slo"`` (a bucket is too slow everywhere), ``"max_count"`` or
    ``"max_price_per_hour"``."""

    def __init__(self, constraint: str, message: str) -> None:
        self.constraint = constraint
        super().__init__(message)


class NoCapableDevice(HeteroError):
    """No device in the fleet can run a work item (memory, capabilities, tags)."""


class Rejected(NoCapableDevice):
    """Raised by a policy's ``pick`` (or a filter's ``allow``) when an item can never be placed;
    the dispatcher fails the item with this error."""


class InvalidItem(HeteroError, ValueError):
    """A work item was built with a value it cannot have (negative or non-finite cost, …)."""


class UnknownItem(HeteroError, KeyError):
    """An event named a work item the dispatcher never admitted, or has forgotten."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateItem(HeteroError, ValueError):
    """A work item was submitted while another item with the same id is still in flight."""


class ItemNotRunning(HeteroError, ValueError):
    """``complete`` or ``fail`` named an item that is not running (queued, pending or ended)."""


class QueueFull(HeteroError):
    """The dispatcher's queue is at ``max_queue_size``; the caller should back off and retry."""


class InvalidTransition(HeteroError):
    """A work item was asked to move between states that the transition table does not allow."""

    def __init__(self, item_id: object, start: str, finish: str, history: list[str]) -> None:
        self.item_id = item_id
        self.start = start
        self.finish = finish
        self.history = list(history)
        super().__init__(
            f"work item {item_id!r}: invalid transition {start} -> {finish} "
            f"(history: {' -> '.join(history) or 'empty'})"
        )


class TaskFailed(HeteroError):
    """A task failed on its device; ``remote_traceback`` holds the traceback from where it ran
    and ``message`` the reason alone (``str()`` is both)."""

    def __init__(self, message: str, remote_traceback: str | None = None) -> None:
        self.message = message
        self.remote_traceback = remote_traceback
        super().__init__(message if not remote_traceback else f"{message}\n{remote_traceback}")


class BackendError(HeteroError):
    """An execution backend (process pool, Ray, HTTP replica) failed."""


class ProviderError(BackendError):
    """An autoscaler's provider could not start (or stop) a replica: the type, every attempt's
    reason and the last lines the replica printed."""


class UnknownModel(HeteroError):
    """No replica serves the requested model (the router answers HTTP 404)."""


class NoReplica(HeteroError):
    """Replicas serve the model (or may: an unreachable one's model list was never read), but
    none of them is healthy now (the router answers HTTP 503)."""
