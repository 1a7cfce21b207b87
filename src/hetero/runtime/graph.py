"""Task graphs: a task whose arguments hold other tasks' futures waits for them before the
engine admits it.

Once every parent is done, their results take their futures' places in the arguments
(``futures.resolve``) and the task is admitted like any other; when one fails or is
cancelled, the task ends failed without running, naming that parent.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from hetero.errors import HeteroError, TaskFailed
from hetero.runtime.futures import Ending, resolve
from hetero.runtime.task_record import Task

if TYPE_CHECKING:
    from hetero.runtime.engine import Engine

__all__ = ["TaskGraph", "parent_failure"]


class TaskGraph:
    """The tasks of ``engine`` waiting on their parents' futures (in its task table, not yet
    handed to its dispatcher)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def wait(self, task: Task, parents: list[Future[Any]]) -> None:
        """Admit ``task`` once ``parents`` are done."""
        engine = self._engine
        task.batch = True  # placed for the makespan (WorkItem.batch): the graph's end counts
        task.waiting_on = len(parents)
        with engine.lock:
            engine.tasks[task.id] = task
        for parent in parents:
            parent.add_done_callback(functools.partial(self._parent_done, task))

    def _parent_done(self, task: Task, parent: Future[Any]) -> None:
        engine = self._engine
        with engine.lock:
            if task.future.done() or task.id not in engine.tasks:
                return
            if parent.cancelled() or parent.exception() is not None:
                del engine.tasks[task.id]
                engine.stats["failed"] += 1
                engine.endings.append(Ending(task.future, error=parent_failure(task, parent)))
                failed = True
            else:
                task.waiting_on -= 1
                if task.waiting_on > 0:
                    return
                del engine.tasks[task.id]
                memo: dict[int, Any] = {}
                task.args = resolve(task.args, memo)
                task.kwargs = resolve(task.kwargs, memo)
                failed = False
        if failed:
            engine.settle()
            return
        try:
            engine.admit(task)
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
