"""``Driver``: the one loop that carries out a ``Dispatcher``'s instructions.

Every executor (the engine, the router, the simulator) drives a dispatcher the same way: it
reports events, carries out the ``Run``/``Stop``/``Finish`` instructions that come back, in
order, reports what carrying them out led to, and keeps one timer at the earliest deadline the
dispatcher announced (``WakeAt``), calling ``expire`` when it fires. Those rules are written
here once; an executor supplies only how an item runs, stops and ends on it, and how it is
woken at a time (a thread's condition, an event loop's ``call_at``, a simulated event).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetero.sched.dispatcher import Dispatcher
from hetero.sched.instructions import Finish, Instruction, Run, Stop

__all__ = ["Driver"]


class Driver:
    """Carries out a dispatcher's instructions; executors subclass it.

    Subclasses implement ``on_run``, ``on_stop`` and ``on_finish``, which may return further
    instructions (stopping an item may free a device the dispatcher fills at once), and
    ``arm_timer``. ``apply`` carries out a batch and what follows from it, breadth first, so
    that instructions are carried out in the order the dispatcher gave them.
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        # The clock time the timer is armed for: a WakeAt no earlier needs no new timer.
        self.wake_at = math.inf

    def apply(self, out: Sequence[Instruction]) -> None:
        """Carry out ``out`` and every instruction that carrying it out leads to."""
        while out:
            more: list[Instruction] = []
            for ins in out:
                cls = type(ins)
                if cls is Run:
                    follow = self.on_run(ins)  # type: ignore[arg-type]
                elif cls is Finish:
                    follow = self.on_finish(ins)  # type: ignore[arg-type]
                elif cls is Stop:
                    follow = self.on_stop(ins)  # type: ignore[arg-type]
                else:  # WakeAt
                    at = ins.at  # type: ignore[union-attr]
                    if at < self.wake_at:
                        self.wake_at = at
                        self.arm_timer(at)
                    continue
                if follow:
                    more += follow
            out = more

    def expire(self) -> None:
        """The timer fired: end the items whose deadline has passed. The dispatcher announces
        its next deadline with a ``WakeAt``, which arms the timer again."""
        self.wake_at = math.inf
        self.apply(self.dispatcher.expire())

    def on_run(self, ins: Run) -> list[Instruction] | None:
        """Start ``ins.item`` on ``ins.device``."""
        raise NotImplementedError

    def on_stop(self, ins: Stop) -> list[Instruction] | None:
        """Stop the attempt of ``ins.item`` running on ``ins.device`` (``ins.cause`` says why)."""
        raise NotImplementedError

    def on_finish(self, ins: Finish) -> list[Instruction] | None:
        """``ins.item`` ended for good: tell whoever waits on it."""
        raise NotImplementedError

    def arm_timer(self, at: float) -> None:
        """Call ``expire`` at clock time ``at`` (instead of at any later time armed before)."""
        raise NotImplementedError
