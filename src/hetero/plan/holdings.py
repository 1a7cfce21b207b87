"""A ``DevicePool``'s books: its devices in the order they joined, who holds each and how much,
and the live allocations; ``validate`` checks every invariant between them. No lock and no
clock: the pool calls it under its lock and decides when allocations start and end."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hetero.devices.spec import Device
from hetero.errors import UnknownDevice
from hetero.plan.allocation import Allocation, DeviceUsage
from hetero.plan.placement import gpu_of
from hetero.plan.request import closest

__all__ = ["Holders", "Holdings"]


@dataclass(slots=True)
class Holders:
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


class Holdings:
    """The pool's devices (``devices``, ``position`` by id), their ``holders`` (one per device,
    in the same order) and the live ``allocations`` by name."""

    __slots__ = ("allocations", "devices", "holders", "position")

    def __init__(self, devices: Sequence[Device]) -> None:
        self.devices: list[Device] = list(devices)
        self.position: dict[str, int] = {device.id: i for i, device in enumerate(self.devices)}
        self.holders = [Holders() for _ in self.devices]
        self.allocations: dict[str, Allocation] = {}

    def position_of(self, device_id: str) -> int:
        """The position of ``device_id``; ``UnknownDevice`` naming the closest ids if unknown."""
        position = self.position.get(device_id)
        if position is None:
            raise UnknownDevice(
                f"no device {device_id!r} in this pool{closest(device_id, self.position)}"
            )
        return position

    def free(self, position: int) -> int:
        """Bytes of the device at ``position`` that no allocation holds."""
        return self.devices[position].memory_bytes - self.holders[position].held

    def add(self, device: Device) -> None:
        """Append ``device`` (its id is new: the pool checked it)."""
        self.position[device.id] = len(self.devices)
        self.devices.append(device)
        self.holders.append(Holders())

    def holding(self, position: int) -> list[Allocation]:
        """The live allocations that hold the device at ``position``."""
        return [self.allocations[name] for name in self.holders[position].memory]

    def remove(self, position: int) -> None:
        """Drop the device at ``position``; nothing may hold it any more."""
        del self.devices[position]
        del self.holders[position]
        self.position = {device.id: i for i, device in enumerate(self.devices)}

    def hold(self, allocation: Allocation, positions: Sequence[int]) -> None:
        """Record ``allocation`` on the devices at ``positions``, on all of them or none."""
        name, request = allocation.name, allocation.request
        done: list[int] = []
        try:
            for position in positions:
                self.holders[position].hold(name, request.memory, request.exclusive)
                done.append(position)
        except BaseException:
            for position in done:
                self.holders[position].drop(name)
            raise
        self.allocations[name] = allocation

    def drop(self, allocation: Allocation) -> None:
        """Forget ``allocation`` and free its devices."""
        del self.allocations[allocation.name]
        for device in allocation.devices:
            self.holders[self.position[device.id]].drop(allocation.name)

    def usage(self) -> tuple[DeviceUsage, ...]:
        """Every device's holders and free memory, in order."""
        return tuple(
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
            for device, holders in zip(self.devices, self.holders, strict=True)
        )

    def validate(self) -> None:
        """Check every invariant between allocations and devices (``AssertionError``)."""
        _check(
            len(self.devices) == len(self.holders) == len(self.position)
            and all(self.position.get(d.id) == i for i, d in enumerate(self.devices)),
            "the device index does not match the device list",
        )
        for name, allocation in self.allocations.items():
            self._validate_allocation(name, allocation)
        for device, holders in zip(self.devices, self.holders, strict=True):
            _check(
                holders.held <= device.memory_bytes,
                f"{device.id}: {holders.held} bytes held of {device.memory_bytes}",
            )
            unknown = set(holders.memory) - set(self.allocations)
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
            position = self.position.get(device.id)
            if position is None or self.devices[position] is not device:
                raise AssertionError(f"{name}: holds {device.id!r}, which is not in the pool")
            holders = self.holders[position]
            _check(
                holders.memory.get(name) == request.memory,
                f"{name}: {device.id} does not record its {request.memory} bytes",
            )
            if request.exclusive:
                _check(holders.exclusive == name, f"{name}: {device.id} not exclusive to it")


def _check(condition: bool, message: str) -> None:
    # An explicit raise, not ``assert``: the checks must also run under ``python -O``.
    if not condition:
        raise AssertionError(message)
