"""Task graphs: a task whose arguments hold other tasks' futures waits for them before the
engine admits it.

Once every parent is done, their results take their futures' places in the arguments
(``futures.resolve``) and the task is admitted like any other; when one fails or is
cancelled, the task ends failed without running, naming that parent.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from hetero.errors import HeteroError, TaskFailed
from hetero.runtime.futures import Ending, resolve
from hetero.runtime.task_record import Task

if TYPE_CHECKING:
    from hetero.runtime.books import EngineBooks

__all__ = ["GraphHost", "TaskGraph", "parent_failure"]


class GraphHost(Protocol):
    """What a task graph needs of the engine (``hetero.runtime.engine.Engine``)."""

    @property
    def lock(self) -> threading.RLock:
        """The lock that guards the engine's books."""

    def admit(self, task: Task) -> None:
        """Hand ``task``, whose parents are done, to the dispatcher."""

    def settle(self) -> None:
        """Complete the futures of the tasks that ended (with the lock released)."""


class TaskGraph:
    """The tasks of ``host`` waiting on their parents' futures (in the task table of its
    ``books``, not yet handed to its dispatcher)."""

    def __init__(self, host: GraphHost, books: EngineBooks) -> None:
        self._host = host
        self._books = books

    def wait(self, task: Task, parents: list[Future[Any]]) -> None:
        """Admit ``task`` once ``parents`` are done."""
        task.batch = True  # placed for the makespan (WorkItem.batch): the graph's end counts
        task.waiting_on = len(parents)
        with self._host.lock:
            self._books.tasks[task.id] = task
        for parent in parents:
            parent.add_done_callback(functools.partial(self._parent_done, task))

    def _parent_done(self, task: Task, parent: Future[Any]) -> None:
        host, books = self._host, self._books
        with host.lock:
            if task.future.done() or task.id not in books.tasks:
                return
            if parent.cancelled() or parent.exception() is not None:
                del books.tasks[task.id]
                books.stats["failed"] += 1
                books.endings.append(Ending(task.future, error=parent_failure(task, parent)))
                failed = True
            else:
                task.waiting_on -= 1
                if task.waiting_on > 0:
                    return
                del books.tasks[task.id]
                memo: dict[int, Any] = {}
                task.args = resolve(task.args, memo)
                task.kwargs = resolve(task.kwargs, memo)
                failed = False
        if failed:
            host.settle()
            return
        try:
            host.admit(task)
        except HeteroError as exc:
            task.future.set_exception(exc)


def parent_failure(task: Task, parent: Future[Any]) -> TaskFailed:
    """The error of ``task``, not run because ``parent`` was cancelled or failed."""
    raised = None if parent.cancelled() else parent.exception()
    # The parent's message alone: its traceback is printed once, with the parent itself as
    # this error's cause, not again at every level of the graph.
    reason = raised.message if isinstance(raised, TaskFailed) else raised
    cause = "was cancelled" if raised is None else f"failed: {reason}"
    pid = getattr(parent, "task_id", "?")
    error = TaskFailed(f"task {task.id} ({task.name}) not run: parent task {pid} {cause}")
    error.__cause__ = raised
    return error
