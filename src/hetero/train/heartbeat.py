"""Hang detection for ``hetero launch`` (``--heartbeat-timeout``): what a rank's heartbeat says,
and the rule by which the launcher finds a hung rank in its ranks' last heartbeats.

A daemon thread in each rank (``heartbeat_sender.py``) looks at the rank's main thread every
interval and writes a :class:`Beat`: when it was sent; when the rank last made progress (a
``hetero.comm`` call completed, ``mark_progress()`` was called, or the main thread was seen
waiting), None until its first completed call or mark; since when the main thread has been
waiting in a call that may wait on its peers (a collective, autograd's backward where DDP
reduces the gradients, a device sync); and where the main thread is. :class:`Tracker` turns
those looks into beats; :func:`find_hung` judges them. Both are pure: the time is passed in.

The rule, with ``T`` the timeout (``find_hung``):

1. A rank whose last beat is older than ``T`` is hung: its process is stopped (SIGSTOP) or its
   interpreter is stuck in C holding the GIL, so not even its heartbeat thread runs.
2. Else a rank that is *not* waiting and has made no progress for more than ``T`` is hung,
   provided a peer has been waiting for more than ``T``: that peer is blocked on it. A rank
   legitimately waiting for a slow peer is inside a collective, so it is never the one blamed.
   A rank is judged so only once it has progressed: its set-up (imports, data preparation
   before its first collective completes) may take as long as it takes.

Of several, the one silent longest, else the one without progress longest, is blamed. A run in
which every rank waits (mismatched collectives) or none does (long compute with no collective)
is left to the collectives' own timeout. A rank that works for longer than ``T`` outside any
collective while its peers wait for it (rank 0 alone evaluating, a slow synchronous checkpoint
write) looks hung: ``T`` must be longer than that, or the rank calls ``mark_progress()``. Times
are counted from when the judge started watching without a break (``watched_since``), so a
launcher that was itself not running (a suspended machine) blames nobody for that time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import asdict, dataclass

__all__ = ["WAITING_MODULES", "Beat", "Hung", "Tracker", "find_hung", "waits_on_peers"]

#: The modules in whose code a main thread blocks while it waits for its peers: collectives
#: (torch.distributed, hetero.comm), DDP's buffer broadcast (torch.nn.parallel), the gradient
#: reduction inside backward (torch.autograd), a GPU queue behind a collective (torch.cuda).
WAITING_MODULES = ("torch.distributed", "torch.nn.parallel", "torch.autograd", "torch.cuda")
_HETERO_WAITING = ("hetero.comm",)


def waits_on_peers(module: str) -> bool:
    """Whether a main thread whose innermost Python frame is in ``module`` may be waiting for
    its peers (a module named in ``WAITING_MODULES``, or ``hetero.comm``, or one inside)."""
    return any(
        module == name or module.startswith(f"{name}.")
        for name in (*WAITING_MODULES, *_HETERO_WAITING)
    )


@dataclass(frozen=True, slots=True)
class Beat:
    """A rank's heartbeat; times in seconds of one clock (``time.monotonic``: the same for
    every process of a machine)."""

    sent: float
    progress: float | None  # when it last made progress; None: not yet, it is setting up
    waiting: float | None  # since when its main thread waits on its peers; None: it does not
    where: str  # its main thread's innermost frame, "file:line (function)"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Beat:
        """The inverse of :meth:`to_json`; ``ValueError``, ``KeyError`` or ``TypeError`` where
        ``text`` is not one."""
        data = json.loads(text)
        progress, waiting = data["progress"], data["waiting"]
        return cls(
            float(data["sent"]),
            None if progress is None else float(progress),
            None if waiting is None else float(waiting),
            str(data["where"]),
        )


@dataclass(frozen=True, slots=True)
class Hung:
    """A rank found hung: its local rank, and why (for the launcher's line)."""

    rank: int
    reason: str


class Tracker:
    """A rank's beats from looks at its main thread, at the times ``now()`` gives. Each
    :meth:`look` gives the module and place of the main thread's innermost frame and ``done``,
    a value that changes whenever the rank progresses (its count of completed collectives and
    of ``mark_progress()`` calls), ``done`` at the start."""

    __slots__ = ("_done", "_now", "_progress", "_waiting")

    def __init__(self, now: Callable[[], float], done: Hashable) -> None:
        self._now = now
        self._done = done
        self._progress: float | None = None
        self._waiting: float | None = None

    def look(self, module: str, where: str, done: Hashable) -> Beat:
        now = self._now()
        progressed = done != self._done
        self._done = done
        if not waits_on_peers(module):
            self._waiting = None
        elif self._waiting is None or progressed:
            self._waiting = now  # a new wait: one call completed since the last look
        if progressed or (self._waiting is not None and self._progress is not None):
            self._progress = now
        return Beat(now, self._progress, self._waiting, where)


def find_hung(
    beats: Mapping[int, Beat], now: float, timeout: float, watched_since: float = -math.inf
) -> Hung | None:
    """The hung rank among ``beats`` (each running rank's last beat, by local rank; a rank
    that has sent none yet is not judged) at ``now``, by the module's rule, for a judge that
    has watched without a break since ``watched_since``; None when none is."""

    def over(t: float) -> bool:
        return now - max(t, watched_since) > timeout

    silent = [(b.sent, r) for r, b in beats.items() if over(b.sent)]
    if silent:
        sent, rank = min(silent)
        return Hung(
            rank,
            f"sent no heartbeat for {now - sent:.1f} s (stopped, or stuck in C holding the "
            f"GIL); last seen at {beats[rank].where}",
        )
    waiting = [
        (b.waiting, r) for r, b in beats.items() if b.waiting is not None and over(b.waiting)
    ]
    stalled = [
        (b.progress, r)
        for r, b in beats.items()
        if b.waiting is None and b.progress is not None and over(b.progress)
    ]
    if not (waiting and stalled):
        return None
    progress, rank = min(stalled)
    since, peer = min(waiting)
    return Hung(
        rank,
        f"made no progress for {now - progress:.1f} s outside any collective, at "
        f"{beats[rank].where}, while local rank {peer} waited {now - since:.1f} s in one",
    )
