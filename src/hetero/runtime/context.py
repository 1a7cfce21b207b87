"""``hetero.Context``: run Python functions on a mixed fleet, placed by ``hetero.sched``.

The public façade: it checks its arguments, builds the fleet, the ``Dispatcher`` and the
``Backend``, and hands the work to the driver's ``Engine`` (``hetero.runtime.engine``), which
turns calls into work items and carries out the dispatcher's instructions. The backend reports
to the engine's ``BackendSink`` (``hetero.runtime.events``), never to this object; the shared
memory the tasks use is the ``Ledger``'s (``hetero.runtime.ledger``), readings and the status
for ``hetero top`` the ``FleetMonitor``'s (``hetero.runtime.fleet_monitor``), profiles the
``Profiler``'s (``hetero.runtime.profiling``).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from hetero.config import HeteroConfig, SchedulerConfig, load_config
from hetero.devices.spec import Device
from hetero.errors import ConfigError, HeteroError
from hetero.log import config_log_level
from hetero.runtime.backend import Backend
from hetero.runtime.engine import Engine, cap_memory
from hetero.runtime.futures import TaskFuture
from hetero.runtime.interrupts import summarise, summarised
from hetero.runtime.profiling import ProfileBlock, ProfileSession
from hetero.runtime.status import StatusSnapshot
from hetero.runtime.tasks import TaskFunction, as_task
from hetero.sched.clock import MonotonicClock
from hetero.sched.dispatcher import Dispatcher
from hetero.sched.perf import PerfModel
from hetero.telemetry.trace import DeviceInfo
from hetero.units import parse_size

__all__ = ["Context", "TaskFuture", "get_memory_usage"]

R = TypeVar("R")

_open: list[Context] = []  # open contexts, oldest first (get_memory_usage takes the newest)
_ids = itertools.count(1)


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
            cap_memory(d, pool)
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
        dispatcher = Dispatcher.from_config(
            base, devices=fleet, clock=MonotonicClock(), **overrides
        )
        self.strategy = base.scheduler.strategy
        self.time_scale = scale
        #: The time scale of host-timed work (tasks without a declared cost): a speed-1 device
        #: takes this many seconds per second of this host's CPU time.
        self.cpu_time_scale = scale if time_scale is not None else _relative_scale(fleet)
        self.monitoring_interval = sched.monitoring_interval
        self._own_checkpoints = checkpoint_dir is None
        if checkpoint_dir is False:
            self.checkpoint_dir: Path | None = None
        elif checkpoint_dir is None or checkpoint_dir is True:
            self.checkpoint_dir = Path(tempfile.mkdtemp(prefix="hetero-ckpt-"))
        else:
            self.checkpoint_dir = Path(checkpoint_dir)  # checked writable above
        self._id = next(_ids)
        if isinstance(backend, str):
            from hetero.runtime.local import LocalBackend

            limits = [d.memory_limit for d in fleet]
            backend = LocalBackend(time_scale=self.time_scale, memory_limits=limits)
        self._engine = Engine(
            fleet,
            dispatcher,
            backend,
            key=self._id,
            strategy=self.strategy,
            cpu_time_scale=self.cpu_time_scale,
            checkpoint_base=(
                f"{self.checkpoint_dir}/ctx{os.getpid()}-{self._id}"
                if self.checkpoint_dir is not None
                else None
            ),
            prefetch=prefetch,
            memory_pool=pool,
            config_path=self._config_path,
            monitoring_interval=self.monitoring_interval,
        )
        _open.append(self)
        from hetero.telemetry import PROFILE_DIR_ENV, PROFILE_NAME_ENV

        env_dir = os.environ.get(PROFILE_DIR_ENV)
        self._env_profile: ProfileSession | None = None
        if env_dir:
            name = os.environ.get(PROFILE_NAME_ENV) or "run"
            self._env_profile = self._engine.profiler.start(name, Path(env_dir))

    # ------------------------------------------------------------------- the engine's state

    @property
    def devices(self) -> list[Device]:
        """The fleet (devices that join while it runs are appended)."""
        return self._engine.devices

    @property
    def dispatcher(self) -> Dispatcher:
        return self._engine.dispatcher

    @property
    def backend(self) -> Backend:
        return self._engine.backend

    @property
    def stats(self) -> dict[str, int]:
        """Tasks ``submitted``, ``done``, ``failed``, ``cancelled``, and attempts ``retried``."""
        return self._engine.books.stats

    @property
    def closed(self) -> bool:
        return self._engine.closed

    # ------------------------------------------------------------------------ public API

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        # A clean exit waits for submitted work (as concurrent.futures does); an exception
        # (Ctrl-C included) cancels what has not finished.
        self.close(wait=exc_type is None)
        if isinstance(exc, KeyboardInterrupt) and not summarised(exc):
            s = self.stats
            failed = f" ({s['failed']} failed)" if s["failed"] else ""
            summarise(
                exc,
                f"interrupted: {s['done'] + s['failed']} of {s['submitted']} tasks "
                f"finished{failed}, {s['cancelled']} cancelled",
            )

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
        return self._engine.submit(spec, args, kwargs)

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

        return MapRun(self._engine, as_task(fn), iterable, batch_size, ordered, window, progress)

    def profile(self, name: str = "run", directory: str | os.PathLike[str] | None = None) -> Any:
        """Record every task attempt while the block runs; on exit write ``<name>.trace.json``
        (Chrome trace, opens in Perfetto) and ``<name>.html`` to ``directory``
        (default ``./hetero-profile``)."""
        where = Path(directory or "hetero-profile")
        return ProfileBlock(self._engine.profiler, self.device_infos, name, where)

    def close(self, wait: bool = True, timeout: float | None = None) -> None:
        """Shut down. ``wait``: let submitted tasks finish first; else cancel them. Workers end
        either way, with every process their tasks started (daemons included where a cgroup can
        be made, or on Linux; see ``hetero.runtime.fence``); idempotent."""
        if not self._engine.shutdown(wait, timeout):
            return
        if self._env_profile is not None:
            self._engine.profiler.finish(self._env_profile, self.device_infos)
        if self._own_checkpoints and self.checkpoint_dir is not None:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        with contextlib.suppress(ValueError):
            _open.remove(self)

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
        if self._engine.closed or self._engine.closing:
            raise HeteroError("this Context is closed; create a new one to run more tasks")
        self._engine.start(timeout)
        return self

    def cancel(self, task_id: int) -> bool:
        """Cancel a task wherever it is (a running one is stopped); ``False`` if it has ended."""
        return self._engine.cancel(task_id)

    def status(self) -> StatusSnapshot:
        """What ``hetero top`` shows: the tasks by state, and each device's load and speed."""
        return self._engine.monitoring.status()

    def memory_usage(self) -> dict[str, dict[str, int]]:
        """``{device id: {"used", "free", "total"}}`` in bytes, read from each device now."""
        return self._engine.monitoring.memory_usage()


def get_memory_usage() -> dict[str, dict[str, int]]:
    """Memory used and free per device of the most recently created open ``Context``."""
    for ctx in reversed(_open):
        if not ctx.closed:
            return ctx.memory_usage()
    raise HeteroError("get_memory_usage() needs an open hetero.Context")


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
