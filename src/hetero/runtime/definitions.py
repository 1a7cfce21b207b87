"""What the engine works out once per task definition (a ``TaskFunction``) rather than at every
submit: the code shipped to workers, pickled once under a key workers cache it by, and the
devices the task's options let it use."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import cloudpickle

from hetero.devices.spec import Device
from hetero.errors import HeteroError, NoCapableDevice
from hetero.runtime.tasks import TaskFunction
from hetero.sched.view import FleetView

__all__ = ["TaskDefinitions"]


class TaskDefinitions:
    """Pickled task functions by function object, and device selections by option values;
    ``owner`` prefixes the functions' keys, so that two engines in one process never share
    one."""

    def __init__(self, owner: int) -> None:
        self._owner = owner
        self._entries: dict[tuple[int, int], tuple[Any, tuple[str, bytes]]] = {}
        self._keys = itertools.count()
        self._placements: dict[tuple[Any, Any], list[str]] = {}

    def fleet_changed(self) -> None:
        """A device joined: device selections have one more device to match."""
        self._placements.clear()

    def code(self, spec: TaskFunction[Any, Any]) -> tuple[str, bytes]:
        """``spec``'s code as ``(key, cloudpickled bytes)``: its function, or its variants by
        device kind (with the function as the ``default`` one)."""
        variants = spec.options.variants
        obj: Any = spec.fn if not variants else dict(variants)
        if variants and "default" not in variants:
            obj.setdefault("default", spec.fn)
        # Keyed by the function object (kept alive here, so its id stays unique), not by the
        # TaskFunction: submitting a plain function wraps it anew each time.
        cache_key = (id(spec.fn), id(variants) if variants else 0)
        cached = self._entries.get(cache_key)
        if cached is not None:
            return cached[1]
        try:
            blob = cloudpickle.dumps(obj, protocol=5)
        except Exception as exc:
            raise HeteroError(
                f"task {spec.name!r} cannot be sent to a worker: its function does not pickle "
                f"({type(exc).__name__}: {exc}); define it at module level or avoid capturing "
                "locks, sockets, open files or generators"
            ) from exc
        entry = (f"{self._owner}-{next(self._keys)}", blob)
        self._entries[cache_key] = ((spec.fn, variants), entry)
        return entry

    def devices(
        self, spec: TaskFunction[Any, Any], view: FleetView, fleet: Sequence[Device]
    ) -> list[str] | None:
        """The ids of the devices of ``fleet`` (seen by placement as ``view``) that ``spec``
        may use: those its ``devices`` option selects, of the kinds it has variants for
        (``None``: any). Cached per option values: it runs at every submit."""
        options = spec.options
        variants = options.variants
        kinds = None if not variants or "default" in variants else frozenset(variants)
        key = (options.devices, kinds)
        if key == (None, None):
            return None
        cached = self._placements.get(key)
        if cached is not None:
            return cached
        ids = [d.id for d in fleet]
        if options.devices is not None:
            from hetero.sched.policies.selectors import select

            try:
                mask = select(options.devices, view, f"task {spec.name!r}: devices")
            except ValueError as exc:
                raise NoCapableDevice(str(exc)) from None
            ids = [i for i, ok in zip(ids, mask, strict=True) if ok]
        if kinds is not None:
            by_kind = {d.id: d.kind.value for d in fleet}
            ids = [i for i in ids if by_kind[i] in kinds]
            if not ids:
                have = sorted({d.kind.value for d in fleet})
                raise NoCapableDevice(
                    f"task {spec.name!r} has variants for {', '.join(sorted(kinds))} but "
                    f"{'the devices it may use are' if options.devices else 'the fleet has only'} "
                    f"{', '.join(have)} devices; add a 'default' variant or such a device"
                )
        self._placements[key] = ids
        return ids
