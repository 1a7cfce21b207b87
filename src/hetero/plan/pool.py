"""Allocation: holding devices of a pool for a request, all or nothing, until it ends.

A request (``AllocationRequest``) asks for ``count`` devices of a kind or model with some memory
(and compute) each, shared or exclusive, with affinity (one node, an interconnect, named devices,
tags) and anti-affinity (one device per node, devices to avoid, the devices or nodes of named
allocations). ``DevicePool.allocate`` computes the whole pick from the current state before it
changes anything and commits it in one step, so a request holds every device it asked for or
none; where links are known it takes the best-connected group (``plan/placement.py``). With a
``timeout`` it waits for releases. Devices join and leave at run time; an allocation ends when
released, when one of its devices leaves, or when its lease runs out. One lock guards all
state. See ``docs/allocation.md``.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np
import numpy.typing as npt

from hetero._format import count
from hetero.devices.rings import device_bandwidth
from hetero.devices.spec import Device
from hetero.devices.topology import Topology
from hetero.errors import AllocationError, ConfigError, DeviceError
from hetero.plan.allocation import (
    Allocation,
    AllocationEnd,
    DeviceUsage,
    EndCause,
    PoolSnapshot,
)
from hetero.plan.placement import Usable, gpu_of, one_slice_per_gpu, pick
from hetero.plan.request import (
    AllocationRequest,
    AntiAffinity,
    Problems,
    closest,
    lease_problems,
    norm_name,
)
from hetero.sched.clock import Clock, MonotonicClock
from hetero.units import format_size

__all__ = ["DevicePool"]

_Filters = list[tuple[str, Callable[[Device], bool]]]


@dataclass(slots=True)
class _Holders:
    """Who holds one device: bytes per allocation name, and the exclusive holder if any."""

    memory: dict[str, int] = field(default_factory=dict)
    exclusive: str | None = None

    def hold(self, name: str, memory: int, exclusive: bool) -> None:
        self.memory[name] = memory
        if exclusive:
            self.exclusive = name

    def drop(self, name: str) -> None:
        del self.memory[name]
        if self.exclusive == name:
            self.exclusive = None

    @property
    def held(self) -> int:
        return sum(self.memory.values())


class DevicePool:
    """Devices handed out to ``AllocationRequest``s; thread-safe (one lock around all state).

    Health is read from each device's ``state.healthy``; ``mark_unhealthy``/``mark_healthy``
    set it (and wake waiters). Memory is the pool's own reservations against
    ``Device.memory_bytes``, not the driver's live usage. ``topology`` gives the GPU topology of
    each node (``{node: Topology}``, e.g. ``read_topology()`` on that node), which the pick
    uses to prefer the best-connected group. ``clock`` (a ``Clock``, real time by default)
    times leases and waits.
    """

    def __init__(
        self,
        devices: Sequence[Device],
        *,
        topology: Mapping[str, Topology] | None = None,
        clock: Clock | None = None,
    ) -> None:
        problems: Problems = []
        self._position: dict[str, int] = {}
        for i, device in enumerate(devices):
            if not isinstance(device, Device):
                problems.append((f"devices[{i}]", f"expected a Device, got {device!r}"))
            elif device.id in self._position:
                first = self._position[device.id]
                problems.append(
                    (f"devices[{i}].id", f"duplicate id {device.id!r} (also devices[{first}])")
                )
            else:
                self._position[device.id] = i
        problems += _topology_problems(topology)
        if problems:
            raise ConfigError(problems)
        self._devices: list[Device] = list(devices)
        self._holders = [_Holders() for _ in self._devices]
        self._topology: Mapping[str, Topology] = dict(topology or {})
        self._clock: Clock = clock or MonotonicClock()
        self._allocations: dict[str, Allocation] = {}
        self._changed = threading.Condition(threading.Lock())
        self._serial = itertools.count(1)
        self._waiting = 0

    @property
    def devices(self) -> tuple[Device, ...]:
        """The devices in the pool now, in the order they joined."""
        with self._changed:
            return tuple(self._devices)

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
            filters = self._static_filters(request)
            while True:
                self._expire_due()
                candidates = self._candidates(request, filters)
                # Checked on every pass: another thread may take the name while this one waits.
                self._check_name(request)
                picked = self._pick_now(request, candidates)
                if picked is not None:
                    return self._commit(request, picked)
                now = self._clock.now()
                if deadline <= now:
                    self._raise_busy(request, candidates, timeout)
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
            candidates = self._candidates(request, self._static_filters(request))
            picked = self._pick_now(request, candidates)
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
            return self._allocations.get(allocation.name) is allocation

    def add_device(self, device: Device) -> None:
        """Add ``device`` to the pool (after the others) and wake waiters that may now fit.

        ``ConfigError`` for something that is not a ``Device`` or an id already in the pool.
        """
        with self._changed:
            if not isinstance(device, Device):
                raise ConfigError([("device", f"expected a Device, got {device!r}")])
            if device.id in self._position:
                raise ConfigError(
                    [("device.id", f"duplicate id {device.id!r}: the pool has a device with it")]
                )
            self._position[device.id] = len(self._devices)
            self._devices.append(device)
            self._holders.append(_Holders())
            self._changed.notify_all()

    def remove_device(self, device_id: str, reason: str | None = None) -> tuple[Allocation, ...]:
        """Take ``device_id`` out of the pool. Every allocation that holds it ends (all of its
        devices are given back: an allocation is all or nothing), with ``EndCause.DEVICE_REMOVED``
        and a reason that names the device and ``reason``; they are returned. Waiters wake, and
        a waiting request the pool can no longer meet raises. ``DeviceError`` for an unknown id.
        """
        if reason is not None and not isinstance(reason, str):
            raise ConfigError([("reason", f"expected text or None, got {reason!r}")])
        with self._changed:
            self._expire_due()
            position = self._position_of(device_id)
            why = f"device {device_id!r} was removed from the pool"
            ended = [self._allocations[name] for name in self._holders[position].memory]
            for allocation in ended:
                self._end(
                    allocation, EndCause.DEVICE_REMOVED, f"{why}: {reason}" if reason else why
                )
            del self._devices[position]
            del self._holders[position]
            self._position = {device.id: i for i, device in enumerate(self._devices)}
            self._changed.notify_all()
            return tuple(ended)

    def mark_unhealthy(self, device_id: str) -> None:
        """Never allocate ``device_id`` again until ``mark_healthy``; current holders keep it."""
        with self._changed:
            self._devices[self._position_of(device_id)].state.healthy = False

    def mark_healthy(self, device_id: str) -> None:
        """Let ``device_id`` be allocated again, and wake waiters that may now fit."""
        with self._changed:
            self._devices[self._position_of(device_id)].state.healthy = True
            self._changed.notify_all()

    def snapshot(self) -> PoolSnapshot:
        """Holders and free memory of every device, live allocations, when their leases end and
        waiters, consistently."""
        with self._changed:
            self._expire_due()
            usage = tuple(
                DeviceUsage(
                    id=device.id,
                    node=device.node,
                    model=device.model,
                    healthy=device.state.healthy,
                    memory_bytes=device.memory_bytes,
                    memory_free=device.memory_bytes - holders.held,
                    holders=dict(holders.memory),
                    exclusive=holders.exclusive,
                )
                for device, holders in zip(self._devices, self._holders, strict=True)
            )
            allocations = {name: a.device_ids for name, a in self._allocations.items()}
            expires = {
                name: a._expires_at
                for name, a in self._allocations.items()
                if a._expires_at is not None
            }
            return PoolSnapshot(usage, allocations, self._waiting, expires)

    def validate_state(self) -> None:
        """Check every invariant between allocations and devices (``AssertionError``)."""
        with self._changed:
            self._expire_due()
            _check(
                len(self._devices) == len(self._holders) == len(self._position)
                and all(self._position.get(d.id) == i for i, d in enumerate(self._devices)),
                "the device index does not match the device list",
            )
            for name, allocation in self._allocations.items():
                self._validate_allocation(name, allocation)
            for device, holders in zip(self._devices, self._holders, strict=True):
                _check(
                    holders.held <= device.memory_bytes,
                    f"{device.id}: {holders.held} bytes held of {device.memory_bytes}",
                )
                unknown = set(holders.memory) - set(self._allocations)
                _check(not unknown, f"{device.id}: held by released allocations {unknown}")
                if holders.exclusive is not None:
                    _check(
                        list(holders.memory) == [holders.exclusive],
                        f"{device.id}: exclusive to {holders.exclusive!r} but held by "
                        f"{sorted(holders.memory)}",
                    )

    def _validate_allocation(self, name: str, allocation: Allocation) -> None:
        request = allocation.request
        ids = allocation.device_ids
        _check(allocation.name == name, f"{name}: registered as {allocation.name!r}")
        _check(allocation._end is None, f"{name}: live but ended ({allocation._end})")
        _check(
            len(set(ids)) == len(ids) == request.count,
            f"{name}: holds {list(ids)} for a request of {request.count}",
        )
        gpus = [gpu for gpu in map(gpu_of, allocation.devices) if gpu is not None]
        _check(len(set(gpus)) == len(gpus), f"{name}: two devices on one GPU: {gpus}")
        _check(
            (allocation._lease is None) == (allocation._expires_at is None),
            f"{name}: lease {allocation._lease} but expiry {allocation._expires_at}",
        )
        nodes = [device.node for device in allocation.devices]
        if request.grouping == "one_node":
            _check(len(set(nodes)) == 1, f"{name}: on nodes {nodes}, asked for one")
        elif request.grouping == "spread":
            _check(len(set(nodes)) == len(nodes), f"{name}: nodes {nodes} repeat")
        for device in allocation.devices:
            position = self._position.get(device.id)
            if position is None or self._devices[position] is not device:
                raise AssertionError(f"{name}: holds {device.id!r}, which is not in the pool")
            holders = self._holders[position]
            _check(
                holders.memory.get(name) == request.memory,
                f"{name}: {device.id} does not record its {request.memory} bytes",
            )
            if request.exclusive:
                _check(holders.exclusive == name, f"{name}: {device.id} not exclusive to it")

    # -- ending (all under the lock) ---------------------------------------------------------

    def _live(self, allocation: Allocation, missing_ok: bool) -> bool:
        """Whether ``allocation`` is live here; if not, ``AllocationError`` saying how it ended
        (unless ``missing_ok``)."""
        if allocation.pool is not self:
            raise AllocationError(f"allocation {allocation.name!r} belongs to another pool")
        if self._allocations.get(allocation.name) is allocation:
            return True
        if missing_ok:
            return False
        end = allocation._end
        if end is None or end.cause is EndCause.RELEASED:
            raise AllocationError(f"allocation {allocation.name!r} was already released")
        raise AllocationError(f"allocation {allocation.name!r} has ended: {end.reason}")

    def _end(self, allocation: Allocation, cause: EndCause, reason: str) -> None:
        del self._allocations[allocation.name]
        for device in allocation.devices:
            self._holders[self._position[device.id]].drop(allocation.name)
        allocation._end = AllocationEnd(cause, reason, self._clock.now())
        self._changed.notify_all()

    def _expire_due(self) -> list[Allocation]:
        now = self._clock.now()
        due = [
            a
            for a in self._allocations.values()
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
        return min(
            (a._expires_at for a in self._allocations.values() if a._expires_at is not None),
            default=math.inf,
        )

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

    # -- choosing (all under the lock) -------------------------------------------------------

    def _candidates(self, request: AllocationRequest, filters: _Filters) -> list[int]:
        """Positions of the devices that pass ``filters`` (the request's fixed constraints).

        Raises ``AllocationError`` for a request that these devices could never meet, even
        with nothing held.
        """
        positions = list(range(len(self._devices)))
        funnel = [f"the pool has {count(len(positions), 'device')}"]
        for label, keep in filters:
            positions = [p for p in positions if keep(self._devices[p])]
            funnel.append(f"{len(positions)} {label}")
            if not positions:
                break
        distinct = one_slice_per_gpu(
            [(0, p, self._devices[p].node) for p in positions], self._devices
        )
        if len(distinct) < len(positions):
            funnel.append(
                f"{len(distinct)} on distinct GPUs (MIG slices of one GPU never share an "
                "allocation)"
            )
        if pick(distinct, request) is None:
            usable = [p for _, p, _ in distinct]
            detail = self._grouping_detail(request, positions, usable, "")
            raise AllocationError(
                f"request can never be met by this pool: need {request.describe()}; "
                f"{', '.join(funnel)}{detail}"
            )
        return positions

    def _static_filters(self, request: AllocationRequest) -> _Filters:
        """The request's fixed constraints as ``(what passing devices are, test)``, in order.

        Tests of devices, not positions, so they hold while devices come and go. Raises
        ``AllocationError`` for unknown device ids or allocation names.
        """
        affinity, anti = request.affinity, request.anti_affinity
        filters: _Filters = []
        if affinity.devices:
            wanted = set(self._known_ids(affinity.devices, "affinity.devices"))
            filters.append(("are in affinity.devices", lambda d: d.id in wanted))
        if request.kind is not None:
            kind = request.kind
            filters.append((f"are {kind}s", lambda d: d.kind == kind))
        if request.model is not None:
            model = request.model
            filters.append((f"are {model}", lambda d: d.model == model))
        if affinity.tags:
            tags = frozenset(affinity.tags)
            filters.append((f"carry {', '.join(sorted(tags))}", lambda d: tags <= d.tags))
        if affinity.interconnect is not None:
            wire = self._known_interconnect(affinity.interconnect)
            filters.append(
                (
                    f"have {affinity.interconnect} interconnect",
                    lambda d: norm_name(d.spec.interconnect).startswith(wire),
                )
            )
        if request.memory:
            memory = request.memory
            filters.append(
                (f"have at least {format_size(memory)}", lambda d: d.memory_bytes >= memory)
            )
        if request.min_tflops is not None:
            tflops, dtype = request.min_tflops, request.dtype
            filters.append(
                (
                    f"reach {tflops:g} {dtype} TFLOPS",
                    lambda d: d.spec.peak_tflops(dtype) >= tflops,
                )
            )
        if anti.avoid:
            avoid = set(self._known_ids(anti.avoid, "anti_affinity.avoid"))
            filters.append(("are not in anti_affinity.avoid", lambda d: d.id not in avoid))
        if anti.allocations:
            filters.append(self._away_from(anti))
        return filters

    def _away_from(self, anti: AntiAffinity) -> tuple[str, Callable[[Device], bool]]:
        # The named allocations' devices are read once, when the request arrives: a waiting
        # request keeps away from them even if they are released meanwhile.
        held: list[Device] = []
        for name in anti.allocations:
            allocation = self._allocations.get(name)
            if allocation is None:
                live = self._allocations
                hint = closest(name, live) if live else " (no allocation is live)"
                raise AllocationError(
                    f"anti_affinity.allocations: no live allocation named {name!r}{hint}"
                )
            held.extend(allocation.devices)
        names = ", ".join(anti.allocations)
        if anti.level == "node":
            nodes = {device.node for device in held}
            return f"are off the nodes of {names}", lambda d: d.node not in nodes
        ids = {device.id for device in held}
        return f"are not held by {names}", lambda d: d.id not in ids

    def _check_name(self, request: AllocationRequest) -> None:
        if request.name is not None and request.name in self._allocations:
            raise AllocationError(
                f"name: allocation {request.name!r} is live; release it or pick another name"
            )

    def _known_ids(self, ids: Collection[str], path: str) -> Collection[str]:
        for device_id in ids:
            if device_id not in self._position:
                raise AllocationError(
                    f"{path}: no device {device_id!r} in this pool"
                    f"{closest(device_id, self._position)}"
                )
        return ids

    def _known_interconnect(self, wanted: str) -> str:
        """``wanted`` normalized, if some device's interconnect starts with it."""
        key = norm_name(wanted)
        wires = sorted({device.spec.interconnect for device in self._devices})
        if not any(norm_name(wire).startswith(key) for wire in wires):
            # Families ("NVLink" of "NVLink3") are what people type, so suggest those too.
            families = {re.sub(r"[\d.]+$", "", wire) for wire in wires} | set(wires)
            raise AllocationError(
                f"affinity.interconnect: no device in this pool has {wanted!r}"
                f"{closest(wanted, families)}; the pool has: {', '.join(wires) or 'no devices'}"
            )
        return key

    def _usable(
        self, request: AllocationRequest, candidates: list[int]
    ) -> tuple[list[Usable], dict[str, int]]:
        """Candidates usable now, one slice per GPU; counts of why the others are not."""
        usable: list[Usable] = []
        reasons: dict[str, int] = {}
        for position in candidates:
            device, holders = self._devices[position], self._holders[position]
            free = device.memory_bytes - holders.held
            if not device.state.healthy:
                reason = "unhealthy"
            elif holders.exclusive is not None:
                reason = "held exclusively"
            elif request.exclusive and holders.memory:
                reason = "shared by other allocations"
            elif free < request.memory:
                reason = f"with less than {format_size(request.memory)} free"
            else:
                usable.append((free - request.memory, position, device.node))
                continue
            reasons[reason] = reasons.get(reason, 0) + 1
        return one_slice_per_gpu(usable, self._devices), reasons

    def _pick_now(self, request: AllocationRequest, candidates: list[int]) -> list[int] | None:
        links = self._links if self._topology else None
        return pick(self._usable(request, candidates)[0], request, links)

    def _links(self, positions: Sequence[int]) -> npt.NDArray[np.float64]:
        return device_bandwidth([self._devices[p] for p in positions], self._topology)

    def _raise_busy(
        self, request: AllocationRequest, candidates: list[int], timeout: float | None
    ) -> NoReturn:
        usable, reasons = self._usable(request, candidates)
        why = ", ".join(f"{n} {reason}" for reason, n in reasons.items())
        of = f"of {len(candidates)} matching devices, {why}" if why else ""
        detail = self._grouping_detail(request, candidates, [p for _, p, _ in usable], " usable")
        if timeout is None:
            head = f"cannot allocate {request.describe()} now"
            hint = " (pass timeout= to wait for releases)"
        else:
            head = f"timed out after {timeout:g} s waiting for {request.describe()}"
            hint = ""
        raise AllocationError(f"{head}: {of or 'no matching device is usable'}{detail}{hint}")

    def _grouping_detail(
        self, request: AllocationRequest, candidates: list[int], usable: list[int], what: str
    ) -> str:
        """How many ``usable`` devices each node of the ``candidates`` has, when that matters."""
        if request.grouping == "any":
            return f"; {len(usable)}{what} in all" if what else ""
        per_node = dict.fromkeys((self._devices[p].node for p in candidates), 0)
        for position in usable:
            per_node[self._devices[position].node] += 1
        if request.grouping == "one_node":
            head = f"at most {max(per_node.values(), default=0)}{what} on one node"
        else:
            occupied = sum(n > 0 for n in per_node.values())
            nodes = "node" if occupied == 1 else "nodes"
            head = f"{what.strip() or 'matching'} devices on only {occupied} {nodes}"
        shown = ", ".join(f"node {node!r} has {n}" for node, n in list(per_node.items())[:8])
        more = f" and {len(per_node) - 8} more nodes" if len(per_node) > 8 else ""
        return f"; {head}: {shown}{more}" if per_node else f"; {head}"

    def _commit(self, request: AllocationRequest, positions: list[int]) -> Allocation:
        name = request.name or self._fresh_name()
        expires = None if request.lease is None else self._clock.now() + request.lease
        devices = [self._devices[p] for p in positions]
        allocation = Allocation(self, name, request, devices, expires)
        done: list[int] = []
        try:
            for position in positions:
                self._holders[position].hold(name, request.memory, request.exclusive)
                done.append(position)
        except BaseException:
            for position in done:
                self._holders[position].drop(name)
            raise
        self._allocations[name] = allocation
        return allocation

    def _fresh_name(self) -> str:
        while True:
            name = f"alloc-{next(self._serial)}"
            if name not in self._allocations:
                return name

    def _position_of(self, device_id: str) -> int:
        position = self._position.get(device_id)
        if position is None:
            raise DeviceError(
                f"no device {device_id!r} in this pool{closest(device_id, self._position)}"
            )
        return position


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


def _check(condition: bool, message: str) -> None:
    # An explicit raise, not ``assert``: the checks must also run under ``python -O``.
    if not condition:
        raise AssertionError(message)
