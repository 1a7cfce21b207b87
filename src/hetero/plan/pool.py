"""Allocation: holding devices of a pool for a request, all or nothing, until release.

A request (``AllocationRequest``) asks for ``count`` devices of a kind or model with some memory
each, shared or exclusive, with affinity (one node, an interconnect, named devices, tags) and
anti-affinity (one device per node, devices to avoid, the devices or nodes of named allocations).
``DevicePool.allocate`` computes the whole pick from the current state before it changes
anything and commits it in one step, so a request holds every device it asked for or none.
With a ``timeout`` it waits for releases. One lock guards all state. See ``docs/allocation.md``.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NoReturn

from hetero._format import count
from hetero.devices.spec import Device
from hetero.errors import AllocationError, ConfigError, DeviceError
from hetero.plan.request import AllocationRequest, AntiAffinity, Problems, closest, norm_name
from hetero.units import format_size

__all__ = ["Allocation", "DevicePool", "DeviceUsage", "PoolSnapshot"]


class Allocation:
    """Devices held for one request until ``release()`` or the end of a ``with`` block."""

    __slots__ = ("_pool", "devices", "name", "request")

    def __init__(
        self, pool: DevicePool, name: str, request: AllocationRequest, devices: Sequence[Device]
    ) -> None:
        self._pool = pool
        self.name = name
        self.request = request
        self.devices: tuple[Device, ...] = tuple(devices)

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
    def released(self) -> bool:
        return not self._pool.holds(self)

    def release(self) -> None:
        """Give the devices back (``AllocationError`` if already released)."""
        self._pool.release(self)

    def __enter__(self) -> Allocation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Releasing inside the block is allowed; the exit then has nothing left to give back.
        self._pool.release(self, missing_ok=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": list(self.device_ids),
            "nodes": list(self.nodes),
            "memory_bytes": self.memory,
            "exclusive": self.exclusive,
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
    """A consistent copy of a pool's state, taken under its lock."""

    devices: tuple[DeviceUsage, ...]
    allocations: Mapping[str, tuple[str, ...]] = field(hash=False)
    waiting: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": [usage.to_dict() for usage in self.devices],
            "allocations": {name: list(ids) for name, ids in self.allocations.items()},
            "waiting": self.waiting,
        }


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
    ``Device.memory_bytes``, not the driver's live usage.
    """

    def __init__(self, devices: Sequence[Device]) -> None:
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
        if problems:
            raise ConfigError(problems)
        self._devices: tuple[Device, ...] = tuple(devices)
        self._holders = [_Holders() for _ in self._devices]
        self._allocations: dict[str, Allocation] = {}
        self._changed = threading.Condition(threading.Lock())
        self._serial = itertools.count(1)
        self._waiting = 0

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    @property
    def waiting(self) -> int:
        """How many ``allocate`` calls are waiting for a release right now."""
        with self._changed:
            return self._waiting

    def allocate(self, request: AllocationRequest, timeout: float | None = None) -> Allocation:
        """Hold devices for ``request``, all or none.

        Without ``timeout`` it raises ``AllocationError`` at once when the devices are busy; with
        one it waits up to ``timeout`` seconds (``math.inf``: no limit) for releases. A request
        this pool could not meet even when empty raises at once, saying which constraint fails.
        """
        deadline = _deadline(timeout)
        with self._changed:
            candidates = self._candidates(request)
            while True:
                # Checked on every pass: another thread may take the name while this one waits.
                self._check_name(request)
                picked = self._pick_now(request, candidates)
                if picked is not None:
                    return self._commit(request, picked)
                left = deadline - time.monotonic()
                if left <= 0:
                    self._raise_busy(request, candidates, timeout)
                self._waiting += 1
                try:
                    self._changed.wait(None if math.isinf(left) else left)
                finally:
                    self._waiting -= 1

    def try_allocate(self, request: AllocationRequest) -> Allocation | None:
        """Like ``allocate`` without waiting, but ``None`` when the devices are busy right now.

        A request that can never be met, or that names unknown devices or allocations, still
        raises ``AllocationError``: ``None`` would hide a mistake behind an endless retry.
        """
        with self._changed:
            self._check_name(request)
            candidates = self._candidates(request)
            picked = self._pick_now(request, candidates)
            return None if picked is None else self._commit(request, picked)

    def release(self, allocation: Allocation, missing_ok: bool = False) -> None:
        """Give back every device of ``allocation`` and wake waiters.

        Releasing twice raises ``AllocationError`` unless ``missing_ok`` (a ``with`` block's exit).
        """
        with self._changed:
            if allocation.pool is not self:
                raise AllocationError(f"allocation {allocation.name!r} belongs to another pool")
            if self._allocations.get(allocation.name) is not allocation:
                if missing_ok:
                    return
                raise AllocationError(f"allocation {allocation.name!r} was already released")
            del self._allocations[allocation.name]
            for device in allocation.devices:
                self._holders[self._position[device.id]].drop(allocation.name)
            self._changed.notify_all()

    def holds(self, allocation: Allocation) -> bool:
        """Whether ``allocation`` is live in this pool."""
        with self._changed:
            return self._allocations.get(allocation.name) is allocation

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
        """Holders and free memory of every device, live allocations and waiters, consistently."""
        with self._changed:
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
            return PoolSnapshot(usage, allocations, self._waiting)

    def validate_state(self) -> None:
        """Check every invariant between allocations and devices (``AssertionError``)."""
        with self._changed:
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
        _check(
            len(set(ids)) == len(ids) == request.count,
            f"{name}: holds {list(ids)} for a request of {request.count}",
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

    # -- choosing (all under the lock) -------------------------------------------------------

    def _candidates(self, request: AllocationRequest) -> list[int]:
        """Positions of the devices that suit ``request`` when the pool is empty.

        Raises ``AllocationError`` for unknown ids or allocation names, and for a request that
        these devices can never meet.
        """
        positions = list(range(len(self._devices)))
        funnel = [f"the pool has {count(len(positions), 'device')}"]
        for label, keep in self._static_filters(request):
            positions = [p for p in positions if keep(self._devices[p])]
            funnel.append(f"{len(positions)} {label}")
            if not positions:
                break
        if _pick([(0, p, self._devices[p].node) for p in positions], request) is None:
            detail = self._grouping_detail(request, positions, positions, "")
            raise AllocationError(
                f"request can never be met by this pool: need {request.describe()}; "
                f"{', '.join(funnel)}{detail}"
            )
        return positions

    def _static_filters(
        self, request: AllocationRequest
    ) -> list[tuple[str, Callable[[Device], bool]]]:
        """The request's fixed constraints as ``(what passing devices are, test)``, in order."""
        affinity, anti = request.affinity, request.anti_affinity
        filters: list[tuple[str, Callable[[Device], bool]]] = []
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
    ) -> tuple[list[tuple[int, int, str]], dict[str, int]]:
        """Candidates usable now as ``(leftover bytes, position, node)``; counts of why not."""
        usable: list[tuple[int, int, str]] = []
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
        return usable, reasons

    def _pick_now(self, request: AllocationRequest, candidates: list[int]) -> list[int] | None:
        return _pick(self._usable(request, candidates)[0], request)

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
        allocation = Allocation(self, name, request, [self._devices[p] for p in positions])
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

    def _device(self, device_id: str) -> Device:
        position = self._position.get(device_id)
        if position is None:
            raise DeviceError(
                f"no device {device_id!r} in this pool{closest(device_id, self._position)}"
            )
        return self._devices[position]


def _pick(usable: Sequence[tuple[int, int, str]], request: AllocationRequest) -> list[int] | None:
    """Positions of ``request.count`` devices out of ``usable`` ``(leftover, position, node)``.

    Best fit on the fewest nodes: whole nodes with the most usable devices first, then the rest
    from the node where it leaves the least memory over; ``spread`` takes each node's best fit.
    Ties go to the lower position, so the pick is deterministic. ``None`` when nothing fits.
    """
    count = request.count
    by_node: dict[str, list[tuple[int, int]]] = {}
    for leftover, position, node in sorted(usable):
        by_node.setdefault(node, []).append((leftover, position))
    fits = list(by_node.values())
    if request.grouping == "spread":
        best = sorted(node_fits[0] for node_fits in fits)
        return sorted(p for _, p in best[:count]) if len(best) >= count else None
    fits.sort(
        key=lambda node_fits: (-len(node_fits), sum(left for left, _ in node_fits), node_fits[0])
    )
    # Whole nodes, largest first, until the next one could finish the request by itself.
    taken: list[tuple[int, int]] = []
    first = 0
    while first < len(fits) and len(taken) + len(fits[first]) < count:
        taken.extend(fits[first])
        first += 1
    if first == len(fits) or (taken and request.grouping == "one_node"):
        return None
    rest = count - len(taken)
    last = min(
        (node_fits for node_fits in fits[first:] if len(node_fits) >= rest),
        key=lambda node_fits: (sum(left for left, _ in node_fits[:rest]), node_fits[0]),
    )
    return sorted(p for _, p in taken + last[:rest])


def _deadline(timeout: float | None) -> float:
    """The monotonic time to give up at (``-inf``: do not wait)."""
    if timeout is None:
        return -math.inf
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or math.isnan(timeout)
        or timeout < 0
    ):
        raise ConfigError(
            [("timeout", f"expected seconds >= 0 (math.inf: no limit) or None, got {timeout!r}")]
        )
    return time.monotonic() + timeout


def _check(condition: bool, message: str) -> None:
    # An explicit raise, not ``assert``: the checks must also run under ``python -O``.
    if not condition:
        raise AssertionError(message)
