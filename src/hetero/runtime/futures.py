"""Task futures: ``TaskFuture``, the futures among a task's arguments (a task graph) and the
completion of futures once the engine's lock is released (so their callbacks may submit more).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

from hetero.errors import TaskFailed
from hetero.runtime.tracebacks import readable_traceback

__all__ = ["Ending", "TaskFuture", "futures_in", "resolve", "settle"]


_HEADER = "Traceback (most recent call last):"


class _Canceller(Protocol):
    def cancel(self, task_id: int) -> bool: ...


class TaskFuture(Future):  # type: ignore[type-arg]
    """A ``concurrent.futures.Future`` for one task (``as_completed`` and ``wait`` work), with
    its ``task_id`` and, once it has run, the ``device`` id it ran on."""

    def __init__(self, task_id: int, name: str, owner: _Canceller | None = None) -> None:
        super().__init__()
        self.task_id = task_id
        self.name = name
        self.device: str | None = None
        self._owner = owner

    def cancel(self) -> bool:
        """Cancel the task (stopping it if it runs); ``False`` if it has already ended."""
        if self.done():
            return self.cancelled()
        owner, self._owner = self._owner, None
        if owner is not None and owner.cancel(self.task_id):
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


@dataclass(slots=True)
class Ending:
    """A future to complete once the lock is released."""

    future: TaskFuture
    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False


def settle(endings: Iterable[Ending]) -> None:
    """Complete each future as its ending says (one its owner cancelled meanwhile stays so)."""
    for e in endings:
        if e.future.done():
            continue
        if e.cancelled:
            Future.cancel(e.future)
        elif e.error is not None:
            e.future.set_exception(_shown(e.error, e.future.device))
        else:
            e.future.set_result(e.result)


def _shown(error: BaseException, device: str | None) -> BaseException:
    """``error`` as the caller sees it. A ``TaskFailed`` with the worker's traceback says the
    reason alone in its message, and carries the traceback (its frames named by the user's
    files and lines: ``readable_traceback``) as a note, which Python prints with the error when
    nothing catches it: ``print(err)`` or a log line of a caught one stays one line. Before
    Python 3.11 (no notes) the traceback stays in the message."""
    if not isinstance(error, TaskFailed) or not error.remote_traceback:
        return error
    if error.args == (error.message,):
        return error  # shown already (the same error settles another future)
    text = readable_traceback(error.remote_traceback).rstrip("\n")
    if device is not None and text.startswith(_HEADER):
        text = f"Traceback on {device} (most recent call last):" + text[len(_HEADER) :]
    error.remote_traceback = text + "\n"
    if sys.version_info >= (3, 11):
        error.args = (error.message,)
        error.add_note(text)
    else:
        error.args = (f"{error.message}\n{text}",)
    return error


#: Containers searched for futures in a task's arguments, at any depth (exact types: a subclass,
#: such as a namedtuple, cannot always be rebuilt from its items).
_CONTAINERS = (list, tuple, dict, set, frozenset)


def futures_in(value: Any) -> list[Future[Any]]:
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


def resolve(value: Any, memo: dict[int, Any]) -> Any:
    """``value`` with every future that ``futures_in`` finds replaced by its result. ``memo``
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
        copy: Any = {k: resolve(v, memo) for k, v in value.items()}
    else:
        copy = kind(resolve(v, memo) for v in value)
    memo[id(value)] = copy
    return copy
