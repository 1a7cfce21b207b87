"""The ``Dispatcher``: owns the queues and every item's state; executors carry out what it says.

Events go in (``submit``, ``complete``, ``fail``, ``cancel``, ``device_down``, ``device_up``,
``expire``; ``join`` makes several running items one run in one slot: a batch) and
instructions come out (``Run`` an item on a device, ``Stop`` a running one, ``Finish`` an item
for good, each ``Stop`` and ``Finish`` with its typed ``Cause``; ``WakeAt`` when ``expire``
must be called earlier than announced before, so an executor's one timer never misses a
deadline, whichever path admitted the item). The dispatcher does no I/O and reads
time only from its clock, so the simulator, the local engine, the Ray backend and the router all
drive the same code.

Queues (``hetero.sched.queues``): a central priority queue holds items the policy left waiting
(``pending``); each device has its own priority queue of items placed on it (``queued``) in
front of its ``slots``. Higher priority runs first; within a priority, ``queue_order="size"``
(the default) runs the item with the earliest *aged size key* first: arrival time plus
``aging`` times its service time on the fastest usable device (capped at ``max_bypass``
seconds), so small items pass large ones, but only those that arrive within that window after
them. ``"fifo"`` runs them in arrival order. Capacity is bounded by ``max_queue_size`` (pending
+ queued); beyond it ``submit`` raises ``QueueFull``.

Memory is a hard limit whatever the policy: an item goes only to a device whose free memory
(total minus what placed items hold) fits its ``memory``; one that no device of the fleet could
ever hold is refused at ``submit``.

The instructions are ``hetero.sched.instructions``; what an idle device steals is found by
``hetero.sched.stealing``; the invariants ``validate_state`` checks are
``hetero.sched.invariants``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hetero._format import count
from hetero.devices.spec import Device
from hetero.errors import (
    ConfigError,
    DuplicateItem,
    DuplicateMember,
    ItemNotRunning,
    NoCapableDevice,
    QueueFull,
    UnknownDevice,
    UnknownItem,
    UnknownMember,
)
from hetero.sched.clock import Clock
from hetero.sched.health import Hold
from hetero.sched.instructions import Finish, Instruction, Run, Stop, WakeAt
from hetero.sched.invariants import validate_state
from hetero.sched.item import TERMINAL, Cause, ItemRecord, ItemState, SharedRun, WorkItem
from hetero.sched.metrics import Metrics
from hetero.sched.options import QUEUE_ORDERS, DispatchOptions, QueueOrder
from hetero.sched.perf import PerfModel
from hetero.sched.policy import Completed, Policy
from hetero.sched.queues import Entry, head, make_queues
from hetero.sched.stealing import StealIndex
from hetero.sched.view import FleetView
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.config import HeteroConfig

__all__ = ["QUEUE_ORDERS", "Dispatcher"]

PENDING, QUEUED, RUNNING = ItemState.PENDING, ItemState.QUEUED, ItemState.RUNNING
DONE, FAILED, CANCELLED = ItemState.DONE, ItemState.FAILED, ItemState.CANCELLED
RETRYING, PREEMPTED = ItemState.RETRYING, ItemState.PREEMPTED


BoolArray = npt.NDArray[np.bool_]


class Dispatcher:
    """Places work items on devices with a ``Policy`` and tracks them to the end.

    Args:
        devices: the fleet.
        policy: decides placements.
        clock: the only source of time.
        perf: speeds per (device, kind); default: catalog priors.
        slots: items each device runs at once (default 1 each).
        parallel: of those, how many it really works on together, each at speed / parallel
            (default: all its slots; 1 for a worker whose other slots hold prefetched items).
        options: the settings (queue bound, timeout, retries, preemption, stealing, queue
            order, aging, bypass cap, finished records): see ``DispatchOptions``, which holds
            each one's default; default: ``DispatchOptions()``.
        **settings: the same settings as keywords (``max_queue_size=5, timeout=2.0``), each
            replacing that field of ``options``; a name that is no setting is a
            ``ConfigError``.

    The settings are also plain attributes (``max_queue_size``, ``timeout``, ...), read from
    ``options`` once; the queues' (``queue_order``, ``aging``, ``max_bypass``) are read-only,
    as the queues were built with them.
    """

    def __init__(
        self,
        devices: Sequence[Device],
        policy: Policy,
        clock: Clock,
        *,
        perf: PerfModel | None = None,
        slots: Sequence[int] | None = None,
        parallel: Sequence[int] | None = None,
        options: DispatchOptions | None = None,
        **settings: Any,
    ) -> None:
        self.options = opts = DispatchOptions.build(options, **settings)
        self.clock = clock
        self.perf = perf if perf is not None else PerfModel(devices)
        self.view = FleetView(devices, self.perf, clock, slots, parallel)
        self.policy = policy
        # Plain attributes, not properties: the hot paths read them.
        self.max_queue_size = opts.max_queue_size
        self.timeout = opts.timeout
        self.max_retries = opts.max_retries
        self.preemption = opts.preemption
        self.stealing = opts.stealing
        self.keep_finished = opts.keep_finished
        self.late_after = opts.late_after
        self._largest_memory = int(self.view.mem_total.max())
        self.metrics = Metrics(self.view.n, clock.now())
        self.records: dict[int | str, ItemRecord] = {}
        # One counter for every heap's entries: a new seq on each push makes the item's older
        # entries stale (queues.head).
        self._seq = itertools.count()
        self._queues = make_queues(
            opts.queue_order, self.view, self.perf, opts.aging, opts.max_bypass
        )
        self._steals = StealIndex(self.view, self.perf, policy, self._queues)
        self._running: list[set[ItemRecord]] = [set() for _ in range(self.view.n)]
        # (priority, seq, rec) of running items, only kept with preemption
        self._running_heap: list[tuple[int, int, ItemRecord]] = []
        self._deadlines: list[tuple[float, int, ItemRecord]] = []
        self._wake_at = math.inf  # the earliest deadline announced with WakeAt
        self.waiting = 0  # pending + queued (view.queued of them on devices)
        self.active = 0  # admitted and not terminal
        self._slots = self.view.slots.tolist()  # fixed; a list is cheaper to index
        self._free_slots = int(self.view.slots[self.view.usable].sum())  # on usable devices
        self._down: set[int] = set()  # marked down (device_down) until device_up
        # Per device, why it takes no new work now (hold / release); see usable.
        self._holds: list[set[Hold]] = [set() for _ in range(self.view.n)]
        self._lowered = False  # set_slots has lowered some device's slots (see _release)
        self._only_masks: dict[tuple[str, ...], BoolArray] = {}  # submit's only= sets
        # The one mask of those that names every device (every such set shares it): an item
        # restricted to it may go to any usable device, so it is placed as an unrestricted one
        # is, without a mask made and tested per placement (a router restricts every request
        # to its model's replicas, most often all of them). None until one is made, and again
        # once a device joins (then no earlier set names every device).
        self._whole: BoolArray | None = None
        self._removed: set[int] = set()  # left the fleet (remove_device); ids stay reserved
        self._steal_on_place = opts.stealing and not policy.places_by_delay
        # Only build completion events for policies that learn from them.
        self._policy_learns = type(policy).observe is not Policy.observe
        policy.bind(self.view)

    @property
    def queue_order(self) -> QueueOrder:
        return self.options.queue_order

    @property
    def aging(self) -> float:
        return self.options.aging

    @property
    def max_bypass(self) -> float | None:
        return self.options.max_bypass

    @classmethod
    def from_config(
        cls,
        config: HeteroConfig,
        devices: Sequence[Device] | None = None,
        clock: Clock | None = None,
        **overrides: Any,
    ) -> Dispatcher:
        """A dispatcher for a fleet config: its devices (built if not given), its strategy with
        options, its batch table and every ``DispatchOptions`` setting of its ``scheduler``
        section (queue bound, timeout, retries, preemption, stealing, queue order, aging, bypass
        cap). ``overrides`` are ``Dispatcher`` keywords (``perf``, ``slots``, a setting...)."""
        from hetero.devices.fleet import build_fleet
        from hetero.sched.clock import MonotonicClock
        from hetero.sched.registry import make_policy

        sched = config.scheduler
        fleet = list(devices) if devices is not None else build_fleet(config)
        # Every setting the config has (it has no keep_finished: that stays the default).
        in_config = type(sched).model_fields
        options = DispatchOptions(
            **{name: getattr(sched, name) for name in DispatchOptions.names() if name in in_config}
        )
        keywords: dict[str, Any] = {
            "perf": PerfModel(fleet, batch_table=sched.batch_sizes),
            "options": options,
            **overrides,
        }
        policy = make_policy(sched.strategy, sched.options)
        return cls(fleet, policy, clock if clock is not None else MonotonicClock(), **keywords)

    # ----------------------------------------------------------------------------- events in

    def submit(
        self,
        item: WorkItem,
        *,
        only: Sequence[str] | None = None,
        retries: int | None = None,
        timeout: float | None = None,
    ) -> list[Instruction]:
        """Admit ``item``. Raises ``QueueFull`` when ``max_queue_size`` items are waiting and
        ``NoCapableDevice`` when its ``memory`` exceeds every device's.

        ``only`` restricts it to these device ids (a hard constraint, e.g. the device kinds a
        task has code for); ``retries`` overrides ``max_retries`` and ``timeout`` the
        dispatcher's timeout for this item (its ``deadline``, if set, wins).
        """
        mask = None
        if only is not None:
            # Callers pass the same few sets again and again (a router: the replicas of a
            # model), so their masks are kept; records share them and never write to them.
            key = only if isinstance(only, tuple) else tuple(only)
            mask = self._only_masks.get(key)
            if mask is None:
                mask = np.zeros(self.view.n, dtype=bool)
                mask[[self._device(d) for d in key]] = True
                if not mask.any():
                    raise NoCapableDevice(f"work item {item.id!r} may run on no device (only=[])")
                if mask.all():
                    if self._whole is None:
                        self._whole = mask
                    mask = self._whole
                if len(self._only_masks) < 256:
                    self._only_masks[key] = mask
        if retries is not None and not (isinstance(retries, int) and retries >= 0):
            raise ConfigError([("retries", f"must be an integer >= 0, got {retries!r}")])
        largest = (
            self._largest_memory
            if mask is None or not item.memory
            else int(self.view.mem_total[mask].max())
        )
        if item.memory > largest:
            totals = (
                self.view.mem_total if mask is None else np.where(mask, self.view.mem_total, -1)
            )
            biggest = int(totals.argmax())
            raise NoCapableDevice(
                f"work item {item.id!r} needs {format_size(item.memory)} of memory; the largest "
                f"device{'' if mask is None else ' it may use'}, {self.view.ids[biggest]}, has "
                f"{format_size(largest)}"
            )
        if self.waiting >= self.max_queue_size:
            raise QueueFull(
                f"queue full: {count(self.waiting, 'item')} waiting "
                f"(max_queue_size={self.max_queue_size}); "
                "retry later or raise scheduler.max_queue_size"
            )
        old = self.records.get(item.id)
        if old is not None and old.state not in TERMINAL:
            raise DuplicateItem(
                f"work item id {item.id!r} is already in flight ({old.state.value}); "
                "give each item a unique id"
            )
        now = self.clock.now()
        rec = ItemRecord(item, now, history=[PENDING])
        if mask is not None:
            rec.only = mask
        if retries is not None:
            rec.retries = retries
        self.records[item.id] = rec
        self.active += 1
        if timeout is None:
            timeout = self.timeout
        deadline = (
            item.deadline
            if item.deadline is not None
            else (now + timeout if timeout is not None else None)
        )
        out: list[Instruction] = []
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, next(self._seq), rec))
            if deadline < self._wake_at:
                self._wake_at = deadline
                out.append(WakeAt(deadline))
        self.waiting += 1
        self._place(rec, out)
        return out

    def complete(
        self, item_id: int | str, service_time: float | None = None, work: float | None = None
    ) -> list[Instruction]:
        """The executor reports that ``item_id`` finished successfully.

        ``service_time`` is how long the device itself worked on it, when the executor knows
        (a worker that runs one item at a time while the next waits in its inbox); by default,
        the time since the item started. ``work`` is what the item turned out to cost when that
        differs from its estimate (an LLM request that stopped before ``max_tokens``): the
        performance model learns from it; 0 teaches it nothing (a request the server refused).
        """
        rec = self.records.get(item_id)
        if rec is None or rec.state is not RUNNING:
            rec = self._running_record(item_id, "complete")  # raises the right error
        out: list[Instruction] = []
        i = rec.device
        now = self.clock.now()
        busy = now - rec.started
        concurrency = self._slots[i]
        if service_time is not None:
            busy, concurrency = service_time, 1
        self._release(rec, running=True)
        rec.move(DONE)
        latency = now - rec.submitted
        item = rec.item
        self.metrics.record(i, latency, busy, item.cost, now)
        done = item.cost if work is None else work
        if busy > 0:
            self.perf.observe(i, item.kind, done, busy, concurrency)
        if self._policy_learns:
            self.policy.observe(Completed(i, item.kind, done, busy, latency))
        self._end(rec, out, DONE, "", Cause.DONE, now)
        self._refill(i, out)
        return out

    def fail(self, item_id: int | str, reason: str, retryable: bool = True) -> list[Instruction]:
        """The executor reports that the running attempt of ``item_id`` failed."""
        rec = self._running_record(item_id, "fail")
        out: list[Instruction] = []
        i = rec.device
        self._attempt_failed(rec, reason, retryable, out, Cause.FAILED)
        self._refill(i, out)
        return out

    def requeue(self, item_id: int | str, reason: str) -> list[Instruction]:
        """The running attempt of ``item_id`` was lost through no fault of its own (its worker
        was stopped to end another item): place it again, charging no attempt and keeping its
        device eligible."""
        rec = self._running_record(item_id, "requeue")
        i = rec.device
        out: list[Instruction] = []
        self._requeue(rec, reason, out)
        self._refill(i, out)
        return out

    def _requeue(self, rec: ItemRecord, reason: str, out: list[Instruction]) -> None:
        self._release(rec, running=True)
        rec.attempts -= 1  # the lost attempt does not count
        rec.move(RETRYING)
        rec.reason = reason
        self.waiting += 1
        self._place(rec, out)

    def join(self, item_id: int | str, with_id: int | str) -> list[Instruction]:
        """Run ``item_id`` with the running ``with_id``, in its slot: one run of several items
        (a batch, which the executor carries out as one call). ``item_id`` is queued on that
        device, or has just started there in a slot of its own, which frees (the device then
        takes more work). The items of a run end one by one like any running item
        (``complete``, ``fail``, ``cancel``, ``expire``, a device lost); the slot frees when
        the last has ended. Items in a run are not preempted: stopping one frees no slot."""
        lead = self._running_record(with_id, "join")
        rec = self.records.get(item_id)
        if rec is None:
            raise self._unknown(item_id, "join")
        view = self.view
        i = lead.device
        if (
            rec is lead
            or rec.device != i
            or not (rec.state is QUEUED or (rec.state is RUNNING and rec.run is None))
        ):
            where = view.ids[rec.device] if rec.device >= 0 else "no device"
            raise ItemNotRunning(
                f"cannot join work item {item_id!r} to {with_id!r}: it is {rec.state.value} on "
                f"{where}; only an item queued on {view.ids[i]}, or started there alone, joins "
                "a run there"
            )
        run = lead.run
        if run is None:
            run = lead.run = SharedRun(lead.started)
            lead.seq = next(self._seq)  # its preemption entry goes stale
        item = rec.item
        freed = rec.state is RUNNING
        if freed:  # its own slot frees
            view.in_flight_at[i] -= 1
            view.running_at[i] -= 1
            view.running_since_at[i] -= rec.started
            if view.usable_at[i] and (not self._lowered or view.running_at[i] < self._slots[i]):
                self._free_slots += 1
        else:
            self._release(rec, running=False)
            rec.move(RUNNING)
            rec.started = self.clock.now()
            rec.attempts += 1
            self.waiting -= 1
            view.outstanding_at[i] += item.cost
            view.running_work_at[i] += item.cost
            if item.memory:
                view.mem_used_at[i] += item.memory
            self._running[i].add(rec)
        rec.seq = next(self._seq)
        rec.run = run
        run.members += 1
        out: list[Instruction] = []
        if freed:
            self._refill(i, out)
        return out

    def cancel(self, item_id: int | str, reason: str = "cancelled") -> list[Instruction]:
        """Cancel an item wherever it is; a running one gets a ``Stop``. An item that has
        already ended is left as it is."""
        return self._end_now(item_id, reason, CANCELLED, Cause.CANCELLED, "cancel")

    def abandon(self, item_id: int | str, reason: str) -> list[Instruction]:
        """End an item as failed wherever it is, with no further attempt (nothing is left that
        could run it: every device is gone); a running one gets a ``Stop``. An item that has
        already ended is left as it is."""
        return self._end_now(item_id, reason, FAILED, Cause.ABANDONED, "abandon")

    def _end_now(
        self, item_id: int | str, reason: str, state: ItemState, cause: Cause, what: str
    ) -> list[Instruction]:
        rec = self.records.get(item_id)
        if rec is None:
            raise self._unknown(item_id, what)
        if rec.state in TERMINAL:
            return []
        out: list[Instruction] = []
        i = rec.device
        if rec.state is RUNNING:
            self._release(rec, running=True)
            out.append(Stop(rec.item, i, reason, cause))
        elif rec.state is QUEUED:
            self._release(rec, running=False)
            self.waiting -= 1
        elif rec.state is PENDING:
            self.waiting -= 1
        rec.move(state)
        self._end(rec, out, state, reason, cause)
        if i >= 0:
            self._refill(i, out)
        return out

    def device_down(self, device_id: str, reason: str = "device unhealthy") -> list[Instruction]:
        """Mark a device unhealthy: it gets nothing more; its items move elsewhere (a held
        device's running items too: it is down now)."""
        i = self._device(device_id)
        out: list[Instruction] = []
        if i in self._down or i in self._removed:
            return out
        self._down.add(i)
        if self.view.usable[i]:
            self._free_slots -= self._free_on(i)
            self.view.set_usable(i, False)
        why = f"{reason} ({device_id})"
        for rec in sorted(self._running[i], key=lambda r: r.seq):
            out.append(Stop(rec.item, i, why, Cause.DEVICE_LOST))
            self._attempt_failed(rec, why, True, out, Cause.DEVICE_LOST)
        self._move_queue(i, out, exclude=True)
        return out

    def device_up(self, device_id: str) -> list[Instruction]:
        """A device is healthy again: it may take pending and stolen work. Whatever held it is
        released too (a drained device comes back); a removed one joins again only through
        ``add_device``."""
        i = self._device(device_id)
        if i in self._removed:
            raise UnknownMember(
                [("device", f"{device_id!r} was removed from the fleet; add_device brings it back")]
            )
        self._down.discard(i)
        self._holds[i].clear()
        return self._resume(i)

    def hold(self, device_id: str, why: Hold) -> list[Instruction]:
        """Keep a device from new work for ``why``: its queued items move elsewhere, its
        running ones finish there (``complete``/``fail`` as usual). Holds add up: ``release``
        ends one, and the device takes work again once none is left and it is not down;
        ``device_up`` ends them all."""
        i = self._device(device_id)
        out: list[Instruction] = []
        holds = self._holds[i]
        if why in holds or i in self._removed:
            return out
        holds.add(why)
        if self.view.usable[i]:
            self._free_slots -= self._free_on(i)
            self.view.set_usable(i, False)
            self._move_queue(i, out)
        return out

    def release(self, device_id: str, why: Hold) -> list[Instruction]:
        """End the hold ``why`` on a device (see ``hold``)."""
        i = self._device(device_id)
        if i in self._removed:
            return []
        self._holds[i].discard(why)
        return self._resume(i)

    def holds(self, device_id: str) -> frozenset[Hold]:
        """Why a device takes no new work now, beside being down (``is_down``)."""
        return frozenset(self._holds[self._device(device_id)])

    def live_holds(self, index: int) -> AbstractSet[Hold]:
        """Device ``index``'s holds as a live set (the dispatcher's own: read it, never write
        it), for an executor that shows them per device."""
        return self._holds[index]

    def is_down(self, device_id: str) -> bool:
        return self._device(device_id) in self._down

    def _resume(self, i: int) -> list[Instruction]:
        """Device ``i`` takes work again if nothing keeps it out any more."""
        out: list[Instruction] = []
        if self.view.usable[i] or i in self._down or self._holds[i]:
            return out
        self.view.set_usable(i, True)
        self._free_slots += self._free_on(i)
        self._refill(i, out)
        return out

    # ------------------------------------------------------------------------ membership

    def add_device(
        self, device: Device, slots: int = 1, parallel: int | None = None
    ) -> list[Instruction]:
        """A device joins the fleet (a replica, a node's GPU): it takes pending work and steals
        queued work at once. A device removed earlier may join again under its id."""
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ConfigError([("slots", f"must be an integer >= 1, got {slots!r}")])
        if parallel is not None and not (isinstance(parallel, int) and 1 <= parallel <= slots):
            raise ConfigError(
                [("parallel", f"must be an integer from 1 to slots ({slots}), got {parallel!r}")]
            )
        i = self.view.index.get(device.id)
        if i is not None:
            if i not in self._removed:
                raise DuplicateMember(
                    [("device", f"device id {device.id!r} is already in the fleet")]
                )
            self._removed.discard(i)
            return self.device_up(device.id)
        self.perf.add(device)
        i = self.view.add(device, slots, parallel)
        self._only_masks.clear()  # one device short now
        self._whole = None
        for rec in self.records.values():  # a device joins outside every only= list
            if rec.only is not None and rec.state not in TERMINAL:
                rec.only = np.append(rec.only, False)
        self.metrics.add_device()
        self._queues.add_device()
        self._steals.add_device(i)
        self._running.append(set())
        self._holds.append(set())
        self._slots.append(slots)
        self._largest_memory = max(self._largest_memory, device.memory_bytes)
        self._free_slots += slots
        self.policy.bind(self.view)
        out: list[Instruction] = []
        self._refill(i, out)
        return out

    def drain_device(self, device_id: str) -> list[Instruction]:
        """Take no more work on a device (``hold`` with ``Hold.DRAINING``): its queued items
        move elsewhere, its running ones finish there. ``release``, ``device_up`` or
        ``add_device`` takes it back; ``remove_device`` ends what still runs."""
        return self.hold(device_id, Hold.DRAINING)

    def set_slots(self, device_id: str, slots: int) -> list[Instruction]:
        """How many items a device may run at once, learned while it runs (a replica's
        capacity, ``hetero.sched.capacity``). More slots start its queue and take waiting work
        at once; fewer let what runs there finish, and nothing new starts until it is below
        the new count. The speed model keeps each item's own speed: the device's throughput
        scales with its slots."""
        if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or slots < 1:
            raise ConfigError([("slots", f"must be an integer >= 1, got {slots!r}")])
        i = self._device(device_id)
        view = self.view
        old = self._slots[i]
        if slots == old:
            return []
        free_before = self._free_on(i)
        self._lowered = self._lowered or slots < old
        self._slots[i] = int(slots)
        view.slots[i] = slots
        # Each running item goes at speed / parallel: parallel follows the slots unless some
        # slots only hold a prefetched item (then it never exceeds them).
        view.parallel[i] = slots if view.parallel[i] == old else min(int(view.parallel[i]), slots)
        view.multi_slot = bool((view.parallel > 1).any())
        view.prefetching = bool((view.parallel < view.slots).any())
        self.perf.rescale(i, slots / old)
        self._steals.rescaled(i)
        out: list[Instruction] = []
        if view.usable[i]:
            self._free_slots += self._free_on(i) - free_before
            if slots > old:
                self._steals.forget_misses()  # more room: a steal may be worth it now
                self._refill(i, out)
        return out

    def _free_on(self, i: int) -> int:
        """Free slots of device ``i`` (none while it runs more than a lowered slot count)."""
        return max(0, int(self._slots[i]) - int(self.view.running[i]))

    def remove_device(self, device_id: str, reason: str = "device removed") -> list[Instruction]:
        """A device leaves the fleet: it is drained, and what still runs there is stopped and
        placed elsewhere without being charged an attempt (it did not fail). What no device
        left may run ends as failed (``abandon_stranded``): it would wait for ever."""
        i = self._device(device_id)
        out = self.hold(device_id, Hold.REMOVED)
        for rec in sorted(self._running[i], key=lambda r: r.seq):
            out.append(Stop(rec.item, i, f"{reason} ({device_id})", Cause.DEVICE_REMOVED))
            self._requeue(rec, reason, out)
        self._removed.add(i)
        out += self.abandon_stranded(
            f"no device it may use is left (the last: {device_id}: {reason})"
        )
        return out

    def abandon_stranded(self, reason: str, *, down_is_final: bool = False) -> list[Instruction]:
        """End as failed (``Cause.ABANDONED``, with ``reason``) every active item that no
        device may run again: each device it may use has left the fleet or, with
        ``down_is_final``, is down too and will not come back (the executor knows: a
        simulation with no events left, an engine that gave up on its devices). A held device
        still counts: it takes work again once its holds are released."""
        alive = np.ones(self.view.n, dtype=bool)
        alive[list(self._removed | self._down if down_is_final else self._removed)] = False
        stranded = [
            rec.item.id
            for rec in self.records.values()
            if rec.state not in TERMINAL
            and not (alive.any() if rec.only is None else (alive & rec.only).any())
        ]
        out: list[Instruction] = []
        for item_id in stranded:
            out += self.abandon(item_id, reason)
        return out

    @property
    def queued_total(self) -> int:
        """Items waiting in device queues (the rest of ``waiting`` is pending)."""
        return self.view.queued

    def queued_items(self, device_id: str) -> list[WorkItem]:
        """The items waiting in a device's queue, in the order they would start there."""
        return [rec.item for rec in self._queues.ordered(self._device(device_id))]

    @property
    def members(self) -> list[str]:
        """The ids of the devices in the fleet now (not removed)."""
        return [d for i, d in enumerate(self.view.ids) if i not in self._removed]

    def _move_queue(self, i: int, out: list[Instruction], exclude: bool = False) -> None:
        """Place the items queued on device ``i`` elsewhere (it takes no more work);
        ``exclude`` keeps them off it for good."""
        queue = self._queues.devices[i]
        # Taken one at a time, not from a list made first: placing one may steal a later one.
        while (entry := head(queue, QUEUED, take=True)) is not None:
            rec = entry[3]
            self._release(rec, running=False)
            rec.move(RETRYING)
            if exclude:
                self._exclude(rec, i)
            self._place(rec, out)
        self._steals.clear(i)

    def set_external_memory(self, device_id: str, used: int) -> list[Instruction]:
        """Memory measured on a device beyond what its placed items declare (other processes,
        framework caches, a leak): placement counts it as taken, so a device that fills up gets
        no more items that need memory until it frees some (then waiting items are placed)."""
        if isinstance(used, bool) or not isinstance(used, (int, np.integer)) or used < 0:
            raise ConfigError([("used", f"must be an integer >= 0 bytes, got {used!r}")])
        i = self._device(device_id)
        freed = used < self.view.mem_external[i]
        self.view.mem_external[i] = used
        out: list[Instruction] = []
        if freed and (self._queues.pending or self._queues.late):
            self._drain_pending(out)
        return out

    def expire(self) -> list[Instruction]:
        """Fail every item whose deadline has passed (call at ``next_deadline()``)."""
        out: list[Instruction] = []
        now = self.clock.now()
        heap = self._deadlines
        freed: list[int] = []
        while heap and heap[0][0] <= now:
            deadline, _, rec = heapq.heappop(heap)
            if rec.state in TERMINAL:
                continue
            i = rec.device
            reason = f"timed out after {deadline - rec.submitted:.6g}s"
            if rec.state is RUNNING:
                self._release(rec, running=True)
                out.append(Stop(rec.item, i, reason, Cause.TIMED_OUT))
                self.metrics.record_failure(i, now - rec.started, now)
                freed.append(i)
            elif rec.state is QUEUED:
                self._release(rec, running=False)
                self.waiting -= 1
            else:
                self.waiting -= 1  # pending, retrying or preempted: not on a device
            rec.move(FAILED)
            self._end(rec, out, FAILED, reason, Cause.TIMED_OUT)
        # Refill after every expired item is out, so none is started only to be stopped.
        for i in dict.fromkeys(freed):
            self._refill(i, out)
        following = self.next_deadline()
        self._wake_at = math.inf if following is None else following
        if following is not None:
            out.append(WakeAt(following))
        return out

    def next_deadline(self) -> float | None:
        """When ``expire`` next has work to do, or ``None``."""
        heap = self._deadlines
        while heap and heap[0][2].state in TERMINAL:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    # ------------------------------------------------------------------------------ internals

    def _running_record(self, item_id: int | str, what: str) -> ItemRecord:
        rec = self.records.get(item_id)
        if rec is None:
            raise self._unknown(item_id, what)
        if rec.state is not RUNNING:
            raise ItemNotRunning(
                f"cannot {what} work item {item_id!r}: it is {rec.state.value}, not running"
            )
        return rec

    def _unknown(self, item_id: int | str, what: str) -> UnknownItem:
        live = [rec.item.id for rec in self.records.values() if rec.state not in TERMINAL]
        shown = ", ".join(repr(i) for i in live[:5]) + (", …" if len(live) > 5 else "")
        forgotten = "" if self.keep_finished else "; finished items are not kept (keep_finished)"
        return UnknownItem(
            f"cannot {what} unknown work item {item_id!r}: {count(len(live), 'item')} in flight"
            f"{': ' + shown if live else ''}{forgotten} (Dispatcher.records holds them all)"
        )

    def _device(self, device_id: str) -> int:
        i = self.view.index.get(device_id)
        if i is None:
            ids = self.view.ids
            shown = ", ".join(ids[:8]) + (f", … ({len(ids)} in all)" if len(ids) > 8 else "")
            raise UnknownDevice(f"unknown device {device_id!r}; the fleet has: {shown}")
        return i

    def _allowed(self, rec: ItemRecord) -> BoolArray | None:
        """The devices ``rec`` may go to now, as a mask (``None``: every usable device): not one
        its attempts failed on (unless all have) and, for an item that holds memory, only those
        with that much free. An empty mask means it must wait."""
        view = self.view
        item = rec.item
        only = rec.only
        if not rec.excluded and not item.memory and (only is None or only is self._whole):
            return None
        usable = view.usable if only is None else view.usable & only
        mask = usable.copy()
        if rec.excluded:
            mask[list(rec.excluded)] = False
            if not mask.any():
                mask = usable.copy()  # every device failed it: try any again
        if item.memory:
            mask &= view.mem_free() >= item.memory
        return mask

    def _place(self, rec: ItemRecord, out: list[Instruction]) -> None:
        """Ask the policy for a device; queue the item there, or keep it pending."""
        view = self.view
        # Any usable device (None) in the common case, without the call.
        only = rec.only
        restricted = (
            rec.excluded or rec.item.memory or (only is not None and only is not self._whole)
        )
        allowed = self._allowed(rec) if restricted else None
        if allowed is not None and not allowed.any():
            i = None
        else:
            try:  # _try_pick, inlined: every item passes here
                i = self.policy.pick(rec.item, view, allowed)
            except NoCapableDevice as exc:
                self._reject(rec, out, exc)
                return
        if i is None:
            if rec.state is not PENDING:
                rec.move(PENDING)
            rec.device = -1
            rec.seq = next(self._seq)
            self._queues.wait(rec)
            return
        running = view.running_at[i]
        free = running < self._slots[i]
        if free and view.in_flight_at[i] == running:
            self._run_now(rec, i, out)  # a free slot and nothing queued (view.starts_now)
            return
        self._enqueue(rec, i)
        if free:
            self._start_ready(i, out)
            return
        if self.preemption:
            self._maybe_preempt(rec, out)
        if self._steal_on_place and rec.state is QUEUED and self._free_slots:
            # The policy queued it behind a busy device while a slot is free elsewhere: the
            # fastest idle device may finish it sooner. (Skipped for policies that already
            # weighed every device's expected delay: such a steal would never pay.)
            idle = np.where(view.running < view.slots, view.inv_speed(rec.item.kind), np.inf)
            thief = int(idle.argmin())
            if idle[thief] < np.inf:
                self._steal(thief, out)

    def _enqueue(self, rec: ItemRecord, i: int) -> None:
        """Place ``rec`` in device ``i``'s queue."""
        view = self.view
        item = rec.item
        rec.move(QUEUED)
        rec.device = i
        rec.seq = next(self._seq)
        key = self._queues.push(rec, i)
        cost = item.cost
        view.in_flight_at[i] += 1
        view.outstanding_at[i] += cost
        view.queued_work[i] += cost
        if item.memory:
            view.mem_used_at[i] += item.memory
        view.queued += 1
        if self.stealing:  # only _steal reads the index
            self._steals.queued(rec, key, i)

    def _run_now(self, rec: ItemRecord, i: int, out: list[Instruction]) -> None:
        """``_enqueue`` then ``_start_ready`` for a device with a free slot and an empty queue,
        without the queue round trip (the common case, so it is worth its few lines)."""
        view = self.view
        item = rec.item
        rec.move(QUEUED)
        rec.move(RUNNING)
        rec.device = i
        rec.seq = next(self._seq)
        rec.started = now = self.clock.now()
        rec.attempts += 1
        cost = item.cost
        view.in_flight_at[i] += 1
        view.running_at[i] += 1
        view.outstanding_at[i] += cost
        view.running_work_at[i] += cost
        view.running_since_at[i] += now
        if view.prefetching:
            view.last_start_at[i] = now
        if item.memory:
            view.mem_used_at[i] += item.memory
        self._free_slots -= 1
        self.waiting -= 1
        self._running[i].add(rec)
        if self.preemption:
            heapq.heappush(self._running_heap, (item.priority, rec.seq, rec))
        out.append(Run(item, i, view.ids[i]))

    def _start_ready(self, i: int, out: list[Instruction]) -> None:
        """Start queued items on device ``i`` while it has free slots."""
        view = self.view
        slots = self._slots[i]
        pop = self._queues.pop
        while view.running_at[i] < slots:
            rec = pop(i)
            if rec is None:
                return
            item = rec.item
            cost = item.cost
            rec.move(RUNNING)
            rec.started = now = self.clock.now()
            rec.attempts += 1
            view.running_at[i] += 1
            view.queued_work[i] -= cost
            view.running_work_at[i] += cost
            view.running_since_at[i] += now
            if view.prefetching:
                view.last_start_at[i] = now
            self._free_slots -= 1
            view.queued -= 1
            self.waiting -= 1
            self._running[i].add(rec)
            if self.preemption:
                heapq.heappush(self._running_heap, (item.priority, rec.seq, rec))
            out.append(Run(item, i, view.ids[i]))

    def _release(self, rec: ItemRecord, running: bool) -> None:
        """Give back what ``rec`` holds on its device (slot, load, memory); a member of a
        shared run gives back its slot only as the last of the run."""
        view = self.view
        i = rec.device
        item = rec.item
        cost = item.cost
        if item.memory:
            view.mem_used_at[i] -= item.memory
        # Each entry read once into a local: this runs for every item.
        in_flight = view.in_flight_at[i] - 1
        if running:
            self._running[i].discard(rec)
            started = rec.started
            run = rec.run
            if run is not None:
                rec.run = None
                run.members -= 1
                if run.members:  # the run goes on in its slot without this item
                    view.outstanding_at[i] -= cost
                    view.running_work_at[i] -= cost
                    return
                started = run.started
            view.in_flight_at[i] = in_flight
            still = view.running_at[i] - 1
            view.running_at[i] = still
            if still:
                view.running_work_at[i] -= cost
                view.running_since_at[i] -= started
            else:  # exactly nothing running: drop the float drift
                view.running_work_at[i] = 0.0
                view.running_since_at[i] = 0.0
            # A device may run more than slots that set_slots lowered: no slot frees up then.
            if view.usable_at[i] and (not self._lowered or still < self._slots[i]):
                self._free_slots += 1
        else:
            view.in_flight_at[i] = in_flight
            view.queued_work[i] -= cost
            view.queued -= 1
            emptied = in_flight == view.running_at[i]
            self._queues.left(rec, i, emptied)
            if emptied:
                view.queued_work[i] = 0.0  # drop float drift once the queue is empty
        # Nothing left on the device: no float drift either.
        view.outstanding_at[i] = view.outstanding_at[i] - cost if in_flight else 0.0

    def _end(
        self,
        rec: ItemRecord,
        out: list[Instruction],
        state: ItemState,
        reason: str,
        cause: Cause = Cause.DONE,
        now: float | None = None,
    ) -> None:
        rec.reason = reason
        rec.finished = self.clock.now() if now is None else now
        self.active -= 1
        if not self.keep_finished:
            del self.records[rec.item.id]
        out.append(Finish(rec.item, state, reason, cause))

    def _exclude(self, rec: ItemRecord, i: int) -> None:
        if rec.excluded is None:
            rec.excluded = set()
        rec.excluded.add(i)

    def _attempt_failed(
        self, rec: ItemRecord, reason: str, retryable: bool, out: list[Instruction], cause: Cause
    ) -> None:
        i = rec.device
        now = self.clock.now()
        self._release(rec, running=True)
        self.metrics.record_failure(i, now - rec.started, now)
        rec.failures += 1
        if retryable and rec.failures <= (rec.retries if rec.retries >= 0 else self.max_retries):
            rec.move(RETRYING)
            rec.reason = reason
            self._exclude(rec, i)
            self.waiting += 1
            self._place(rec, out)
            return
        rec.move(FAILED)
        tries = f" after {rec.failures} attempts" if rec.failures > 1 else ""
        self._end(rec, out, FAILED, f"{reason}{tries}", cause)

    def _refill(self, i: int, out: list[Instruction]) -> None:
        """Device ``i`` freed capacity: start its queue, steal for it, then place pending items."""
        view = self.view
        if view.usable_at[i]:
            if view.in_flight_at[i] > view.running_at[i]:
                self._start_ready(i, out)  # it starts one at least: nothing to steal then
            elif self.stealing and view.queued and view.running_at[i] == 0:
                self._steal(i, out)
        queues = self._queues
        if queues.pending or queues.late:
            self._drain_pending(out)

    def _drain_pending(self, out: list[Instruction]) -> None:
        queues = self._queues
        if self.late_after is not None:
            queues.note_late(self.clock.now() - self.late_after)
        if self._drain(queues.pending, out) and queues.late:
            self._drain(queues.late, out)

    def _drain(self, pending: list[Entry], out: list[Instruction]) -> bool:
        """Place the items of one pending heap in strict priority order, stopping at the first
        the policy still leaves waiting; True when the heap emptied."""
        while (entry := head(pending, PENDING)) is not None:
            rec = entry[3]
            allowed = self._allowed(rec)
            if allowed is not None and not allowed.any():
                return False
            i = self._try_pick(rec, out, allowed)
            if i is None:
                return False
            heapq.heappop(pending)
            if i < 0:
                continue
            self._enqueue(rec, i)
            if self.view.running_at[i] < self.view.slots[i]:
                self._start_ready(i, out)
        return True

    def _try_pick(
        self, rec: ItemRecord, out: list[Instruction], allowed: BoolArray | None
    ) -> int | None:
        """The policy's pick: a position, ``None`` to keep waiting, or -1 if it rejected the item
        (which is then failed with the reason)."""
        try:
            return self.policy.pick(rec.item, self.view, allowed)
        except NoCapableDevice as exc:
            self._reject(rec, out, exc)
            return -1

    def _reject(self, rec: ItemRecord, out: list[Instruction], exc: NoCapableDevice) -> None:
        """The policy found that ``rec`` can never run: it fails with the policy's reason."""
        self.waiting -= 1
        rec.move(FAILED)
        self._end(rec, out, FAILED, str(exc), Cause.REJECTED)

    def _steal(self, thief: int, out: list[Instruction]) -> None:
        """Idle ``thief`` takes queued items from the most-loaded devices while it has free
        slots and would finish them sooner (``StealIndex.take`` finds them)."""
        take = self._steals.take
        while self.view.running_at[thief] < self._slots[thief]:
            rec = take(thief)
            if rec is None:
                return
            self._move(rec, thief)
            self._start_ready(thief, out)

    def _maybe_preempt(self, rec: ItemRecord, out: list[Instruction]) -> None:
        """With no slot free anywhere, stop the lowest-priority running item that ``rec``
        outranks."""
        if self._free_slots:
            return
        heap = self._running_heap
        top = head(heap, RUNNING, at=1)
        if top is None or top[0] >= rec.item.priority:
            return
        victim = top[2]
        j = victim.device
        if rec.device != j:
            # The newcomer takes the victim's slot, if it may run there (a device going down
            # still lists its running items until they are moved) and its memory fits beside the
            # victim's (the victim stays queued on that device, holding its memory).
            view = self.view
            if (
                not view.usable[j]
                or (rec.excluded is not None and j in rec.excluded)
                or (rec.only is not None and not rec.only[j])
                or rec.item.memory > view.mem_total[j] - view.mem_used[j] - view.mem_external[j]
            ):
                return
            self._move(rec, j)
        heapq.heappop(heap)
        self._release(victim, running=True)
        victim.move(PREEMPTED)
        out.append(
            Stop(
                victim.item,
                j,
                f"preempted by higher-priority item {rec.item.id!r}",
                Cause.PREEMPTED,
            )
        )
        self.waiting += 1
        self._enqueue(victim, j)
        self._start_ready(j, out)

    def _move(self, rec: ItemRecord, i: int) -> None:
        """A queued item goes to device ``i``'s queue instead (queued -> queued)."""
        self._release(rec, running=False)
        self._enqueue(rec, i)  # a new seq makes its entry in the old queue stale

    # --------------------------------------------------------------------------- inspection

    def busy_seconds(self) -> npt.NDArray[np.float64]:
        """Slot-seconds each device has spent running items so far, the running ones included
        (differences over an interval give its average utilization)."""
        view = self.view
        # The view keeps the running slots and the sum of their start times (a shared run's
        # once), so what runs now adds slots × now less that sum.
        in_progress = view.running * self.clock.now() - view.running_since
        return np.array(self.metrics.busy) + in_progress

    def state_of(self, item_id: int | str) -> ItemState:
        rec = self.records.get(item_id)
        if rec is None:
            raise self._unknown(item_id, "look up")
        return rec.state

    def validate_state(self) -> None:
        """Check every invariant between records, queues and the view (``AssertionError``;
        ``hetero.sched.invariants``)."""
        validate_state(self)
