"""Which devices of a ``DevicePool`` may take a request: its fixed constraints as tests of
devices (unknown device ids and allocation names refused), the devices usable now, and the
errors that say which constraint a request fails, never or only now. The pool calls these under
its lock; ``plan/placement.py`` (within one rack: ``plan/racks.py``) then picks among the
usable devices. ``rack_of`` is the pool's ``{node: rack}``; a node missing there is a rack of
its own."""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping

from hetero._format import count
from hetero.devices.spec import Device
from hetero.errors import AllocationError
from hetero.plan.allocation import Allocation
from hetero.plan.holdings import Holdings
from hetero.plan.placement import Usable, one_slice_per_gpu
from hetero.plan.racks import pick_placed, rack_key, rack_label
from hetero.plan.request import AllocationRequest, AntiAffinity, closest, norm_name
from hetero.units import format_size

__all__ = ["Filters", "busy_error", "candidates", "static_filters", "usable"]

#: A request's fixed constraints, in order: ``(what passing devices are, test)``.
Filters = list[tuple[str, Callable[[Device], bool]]]


def static_filters(request: AllocationRequest, holdings: Holdings) -> Filters:
    """The request's fixed constraints as ``(what passing devices are, test)``, in order.

    Tests of devices, not positions, so they hold while devices come and go. Raises
    ``AllocationError`` for unknown device ids or allocation names.
    """
    affinity, anti = request.affinity, request.anti_affinity
    filters: Filters = []
    if affinity.devices:
        wanted = set(_known_ids(affinity.devices, "affinity.devices", holdings.position))
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
        wire = _known_interconnect(affinity.interconnect, holdings.devices)
        filters.append(
            (
                f"have {affinity.interconnect} interconnect",
                lambda d: norm_name(d.spec.interconnect).startswith(wire),
            )
        )
    if request.memory:
        memory = request.memory
        filters.append((f"have at least {format_size(memory)}", lambda d: d.memory_bytes >= memory))
    if request.min_tflops is not None:
        tflops, dtype = request.min_tflops, request.dtype
        filters.append(
            (
                f"reach {tflops:g} {dtype} TFLOPS",
                lambda d: d.spec.peak_tflops(dtype) >= tflops,
            )
        )
    if anti.avoid:
        avoid = set(_known_ids(anti.avoid, "anti_affinity.avoid", holdings.position))
        filters.append(("are not in anti_affinity.avoid", lambda d: d.id not in avoid))
    if anti.allocations:
        filters.append(_away_from(anti, holdings.allocations))
    return filters


def candidates(
    request: AllocationRequest,
    holdings: Holdings,
    filters: Filters,
    rack_of: Mapping[str, str] | None = None,
) -> list[int]:
    """Positions of the devices that pass ``filters`` (the request's fixed constraints).

    Raises ``AllocationError`` for a request that these devices could never meet, even with
    nothing held (in one rack of ``rack_of`` where it asks for one).
    """
    rack_of = rack_of or {}
    devices = holdings.devices
    positions = list(range(len(devices)))
    funnel = [f"the pool has {count(len(positions), 'device')}"]
    for label, keep in filters:
        positions = [p for p in positions if keep(devices[p])]
        funnel.append(f"{len(positions)} {label}")
        if not positions:
            break
    distinct = one_slice_per_gpu([(0, p, devices[p].node) for p in positions], devices)
    if len(distinct) < len(positions):
        funnel.append(
            f"{len(distinct)} on distinct GPUs (MIG slices of one GPU never share an allocation)"
        )
    if pick_placed(distinct, request, rack_of) is None:
        usable = [p for _, p, _ in distinct]
        detail = _grouping_detail(request, devices, positions, usable, "", rack_of)
        raise AllocationError(
            f"request can never be met by this pool: need {request.describe()}; "
            f"{', '.join(funnel)}{detail}"
        )
    return positions


def usable(
    request: AllocationRequest, holdings: Holdings, candidates: list[int]
) -> tuple[list[Usable], dict[str, int]]:
    """Candidates usable now, one slice per GPU; counts of why the others are not."""
    found: list[Usable] = []
    reasons: dict[str, int] = {}
    for position in candidates:
        device, holders = holdings.devices[position], holdings.holders[position]
        free = holdings.free(position)
        if not device.state.healthy:
            reason = "unhealthy"
        elif holders.exclusive is not None:
            reason = "held exclusively"
        elif request.exclusive and holders.memory:
            reason = "shared by other allocations"
        elif free < request.memory:
            reason = f"with less than {format_size(request.memory)} free"
        else:
            found.append((free - request.memory, position, device.node))
            continue
        reasons[reason] = reasons.get(reason, 0) + 1
    return one_slice_per_gpu(found, holdings.devices), reasons


def busy_error(
    request: AllocationRequest,
    holdings: Holdings,
    candidates: list[int],
    timeout: float | None,
    rack_of: Mapping[str, str] | None = None,
) -> AllocationError:
    """Why ``request`` cannot be met now (``timeout``: after waiting that long)."""
    now, reasons = usable(request, holdings, candidates)
    why = ", ".join(f"{n} {reason}" for reason, n in reasons.items())
    of = f"of {len(candidates)} matching devices, {why}" if why else ""
    detail = _grouping_detail(
        request, holdings.devices, candidates, [p for _, p, _ in now], " usable", rack_of or {}
    )
    if timeout is None:
        head = f"cannot allocate {request.describe()} now"
        hint = " (pass timeout= to wait for releases)"
    else:
        head = f"timed out after {timeout:g} s waiting for {request.describe()}"
        hint = ""
    return AllocationError(f"{head}: {of or 'no matching device is usable'}{detail}{hint}")


def _away_from(
    anti: AntiAffinity, allocations: Mapping[str, Allocation]
) -> tuple[str, Callable[[Device], bool]]:
    # The named allocations' devices are read once, when the request arrives: a waiting
    # request keeps away from them even if they are released meanwhile.
    held: list[Device] = []
    for name in anti.allocations:
        allocation = allocations.get(name)
        if allocation is None:
            hint = closest(name, allocations) if allocations else " (no allocation is live)"
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


def _known_ids(ids: Collection[str], path: str, known: Collection[str]) -> Collection[str]:
    for device_id in ids:
        if device_id not in known:
            raise AllocationError(
                f"{path}: no device {device_id!r} in this pool{closest(device_id, known)}"
            )
    return ids


def _known_interconnect(wanted: str, devices: Collection[Device]) -> str:
    """``wanted`` normalized, if some device's interconnect starts with it."""
    key = norm_name(wanted)
    wires = sorted({device.spec.interconnect for device in devices})
    if not any(norm_name(wire).startswith(key) for wire in wires):
        # Families ("NVLink" of "NVLink3") are what people type, so suggest those too.
        families = {re.sub(r"[\d.]+$", "", wire) for wire in wires} | set(wires)
        raise AllocationError(
            f"affinity.interconnect: no device in this pool has {wanted!r}"
            f"{closest(wanted, families)}; the pool has: {', '.join(wires) or 'no devices'}"
        )
    return key


def _grouping_detail(
    request: AllocationRequest,
    devices: list[Device],
    candidates: list[int],
    usable: list[int],
    what: str,
    rack_of: Mapping[str, str],
) -> str:
    """How many ``usable`` devices each node of the ``candidates`` has, when that matters."""
    if request.affinity.same_rack and not request.affinity.one_node:
        return _rack_detail(request, devices, candidates, usable, what, rack_of)
    if request.grouping == "any":
        return f"; {len(usable)}{what} in all" if what else ""
    per_node = dict.fromkeys((devices[p].node for p in candidates), 0)
    for position in usable:
        per_node[devices[position].node] += 1
    if request.grouping == "one_node":
        head = f"at most {max(per_node.values(), default=0)}{what} on one node"
    else:
        occupied = sum(n > 0 for n in per_node.values())
        nodes = "node" if occupied == 1 else "nodes"
        head = f"{what.strip() or 'matching'} devices on only {occupied} {nodes}"
    shown = ", ".join(f"node {node!r} has {n}" for node, n in list(per_node.items())[:8])
    more = f" and {len(per_node) - 8} more nodes" if len(per_node) > 8 else ""
    return f"; {head}: {shown}{more}" if per_node else f"; {head}"


def _rack_detail(
    request: AllocationRequest,
    devices: list[Device],
    candidates: list[int],
    usable: list[int],
    what: str,
    rack_of: Mapping[str, str],
) -> str:
    """What each rack of the ``candidates`` could give a same-rack request: its ``usable``
    devices, or with ``spread_nodes`` its nodes that have one."""
    nodes: dict[str, set[str]] = {rack_key(devices[p].node, rack_of): set() for p in candidates}
    gives = dict.fromkeys(nodes, 0)
    for position in usable:
        node = devices[position].node
        key = rack_key(node, rack_of)
        nodes[key].add(node)
        gives[key] += 1
    spread = request.anti_affinity.spread_nodes
    if spread:
        gives = {key: len(names) for key, names in nodes.items()}
    head = f"no rack has {request.count} {what.strip() or 'fitting'} devices"
    head += " on distinct nodes" if spread else ""
    shown = ", ".join(f"{rack_label(key)} has {n}" for key, n in list(gives.items())[:8])
    more = f" and {len(gives) - 8} more racks" if len(gives) > 8 else ""
    return f"; {head}: {shown}{more}" if gives else f"; {head}"
