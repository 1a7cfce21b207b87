"""What a ``Dispatcher`` tells its executor to do: ``Run``, ``Stop``, ``Finish``, ``WakeAt``.

Executors carry these out and import them from here, not from the dispatcher: the messages are
the contract between the state machine and its executors (the simulator, the engine, the Ray
backend, the router), the state machine is one of its two sides.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero.sched.item import Cause, ItemState, WorkItem

__all__ = ["Finish", "Instruction", "Run", "Stop", "WakeAt"]


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 4x to build, on the hot path
class Run:
    """Start ``item`` on device ``device`` (position; ``device_id`` is its id)."""

    item: WorkItem
    device: int
    device_id: str


@dataclass(slots=True)
class Stop:
    """Stop ``item`` running on ``device`` (preempted, cancelled, timed out or device lost)."""

    item: WorkItem
    device: int
    reason: str
    cause: Cause


@dataclass(slots=True)
class Finish:
    """``item`` has ended for good in ``state`` (done, failed or cancelled)."""

    item: WorkItem
    state: ItemState
    reason: str = ""
    cause: Cause = Cause.DONE


@dataclass(slots=True)
class WakeAt:
    """Call ``expire`` at clock time ``at``: the earliest deadline moved earlier than any
    announced before (``expire`` itself announces the next one)."""

    at: float


Instruction = Run | Stop | Finish | WakeAt
