"""``Context.map``: one function over many items, spread over every device by speed.

Items are cut into batches as they are needed and each batch is one task, so placement,
ordering, stealing and retries are the dispatcher's, as for any task. What the map decides is
how big a batch is:

- big enough that a batch takes about ``TARGET_SECONDS`` on the fastest device (per-task
  overhead stays small), from the speeds the performance model has measured so far;
- no more than ``remaining / (4 × devices)``, nor than what the slowest device finishes while
  the whole fleet finishes half of the rest, when the length is known (guided
  self-scheduling: batches shrink towards the end, so the last ones are single items and no
  device is left holding a big one while the others idle);
- no more than the largest batch a device's memory holds, when the task declares memory per
  item (``PerfModel.batch_sizes``).

At most ``window`` batches are in flight (default: 4 per usable device, counted as devices
join or leave, or more where the slowest device needs a deeper window to get work,
``FleetView.batch_depth``, up to ``MAX_WINDOW``; and a bounded number of done batches waiting to
be read), so an endless iterator is mapped in bounded memory. Of those, each device's worker
holds at most its dispatcher slots (the one it runs and ``prefetch`` more); the rest wait in
the dispatcher, which hands them to the devices that will finish them first, so a fast device
holds more of the window than a slow one.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from hetero.errors import ConfigError, TaskFailed
from hetero.runtime.batching import split
from hetero.runtime.interrupts import summarise
from hetero.runtime.tasks import TaskFunction

if TYPE_CHECKING:
    from hetero.devices.spec import Device
    from hetero.sched.view import FleetView

__all__ = ["MAX_WINDOW", "TARGET_SECONDS", "MapHost", "MapItemError", "MapRun"]

#: Seconds of work a batch aims at on the fastest device.
TARGET_SECONDS = 0.01
#: Batches done but not yet read may reach this many windows.
READ_AHEAD = 4
#: The most batches a window deepens to for the slowest device: a device so slow that a
#: deeper window would be needed for it to get work at all is left out of the map.
MAX_WINDOW = 1024


class MapHost(Protocol):
    """What a map needs of the engine that runs its batches (``hetero.runtime.engine.Engine``)."""

    @property
    def view(self) -> FleetView:
        """The fleet as placement sees it: usable devices, speeds, window depth."""

    @property
    def devices(self) -> Sequence[Device]: ...

    def function(self, spec: TaskFunction[Any, Any]) -> tuple[str, bytes]:
        """``spec``'s code as shipped to workers: ``(key, cloudpickled bytes)``."""

    def start(self, timeout: float | None) -> None:
        """Start every device's worker (``None``: without waiting until they are ready)."""

    def submit(
        self,
        spec: TaskFunction[Any, Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        *,
        function: tuple[str, bytes] | None = None,
        name: str | None = None,
        cost: tuple[float, bool] | None = None,
        batch: bool = False,
    ) -> Future[Any]:
        """Start one task of ``spec`` (a batch) and return its future."""


class MapItemError(Exception):
    """The map's function ``name`` raised ``error`` on the item at ``index`` of the input. The
    worker raises it with the function's traceback; the map's ``TaskFailed`` has ``error``
    itself as its cause."""

    def __init__(self, name: str, index: int, error: Exception) -> None:
        super().__init__(name, index, error)
        self.name = name
        self.index = index
        self.error = error

    def __str__(self) -> str:
        error = self.error
        return f"{self.name} failed on input {self.index}: {type(error).__name__}: {error}"


class _Batch:
    """Calls ``fn`` (named ``name``) on each item of a batch (the map's one shipped function);
    ``first`` is the index of the batch's first item in the map's input. A batched task's
    ``fn`` (``max_size``: its ``BatchOptions.max_size``) takes the items as lists of at most
    that many instead, one result per item."""

    def __init__(self, fn: Any, name: str, max_size: int | None = None) -> None:
        self.fn = fn
        self.name = name
        self.max_size = max_size

    def __call__(self, items: list[Any], first: int) -> list[Any]:
        fn = self.fn
        results: list[Any] = []
        if self.max_size is not None:
            for k in range(0, len(items), self.max_size):
                part = items[k : k + self.max_size]
                results += split(self.name, fn(part), len(part))
            return results
        for i, x in enumerate(items):
            try:
                results.append(fn(x))
            except Exception as exc:
                error = MapItemError(self.name, first + i, exc)
                raise error.with_traceback(exc.__traceback__) from None
        return results


class MapRun(Iterator[Any]):
    """The iterator ``Context.map`` returns: results in input order (``ordered=True``) or as
    batches complete. Work starts at once and continues while the caller waits."""

    def __init__(
        self,
        host: MapHost,
        spec: TaskFunction[Any, Any],
        iterable: Iterable[Any],
        batch_size: int | str,
        ordered: bool,
        window: int | None,
        progress: bool | None,
    ) -> None:
        problems = []
        if batch_size != "auto" and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            problems.append(
                ("batch_size", f"must be 'auto' or an integer >= 1, got {batch_size!r}")
            )
        if window is not None and (
            isinstance(window, bool) or not isinstance(window, int) or window < 1
        ):
            problems.append(("window", f"must be an integer >= 1, got {window!r}"))
        try:
            items = iter(iterable)
        except TypeError:
            problems.append(("iterable", f"must be iterable, got {type(iterable).__name__}"))
        if problems:
            raise ConfigError(problems)
        self._host = host
        self._spec = spec
        self._items = items
        self._total: int | None = len(iterable) if hasattr(iterable, "__len__") else None  # type: ignore[arg-type]
        self._batch_size = batch_size
        self._ordered = ordered
        self._fixed_window = window
        options = spec.options
        # A batched task's function takes lists: the map's batches call it with theirs.
        max_size = options.batch.max_size if options.batch is not None else None
        if options.variants:  # each variant runs the whole batch of its device kind
            batched = {
                kind: _Batch(fn, spec.name, max_size) for kind, fn in options.variants.items()
            }
            options = replace(options, variants=batched)
        self._name = f"{spec.name}[map]"
        self._kind = options.speed_kind(self._name)  # the row that times its batches
        batch_fn = TaskFunction(
            _Batch(spec.fn, spec.name, max_size), replace(options, name=self._name, batch=None)
        )
        self._function = host.function(batch_fn)
        self._batch_spec = batch_fn
        self._cond = threading.Condition()
        self._pending: dict[int, tuple[int, Future[Any]]] = {}  # batch no -> (first index, f)
        self._ready: dict[int, Future[Any]] = {}
        self._next_batch = 0  # next batch number to submit
        self._next_out = 0  # next batch number to yield (ordered)
        self._taken = 0  # items read from the input
        self._cost_sum = 0.0  # their work units
        self._exhausted = False
        self._buffer: list[Any] = []
        self._done_items = 0
        self._cap = self._memory_cap()
        show = sys.stderr.isatty() if progress is None else progress
        self._bar = _Bar(self._total, spec.name) if show else None
        # A map uses every device: start all workers now, side by side, rather than each on
        # its first batch.
        host.start(None)
        self._fill()

    # -------------------------------------------------------------------------- iteration

    def __iter__(self) -> MapRun:
        return self

    def __next__(self) -> Any:
        try:
            while not self._buffer:
                batch = self._wait_next()
                if batch is None:
                    if self._bar is not None:
                        self._bar.close()
                    raise StopIteration
                self._buffer = list(reversed(batch))
        except KeyboardInterrupt as exc:  # Ctrl-C: the rest is cancelled, said in one line
            summary = self._interrupted()
            self.close()
            summarise(exc, summary)
            raise
        return self._buffer.pop()

    def _interrupted(self) -> str:
        """What an interrupted map did: the items finished, and those it cancels (or, over an
        iterator, those read and not finished)."""
        done, total = self._done_items, self._total
        if total is None:
            return (
                f"interrupted: {done} items finished, {self._taken - done} cancelled (the "
                "rest of the input was not read)"
            )
        return f"interrupted: {done} of {total} items finished, {total - done} cancelled"

    def __len__(self) -> int:
        if self._total is None:
            raise TypeError("the length of a map over an iterator is not known")
        return self._total

    def close(self) -> None:
        """Cancel what has not run (also when the iterator is dropped unfinished)."""
        with self._cond:
            pending = [f for _, f in self._pending.values()]
            self._exhausted = True
        for f in pending:
            f.cancel()
        if self._bar is not None:
            self._bar.close()

    def __del__(self) -> None:
        # Also runs for a MapRun whose arguments were refused before it was built.
        if not getattr(self, "_exhausted", True) or getattr(self, "_pending", None):
            self.close()

    def _wait_next(self) -> list[Any] | None:
        with self._cond:
            while True:
                self._fill_locked()
                if self._ordered:
                    future = self._ready.pop(self._next_out, None)
                    if future is not None:
                        self._next_out += 1
                        break
                elif self._ready:
                    _, future = self._ready.popitem()
                    break
                if not self._pending and not self._ready and self._exhausted:
                    return None
                self._cond.wait()
            self._fill_locked()
        try:
            return future.result()  # type: ignore[no-any-return]
        except TaskFailed as exc:
            if isinstance(exc.__cause__, MapItemError):
                exc.__cause__ = exc.__cause__.error  # the user's exception, not the wrapper
            raise

    # -------------------------------------------------------------------------- batching

    def _devices(self) -> int:
        """Devices that may take batches now: the window follows a fleet that grows or
        shrinks while the map runs (a cluster's nodes)."""
        return max(1, int(self._host.view.usable.sum()))

    def _fill(self) -> None:
        with self._cond:
            self._fill_locked()

    def _fill_locked(self) -> None:
        # In flight at most ``window`` batches; waiting to be read (behind a slow head of
        # line, when ordered) at most ``READ_AHEAD`` windows more, so slow items do not stall
        # the devices and memory stays bounded.
        devices = self._devices()  # once per fill: the fleet may have changed since the last
        # Deep enough that the least-finish-time placement reaches the slowest device too.
        view = self._host.view
        window = self._fixed_window or max(
            4 * devices, 8, min(view.batch_depth(self._kind), MAX_WINDOW)
        )
        while (
            not self._exhausted
            and len(self._pending) < window
            and len(self._pending) + len(self._ready) < READ_AHEAD * window
        ):
            size = self._size(devices)
            chunk = []
            for _ in range(size):
                try:
                    chunk.append(next(self._items))
                except StopIteration:
                    self._exhausted = True
                    break
            if not chunk:
                break
            self._submit(chunk)

    def _submit(self, chunk: list[Any]) -> None:
        options = self._spec.options
        cost = sum(options.cost_of((x,), {})[0] for x in chunk)
        declared = options.cost is not None
        self._cost_sum += cost
        number = self._next_batch
        self._next_batch += 1
        first = self._taken
        self._taken += len(chunk)
        memory = options.memory * len(chunk)
        spec = self._batch_spec
        if memory != spec.options.memory:
            spec = spec.with_options(memory=memory)
        if options.complexity is not None:
            # A batch is as complex as its most complex item (a long sequence pads the rest).
            spec = spec.with_options(
                complexity=max(options.complexity_of((x,), {}) or 0.0 for x in chunk)
            )
        future = self._host.submit(
            spec,
            (chunk, first),
            {},
            function=self._function,
            name=self._name,
            cost=(cost, declared),
            batch=True,
        )
        self._pending[number] = (first, future)
        future.add_done_callback(functools.partial(self._batch_done, number, len(chunk)))

    def _batch_done(self, number: int, items: int, _: object = None) -> None:
        with self._cond:
            entry = self._pending.pop(number, None)
            if entry is None:
                return
            self._ready[number] = entry[1]
            self._done_items += items
            if self._bar is not None:
                self._bar.update(items)
            self._cond.notify_all()

    def _size(self, devices: int) -> int:
        if self._batch_size != "auto":
            return int(self._batch_size)
        view = self._host.view
        options = self._spec.options
        speed = view.perf.speed(self._kind)[view.usable]
        if speed.size == 0:
            return 1
        fastest = float(speed.max())
        # Work units per item: declared, else the mean of the items costed so far.
        if isinstance(options.cost, (int, float)):
            per_item = float(options.cost)
        else:
            per_item = self._cost_sum / self._taken if self._taken else 1.0
        size = max(1, math.ceil(TARGET_SECONDS * fastest / max(per_item, 1e-12)))
        if self._total is not None:
            remaining = self._total - self._taken
            # A batch the slowest device takes must not outlast half of what is left of the
            # map on the whole fleet: near the end, batches shrink to one item.
            slowest = remaining * float(speed.min()) / (2 * float(speed.sum()))
            size = min(size, max(1, math.floor(min(remaining / (4 * devices), slowest))))
        return max(1, min(size, self._cap))

    def _memory_cap(self) -> int:
        per_item = self._spec.options.memory
        if not per_item:
            return sys.maxsize
        perf = self._host.view.perf
        total = sum(d.memory_bytes // per_item for d in self._host.devices)
        if total < 1:
            return 1  # the dispatcher refuses it with the sizes involved
        shares = perf.batch_sizes(total, sample_bytes=per_item, kind=self._kind)
        return max(1, max(shares))


class _Bar:
    """A rich progress bar on stderr."""

    def __init__(self, total: int | None, name: str) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(name, total=total)
        self._open = True

    def update(self, items: int) -> None:
        self._progress.advance(self._task, items)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._progress.stop()
