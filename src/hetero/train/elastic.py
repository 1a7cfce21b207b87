"""Elastic membership of a launch's ranks (``hetero launch --nproc MIN:MAX``): which of its MAX
rank slots run, when a failing one is lost, and when a lost one may rejoin.

``Membership`` is pure: the launcher hands it each failure with the time and carries out what
it decides (start the same ranks again, go on without the lost one, give up). A lost slot may
rejoin once its wait is over; the launcher then asks the ranks to regroup by creating the file
named in ``REGROUP_FILE_ENV``. At their next checkpoint rank 0 answers by creating
``regroup_answer(file)``, and every rank leaves with ``REGROUP_EXIT`` (``leave_if_regrouping`` in
``checkpoint.py``), so the launcher starts them again, the lost slot among them, from that
checkpoint. The answer, not the ranks' exit statuses, tells the launcher they regrouped: a
process may still crash on its way out.

A rank whose set-up the Trainer refuses (a ``ConfigError`` before the first step) would be
refused alike at every start: under the launcher (``LAUNCHED_ENV``) it records the error and
leaves with ``SETUP_REFUSED_EXIT`` (``leave_refused``), printing nothing, and the launcher says
it once and gives up.
"""

from __future__ import annotations

import enum
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

__all__ = [
    "LAUNCHED_ENV",
    "REGROUP_EXIT",
    "REGROUP_FILE_ENV",
    "SETUP_REFUSED_EXIT",
    "Decision",
    "Membership",
    "Next",
    "Regroup",
    "leave_refused",
    "local_ranks",
    "regroup_answer",
]

#: The environment variable that names the file whose existence asks the ranks to regroup.
REGROUP_FILE_ENV = "HETERO_REGROUP_FILE"
#: The status every rank leaves with when they regroup (EX_TEMPFAIL: start it again).
REGROUP_EXIT = 75
#: The longest a lost slot waits between two tries: each loss doubles its wait up to this.
MAX_REJOIN_WAIT_S = 3600.0
#: Set to "1" on every rank ``hetero launch`` starts.
LAUNCHED_ENV = "HETERO_LAUNCHED"
#: The status a rank leaves with when its set-up is refused (sysexits' EX_CONFIG).
SETUP_REFUSED_EXIT = 78


def regroup_answer(request: Path) -> Path:
    """The file rank 0 creates, before any rank leaves, when the ranks regroup on ``request``."""
    return request.with_name(f"{request.name}.left")


class Regroup(SystemExit):
    """Raised on every rank at a checkpoint when the launcher regroups them (a lost rank
    rejoins): the process leaves with ``REGROUP_EXIT``, and the launcher starts the ranks
    again from that checkpoint."""

    def __init__(self) -> None:
        super().__init__(REGROUP_EXIT)


def leave_refused() -> NoReturn:
    """End a rank started by ``hetero launch`` whose Trainer set-up raised a ``ConfigError``,
    once the error is written to its ``TORCHELASTIC_ERROR_FILE``: at once, with
    ``SETUP_REFUSED_EXIT``, so the launcher prints the error once and starts no rank again.
    ``os._exit``, not ``SystemExit``: the interpreter's teardown with the process group's
    threads alive may abort ("terminate called without an active exception"), and the status
    the launcher reads would be lost (a loaded machine restarted a refused run that way)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(SETUP_REFUSED_EXIT)


class Next(enum.Enum):
    """What the launcher does after a rank failed."""

    RETRY = "retry"  # start the same slots again
    SHRINK = "shrink"  # start the slots left, without the lost one
    STOP = "stop"  # give up: the launch fails


@dataclass(frozen=True, slots=True)
class Decision:
    next: Next
    reason: str  # what the launcher says, after which rank exited and how


@dataclass(slots=True)
class _Slot:
    failures: int = 0  # over the whole launch, so a slot that rejoins is lost at its next one
    losses: int = 0
    lost_at: float | None = None  # None: it runs (or will, at the next start)
    error: str | None = None  # what it raised at its last failure, if known


class Membership:
    """The ``maximum`` rank slots of a launch and the rules that shrink and grow them.

    A slot that fails is started again with the others (``RETRY``, one of ``max_restarts``)
    until it has failed more than ``rank_restarts`` times, or raised the same error as at its
    previous failure; then it is lost and the others go on without it (``SHRINK``, no restart
    counted), unless fewer than ``minimum`` would be left (``STOP``). A lost slot may rejoin
    ``rejoin_after`` seconds after its loss, twice as long after each further loss (up to
    ``MAX_REJOIN_WAIT_S``); its failures still count, so one that rejoins and fails again is
    lost again at once.
    """

    def __init__(
        self,
        minimum: int,
        maximum: int,
        *,
        max_restarts: int,
        rank_restarts: int,
        rejoin_after: float,
    ) -> None:
        if not 1 <= minimum <= maximum:
            raise ValueError(f"need 1 <= minimum <= maximum, got {minimum} and {maximum}")
        self.minimum, self.maximum = minimum, maximum
        self.restarts_left = max_restarts
        self.max_restarts = max_restarts
        self.rank_restarts = rank_restarts
        self.rejoin_after = rejoin_after
        self._slots = [_Slot() for _ in range(maximum)]

    @property
    def live(self) -> tuple[int, ...]:
        """The slots the next start runs, in rank order."""
        return tuple(i for i, s in enumerate(self._slots) if s.lost_at is None)

    @property
    def lost(self) -> tuple[int, ...]:
        return tuple(i for i, s in enumerate(self._slots) if s.lost_at is not None)

    def rejoins_at(self, slot: int) -> float:
        """When the lost ``slot`` may rejoin."""
        s = self._slots[slot]
        if s.lost_at is None:
            raise ValueError(f"slot {slot} is not lost")
        wait = self.rejoin_after * 2.0 ** (s.losses - 1)
        return s.lost_at + min(wait, max(self.rejoin_after, MAX_REJOIN_WAIT_S))

    def due(self, now: float) -> tuple[int, ...]:
        """The lost slots that may rejoin at ``now``."""
        return tuple(i for i in self.lost if self.rejoins_at(i) <= now)

    def rejoin(self, now: float) -> tuple[int, ...]:
        """The ranks regrouped: the slots due at ``now`` run again; returns them."""
        back = self.due(now)
        for i in back:
            self._slots[i].lost_at = None
        return back

    def failed(self, slot: int, now: float, error: str | None = None) -> Decision:
        """``slot`` was the first rank of the running start to fail, at ``now``, with ``error``
        (what it raised, when the launcher knows)."""
        s = self._slots[slot]
        if s.lost_at is not None:
            raise ValueError(f"slot {slot} is lost: it was not running")
        s.failures += 1
        # The same error as at its last failure: retrying will not help.
        repeated = error is not None and error == s.error
        s.error = error
        failed = f"local rank {slot} failed {_times(s.failures)}"
        if s.failures <= self.rank_restarts and not repeated:
            if self.restarts_left == 0:
                return Decision(Next.STOP, f"{failed}; giving up: {self._no_restarts}")
            self.restarts_left -= 1
            restarts = _count(self.restarts_left, "restart")
            return Decision(
                Next.RETRY, f"starting all {len(self.live)} ranks again ({restarts} left)"
            )
        why = (
            "it raised the same error as at its previous failure"
            if repeated
            else f"it failed {_times(s.failures)}, more than --rank-restarts {self.rank_restarts}"
        )
        left = len(self.live) - 1
        fixed = self.minimum == self.maximum
        if left < self.minimum and fixed and self.restarts_left == 0 and not repeated:
            # A fixed size with the default --rank-restarts: out of restarts, as users expect.
            return Decision(Next.STOP, f"{failed}; giving up: {self._no_restarts}")
        if left < self.minimum:
            return Decision(
                Next.STOP,
                f"{failed}; giving up: {why}, and without it {_count(left, 'rank')} would be "
                f"left, fewer than the {self.minimum} --nproc {self.spec} needs",
            )
        s.lost_at, s.losses = now, s.losses + 1
        wait = self.rejoins_at(slot) - now
        later = "at the next checkpoint" if wait == 0 else f"at a checkpoint after {wait:g} s"
        return Decision(
            Next.SHRINK,
            f"it is lost: {why}; going on with {_count(left, 'rank')} "
            f"({local_ranks(self.live)}) from the last checkpoint; it may rejoin {later}",
        )

    @property
    def _no_restarts(self) -> str:
        failed = [(i, s.failures) for i, s in enumerate(self._slots) if s.failures]
        each = ", ".join(f"local rank {i} {_times(n)}" for i, n in failed)
        return (
            f"no restarts left: the ranks were restarted {_times(self.max_restarts)} "
            f"(--max-restarts {self.max_restarts}) and failed "
            f"{_times(sum(n for _, n in failed))}" + (f" ({each})" if len(failed) > 1 else "")
        )

    @property
    def spec(self) -> str:
        """The ``--nproc`` these slots come from."""
        if self.minimum == self.maximum:
            return str(self.maximum)
        return f"{self.minimum}:{self.maximum}"


def local_ranks(slots: tuple[int, ...]) -> str:
    """``slots`` as the launcher names them: "local rank 1", "local ranks 0, 2"."""
    return f"local rank{'' if len(slots) == 1 else 's'} {', '.join(map(str, slots))}"


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
