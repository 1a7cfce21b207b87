"""``hetero.Context``: run Python functions on a mixed fleet, placed by ``hetero.sched``.

The context turns calls into work items and drives a ``Dispatcher`` with a ``MonotonicClock``:
``submit`` when a task's arguments are ready, ``complete``/``fail`` when a worker reports,
``device_down`` when a device keeps failing, ``expire`` from a timer at ``next_deadline()``. It
carries out the ``Run``/``Stop``/``Finish`` instructions through a ``Backend`` and turns
``Finish`` into the task's future. It writes no balancing logic of its own: which device runs
what, in which order, stolen by whom, is the dispatcher's answer.

One lock guards the dispatcher and the task table; futures are completed after it is released,
so callbacks may submit more work.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import cloudpickle

from hetero.config import HeteroConfig, SchedulerConfig, load_config
from hetero.devices.spec import Device
from hetero.errors import (
    ConfigError,
    HeteroError,
    NoCapableDevice,
    QueueFull,
    TaskFailed,
)
from hetero.log import config_log_level
from hetero.runtime.backend import Backend
from hetero.runtime.backlog import Backlog
from hetero.runtime.monitor import (
    DeviceSample,
    MemoryPressure,
    Monitor,
    memory_usage,
    usage_of,
)
from hetero.runtime.serialize import (
    Packed,
    Segment,
    SegmentPool,
    pack,
    remove_prefix,
    unpack,
)
from hetero.runtime.status import DeviceStatus, StatusSnapshot, StatusWriter
from hetero.runtime.tasks import TaskFunction, TaskOptions, as_task
from hetero.runtime.worker import TaskOrder, TaskReply
from hetero.sched.clock import MonotonicClock
from hetero.sched.dispatcher import Dispatcher, Finish, Instruction, Run, Stop
from hetero.sched.item import Cause, ItemState, WorkItem
from hetero.sched.perf import PerfModel
from hetero.telemetry.trace import DeviceInfo, TaskTrace
from hetero.units import format_size, parse_size

__all__ = ["Context", "TaskFuture", "get_memory_usage"]

log = logging.getLogger("hetero.runtime")
R = TypeVar("R")

#: Consecutive worker losses after which a device is marked unhealthy and its work moves.
UNHEALTHY_AFTER = 3
#: Messages by which a worker lets go of an order: it ran it, or it does not hold it.
_LET_GO = frozenset({"done", "error", "dropped"})

_open: list[Context] = []  # open contexts, oldest first (get_memory_usage takes the newest)
_ids = itertools.count(1)


class TaskFuture(Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` for one task (``as_completed`` and ``wait`` work), with
    its ``task_id`` and, once it has run, the ``device`` id it ran on."""

    def __init__(self, task_id: int, name: str, ctx: Context | None = None) -> None:
        super().__init__()
        self.task_id = task_id
        self.name = name
        self.device: str | None = None
        self._ctx = ctx

    def cancel(self) -> bool:
        """Cancel the task (stopping it if it runs); ``False`` if it has already ended."""
        if self.done():
            return self.cancelled()
        ctx, self._ctx = self._ctx, None
        if ctx is not None and ctx.cancel(self.task_id):
            return True
        return super().cancel()

    def __repr__(self) -> str:
        return f"<TaskFuture {self.task_id} {self.name} {self._state.lower()}>"

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            f"a future (task {self.task_id}, {self.name}) cannot be sent to a worker: futures "
            "are replaced by their results only as arguments or inside lists, tuples, dicts "
            "(as values) and sets; pass it there, or its result()"
        )


@dataclass(slots=True, eq=False)
class _Task:
    id: int
    name: str
    function: tuple[str, bytes]
    options: TaskOptions
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: TaskFuture
    only: list[str] | None
    submitted: float
    waiting_on: int = 0
    packed: Packed | None = None
    cost: float = 1.0
    declared: bool = False
    batch: bool = False  # of a map or a task graph: placed for the makespan (WorkItem.batch)
    attempt: int = 0
    device: int = -1
    sent: float = 0.0
    order: int = 0  # orders sent before this attempt's (a worker runs its orders in turn)
    result: Any = None
    reply: TaskReply | None = None
    checkpoint_dir: str | None = None
    wrote_checkpoint: bool = False
    item: WorkItem | None = None


@dataclass(slots=True)
class _Ending:
    """A future to complete once the lock is released."""

    future: TaskFuture
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False


@dataclass
class _Profiling:
    name: str
    directory: Path
    started: float
    traces: list[TaskTrace] = field(default_factory=list)


class Context:
    """Run tasks on a fleet of devices, each kept busy in proportion to its speed.

    Args:
        config: a fleet config (path or ``HeteroConfig``); ``None``: this machine's devices.
        devices: the devices to use instead of building them from ``config``.
        strategy: the placement policy (default: the config's ``scheduler.strategy``).
        time_scale: emulated durations are multiplied by it (a 0.1 runs emulation 10× faster).
            ``None`` (the default): 1 for tasks with a declared cost; a task without one is
            paced relative to this host (``cpu_time_scale``: the fastest emulated device runs
            it at half the host's pace or slower, the others slower by their speed ratio).
        memory_pool_size: bytes (or "2GB") each device's worker may use, enforced where the
            framework can (torch and CuPy pool limits, RSS watch on the CPU) and used by
            placement.
        checkpoint_dir: where ``hetero.checkpoint`` writes (default: a temporary directory
            removed at close); ``False`` disables checkpoints.
        prefetch: orders sent ahead to each worker, so it never waits for a round trip.
        max_retries: retries after a lost worker (default: the config's); per task: ``retries``.
        timeout: seconds a task may take from submission (default: the config's).
        backend: ``"local"`` (one process per device on this machine), ``"ray"`` (one actor
            per device on every node of a Ray cluster; the nodes declare the devices) or a
            ``Backend`` instance (default: the config's ``backend.kind``, else local).
        address: the Ray cluster (``"auto"``, ``"host:port"``, ``"ray://host:port"``; default:
            the config's ``backend.address``, else join a running cluster or start a local one).
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | HeteroConfig | None = None,
        *,
        devices: Sequence[Device] | None = None,
        strategy: str | None = None,
        time_scale: float | None = None,
        memory_pool_size: int | str | None = None,
        checkpoint_dir: str | os.PathLike[str] | bool | None = None,
        prefetch: int = 1,
        max_retries: int | None = None,
        timeout: float | None = None,
        backend: str | Backend | None = None,
        address: str | None = None,
    ) -> None:
        problems: list[tuple[str, str]] = []
        if time_scale is not None and not (
            isinstance(time_scale, (int, float)) and 0 < time_scale < math.inf
        ):
            problems.append(("time_scale", f"must be a number > 0, got {time_scale!r}"))
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            problems.append(("prefetch", f"must be an integer >= 0, got {prefetch!r}"))
        pool = None
        if memory_pool_size is not None:
            try:
                pool = parse_size(memory_pool_size)
                if pool <= 0:
                    raise ValueError(f"must be > 0, got {memory_pool_size!r}")
            except (ValueError, TypeError) as exc:
                problems.append(("memory_pool_size", str(exc)))
        if backend is not None and not isinstance(backend, (str, Backend)):
            problems.append(("backend", f"must be 'local', 'ray' or a Backend, got {backend!r}"))
        elif isinstance(backend, str) and backend not in ("local", "ray"):
            problems.append(("backend", f"unknown backend {backend!r}; allowed: local, ray"))
        if problems:
            raise ConfigError(problems)
        scale = 1.0 if time_scale is None else float(time_scale)
        self._config_path: str | None = None
        if isinstance(config, (str, os.PathLike)):
            self._config_path = str(Path(config).resolve())
            config = load_config(Path(config))
        elif config is not None and config.logging.level is not None:
            config_log_level(config.logging.level)  # a config built in code: as from a file
        self.config = config
        sched = config.scheduler if config is not None else SchedulerConfig()
        # Checked before any backend starts: a cluster is not joined (or started) for a typo.
        if strategy is not None:
            from hetero.sched.registry import make_policy

            make_policy(strategy, sched.options)  # ConfigError naming the strategy
        if isinstance(checkpoint_dir, (str, os.PathLike)):
            _check_writable(Path(checkpoint_dir))
        if backend is None:
            backend = config.backend.kind if config is not None else "local"
        if address is None and config is not None:
            address = config.backend.address
        if address is not None and backend != "ray":
            raise ConfigError([("address", f"applies to backend='ray' only, got {address!r}")])
        if backend == "ray":
            from hetero.runtime.ray_backend import RayBackend

            # The fleet given here is that of a local Ray instance the backend starts itself;
            # a cluster's nodes declare their own.
            own = devices if devices is not None else _declared_fleet(config)
            backend = RayBackend(address, time_scale=scale, fleet=own)
        found = backend.discover() if isinstance(backend, Backend) else None
        if found is not None:
            fleet = found
        elif devices is not None:
            fleet = list(devices)
        else:
            from hetero.devices.fleet import fleet_for

            fleet = fleet_for(config)
        if not fleet:
            raise ConfigError([("devices", "the fleet is empty")])
        # The context's own copies: limits and live state set here stay out of the caller's.
        fleet = [dataclasses.replace(d, state=dataclasses.replace(d.state)) for d in fleet]
        for d in fleet:
            _cap_memory(d, pool)
        self.devices = fleet
        overrides: dict[str, Any] = {
            "slots": [1 + prefetch] * len(fleet),
            # A worker runs one task at a time; its other slots hold the next ones ready.
            "parallel": [1] * len(fleet),
            # A long-lived context must not keep a record per task it ever ran.
            "keep_finished": False,
            # Emulated devices do speed × (1 / time_scale) work units per second: priors in the
            # units the model will measure.
            "perf": PerfModel(
                fleet,
                batch_table=sched.batch_sizes,
                unit_rate=1 / scale if all(d.emulated for d in fleet) else 1.0,
            ),
        }
        if max_retries is not None:
            overrides["max_retries"] = max_retries
        if timeout is not None:
            overrides["timeout"] = timeout
        base = config if config is not None else HeteroConfig(devices=[{"type": "cpu"}])  # type: ignore[list-item]
        if strategy is not None:
            base = base.model_copy(
                update={"scheduler": sched.model_copy(update={"strategy": strategy})}
            )
        self.dispatcher = Dispatcher.from_config(
            base, devices=fleet, clock=MonotonicClock(), **overrides
        )
        self.strategy = base.scheduler.strategy
        self.time_scale = scale
        #: The time scale of host-timed work (tasks without a declared cost): a speed-1 device
        #: takes this many seconds per second of this host's CPU time.
        self.cpu_time_scale = scale if time_scale is not None else _relative_scale(fleet)
        self.monitoring_interval = sched.monitoring_interval
        self._monitor: Monitor | None = None
        self._status: StatusWriter | None = None
        self._started_at = time.time()
        self._pressure = MemoryPressure()
        self._busy_mark: tuple[float, list[float]] = (time.monotonic(), [])
        self._flagged: set[str] = set()
        self._own_checkpoints = checkpoint_dir is None
        if checkpoint_dir is False:
            self.checkpoint_dir: Path | None = None
        elif checkpoint_dir is None or checkpoint_dir is True:
            self.checkpoint_dir = Path(tempfile.mkdtemp(prefix="hetero-ckpt-"))
        else:
            self.checkpoint_dir = Path(checkpoint_dir)  # checked writable above
        self._id = next(_ids)
        self._checkpoint_base = (
            f"{self.checkpoint_dir}/ctx{os.getpid()}-{self._id}" if self.checkpoint_dir else ""
        )
        if isinstance(backend, str):
            from hetero.runtime.local import LocalBackend

            limits = [d.memory_limit for d in fleet]
            self.backend: Backend = LocalBackend(time_scale=self.time_scale, memory_limits=limits)
        else:
            self.backend = backend
        self._prefetch = prefetch
        self._memory_pool = pool
        self._lock = threading.RLock()
        self._tasks: dict[int, _Task] = {}
        self._on_device: list[set[int]] = [set() for _ in fleet]
        self._losses = [0] * len(fleet)
        self._backlog: Backlog[_Task] = Backlog()
        self._garbage: deque[list[Segment] | str] = deque()  # segments, checkpoint dirs
        # Argument files: rewritten for later tasks once no worker maps them (SegmentPool).
        self._pool = SegmentPool()
        self._readers: dict[str, set[int]] = {}  # file -> devices that may still map it
        self._retired: dict[str, int] = {}  # files of ended tasks still mapped: name -> size
        self._placements: dict[tuple[Any, Any], list[str]] = {}
        self._functions: dict[tuple[int, int], tuple[Any, tuple[str, bytes]]] = {}
        self._fn_keys = itertools.count()
        self._ids = itertools.count(1)
        self._closed = False
        self._closing = False
        self._stops = [0] * len(fleet)  # orders cancelled per device, not yet confirmed
        self._orders = itertools.count()
        # Devices whose worker was told to stop the task it runs: the tasks stopped there that
        # the worker has not yet let go of. Such a device takes no work until it has, or is gone.
        self._holding: dict[int, set[int]] = {}
        self._started = False
        self._warned: set[str] = set()
        self._profiles: list[_Profiling] = []
        self._deadline_cond = threading.Condition(self._lock)
        self._timer: threading.Thread | None = None
        self.stats = {"submitted": 0, "done": 0, "failed": 0, "cancelled": 0, "retried": 0}
        _open.append(self)
        from hetero.telemetry import PROFILE_DIR_ENV, PROFILE_NAME_ENV

        env_dir = os.environ.get(PROFILE_DIR_ENV)
        if env_dir:
            name = os.environ.get(PROFILE_NAME_ENV) or "run"
            self._env_profile: _Profiling | None = self._start_profile(name, Path(env_dir))
        else:
            self._env_profile = None

    # ------------------------------------------------------------------------ public API

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # A clean exit waits for submitted work (as concurrent.futures does); an exception
        # (Ctrl-C included) cancels what has not finished.
        self.close(wait=exc_type is None)

    def run(self, fn: Callable[..., R] | TaskFunction[Any, R], /, *args: Any, **kwargs: Any) -> R:
        """Run one task on the device the policy picks and return its result (``TaskFailed``
        if it fails)."""
        return self.submit(fn, *args, **kwargs).result()  # type: ignore[no-any-return]

    def submit(
        self, fn: Callable[..., Any] | TaskFunction[Any, Any], /, *args: Any, **kwargs: Any
    ) -> TaskFuture:
        """Start a task; returns its future. Futures among the arguments (also inside lists,
        tuples, dicts and sets) are resolved first: a task graph."""
        spec = as_task(fn)
        return self._submit(spec, args, kwargs)

    def map(
        self,
        fn: Callable[..., Any] | TaskFunction[Any, Any],
        iterable: Iterable[Any],
        *,
        batch_size: int | str = "auto",
        ordered: bool = True,
        window: int | None = None,
        progress: bool | None = None,
    ) -> Iterator[Any]:
        """``fn`` over every item, spread over every device by its speed: an iterator of the
        results, in input order (``ordered=False``: as batches complete).

        ``batch_size`` is items per task ("auto": sized by measured speed, shrinking towards
        the end); at most ``window`` batches are in flight (default 4 per device), so
        iterators and streams map in bounded memory; ``progress`` shows a bar (default: when
        stderr is a terminal). See ``hetero.runtime.mapping``."""
        from hetero.runtime.mapping import MapRun

        return MapRun(self, as_task(fn), iterable, batch_size, ordered, window, progress)

    def profile(self, name: str = "run", directory: str | os.PathLike[str] | None = None) -> Any:
        """Record every task attempt while the block runs; on exit write ``<name>.trace.json``
        (Chrome trace, opens in Perfetto) and ``<name>.html`` to ``directory``
        (default ``./hetero-profile``)."""
        return _ProfileBlock(self, name, Path(directory or "hetero-profile"))

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Shut down. ``wait``: let submitted tasks finish first; else cancel them. Workers end
        either way; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closing = True
        if wait:
            self._wait_all(timeout)
        endings: list[_Ending] = []
        with self._lock:
            self._closed = True
            self._backlog.clear()
            out: list[Instruction] = []
            for task_id in list(self._tasks):
                if task_id in self.dispatcher.records:
                    out += self.dispatcher.cancel(task_id, "context closed")
            self._apply(out, endings)
            for task in list(self._tasks.values()):  # waiting on parents, or in the backlog
                endings.append(_Ending(task.future, cancelled=True))
                self._forget(task)
            self._deadline_cond.notify_all()
        self.backend.flush()
        self._settle(endings)
        if self._monitor is not None:
            self._monitor.stop(timeout=2.0)
        if self._status is not None:
            self._status.close()
        self.backend.close(timeout=2.0)
        self._pool.clear()
        remove_prefix(self._segment_prefix())  # argument files still mapped at the end
        if self._env_profile is not None:
            self._finish_profile(self._env_profile)
        if self._own_checkpoints and self.checkpoint_dir is not None:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        with contextlib.suppress(ValueError):
            _open.remove(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def device_infos(self) -> list[DeviceInfo]:
        """The devices with their speeds in work units per second: an emulated device's
        declared one over the time scale (its pacing makes it exact), else the measured one
        where observed."""
        speed = self.dispatcher.perf.speed()
        return [
            DeviceInfo(
                d.id,
                d.model,
                d.kind.value,
                d.speed / self.time_scale if d.emulated else float(speed[i]),
                d.emulated,
            )
            for i, d in enumerate(self.devices)
        ]

    def start(self, timeout: float = 60.0) -> Context:
        """Start every device's worker now and wait until each is ready (workers otherwise
        start on their first task, whose latency then includes the start). Returns the
        context, so ``with hetero.Context(...).start() as ctx:`` works."""
        if self._closed or self._closing:
            raise HeteroError("this Context is closed; create a new one to run more tasks")
        self._ensure_started()
        self.backend.warm(timeout)
        return self

    # --------------------------------------------------------------------------- submit

    def _submit(
        self,
        spec: TaskFunction[Any, Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        function: tuple[str, bytes] | None = None,
        name: str | None = None,
        cost: tuple[float, bool] | None = None,
        batch: bool = False,
    ) -> TaskFuture:
        if self._closed or self._closing:
            raise HeteroError("this Context is closed; create a new one to run more tasks")
        self._ensure_started()
        options = spec.options
        only = self._devices_for(spec)
        function = function or self._function(spec)
        task_id = next(self._ids)
        name = name or spec.name
        future = TaskFuture(task_id, name, self)
        task = _Task(
            task_id,
            name,
            function,
            options,
            tuple(args),
            dict(kwargs),
            future,
            only,
            time.monotonic(),
        )
        if cost is not None:
            task.cost, task.declared = cost
        if self.checkpoint_dir is not None:
            task.checkpoint_dir = f"{self._checkpoint_base}/{task_id}"
        parents = _futures_in((task.args, task.kwargs))
        self.stats["submitted"] += 1
        task.batch = batch
        if not parents:
            self._admit(task)
            return future
        task.batch = True  # a node of a task graph: the graph's end is what counts
        task.waiting_on = len(parents)
        with self._lock:
            self._tasks[task_id] = task
        for parent in parents:
            parent.add_done_callback(functools.partial(self._parent_done, task))
        return future

    def _devices_for(self, spec: TaskFunction[Any, Any]) -> list[str] | None:
        """The devices a task may use: those its ``devices`` option selects, of the kinds it has
        variants for (``None``: any). Cached per option values: it runs at every submit."""
        options = spec.options
        variants = options.variants
        kinds = None if not variants or "default" in variants else frozenset(variants)
        key = (options.devices, kinds)
        if key == (None, None):
            return None
        cached = self._placements.get(key)
        if cached is not None:
            return cached
        ids = [d.id for d in self.devices]
        if options.devices is not None:
            from hetero.sched.policies.selectors import select

            try:
                mask = select(options.devices, self.dispatcher.view, f"task {spec.name!r}: devices")
            except ValueError as exc:
                raise NoCapableDevice(str(exc)) from None
            ids = [i for i, ok in zip(ids, mask, strict=True) if ok]
        if kinds is not None:
            by_kind = {d.id: d.kind.value for d in self.devices}
            ids = [i for i in ids if by_kind[i] in kinds]
            if not ids:
                have = sorted({d.kind.value for d in self.devices})
                raise NoCapableDevice(
                    f"task {spec.name!r} has variants for {', '.join(sorted(kinds))} but "
                    f"{'the devices it may use are' if options.devices else 'the fleet has only'} "
                    f"{', '.join(have)} devices; add a 'default' variant or such a device"
                )
        self._placements[key] = ids
        return ids

    def _function(self, spec: TaskFunction[Any, Any]) -> tuple[str, bytes]:
        """The task's code, pickled once per function object (workers cache it by key)."""
        variants = spec.options.variants
        obj: Any = spec.fn if not variants else dict(variants)
        if variants and "default" not in variants:
            obj.setdefault("default", spec.fn)
        # Keyed by the function object (kept alive here, so its id stays unique), not by the
        # TaskFunction: submitting a plain function wraps it anew each time.
        cache_key = (id(spec.fn), id(variants) if variants else 0)
        cached = self._functions.get(cache_key)
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
        entry = (f"{self._id}-{next(self._fn_keys)}", blob)
        self._functions[cache_key] = ((spec.fn, variants), entry)
        return entry

    def _parent_done(self, task: _Task, parent: Future) -> None:  # type: ignore[type-arg]
        endings: list[_Ending] = []
        with self._lock:
            if task.future.done() or task.id not in self._tasks:
                return
            if parent.cancelled() or parent.exception() is not None:
                failure = None if parent.cancelled() else parent.exception()
                # The parent's message alone: its traceback is printed once, with the parent
                # itself as this error's cause, not again at every level of the graph.
                reason = failure.message if isinstance(failure, TaskFailed) else failure
                cause = "was cancelled" if failure is None else f"failed: {reason}"
                pid = getattr(parent, "task_id", "?")
                error = TaskFailed(
                    f"task {task.id} ({task.name}) not run: parent task {pid} {cause}"
                )
                error.__cause__ = failure
                del self._tasks[task.id]
                self.stats["failed"] += 1
                endings.append(_Ending(task.future, error=error))
            else:
                task.waiting_on -= 1
                if task.waiting_on > 0:
                    return
                del self._tasks[task.id]
                memo: dict[int, Any] = {}
                task.args = _resolved(task.args, memo)
                task.kwargs = _resolved(task.kwargs, memo)
        if endings:
            self._settle(endings)
            return
        try:
            self._admit(task)
        except HeteroError as exc:
            task.future.set_exception(exc)

    def _admit(self, task: _Task) -> None:
        """Pack the arguments and hand the task to the dispatcher."""
        options = task.options
        if options.cost is not None and not task.declared:
            task.cost, task.declared = options.cost_of(task.args, task.kwargs)
        try:
            task.packed = pack(
                (task.args, task.kwargs),
                f"{self._segment_prefix()}-a{task.id}",
                self._pool,
                inline=not self.backend.shared_memory,
            )
        except Exception as exc:
            raise HeteroError(
                f"the arguments of task {task.id} ({task.name}) cannot be sent to a worker: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if all(owned for _, _, owned in task.packed.segments):
            task.args, task.kwargs = (), {}  # the packed copy is what retries use
        # else they hold kept results the order refers to: alive until the task ends
        item = WorkItem(
            cost=task.cost,
            kind=options.kind if task.declared else options.speed_kind(task.name),
            memory=options.memory,
            priority=options.priority,
            tags=options.tags,
            id=task.id,
            batch=task.batch,
        )
        task.item = item
        endings: list[_Ending] = []
        with self._lock:
            if self._closed:
                self._release(task)
                raise HeteroError("this Context is closed; create a new one to run more tasks")
            self._tasks[task.id] = task
            if self._backlog:
                self._backlog.push(task, options.priority)
                return
            if not self.dispatcher.view.usable.all() and self._stranded(task):
                del self._tasks[task.id]
                self._release(task)
                raise NoCapableDevice(
                    f"task {task.name!r}: no device it may use is left in the fleet "
                    f"(now: {', '.join(self.dispatcher.members) or 'none'})"
                )
            try:
                out = self.dispatcher.submit(
                    item, only=task.only, retries=options.retries, timeout=options.timeout
                )
            except QueueFull:  # the context keeps a backlog instead of refusing work
                self._backlog.push(task, options.priority)
                return
            except HeteroError as exc:
                del self._tasks[task.id]
                self._release(task)
                if isinstance(exc, NoCapableDevice):
                    raise NoCapableDevice(f"task {task.name!r}: {exc}") from None
                raise
            self._apply(out, endings)
        self.backend.flush()
        self._settle(endings)

    def _segment_prefix(self) -> str:
        return f"hetero-{os.getpid()}-c{self._id}"

    # ------------------------------------------------------------------- instructions out

    def _apply(self, out: list[Instruction], endings: list[_Ending]) -> None:
        """Carry out the dispatcher's instructions (called with the lock held)."""
        more: list[Instruction] = []
        for ins in out:
            if type(ins) is Run:
                if ins.device in self._holding:
                    more += self._redirect(ins)
                else:
                    self._run(ins)
            elif type(ins) is Finish:
                self._finish(ins, endings)
            elif type(ins) is Stop:
                more += self._stop(ins)
            else:  # WakeAt: the timer thread reads the new earliest deadline
                self._deadline_cond.notify()
        if more:
            self._apply(more, endings)
        elif self._backlog:
            self._drain_backlog(endings)

    def _stop(self, ins: Stop) -> list[Instruction]:
        """Have the worker stop a task: an order not yet started is dropped; to stop the one it
        runs, the worker ends (the backend kills it if it cannot: C code holding the GIL). Until
        it has let go of that task, its device is held (drained: its queue moves on, nothing
        new is placed there), since the slot is not free while the task may still run."""
        task = self._tasks.get(ins.item.id)  # type: ignore[arg-type]
        if task is None or task.device < 0:
            return []
        device = task.device
        on_device = self._on_device[device]
        on_device.discard(task.id)
        status = "failed" if ins.cause is Cause.TIMED_OUT else "cancelled"
        self._trace(task, None, status, ins.reason)
        self._stops[device] += 1
        self.backend.cancel(device, task.id)
        task.device = -1
        held = self._holding.get(device)
        if held is not None:
            held.add(task.id)
            return []
        tasks = self._tasks
        if not self.dispatcher.view.usable[device] or any(
            tasks[t].order < task.order for t in on_device if t in tasks
        ):
            return []  # its device is going down or away, or it waits behind another order
        self._holding[device] = {task.id}
        return self.dispatcher.drain_device(self.devices[device].id)

    def _redirect(self, ins: Run) -> list[Instruction]:
        """A ``Run`` decided before its device was held, whose worker is being stopped: placed
        again (charged no attempt), unless it has ended since (later in the same burst)."""
        rec = self.dispatcher.records.get(ins.item.id)
        if rec is None or rec.state is not ItemState.RUNNING or rec.device != ins.device:
            return []
        return self.dispatcher.requeue(ins.item.id, "its device is stopping a task")

    def _stopped(self, device: int, task_id: int, endings: list[_Ending]) -> None:
        """The worker of held ``device`` has let go of ``task_id`` (dropped it, or replied);
        once it has let go of every task stopped there, the device takes work again."""
        held = self._holding[device]
        held.discard(task_id)
        if not held:
            del self._holding[device]
            self._apply(self.dispatcher.device_up(self.devices[device].id), endings)

    def _run(self, ins: Run) -> None:
        task = self._tasks[ins.item.id]  # type: ignore[index]
        task.attempt += 1
        task.device = ins.device
        task.sent = time.monotonic()
        task.order = next(self._orders)
        self._on_device[ins.device].add(task.id)
        for name, _, owned in task.packed.segments if task.packed is not None else ():
            if owned:
                self._readers.setdefault(name, set()).add(ins.device)
        assert task.packed is not None
        order = TaskOrder(
            task.id,
            task.attempt,
            task.function[0],
            task.packed,
            task.name,
            task.cost,
            task.declared,
            task.checkpoint_dir,
            self.cpu_time_scale,
        )
        if log.isEnabledFor(logging.DEBUG):
            self._log_decision(task, ins.device)
        self.backend.send(ins.device, order, task.function)

    def _log_decision(self, task: _Task, device: int) -> None:
        view = self.dispatcher.view
        assert task.item is not None
        delays = view.expected_delay(task.item.kind, task.cost)
        ranked = sorted(range(view.n), key=lambda i: float(delays[i]))
        others = ", ".join(
            f"{view.ids[i]} {float(delays[i]):.3g}s" for i in ranked[:3] if i != device
        )
        log.debug(
            "task %d (%s, cost %.3g, attempt %d) -> %s by %s: expected delay %.3gs there; "
            "next best: %s",
            task.id,
            task.name,
            task.cost,
            task.attempt,
            view.ids[device],
            self.strategy,
            float(delays[device]),
            others or "none",
        )

    def _finish(self, ins: Finish, endings: list[_Ending]) -> None:
        task = self._tasks.pop(ins.item.id, None)  # type: ignore[arg-type]
        if task is None:
            return
        if task.device >= 0:
            self._on_device[task.device].discard(task.id)
        self._release(task)
        if ins.state is ItemState.DONE:
            self.stats["done"] += 1
            endings.append(_Ending(task.future, result=task.result))
        elif ins.state is ItemState.CANCELLED:
            self.stats["cancelled"] += 1
            endings.append(_Ending(task.future, cancelled=True))
        else:
            self.stats["failed"] += 1
            reply = task.reply
            error = TaskFailed(
                f"task {task.id} ({task.name}) failed: {ins.reason}",
                reply.remote_traceback if reply is not None and reply.remote_traceback else None,
            )
            if reply is not None and reply.exception is not None:
                with contextlib.suppress(Exception):
                    error.__cause__ = cloudpickle.loads(reply.exception)
            endings.append(_Ending(task.future, error=error))
        task.result = None

    def _release(self, task: _Task) -> None:
        # Files are removed after the futures are set (in _settle), off the latency path:
        # unlinking 100 MB of shared memory takes longer than the rest of a round trip.
        if task.packed is not None:
            free: list[Segment] = []
            for segment in task.packed.segments:
                name, size, owned = segment
                if not owned:
                    continue  # a kept result's: it is the result's to remove
                if self._readers.get(name):
                    self._retired[name] = size  # recycled once every worker lets go
                else:
                    self._readers.pop(name, None)
                    free.append(segment)
            if free:
                self._garbage.append(free)
            task.packed = None
        task.args, task.kwargs = (), {}
        if task.wrote_checkpoint and task.checkpoint_dir is not None:
            self._garbage.append(task.checkpoint_dir)

    def _forget(self, task: _Task) -> None:
        self._tasks.pop(task.id, None)
        self._release(task)

    def _end_unplaced(
        self, task: _Task, endings: list[_Ending], error: TaskFailed | None = None
    ) -> None:
        """End a task the dispatcher does not hold (waiting on parents, or in the backlog):
        cancelled, or failed with ``error``."""
        self._backlog.remove(task)
        self._forget(task)
        if error is None:
            self.stats["cancelled"] += 1
            endings.append(_Ending(task.future, cancelled=True))
        else:
            self.stats["failed"] += 1
            endings.append(_Ending(task.future, error=error))

    def _drain_backlog(self, endings: list[_Ending]) -> None:
        while self._backlog and self.dispatcher.waiting < self.dispatcher.max_queue_size:
            task = self._backlog.pop()
            assert task.item is not None
            out = self.dispatcher.submit(
                task.item,
                only=task.only,
                retries=task.options.retries,
                timeout=task.options.timeout,
            )
            self._apply(out, endings)

    def _settle(self, endings: list[_Ending]) -> None:
        """Complete futures (outside the lock), then remove what ended tasks left behind."""
        for e in endings:
            if e.future.done():
                continue  # cancelled by its owner meanwhile
            if e.cancelled:
                Future.cancel(e.future)
            elif e.error is not None:
                e.future.set_exception(e.error)
            else:
                e.future.set_result(e.result)
        garbage = self._garbage
        while garbage:
            try:
                item = garbage.popleft()
            except IndexError:  # another thread took the last one
                break
            if isinstance(item, str):
                shutil.rmtree(item, ignore_errors=True)
            else:
                for name, size, _ in item:
                    self._pool.give(name, size)

    def cancel(self, task_id: int) -> bool:
        """Cancel a task wherever it is (a running one is stopped); ``False`` if it has ended."""
        endings: list[_Ending] = []
        with self._lock:
            task = self._tasks.get(task_id)
            if task is None:
                return False
            if task_id not in self.dispatcher.records:
                self._end_unplaced(task, endings)
            else:
                self._apply(self.dispatcher.cancel(task_id, "cancelled by the caller"), endings)
        self.backend.flush()
        self._settle(endings)
        return True

    # ------------------------------------------------------------------------ events in

    def replies(self, device: int, messages: list[tuple[Any, ...]]) -> None:
        """What the worker of ``device`` reported, handled under one lock acquisition."""
        endings: list[_Ending] = []
        recycle = self.backend.recycle
        results = [
            unpack(m[1].result, keep=True, on_release=recycle) if m[0] == "done" else None
            for m in messages
        ]
        with self._lock:
            for msg, unpacked in zip(messages, results, strict=True):
                tag = msg[0]
                if unpacked is not None:
                    self._done(device, msg[1], unpacked, endings)
                elif tag == "error":
                    self._error(device, msg[1], endings)
                elif tag == "dropped":
                    self._stops[device] = max(0, self._stops[device] - 1)
                elif tag == "released":
                    self._let_go(device, msg[1])
                elif tag == "warn" and msg[1] not in self._warned:
                    self._warned.add(msg[1])
                    log.warning("%s", msg[1])
                if device in self._holding and tag in _LET_GO:
                    self._stopped(device, msg[1] if tag == "dropped" else msg[1].task_id, endings)
        self.backend.flush()
        self._settle(endings)

    def _let_go(self, device: int, names: Iterable[str]) -> None:
        """``device``'s worker no longer maps these argument files."""
        free: list[Segment] = []
        for name in names:
            readers = self._readers.get(name)
            if readers is None:
                continue
            readers.discard(device)
            if not readers:
                del self._readers[name]
                size = self._retired.pop(name, None)
                if size is not None:
                    free.append((name, size, True))
        if free:
            self._garbage.append(free)

    def _done(
        self, device: int, reply: TaskReply, unpacked: tuple[Any, float], endings: list[_Ending]
    ) -> None:
        task = self._current(device, reply)
        if task is None:
            return
        self._losses[device] = 0
        task.result, seconds = unpacked
        reply.unpack_seconds += seconds
        task.wrote_checkpoint |= reply.checkpointed
        task.future.device = self.devices[device].id
        self._trace(task, reply, "done")
        out = self.dispatcher.complete(task.id, service_time=reply.ended - reply.started)
        self._apply(out, endings)

    def _error(self, device: int, reply: TaskReply, endings: list[_Ending]) -> None:
        task = self._current(device, reply)
        if task is None:
            return
        task.reply = reply
        task.wrote_checkpoint |= reply.checkpointed
        task.future.device = self.devices[device].id
        retry = reply.retryable and (task.options.retry_exceptions or reply.out_of_memory)
        out = self.dispatcher.fail(task.id, reply.error, retryable=retry)
        self._attempt_ended(task, reply, out, reply.error)
        self._apply(out, endings)

    def worker_lost(self, device: int, reason: str) -> None:
        endings: list[_Ending] = []
        with self._lock:
            if self._closed:
                return
            held = self._holding.pop(device, None) is not None  # the worker is gone now
            lost = [
                t
                for t in map(self._tasks.get, sorted(self._on_device[device]))
                if t is not None and self.dispatcher.state_of(t.id) is ItemState.RUNNING
            ]
            self._on_device[device].clear()
            self._let_go(device, [n for n, d in self._readers.items() if device in d])
            deliberate = self._stops[device] > 0  # ended to stop a task: not the device's fault
            self._stops[device] = 0
            if not deliberate:
                self._losses[device] += 1
            for task in lost:
                task.wrote_checkpoint = True  # unknown: it may have written one
            if lost:
                level = logging.INFO if deliberate else logging.WARNING
                log.log(level, "%s; %d task(s) moved", reason, len(lost))
            out: list[Instruction] = []
            if self._losses[device] >= UNHEALTHY_AFTER:
                # Down first, so that the lost tasks and the queue move elsewhere rather than
                # back onto this device.
                dev = self.devices[device].id
                log.warning("%s marked unhealthy after %d lost workers", dev, self._losses[device])
                why = f"{reason}; marked unhealthy after {self._losses[device]} lost workers"
                out += self.dispatcher.device_down(dev, why)
            else:
                for task in lost:
                    if deliberate:
                        out += self.dispatcher.requeue(task.id, reason)
                    else:
                        out += self.dispatcher.fail(task.id, reason, retryable=True)
                if held:
                    out += self.dispatcher.device_up(self.devices[device].id)
            for task in lost:
                self._attempt_ended(task, None, out, reason, charged=not deliberate)
            self._apply(out, endings)
            if self._losses[device] >= UNHEALTHY_AFTER:
                self._fail_if_fleetless(f"{self.devices[device].id}: {reason}", endings)
        self.backend.flush()
        self._settle(endings)

    def device_added(self, device: Device) -> int:
        """A device joined (its node joined the cluster): it takes work at once."""
        endings: list[_Ending] = []
        with self._lock:
            _cap_memory(device, self._memory_pool)
            index = len(self.devices)
            self.devices.append(device)
            self._on_device.append(set())
            self._losses.append(0)
            self._stops.append(0)
            self._placements.clear()  # device selections: one more device to match
            log.info("%s joined the fleet", device.id)
            out = self.dispatcher.add_device(device, slots=1 + self._prefetch, parallel=1)
            self._apply(out, endings)
        self.backend.flush()
        self._settle(endings)
        return index

    def device_gone(self, device: int, reason: str) -> None:
        """``device`` left for good: what it ran or held queued is placed elsewhere, without
        being charged an attempt (it did not fail)."""
        endings: list[_Ending] = []
        with self._lock:
            if self._closed:
                return
            dev = self.devices[device]
            self._on_device[device].clear()
            self._stops[device] = 0
            self._holding.pop(device, None)
            out = self.dispatcher.remove_device(dev.id, reason)
            log.warning("%s left the fleet: %s", dev.id, reason)
            self._apply(out, endings)
            self._fail_if_fleetless(reason, endings)
        self.backend.flush()
        self._settle(endings)

    def _fail_if_fleetless(self, reason: str, endings: list[_Ending]) -> None:
        """End every task that no device left could run (failed, with the reason) rather than
        let its caller wait for ever: all of them when the fleet is empty."""
        why = f"no device it may use is left (the last: {reason})"
        out: list[Instruction] = []
        for task in list(self._tasks.values()):
            if not self._stranded(task):
                continue
            if task.id in self.dispatcher.records:
                out += self.dispatcher.abandon(task.id, why)
            else:
                error = TaskFailed(f"task {task.id} ({task.name}) failed: {why}")
                self._end_unplaced(task, endings, error)
        self._apply(out, endings)

    def _stranded(self, task: _Task) -> bool:
        """Whether no usable device may run ``task`` (devices that left never come back)."""
        view = self.dispatcher.view
        holding = self._holding  # held devices take work again once their worker lets go
        if task.only is None:
            return not (view.usable.any() or holding)
        index = view.index
        return not any(view.usable[index[i]] or index[i] in holding for i in task.only)

    def _attempt_ended(
        self,
        task: _Task,
        reply: TaskReply | None,
        out: list[Instruction],
        reason: str,
        charged: bool = True,
    ) -> None:
        """Trace and count an attempt that failed: ``failed`` when the dispatcher ended the
        task with it (``out`` holds its ``Finish``), else ``retried``."""
        final = any(type(i) is Finish and i.item.id == task.id for i in out)
        if not final and charged:
            self.stats["retried"] += 1
        self._trace(task, reply, "failed" if final else "retried", reason)
        if reply is None:
            task.device = -1

    def _current(self, device: int, reply: TaskReply) -> _Task | None:
        """The task a reply is for, unless the reply is stale (an attempt already moved on)."""
        task = self._tasks.get(reply.task_id)
        if task is None or task.attempt != reply.attempt or task.device != device:
            return None  # its result, if any, is removed when collected
        self._on_device[device].discard(task.id)
        return task

    # --------------------------------------------------------------------------- threads

    def _ensure_started(self) -> None:
        if self._started:
            return
        with self._lock:
            if self._started:
                return
            self.backend.start(self.devices, self)
            self._timer = threading.Thread(
                target=self._expire_loop, daemon=True, name="hetero-timer"
            )
            self._timer.start()
            self._status = _status_writer()
            self._monitor = Monitor(
                self._monitor_targets, self._on_sample, interval=self.monitoring_interval
            )
            self._monitor.start()
            self._started = True

    def _expire_loop(self) -> None:
        with self._lock:
            while not self._closed:
                deadline = self.dispatcher.next_deadline()
                if deadline is None:
                    self._deadline_cond.wait()
                    continue
                delay = deadline - time.monotonic()
                if delay > 0:
                    self._deadline_cond.wait(delay)
                    continue
                endings: list[_Ending] = []
                self._apply(self.dispatcher.expire(), endings)
                self._lock.release()
                try:
                    self.backend.flush()
                    self._settle(endings)
                finally:
                    self._lock.acquire()

    def _monitor_targets(self) -> list[tuple[Device, int | None]]:
        """The devices this process reads itself (on this machine), with their worker pids."""
        here = self.backend.on_this_machine()
        pids = self.backend.pids()
        return [(d, pids[i]) for i, d in enumerate(self.devices) if here[i]]

    def _on_sample(self, samples: list[DeviceSample]) -> None:
        """Fold a round of device readings (this machine's, and those the backend took on
        other machines) into the fleet's state and publish a status.

        Memory measured beyond what placed tasks declare goes to the dispatcher, so a device
        that fills up gets no more tasks that need memory; a device reporting errors is marked
        down. Slowdowns need nothing here: observed durations already lower the device's speed.
        """
        samples = [*samples, *self.backend.remote_samples()]
        out: list[Instruction] = []
        with self._lock:
            view = self.dispatcher.view
            found = [(view.index[s.device_id], s) for s in samples if s.device_id in view.index]
            for i, sample in found:
                device = self.devices[i]
                if sample.memory_used is not None:
                    held = max(0, sample.memory_used - int(view.mem_used[i]))
                    out += self.dispatcher.set_external_memory(device.id, held)
                if sample.errors and not device.emulated and device.kind.value == "gpu":
                    self._holding.pop(i, None)  # down now: it takes no work until device_up
                    out += self.dispatcher.device_down(device.id, "device reported errors")
            endings: list[_Ending] = []
            self._apply(out, endings)
        self.backend.flush()
        self._settle(endings)
        busy = self._busy_percent()
        for device, percent in zip(self.devices, busy, strict=False):
            if device.emulated:
                # Its worker mostly sleeps (pacing): busy is the time it held tasks.
                device.state.utilization = percent
        for i, sample in found:
            device = self.devices[i]
            state = device.state
            if not device.emulated and sample.utilization is not None:
                state.utilization = sample.utilization
            if sample.memory_used is not None:
                state.memory_used = sample.memory_used
            state.temperature_c = sample.temperature
            if (
                self._pressure.is_high(sample.memory_used, sample.memory_total)
                and device.id not in self._flagged
            ):
                self._flagged.add(device.id)
                log.warning("%s is nearly out of memory (%s)", device.id, _usage(sample))
        if self._status is not None:
            self._status.write(self.status())

    def _busy_percent(self) -> list[float]:
        """Per device, the percent of the time since the last call spent on tasks (service time
        of the tasks completed since)."""
        now = time.monotonic()
        with self._lock:
            busy = list(self.dispatcher.metrics.busy)
        last_at, last = self._busy_mark
        self._busy_mark = (now, busy)
        span = now - last_at
        if not last or span <= 0:
            return [0.0] * len(busy)
        last = last + busy[len(last) :]  # devices that joined since: no time measured yet
        return [
            min(100.0, max(0.0, 100.0 * (b - a) / span)) for a, b in zip(last, busy, strict=True)
        ]

    def status(self) -> StatusSnapshot:
        """What ``hetero top`` shows: the tasks by state, and each device's load and speed."""
        with self._lock:
            d = self.dispatcher
            speed = d.perf.speed()
            metrics = d.metrics
            devices: list[DeviceStatus] = []
            for i, device in enumerate(self.devices):
                done = int(metrics.completed[i])
                devices.append(
                    {
                        "id": device.id,
                        "model": device.model,
                        "kind": device.kind.value,
                        "emulated": device.emulated,
                        "healthy": bool(d.view.usable[i]) or i in self._holding,
                        "speed": float(speed[i]) if done else None,
                        "prior_speed": d.perf.prior(device, "default"),
                        "running": int(d.view.running[i]),
                        "queued": int(d.view.in_flight[i] - d.view.running[i]),
                        "done": done,
                        "failed": int(metrics.failed[i]),
                        "utilization": device.state.utilization,
                        "memory_used": device.state.memory_used,
                        "memory_total": device.memory_bytes,
                        "temperature": device.state.temperature_c,
                    }
                )
            running = int(d.view.running.sum())
            return {
                "pid": os.getpid(),
                "started": self._started_at,
                "updated": time.time(),
                "config": self._config_path,
                "tasks": {
                    "submitted": self.stats["submitted"],
                    "done": self.stats["done"],
                    "failed": self.stats["failed"],
                    "running": running,
                    "waiting": len(self._tasks) - running,
                },
                "devices": devices,
            }

    def memory_usage(self) -> dict[str, dict[str, int]]:
        """``{device id: {"used", "free", "total"}}`` in bytes, read from each device now."""
        here = self._monitor_targets()
        pids = {d.id: p for d, p in here if p is not None}
        usage = memory_usage([d for d, _ in here], pids)
        by_id = {d.id: d for d in self.devices}
        for sample in self.backend.remote_samples():
            usage[sample.device_id] = usage_of(by_id[sample.device_id], sample)
        return usage

    def _wait_all(self, timeout: float | None) -> None:
        with self._lock:
            futures = [t.future for t in self._tasks.values()] + [t.future for t in self._backlog]
        from concurrent.futures import wait

        wait(futures, timeout=timeout)

    # ------------------------------------------------------------------------- profiling

    def _trace(self, task: _Task, reply: TaskReply | None, status: str, error: str = "") -> None:
        if not self._profiles:
            return
        now = time.monotonic()
        record = TaskTrace(
            task_id=task.id,
            name=task.name,
            device=self.devices[task.device].id if task.device >= 0 else "",
            attempt=task.attempt,
            cost=task.cost,
            submitted=task.submitted,
            sent=task.sent,
            started=reply.started if reply is not None else task.sent,
            ended=reply.ended if reply is not None else now,
            transfer_in=(task.packed.seconds if task.packed else 0.0)
            + (reply.unpack_seconds if reply is not None else 0.0),
            transfer_out=reply.pack_seconds if reply is not None else 0.0,
            bytes_in=task.packed.nbytes if task.packed else 0,
            bytes_out=reply.bytes_out if reply is not None else 0,
            status=status,
            error=error,
        )
        for p in self._profiles:
            p.traces.append(record)

    def _start_profile(self, name: str, directory: Path) -> _Profiling:
        prof = _Profiling(name, directory, time.monotonic())
        with self._lock:
            self._profiles.append(prof)
        return prof

    def _finish_profile(self, prof: _Profiling) -> Any:
        from hetero.telemetry import Profile

        with self._lock:
            if prof in self._profiles:
                self._profiles.remove(prof)
        profile = Profile(prof.traces, self.device_infos(), prof.started, time.monotonic())
        paths = profile.save(prof.directory, _unique_name(prof.directory, prof.name))
        log.info("profile written: %s", ", ".join(str(p) for p in paths))
        return profile, paths


class _ProfileBlock:
    """What ``Context.profile`` returns: a context manager; after the block, ``profile`` holds
    the ``Profile`` and ``paths`` the files written."""

    def __init__(self, ctx: Context, name: str, directory: Path) -> None:
        self._ctx = ctx
        self._name = name
        self._directory = directory
        self._prof: _Profiling | None = None
        self.profile: Any = None
        self.paths: tuple[Path, ...] = ()

    def __enter__(self) -> _ProfileBlock:
        self._prof = self._ctx._start_profile(self._name, self._directory)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._prof is not None
        self.profile, paths = self._ctx._finish_profile(self._prof)
        self.paths = tuple(paths)


def _status_writer() -> StatusWriter | None:
    """The writer of this process's status for ``hetero top``, or ``None`` (with a warning) when
    its directory cannot be used: a run does not fail for want of a status file."""
    writer = StatusWriter()
    try:
        writer.prepare()
    except (HeteroError, OSError) as exc:
        log.warning("%s; this Context publishes no status for `hetero top`", exc)
        return None
    return writer


def _usage(sample: DeviceSample) -> str:
    used, total = sample.memory_used or 0, sample.memory_total or 0
    return f"{format_size(used)} of {format_size(total)} used"


def get_memory_usage() -> dict[str, dict[str, int]]:
    """Memory used and free per device of the most recently created open ``Context``."""
    for ctx in reversed(_open):
        if not ctx.closed:
            return ctx.memory_usage()
    raise HeteroError("get_memory_usage() needs an open hetero.Context")


def _cap_memory(device: Device, pool: int | None) -> None:
    """Limit ``device`` to ``memory_pool_size`` bytes (``None``: no cap)."""
    if pool is not None:
        limit = device.memory_limit
        device.memory_limit = pool if limit is None else min(pool, limit)
        device.state.memory_total = device.memory_bytes


def _relative_scale(fleet: Sequence[Device]) -> float:
    """The default time scale of host-timed work on an emulated fleet: the fastest emulated
    device runs it at half this host's pace (its worker then sleeps half the time, which
    absorbs each task's hand-over costs), and slower still where the whole fleet would
    otherwise need more than half of this host's cores (all of them busy at once would queue
    for a CPU, and the waits would slow the fastest devices most)."""
    speeds = [d.speed for d in fleet if d.emulated]
    if not speeds:
        return 1.0
    fastest = max(speeds)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    demand = sum(speeds) / fastest  # cores the fleet keeps busy at the host's own pace
    return fastest * max(2.0, 2.0 * demand / (cores or 1))


def _declared_fleet(config: HeteroConfig | None) -> list[Device] | None:
    """The devices a config lists, if it lists any."""
    if config is None or not config.devices:
        return None
    from hetero.devices.fleet import build_fleet

    return build_fleet(config)


#: Containers searched for futures in a task's arguments, at any depth (exact types: a subclass,
#: such as a namedtuple, cannot always be rebuilt from its items).
_CONTAINERS = (list, tuple, dict, set, frozenset)


def _futures_in(value: Any) -> list[Future[Any]]:
    """The futures in ``value``: itself, or held by its containers (a dict: its values)."""
    found: list[Future[Any]] = []
    stack: list[Iterable[Any]] = [(value,)]
    seen: set[int] = set()  # containers already searched (shared, or in a cycle)
    while stack:
        for item in stack.pop():
            if isinstance(item, Future):
                found.append(item)
            elif type(item) in _CONTAINERS and id(item) not in seen:
                seen.add(id(item))
                stack.append(item.values() if type(item) is dict else item)
    return found


def _resolved(value: Any, memo: dict[int, Any]) -> Any:
    """``value`` with every future that ``_futures_in`` finds replaced by its result. ``memo``
    maps containers to their copies, so a shared one is copied once and a cycle ends."""
    if isinstance(value, Future):
        return value.result()
    kind = type(value)
    if kind not in _CONTAINERS:
        return value
    if id(value) in memo:
        return memo[id(value)]
    memo[id(value)] = value  # a cycle back to it keeps the original
    if kind is dict:
        copy: Any = {k: _resolved(v, memo) for k, v in value.items()}
    else:
        copy = kind(_resolved(v, memo) for v in value)
    memo[id(value)] = copy
    return copy


def _unique_name(directory: Path, name: str) -> str:
    """``name``, or ``name-2``, ``name-3``… when a report of that name exists already."""
    if not (directory / f"{name}.html").exists():
        return name
    for k in itertools.count(2):
        if not (directory / f"{name}-{k}.html").exists():
            return f"{name}-{k}"
    raise AssertionError("unreachable")


def _check_writable(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hetero-check-"):
            pass
    except OSError as exc:
        raise HeteroError(
            f"checkpoint_dir {str(path)!r} cannot be written: {exc.strerror or exc}; "
            "give a writable directory or checkpoint_dir=False"
        ) from exc


@atexit.register
def _close_all() -> None:
    """No worker outlives the driver, even when a Context was never closed."""
    for ctx in list(_open):
        with contextlib.suppress(Exception):
            ctx.close(wait=False)
