"""The one exception hierarchy of hetero.

Every error the library raises on purpose derives from :class:`HeteroError`, so callers can catch
``HeteroError`` alone, or one group of it (``ItemError``, ``MembershipError``, ``ServeError``).
Errors from third-party code are mapped at the boundary with ``raise X from exc`` so the original
cause stays attached. A class with two hetero bases is drawn under each; builtin bases are in
parentheses::

    HeteroError
    ├── ConfigError (ValueError)           a configuration value is invalid
    │   ├── DuplicateMember                also a MembershipError
    │   └── UnknownMember                  also a MembershipError
    ├── DeviceError                        a device is missing, unhealthy or unusable
    │   └── UnknownDevice (KeyError)       also a MembershipError
    ├── MembershipError                    a change to a fleet conflicts with its state
    │   ├── DuplicateMember                adds a device or replica the fleet has
    │   ├── UnknownMember                  names one the fleet does not have (now)
    │   └── UnknownDevice                  a device id the fleet does not have
    ├── AllocationError                    devices cannot be allocated as requested
    │   └── InfeasiblePlan                 no fleet from the menu meets the SLO
    ├── NoCapableDevice                    no device can run a work item
    │   └── Rejected                       a policy refuses an item for good
    ├── ItemError                          a work item, or an event about one, is wrong
    │   ├── InvalidItem (ValueError)       built with a value it cannot have
    │   ├── UnknownItem (KeyError)         never admitted, or forgotten
    │   ├── DuplicateItem (ValueError)     its id is in flight already
    │   ├── ItemNotRunning (ValueError)    complete/fail for an item that is not running
    │   └── InvalidTransition              a move the state table does not allow
    ├── QueueFull                          the dispatcher's queue is full: back off
    ├── TaskFailed                         a task failed where it ran
    ├── BackendError                       an execution backend failed
    │   └── ProviderError                  an autoscaler could not start or stop a replica
    └── ServeError                         the router cannot take a request
        ├── UnknownModel                   no replica serves the model (HTTP 404)
        └── NoReplica                      none that serves it is healthy (HTTP 503)
"""

from __future__ import annotations

__all__ = [
    "AllocationError",
    "BackendError",
    "ConfigError",
    "DeviceError",
    "DuplicateItem",
    "DuplicateMember",
    "HeteroError",
    "InfeasiblePlan",
    "InvalidItem",
    "InvalidTransition",
    "ItemError",
    "ItemNotRunning",
    "MembershipError",
    "NoCapableDevice",
    "NoReplica",
    "ProviderError",
    "QueueFull",
    "Rejected",
    "ServeError",
    "TaskFailed",
    "UnknownDevice",
    "UnknownItem",
    "UnknownMember",
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


class MembershipError(HeteroError):
    """A change to a fleet's membership conflicts with the fleet as it is now: adding a device
    or replica it already has, naming one it does not have (never had, no longer has, or has
    not yet)."""


class DuplicateMember(MembershipError, ConfigError):
    """A device or replica joins a fleet (or pool) that already has one by its id, name or
    address. Also a ``ConfigError``, as it was before it had a class of its own."""


class UnknownMember(MembershipError, ConfigError):
    """A device or replica is named that the fleet does not have now (never had, removed, or
    asked for at a later time). Also a ``ConfigError``, as it was before it had a class of its
    own; ``UnknownDevice`` is the dispatcher's look-up of a device id."""


class UnknownDevice(DeviceError, MembershipError, KeyError):
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


class ItemError(HeteroError):
    """A work item is wrong, or an event names one in a state it cannot take."""


class InvalidItem(ItemError, ValueError):
    """A work item was built with a value it cannot have (negative or non-finite cost, …)."""


class UnknownItem(ItemError, KeyError):
    """An event named a work item the dispatcher never admitted, or has forgotten."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DuplicateItem(ItemError, ValueError):
    """A work item was submitted while another item with the same id is still in flight."""


class ItemNotRunning(ItemError, ValueError):
    """``complete`` or ``fail`` named an item that is not running (queued, pending or ended)."""


class QueueFull(HeteroError):
    """The dispatcher's queue is at ``max_queue_size``; the caller should back off and retry."""


class InvalidTransition(ItemError):
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


class ServeError(HeteroError):
    """The router cannot take a request for what it names (the model, its replicas)."""


class UnknownModel(ServeError):
    """No replica serves the requested model (the router answers HTTP 404)."""


class NoReplica(ServeError):
    """Replicas serve the model (or may: an unreachable one's model list was never read), but
    none of them is healthy now (the router answers HTTP 503)."""
