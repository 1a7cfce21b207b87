"""What a ``DevicePool`` hands out and shows: an ``Allocation`` (with how it ended, an
``AllocationEnd``), and a ``PoolSnapshot`` of every device's holders."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import TracebackType
from typing import TYPE_CHECKING, Any

from hetero.devices.spec import Device
from hetero.plan.request import AllocationRequest

if TYPE_CHECKING:
    from hetero.plan.pool import DevicePool

__all__ = ["Allocation", "AllocationEnd", "DeviceUsage", "EndCause", "PoolSnapshot"]


class EndCause(str, Enum):
    """Why an allocation ended."""

    RELEASED = "released"  # its holder gave it back
    DEVICE_REMOVED = "device_removed"  # one of its devices left the pool
    LEASE_EXPIRED = "lease_expired"  # its lease ran out before it was renewed

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class AllocationEnd:
    """How an allocation ended: the cause, the reason in words, and the pool's clock time."""

    cause: EndCause
    reason: str
    at: float

    def to_dict(self) -> dict[str, Any]:
        return {"cause": self.cause.value, "reason": self.reason, "at": self.at}


class Allocation:
    """Devices held for one request until ``release()``, the end of a ``with`` block, the end
    of its lease, or the removal of one of its devices from the pool."""

    __slots__ = ("_end", "_expires_at", "_lease", "_pool", "devices", "name", "request")

    def __init__(
        self,
        pool: DevicePool,
        name: str,
        request: AllocationRequest,
        devices: Sequence[Device],
        expires_at: float | None = None,
    ) -> None:
        self._pool = pool
        self.name = name
        self.request = request
        self.devices: tuple[Device, ...] = tuple(devices)
        # Written by the pool only, under its lock.
        self._lease = request.lease
        self._expires_at = expires_at
        self._end: AllocationEnd | None = None

    @property
    def pool(self) -> DevicePool:
        return self._pool

    @property
    def device_ids(self) -> tuple[str, ...]:
        return tuple(device.id for device in self.devices)

    @property
    def nodes(self) -> tuple[str, ...]:
        """The distinct nodes of the held devices, in device order."""
        return tuple(dict.fromkeys(device.node for device in self.devices))

    @property
    def memory(self) -> int:
        """Bytes held on each device."""
        return self.request.memory

    @property
    def exclusive(self) -> bool:
        return self.request.exclusive

    @property
    def lease(self) -> float | None:
        """Seconds the lease runs from its last renewal (None: no lease)."""
        return self._lease

    @property
    def expires_at(self) -> float | None:
        """The pool's clock time at which the lease ends (None: no lease)."""
        return self._expires_at

    @property
    def released(self) -> bool:
        """Whether the allocation has ended, whatever the cause (see ``end``)."""
        return not self._pool.holds(self)

    @property
    def end(self) -> AllocationEnd | None:
        """How the allocation ended; ``None`` while it is live."""
        self._pool.expire()  # a lease past its end ends on this look
        return self._end

    def release(self) -> None:
        """Give the devices back (``AllocationError`` if it has ended already)."""
        self._pool.release(self)

    def renew(self, lease: float | None = None) -> float:
        """Restart the lease, for ``lease`` seconds or as long as the last one; returns the
        clock time it now ends at (see ``DevicePool.renew``)."""
        return self._pool.renew(self, lease)

    def __enter__(self) -> Allocation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Ending inside the block is allowed; the exit then has nothing left to give back.
        self._pool.release(self, missing_ok=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": list(self.device_ids),
            "nodes": list(self.nodes),
            "memory_bytes": self.memory,
            "exclusive": self.exclusive,
            "lease": self._lease,
            "expires_at": self._expires_at,
            "end": None if self._end is None else self._end.to_dict(),
            "request": self.request.describe(),
        }

    def __repr__(self) -> str:
        return f"Allocation({self.name!r}, devices={list(self.device_ids)})"


@dataclass(frozen=True, slots=True)
class DeviceUsage:
    """One device in a ``PoolSnapshot``: who holds it and how much memory is left."""

    id: str
    node: str
    model: str
    healthy: bool
    memory_bytes: int
    memory_free: int
    holders: Mapping[str, int] = field(hash=False)
    exclusive: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "model": self.model,
            "healthy": self.healthy,
            "memory_bytes": self.memory_bytes,
            "memory_free": self.memory_free,
            "holders": dict(self.holders),
            "exclusive": self.exclusive,
        }


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A consistent copy of a pool's state, taken under its lock; ``expires`` gives the clock
    time each leased allocation ends at."""

    devices: tuple[DeviceUsage, ...]
    allocations: Mapping[str, tuple[str, ...]] = field(hash=False)
    waiting: int
    expires: Mapping[str, float] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [usage.to_dict() for usage in self.devices],
            "allocations": {name: list(ids) for name, ids in self.allocations.items()},
            "waiting": self.waiting,
            "expires": dict(self.expires),
        }
