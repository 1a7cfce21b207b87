"""Allocation: holding devices of a pool for a request, all or nothing, until it ends.

A request (``AllocationRequest``) asks for ``count`` devices of a kind or model with some memory
(and compute) each, shared or exclusive, with affinity (one node, one rack, an interconnect,
named devices, tags) and anti-affinity (one device per node, devices to avoid, the devices or
nodes of named allocations). ``DevicePool.allocate`` computes the whole pick from the current
state before it changes anything and commits it in one step, so a request holds every device
it asked for or none; where links are known it takes the best-connected group
(``plan/placement.py``), and for ``same_rack`` it picks within one rack (``plan/racks.py``).
With a ``timeout`` it waits for releases. Devices join and leave at run time; an allocation
ends when released, when one of its devices leaves, or when its lease runs out. One lock
guards all state: the books (``plan/holdings.py``), the racks, and the waits, leases and ends
kept here; which devices may take a request is ``plan/eligibility.py``'s. See
``docs/allocation.md``.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hetero.devices.rings import device_bandwidth
from hetero.devices.spec import Device
from hetero.devices.topology import NodeTopology, Topology
from hetero.errors import AllocationError, ConfigError, DuplicateMember
from hetero.plan.allocation import Allocation, AllocationEnd, EndCause, PoolSnapshot
from hetero.plan.eligibility import busy_error, candidates, static_filters, usable
from hetero.plan.holdings import Holdings
from hetero.plan.racks import pick_placed, rack_key
from hetero.plan.request import AllocationRequest, Problems, lease_problems
from hetero.sched.clock import Clock, MonotonicClock

__all__ = ["DevicePool"]


class DevicePool:
    """Devices handed out to ``AllocationRequest``s; thread-safe (one lock around all state).

    Health is read from each device's ``state.healthy``; ``mark_unhealthy``/``mark_healthy``
    set it (and wake waiters). Memory is the pool's own reservations against
    ``Device.memory_bytes``, not the driver's live usage. ``topology`` gives the GPU topology of
    each node (``{node: Topology}``, e.g. ``read_topology()`` on that node), which the pick
    uses to prefer the best-connected group. ``racks`` gives the rack of each node
    (``{node: rack}``, or a ``NodeTopology`` such as ``read_node_topology_file(path)``), beside
    the ``Device.rack`` a fleet config sets; a ``same_rack`` request stays in one rack, and a
    node whose rack neither says is a rack of its own. ``clock`` (a ``Clock``, real time by
    default) times leases and waits.
    """

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        topology: Mapping[str, Topology] | None = None,
        racks: Mapping[str, str] | NodeTopology | None = None,
        clock: Clock | None = None,
    ) -> None:
        problems = _device_problems(devices) + _topology_problems(topology)
        rack_of = _racks_given(racks, problems)
        if not problems:
            for i, device in enumerate(devices):
                problems += _rack_problems(device, f"devices[{i}]", rack_of)
        if problems:
            raise ConfigError(problems)
        # Node -> rack for the nodes whose rack is known; devices that join may add to it.
        self._rack_of = rack_of
        self._holdings = Holdings(devices)
        self._topology: Mapping[str, Topology] = dict(topology or {})
        self._clock: Clock = clock or MonotonicClock()
        self._changed = threading.Condition(threading.Lock())
        self._serial = itertools.count(1)
        self._waiting = 0

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices in the pool now, in the order they joined."""
        with self._changed:
            return tuple(self._holdings.devices)

    @property
    def racks(self) -> dict[str, str]:
        """``{node: rack}`` of the nodes whose rack the pool knows (a copy)."""
        with self._changed:
            return dict(self._rack_of)

    @property
    def waiting(self) -> int:
        """How many ``allocate`` calls are waiting for a release right now."""
        with self._changed:
            return self._waiting

    def allocate(self, request: AllocationRequest, timeout: float | None = None) -> Allocation:
        """Hold devices for ``request``, all or none.

        Without ``timeout`` it raises ``AllocationError`` at once when the devices are busy; with
        one it waits up to ``timeout`` seconds (``math.inf``: no limit) for releases. A request
        this pool could not meet even when empty raises at once, saying which constraint fails;
        so does a waiting one once devices leaving the pool make it impossible. A lease that
        runs out while it waits frees its devices as a release does.
        """
        with self._changed:
            deadline = self._deadline(timeout)
            filters = static_filters(request, self._holdings)
            while True:
                self._expire_due()
                found = candidates(request, self._holdings, filters, self._rack_of)
                # Checked on every pass: another thread may take the name while this one waits.
                self._check_name(request)
                picked = self._pick_now(request, found)
                if picked is not None:
                    return self._commit(request, picked)
                now = self._clock.now()
                if deadline <= now:
                    raise busy_error(request, self._holdings, found, timeout, self._rack_of)
                # Wake for a lease that ends before the deadline: it frees devices too.
                wait = min(deadline, self._next_expiry()) - now
                self._waiting += 1
                try:
                    self._changed.wait(None if math.isinf(wait) else max(wait, 0.0))
                finally:
                    self._waiting -= 1

    def try_allocate(self, request: AllocationRequest) -> Allocation | None:
        """Like ``allocate`` without waiting, but ``None`` when the devices are busy right now.

        A request that can never be met, or that names unknown devices or allocations, still
        raises ``AllocationError``: ``None`` would hide a mistake behind an endless retry.
        """
        with self._changed:
            self._expire_due()
            self._check_name(request)
            filters = static_filters(request, self._holdings)
            found = candidates(request, self._holdings, filters, self._rack_of)
            picked = self._pick_now(request, found)
            return None if picked is None else self._commit(request, picked)

    def release(self, allocation: Allocation, missing_ok: bool = False) -> None:
        """Give back every device of ``allocation`` and wake waiters.

        Releasing an allocation that has ended (released, its lease run out, a device removed)
        raises ``AllocationError`` saying how it ended, unless ``missing_ok`` (a ``with``
        block's exit).
        """
        with self._changed:
            self._expire_due()
            if self._live(allocation, missing_ok):
                self._end(allocation, EndCause.RELEASED, "released")

    def renew(self, allocation: Allocation, lease: float | None = None) -> float:
        """Restart ``allocation``'s lease: it now ends ``lease`` seconds from now (default: as
        long as its last lease). Returns that clock time. ``AllocationError`` if the allocation
        has ended or has no lease and ``lease`` is not given."""
        problems = lease_problems(lease)
        if problems:
            raise ConfigError(problems)
        with self._changed:
            self._expire_due()
            self._live(allocation, missing_ok=False)
            seconds = lease if lease is not None else allocation._lease
            if seconds is None:
                raise AllocationError(
                    f"allocation {allocation.name!r} has no lease to renew; pass lease= to "
                    "give it one"
                )
            allocation._lease = seconds
            allocation._expires_at = self._clock.now() + seconds
            return allocation._expires_at

    def expire(self) -> tuple[Allocation, ...]:
        """End every allocation whose lease has run out, wake waiters, and return those ended.

        Every call of the pool does this first; a holder of a ``Clock`` that moves by itself
        (a test's ``ManualClock``) calls it after moving the clock.
        """
        with self._changed:
            return tuple(self._expire_due())

    def holds(self, allocation: Allocation) -> bool:
        """Whether ``allocation`` is live in this pool."""
        with self._changed:
            self._expire_due()
            return self._holdings.allocations.get(allocation.name) is allocation

    def add_device(self, device: Device) -> None:
        """Add ``device`` to the pool (after the others) and wake waiters that may now fit.

        ``ConfigError`` for something that is not a ``Device`` or a ``rack`` other than the one
        the pool knows for its node; ``DuplicateMember`` (also a ``ConfigError``) for an id
        already in the pool.
        """
        with self._changed:
            if not isinstance(device, Device):
                raise ConfigError([("device", f"expected a Device, got {device!r}")])
            if device.id in self._holdings.position:
                raise DuplicateMember(
                    [("device.id", f"duplicate id {device.id!r}: the pool has a device with it")]
                )
            problems = _rack_problems(device, "device", self._rack_of)
            if problems:
                raise ConfigError(problems)
            self._holdings.add(device)
            self._changed.notify_all()

    def remove_device(self, device_id: str, reason: str | None = None) -> tuple[Allocation, ...]:
        """Take ``device_id`` out of the pool. Every allocation that holds it ends (all of its
        devices are given back: an allocation is all or nothing), with ``EndCause.DEVICE_REMOVED``
        and a reason that names the device and ``reason``; they are returned. Waiters wake, and
        a waiting request the pool can no longer meet raises. ``UnknownDevice`` for an unknown id.
        """
        if reason is not None and not isinstance(reason, str):
            raise ConfigError([("reason", f"expected text or None, got {reason!r}")])
        with self._changed:
            self._expire_due()
            position = self._holdings.position_of(device_id)
            why = f"device {device_id!r} was removed from the pool"
            ended = self._holdings.holding(position)
            for allocation in ended:
                self._end(
                    allocation, EndCause.DEVICE_REMOVED, f"{why}: {reason}" if reason else why
                )
            self._holdings.remove(position)
            self._changed.notify_all()
            return tuple(ended)

    def mark_unhealthy(self, device_id: str) -> None:
        """Never allocate ``device_id`` again until ``mark_healthy``; current holders keep it."""
        with self._changed:
            self._device(device_id).state.healthy = False

    def mark_healthy(self, device_id: str) -> None:
        """Let ``device_id`` be allocated again, and wake waiters that may now fit."""
        with self._changed:
            self._device(device_id).state.healthy = True
            self._changed.notify_all()

    def snapshot(self) -> PoolSnapshot:
        """Holders and free memory of every device, live allocations, when their leases end and
        waiters, consistently."""
        with self._changed:
            self._expire_due()
            live = self._holdings.allocations
            allocations = {name: a.device_ids for name, a in live.items()}
            expires = {name: a._expires_at for name, a in live.items() if a._expires_at is not None}
            return PoolSnapshot(self._holdings.usage(), allocations, self._waiting, expires)

    def validate_state(self) -> None:
        """Check every invariant between allocations and devices (``AssertionError``)."""
        with self._changed:
            self._expire_due()
            self._holdings.validate()
            for allocation in self._holdings.allocations.values():
                if allocation.request.affinity.same_rack:
                    racks = {rack_key(d.node, self._rack_of) for d in allocation.devices}
                    assert len(racks) == 1, (
                        f"{allocation.name!r} asked for one rack but spans {sorted(racks)}"
                    )

    # -- ending (all under the lock) ---------------------------------------------------------

    def _live(self, allocation: Allocation, missing_ok: bool) -> bool:
        """Whether ``allocation`` is live here; if not, ``AllocationError`` saying how it ended
        (unless ``missing_ok``)."""
        if allocation.pool is not self:
            raise AllocationError(f"allocation {allocation.name!r} belongs to another pool")
        if self._holdings.allocations.get(allocation.name) is allocation:
            return True
        if missing_ok:
            return False
        end = allocation._end
        if end is None or end.cause is EndCause.RELEASED:
            raise AllocationError(f"allocation {allocation.name!r} was already released")
        raise AllocationError(f"allocation {allocation.name!r} has ended: {end.reason}")

    def _end(self, allocation: Allocation, cause: EndCause, reason: str) -> None:
        self._holdings.drop(allocation)
        allocation._end = AllocationEnd(cause, reason, self._clock.now())
        self._changed.notify_all()

    def _expire_due(self) -> list[Allocation]:
        now = self._clock.now()
        due = [
            a
            for a in self._holdings.allocations.values()
            if a._expires_at is not None and a._expires_at <= now
        ]
        for allocation in due:
            self._end(
                allocation,
                EndCause.LEASE_EXPIRED,
                f"its lease of {allocation._lease:g} s ran out without a renewal",
            )
        return due

    def _next_expiry(self) -> float:
        live = self._holdings.allocations.values()
        return min((a._expires_at for a in live if a._expires_at is not None), default=math.inf)

    def _deadline(self, timeout: float | None) -> float:
        """The clock time to give up at (``-inf``: do not wait)."""
        if timeout is None:
            return -math.inf
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or math.isnan(timeout)
            or timeout < 0
        ):
            raise ConfigError(
                [
                    (
                        "timeout",
                        f"expected seconds >= 0 (math.inf: no limit) or None, got {timeout!r}",
                    )
                ]
            )
        return self._clock.now() + timeout

    # -- choosing and committing (all under the lock) -------------------------------------

    def _check_name(self, request: AllocationRequest) -> None:
        if request.name is not None and request.name in self._holdings.allocations:
            raise AllocationError(
                f"name: allocation {request.name!r} is live; release it or pick another name"
            )

    def _pick_now(self, request: AllocationRequest, found: list[int]) -> list[int] | None:
        links = self._links if self._topology else None
        now = usable(request, self._holdings, found)[0]
        return pick_placed(now, request, self._rack_of, links)

    def _links(self, positions: Sequence[int]) -> npt.NDArray[np.float64]:
        return device_bandwidth([self._holdings.devices[p] for p in positions], self._topology)

    def _commit(self, request: AllocationRequest, positions: list[int]) -> Allocation:
        name = request.name or self._fresh_name()
        expires = None if request.lease is None else self._clock.now() + request.lease
        devices = [self._holdings.devices[p] for p in positions]
        allocation = Allocation(self, name, request, devices, expires)
        self._holdings.hold(allocation, positions)
        return allocation

    def _fresh_name(self) -> str:
        while True:
            name = f"alloc-{next(self._serial)}"
            if name not in self._holdings.allocations:
                return name

    def _device(self, device_id: str) -> Device:
        return self._holdings.devices[self._holdings.position_of(device_id)]


def _device_problems(devices: Sequence[Device]) -> Problems:
    problems: Problems = []
    first: dict[str, int] = {}
    for i, device in enumerate(devices):
        if not isinstance(device, Device):
            problems.append((f"devices[{i}]", f"expected a Device, got {device!r}"))
        elif device.id in first:
            problems.append(
                (
                    f"devices[{i}].id",
                    f"duplicate id {device.id!r} (also devices[{first[device.id]}])",
                )
            )
        else:
            first[device.id] = i
    return problems


def _topology_problems(topology: Mapping[str, Topology] | None) -> Problems:
    if topology is None:
        return []
    if not isinstance(topology, Mapping):
        return [("topology", f"expected {{node: Topology}}, got {topology!r}")]
    return [
        (f"topology[{node!r}]", f"expected a Topology, got {value!r}")
        for node, value in topology.items()
        if not isinstance(value, Topology)
    ]


def _racks_given(
    racks: Mapping[str, str] | NodeTopology | None, problems: Problems
) -> dict[str, str]:
    """``racks`` as ``{node: rack}``; what is wrong with it goes to ``problems``."""
    if racks is None:
        return {}
    if isinstance(racks, NodeTopology):
        return racks.rack_of
    if not isinstance(racks, Mapping):
        problems.append(("racks", f"expected {{node: rack}} or a NodeTopology, got {racks!r}"))
        return {}
    rack_of: dict[str, str] = {}
    for node, rack in racks.items():
        if not isinstance(node, str) or not node:
            problems.append(("racks", f"expected node names as keys, got {node!r}"))
        elif not isinstance(rack, str) or not rack.strip():
            problems.append((f"racks[{node!r}]", f"expected a rack name, got {rack!r}"))
        else:
            rack_of[node] = rack
    return rack_of


def _rack_problems(device: Device, where: str, rack_of: dict[str, str]) -> Problems:
    """What is wrong with ``device.rack`` given the racks known so far; a rack it brings for a
    node of unknown rack is recorded in ``rack_of``, since one device names its node's rack."""
    rack = device.rack
    if rack is None:
        return []
    if not isinstance(rack, str) or not rack.strip():
        return [(f"{where}.rack", f"expected a rack name or None (unknown), got {rack!r}")]
    known = rack_of.setdefault(device.node, rack)
    if known != rack:
        return [
            (
                f"{where}.rack",
                f"{rack!r} contradicts rack {known!r} that the pool has for node "
                f"{device.node!r} (a node is in one rack); allowed: {known!r} or None",
            )
        ]
    return []
