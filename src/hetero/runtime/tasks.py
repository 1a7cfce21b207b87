"""``@hetero.task``: a function plus how the scheduler should treat it.

Options are checked when the decorator runs, so a typo fails at import, not mid-job.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, ParamSpec, TypeVar, overload

from hetero.devices.spec import DeviceKind
from hetero.errors import ConfigError
from hetero.runtime.batching import BatchOptions, combine, split
from hetero.units import parse_size

__all__ = ["TaskFunction", "TaskOptions", "task"]

P = ParamSpec("P")
R = TypeVar("R")

#: Keys a ``variants`` mapping may use: a device kind, or "default" for every other kind.
VARIANT_KEYS = (*(k.value for k in DeviceKind), "default")


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """How a task is scheduled. ``cost`` is in work units (a number, or a function of the
    task's arguments); ``None`` counts each task as 1 unit and lets emulated devices pace by
    the CPU time measured on this host. ``complexity`` (a number, or a function of the
    arguments) is what the ``tiered`` strategy tiers a call by (``WorkItem.complexity``; its
    sequence length, say); ``None``: its cost."""

    memory: int = 0
    cost: float | Callable[..., float] | None = None
    priority: int = 0
    retries: int | None = None  # None: the scheduler's max_retries
    retry_exceptions: bool = False
    timeout: float | None = None
    kind: str = "default"
    tags: frozenset[str] = frozenset()
    variants: Mapping[str, Callable[..., Any]] | None = None
    name: str | None = None
    devices: tuple[str, ...] | None = None
    batch: BatchOptions | None = None  # calls coalesce into one call with lists (batching.py)
    complexity: float | Callable[..., float] | None = None

    def cost_of(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[float, bool]:
        """The work units of one call and whether they were declared."""
        cost = self.cost
        if cost is None:
            return 1.0, False
        value = cost(*args, **kwargs) if callable(cost) else cost
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError([("cost", f"must return a number >= 0, got {value!r}")])
        if not 0 <= value < math.inf:
            raise ConfigError([("cost", f"must be a finite number >= 0, got {value!r}")])
        return float(value), True

    def complexity_of(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> float | None:
        """The complexity of one call (``None``: not declared, so a tier is chosen by cost)."""
        complexity = self.complexity
        if complexity is None:
            return None
        value = complexity(*args, **kwargs) if callable(complexity) else complexity
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError([("complexity", f"must return a number, got {value!r}")])
        if not math.isfinite(value):
            raise ConfigError([("complexity", f"must be a finite number, got {value!r}")])
        return float(value)

    def speed_kind(self, name: str) -> str:
        """The row of the performance model that times this task, named ``name``: its
        ``kind`` when it declares a cost; else one per task, ``KIND:NAME`` (its unit is one of
        its calls, which no other task's calls weigh the same as)."""
        return self.kind if self.cost is not None else f"{self.kind}:{name}"


def make_options(
    *,
    memory: int | str | None = None,
    cost: float | Callable[..., float] | None = None,
    priority: int = 0,
    retries: int | None = None,
    retry_exceptions: bool = False,
    timeout: float | None = None,
    kind: str = "default",
    tags: Iterable[str] = (),
    variants: Mapping[str, Callable[..., Any]] | None = None,
    name: str | None = None,
    devices: Iterable[str] | None = None,
    batch: BatchOptions | None = None,
    complexity: float | Callable[..., float] | None = None,
) -> TaskOptions:
    """Validated ``TaskOptions`` (``ConfigError`` naming every bad option)."""
    problems: list[tuple[str, str]] = []
    size = 0
    if memory is not None:
        try:
            size = parse_size(memory)
        except (ValueError, TypeError) as exc:
            problems.append(("memory", f"{exc} (e.g. '2GB' or a number of bytes)"))
        else:
            if size < 0:
                problems.append(("memory", f"must be >= 0 bytes, got {memory!r}"))
    if cost is not None and not callable(cost):
        if isinstance(cost, bool) or not isinstance(cost, (int, float)):
            problems.append(("cost", f"must be a number or a function of the args, got {cost!r}"))
        elif not 0 <= cost < math.inf:
            problems.append(("cost", f"must be a finite number >= 0, got {cost!r}"))
    if complexity is not None and not callable(complexity):
        if isinstance(complexity, bool) or not isinstance(complexity, (int, float)):
            problems.append(
                (
                    "complexity",
                    f"must be a number or a function of the args, got {complexity!r}",
                )
            )
        elif not math.isfinite(complexity):
            problems.append(("complexity", f"must be a finite number, got {complexity!r}"))
    if isinstance(priority, bool) or not isinstance(priority, int):
        problems.append(("priority", f"must be an integer (higher runs first), got {priority!r}"))
    if retries is not None and (
        isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
    ):
        problems.append(("retries", f"must be an integer >= 0, got {retries!r}"))
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        problems.append(("timeout", f"must be a number of seconds > 0, got {timeout!r}"))
    if not isinstance(kind, str) or not kind:
        problems.append(("kind", f"must be a non-empty string, got {kind!r}"))
    if isinstance(tags, str):
        tags = [tags]
    tag_set = frozenset(tags)
    if not all(isinstance(t, str) for t in tag_set):
        problems.append(("tags", f"must be strings, got {sorted(map(repr, tag_set))}"))
    if variants is not None:
        if not isinstance(variants, Mapping) or not variants:
            problems.append(("variants", f"must be a non-empty mapping, got {variants!r}"))
        else:
            for key, fn in variants.items():
                if key not in VARIANT_KEYS:
                    problems.append(
                        ("variants", f"unknown key {key!r}; allowed: {', '.join(VARIANT_KEYS)}")
                    )
                elif not callable(fn):
                    problems.append((f"variants[{key!r}]", f"must be callable, got {fn!r}"))
    selectors = None
    if devices is not None:
        selectors = (devices,) if isinstance(devices, str) else tuple(devices)
        if not selectors or not all(isinstance(d, str) and d for d in selectors):
            problems.append(
                ("devices", f"must be device ids, models, kinds or tag:NAME, got {devices!r}")
            )
    if batch is not None and not isinstance(batch, BatchOptions):
        problems.append(
            (
                "batch",
                "must be a hetero.BatchOptions (e.g. BatchOptions(max_size=8, max_wait=0.01)) "
                f"or None, got {batch!r}",
            )
        )
    if problems:
        raise ConfigError(problems)
    return TaskOptions(
        memory=size,
        cost=cost,
        priority=priority,
        retries=retries,
        retry_exceptions=retry_exceptions,
        timeout=None if timeout is None else float(timeout),
        kind=kind,
        tags=tag_set,
        variants=dict(variants) if variants is not None else None,
        name=name,
        devices=selectors,
        batch=batch,
        complexity=complexity,
    )


@dataclass(eq=False)
class TaskFunction(Generic[P, R]):
    """A function with scheduling options. Calling it runs it here, as a plain function; give it
    to ``Context.run``/``submit``/``map`` to run it on the fleet."""

    fn: Callable[P, R]
    options: TaskOptions = field(default_factory=TaskOptions)

    def __post_init__(self) -> None:
        # Not functools.update_wrapper: it would copy the wrapped object's __dict__ over ours.
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            value = getattr(self.fn, attr, None)
            if isinstance(value, str):
                object.__setattr__(self, attr, value)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self.options.batch is None:
            return self.fn(*args, **kwargs)
        # A batched function takes lists: one call here is a batch of one.
        batched_args, batched_kwargs = combine([(args, kwargs)])
        return split(self.name, self.fn(*batched_args, **batched_kwargs), 1)[0]  # type: ignore[no-any-return]

    @property
    def name(self) -> str:
        qualname = getattr(self.fn, "__qualname__", None)
        return self.options.name or (qualname if isinstance(qualname, str) else repr(self.fn))

    def with_options(self, **options: Any) -> TaskFunction[P, R]:
        """A copy with some options changed, e.g. ``score.with_options(priority=5)``."""
        current = {
            "memory": self.options.memory,
            "cost": self.options.cost,
            "priority": self.options.priority,
            "retries": self.options.retries,
            "retry_exceptions": self.options.retry_exceptions,
            "timeout": self.options.timeout,
            "kind": self.options.kind,
            "tags": self.options.tags,
            "variants": self.options.variants,
            "name": self.options.name,
            "devices": self.options.devices,
            "batch": self.options.batch,
            "complexity": self.options.complexity,
        }
        unknown = sorted(set(options) - set(current))
        if unknown:
            raise ConfigError(
                [(k, f"unknown task option; allowed: {', '.join(current)}") for k in unknown]
            )
        return replace(self, options=make_options(**{**current, **options}))


@overload
def task(fn: Callable[P, R], /) -> TaskFunction[P, R]: ...


@overload
def task(
    fn: None = None,
    /,
    *,
    memory: int | str | None = ...,
    cost: float | Callable[..., float] | None = ...,
    priority: int = ...,
    retries: int | None = ...,
    retry_exceptions: bool = ...,
    timeout: float | None = ...,
    kind: str = ...,
    tags: Iterable[str] = ...,
    variants: Mapping[str, Callable[..., Any]] | None = ...,
    name: str | None = ...,
    devices: Iterable[str] | None = ...,
    batch: BatchOptions | None = ...,
    complexity: float | Callable[..., float] | None = ...,
) -> Callable[[Callable[P, R]], TaskFunction[P, R]]: ...


def task(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """Mark a function as a hetero task: ``@hetero.task`` or ``@hetero.task(memory="2GB", …)``.

    Options: ``memory`` (bytes or "2GB": the device must have that much free), ``cost`` (work
    units, or a function of the arguments), ``priority``, ``retries`` (after a worker is lost;
    also after an exception with ``retry_exceptions=True``), ``timeout`` (seconds), ``kind``
    (of work, for speeds per kind), ``devices`` (where it may run: device ids, catalog models,
    kinds such as "gpu", or "tag:NAME"), ``tags`` (for an ``affinity`` policy), ``variants``
    (``{"gpu": f, "cpu": g}``: per-device-kind code; the task runs only on kinds it has code
    for, or everywhere with ``"default"``), ``name``, ``batch`` (a ``BatchOptions``: calls
    that arrive together run as one call of the function, each argument a list of the calls'
    values, and it returns one result per call; see ``hetero.runtime.batching``) and
    ``complexity`` (a number, or a function of the arguments: what the ``tiered`` strategy
    tiers a call by, e.g. ``lambda seq: len(seq)``; default: its cost).
    """
    opts = make_options(**options)
    if fn is not None:
        if not callable(fn):
            raise ConfigError([("fn", f"@hetero.task needs a function, got {fn!r}")])
        return TaskFunction(fn, opts)
    return lambda f: TaskFunction(f, opts)


def as_task(fn: Callable[..., Any] | TaskFunction[Any, Any]) -> TaskFunction[Any, Any]:
    """``fn`` as a ``TaskFunction`` (a plain callable gets the default options)."""
    if isinstance(fn, TaskFunction):
        return fn
    if not callable(fn):
        raise ConfigError([("fn", f"expected a function or @hetero.task, got {fn!r}")])
    return TaskFunction(fn)
