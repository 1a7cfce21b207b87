"""When to add and remove replicas: the autoscaler's decisions, pure.

Events in, actions out: ``ScalePolicy.decide(now, traffic, fleet)`` reads the time it is given,
the traffic observed and the fleet as it stands, and returns the ``Action``s to take. It sleeps,
reads no clock and does no I/O, so a fake clock drives it in tests and the controller
(``controller.py``) drives it for real. How many replicas a traffic needs is not its business:
an injected *sizer* says that (in ``hetero serve --autoscale``, the model-aware fleet planner).

Hysteresis, so that a noisy target moves the fleet rarely:

- *Up* once the target has exceeded warm + starting replicas continuously for ``up_after``;
  replicas still starting count as capacity to come, so a slow start is not doubled. It starts
  enough for the highest target of that window.
- *Down* once the target has been below warm + starting continuously for ``down_after``, judged
  by the highest target of that window (a brief dip removes nothing), one replica at a time,
  never within ``cooldown`` of another action on the type, and only while the whole fleet's
  starts and drains of the last hour are fewer than ``max_actions_per_hour`` less one (the one
  left for a start that undoes the drain: starts never wait).
- A drain the need reverses (a start of the type within twice its wait after it) doubles the
  type's wait before its next drain, up to ``max_down_after`` (40 minutes: ``LONGEST_WAIT``);
  a start that reverses nothing halves it back toward ``down_after``. Near a boundary between
  two fleet sizes the target flickers with the observed rate: a fixed wait drained and
  restarted the same replica every few minutes (the simulated day: 84 drains, most undone
  within 2 to 8 minutes). The longer wait holds only a replica one above the target, or one
  whose type the mix is leaving for another GPU (a start of another type within the wait): a
  fleet two or more above its target after a burst drains after ``down_after``, down to one
  above (an hour's wait held a burst's replicas for an hour after it).
- A type's starts wait until ``cooldown`` has passed since its last drain (a need that comes
  back within the cooldown is the oscillation the cooldown is there for); scale-up is never
  held by the hourly guard, only noted in the reason.
- Never below each type's ``min_count``; never draining the last warm replica of the fleet;
  never more than ``max_count`` of a type, draining ones included: they hold their hardware
  until they are gone.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from hetero.errors import ConfigError

__all__ = [
    "Action",
    "Fleet",
    "Member",
    "PolicyOptions",
    "ReplicaType",
    "ScalePolicy",
    "Sizer",
    "Traffic",
    "TypeFleet",
]

_HOUR = 3600.0
#: How long a type's wait before a drain grows at most by default (``max_down_after``; or
#: ``down_after`` if longer). On the simulated day (``bench/bench_autoscale_sim.py``, seeds 0,
#: 1, 2) an hour cost 0.752x, 0.702x and 0.725x the static peak plan; 40 minutes 0.705x,
#: 0.724x and 0.719x; 20 or 30 minutes 0.675x and 0.682x on seed 0, but 7 actions in its worst
#: 60 minutes: a drain undone sooner is undone more often.
LONGEST_WAIT = 2400.0

#: The recent part of the traffic window a rise is judged on, in seconds (the simulator's ticks
#: may make it longer: its last tick).
RISE_WINDOW = 15.0
#: How many standard deviations of a Poisson count above what the whole window's rate expects
#: the recent part must be before its own rate is believed (noise at 3 req/s over 15 s: ~15 %).
RISE_Z = 3.0


def observed_rate(arrivals: int, seconds: float, recent: int, recent_seconds: float) -> float:
    """Arrivals per second over the window, or over its recent part where that part is higher
    than the window's rate by more than chance (``RISE_Z`` standard deviations of a Poisson
    count): a step up in traffic is seen within seconds, not only once it has filled the window.
    With a 60 s window alone a step from 3 to 8 requests/s crossed the 5.4 that needed a second
    replica 27 s in; new replicas were asked for up to a minute after the step. A fall is seen by
    the whole window only: the policy's ``down_after`` waits far longer anyway."""
    rate = arrivals / seconds if seconds > 0 else 0.0
    if not 0 < recent_seconds < seconds:
        return rate
    expected = rate * recent_seconds
    if recent > expected + RISE_Z * math.sqrt(max(expected, 1.0)):
        return recent / recent_seconds
    return rate


@dataclass(frozen=True, slots=True)
class Traffic:
    """What was observed over the last ``window`` seconds: arrivals per second, and the mean
    prompt and output tokens of a request (with the samples behind them, when kept)."""

    rate: float
    window: float = 60.0
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    prompt_samples: tuple[int, ...] = ()
    output_samples: tuple[int, ...] = ()
    # The share of the window's finished requests within the SLO (None: none finished, or no
    # SLO known): what tells a sizer its model of the replicas is off.
    attainment: float | None = None
    # How many finished requests the attainment is over (None: not told). One miss in the 18
    # requests of a quiet minute is chance, not a fleet too small for the SLO.
    judged: int | None = None
    # Whether the fleet served the whole window as it is now (nothing starting, no replica
    # warm for less than the window): only then does the attainment judge the fleet the
    # sizer last asked for, rather than one still on its way. Set by the policy.
    settled: bool = True


@dataclass(frozen=True, slots=True)
class ReplicaType:
    """A kind of replica the fleet can grow by: ``startup_s`` is how long one takes to become
    warm (the provider's readiness timeout derives from it), ``max_count`` how many the
    hardware allows at most, ``min_count`` how many are kept whatever the traffic."""

    name: str
    startup_s: float
    max_count: int
    min_count: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not self.name:
            problems.append(("name", "a replica type needs a name"))
        if not 0 <= self.startup_s < math.inf:
            problems.append(("startup_s", f"must be seconds >= 0, got {self.startup_s!r}"))
        if self.max_count < 1:
            problems.append(("max_count", f"must be >= 1, got {self.max_count!r}"))
        if not 0 <= self.min_count <= self.max_count:
            problems.append(
                ("min_count", f"must be between 0 and max_count, got {self.min_count!r}")
            )
        if problems:
            raise ConfigError([(f"{self.name or 'type'}.{k}", m) for k, m in problems])


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """The hysteresis, in seconds, and the hourly guard on drains."""

    up_after: float = 15.0
    down_after: float = 300.0
    cooldown: float = 120.0
    # The longest drains reversed again and again make a type's wait (None: LONGEST_WAIT, or
    # down_after if longer).
    max_down_after: float | None = None
    # Starts and drains over the fleet; drains wait while the hour holds one less (starts never).
    max_actions_per_hour: int = 6
    log_size: int = 200  # decisions kept for /status

    @property
    def longest_down_after(self) -> float:
        """``max_down_after``, or its default."""
        if self.max_down_after is not None:
            return self.max_down_after
        return max(LONGEST_WAIT, self.down_after)

    def __post_init__(self) -> None:
        problems = [
            (name, f"must be seconds >= 0, got {value!r}")
            for name in ("up_after", "down_after", "cooldown")
            if not 0 <= (value := getattr(self, name)) < math.inf
        ]
        if self.max_down_after is not None and not (
            self.down_after <= self.max_down_after < math.inf
        ):
            problems.append(
                (
                    "max_down_after",
                    f"must be at least down_after ({self.down_after:g}), "
                    f"got {self.max_down_after!r}",
                )
            )
        if self.max_actions_per_hour < 1:
            problems.append(
                ("max_actions_per_hour", f"must be >= 1, got {self.max_actions_per_hour!r}")
            )
        if self.log_size < 1:
            problems.append(("log_size", f"must be >= 1, got {self.log_size!r}"))
        if problems:
            raise ConfigError(problems)


@dataclass(frozen=True, slots=True)
class Member:
    """One replica as the policy sees it: ``since`` is when it was asked for (starting), became
    warm, or began draining; ``load`` the requests it has in flight (warm ones)."""

    id: str
    since: float
    load: int = 0


@dataclass(frozen=True, slots=True)
class TypeFleet:
    """The replicas of one type, by state."""

    starting: tuple[Member, ...] = ()
    warm: tuple[Member, ...] = ()
    draining: tuple[Member, ...] = ()


#: The fleet by type name; a type missing from it has no replica.
Fleet = Mapping[str, TypeFleet]
#: Replicas wanted per type name for a traffic; a type it leaves out wants none.
Sizer = Callable[[Traffic], Mapping[str, int]]


@dataclass(frozen=True, slots=True)
class Action:
    """One decision: start ``count`` replicas of a type, or drain the replica ``replica``;
    ``reason`` says why in words, for the log and ``/status``."""

    kind: Literal["start", "drain"]
    type_name: str
    at: float
    reason: str
    count: int = 0
    replica: str = ""

    def as_dict(self, now: float) -> dict[str, object]:
        """For ``/status``: how long ago rather than the policy's clock."""
        what: dict[str, object] = (
            {"count": self.count} if self.kind == "start" else {"replica": self.replica}
        )
        return {
            "kind": self.kind,
            "type": self.type_name,
            **what,
            "ago_s": round(now - self.at, 1),
            "reason": self.reason,
        }


@dataclass(slots=True)
class _TypeBooks:
    """What the policy remembers of one type between ticks."""

    targets: deque[tuple[float, int]] = field(default_factory=deque)  # (time, clamped target)
    need_since: float | None = None  # target > warm + starting at every tick since
    quiet_since: float | None = None  # target < warm + starting at every tick since
    last_start: float = -math.inf
    last_drain: float = -math.inf
    down_after: float = 0.0  # this type's wait before a drain (set from the options)
    target: int = 0
    raw_target: int = 0
    held: str = ""  # why a wanted action is not taken now (for /status)


class ScalePolicy:
    """The autoscaler's decisions (see the module's docstring)."""

    def __init__(
        self,
        types: Sequence[ReplicaType],
        sizer: Sizer,
        options: PolicyOptions | None = None,
    ) -> None:
        if not types:
            raise ConfigError([("types", "the autoscaler needs at least one replica type")])
        names = [t.name for t in types]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ConfigError([("types", f"duplicate replica type {dup!r}")])
        self.types = {t.name: t for t in types}
        self.sizer = sizer
        self.options = options or PolicyOptions()
        self.log: deque[Action] = deque(maxlen=self.options.log_size)
        self._books = {t.name: _TypeBooks(down_after=self.options.down_after) for t in types}
        self._drains: deque[float] = deque()  # fleet-wide, for the hourly guard
        self._starts: deque[float] = deque()  # only noted: starts are never held

    # ------------------------------------------------------------------ decisions

    def decide(self, now: float, observed: Traffic, fleet: Fleet) -> list[Action]:
        """The actions to take now for this traffic and fleet (also appended to ``log``)."""
        o = self.options
        newest = max((m.since for f in fleet.values() for m in f.warm), default=-math.inf)
        starting = any(f.starting for f in fleet.values())
        settled = not starting and newest <= now - observed.window
        wanted = self.sizer(replace(observed, settled=settled))
        for times in (self._drains, self._starts):
            while times and times[0] <= now - _HOUR:
                times.popleft()
        # Serving replicas of the whole fleet: the last one is never drained.
        serving = sum(len(f.warm) for f in fleet.values())
        actions: list[Action] = []
        for name, rtype in self.types.items():
            books = self._books[name]
            books.raw_target = max(0, int(wanted.get(name, 0)))
            target = min(max(books.raw_target, rtype.min_count), rtype.max_count)
            books.target = target
            books.targets.append((now, target))
            while books.targets and books.targets[0][0] < now - max(o.up_after, books.down_after):
                books.targets.popleft()
            mine = fleet.get(name, TypeFleet())
            capacity = len(mine.warm) + len(mine.starting)
            # A need (or a quiet) lasts while every tick finds it; one tick without ends it.
            if target <= capacity:
                books.need_since = None
            elif books.need_since is None:
                books.need_since = now
            if target >= capacity:
                books.quiet_since = None
            elif books.quiet_since is None:
                books.quiet_since = now
            books.held = ""
            action = self._up(now, rtype, books, mine, observed) or self._down(
                now, rtype, books, mine, observed, serving
            )
            if action is not None:
                if action.kind == "drain":
                    serving -= 1
                actions.append(action)
        self.log.extend(actions)
        return actions

    def _up(
        self, now: float, rtype: ReplicaType, books: _TypeBooks, mine: TypeFleet, seen: Traffic
    ) -> Action | None:
        o = self.options
        warm, starting = len(mine.warm), len(mine.starting)
        capacity = warm + starting
        room = rtype.max_count - capacity - len(mine.draining)
        if capacity < rtype.min_count:
            # A floor, not a need (a replica failed or never came): no hysteresis, no cooldown.
            count = min(rtype.min_count - capacity, room)
            reason = f"{capacity} < min_count {rtype.min_count}"
        elif books.need_since is None or now - books.need_since < o.up_after:
            return None
        else:
            peak = max(t for at, t in books.targets if at >= now - o.up_after)
            count = min(peak - capacity, room)
            reason = (
                f"target {peak} > {capacity} (warm {warm}, starting {starting}) "
                f"for {now - books.need_since:.0f} s at {seen.rate:.1f} req/s"
            )
            if books.raw_target > rtype.max_count:
                reason += f" (the sizer asked {books.raw_target}, max_count {rtype.max_count})"
            if count > 0 and now - books.last_drain < o.cooldown:
                books.held = (
                    f"drained {now - books.last_drain:.0f} s ago (cooldown {o.cooldown:g} s)"
                )
                return None
        if count <= 0:
            draining = f" ({len(mine.draining)} of them draining)" if mine.draining else ""
            books.held = f"at max_count {rtype.max_count}{draining}"
            return None
        books.need_since = None  # a further need proves itself against the new capacity
        if now - books.last_drain < 2 * books.down_after:  # it undoes a drain: wait longer
            books.down_after = min(2 * books.down_after, o.longest_down_after)
        else:
            books.down_after = max(books.down_after / 2, o.down_after)
        books.last_start = now
        self._starts.append(now)
        if len(self._starts) > o.max_actions_per_hour:
            reason += (
                f"; {len(self._starts)} starts in the last hour, over max_actions_per_hour "
                f"{o.max_actions_per_hour} (starts are not held)"
            )
        return Action("start", rtype.name, now, reason, count=count)

    def _down(
        self,
        now: float,
        rtype: ReplicaType,
        books: _TypeBooks,
        mine: TypeFleet,
        seen: Traffic,
        serving: int,
    ) -> Action | None:
        o = self.options
        if books.quiet_since is None or now - books.quiet_since < o.down_after:
            return None
        warm, starting = len(mine.warm), len(mine.starting)
        capacity = warm + starting
        # The type's longer wait is for a target flickering between this size and the next:
        # one that stays two or more below (the fleet after a burst) drains after down_after.
        recent = max(t for at, t in books.targets if at >= now - o.down_after)
        # A start of another type within the wait is a mix swapping GPUs, not a fleet
        # shrinking: the swap drains at the type's longer wait, as it may swap back.
        shrinking = recent <= capacity - 2 and not any(
            b is not books and now - b.last_start < books.down_after for b in self._books.values()
        )
        wait = o.down_after if shrinking else books.down_after
        if now - books.quiet_since < wait:
            return None
        peak = max(t for at, t in books.targets if at >= now - wait)
        if peak >= capacity or capacity - 1 < rtype.min_count or not mine.warm:
            return None
        since_action = now - max(books.last_start, books.last_drain)
        if since_action < o.cooldown:
            books.held = f"last action {since_action:.0f} s ago (cooldown {o.cooldown:g} s)"
            return None
        if serving <= 1:
            books.held = "the last warm replica of the fleet"
            return None
        # Starts count against the hour too, and never wait: a drain leaves one action of the
        # hour for a start that may undo it.
        actions = len(self._drains) + len(self._starts)
        if actions >= max(1, o.max_actions_per_hour - 1):
            books.held = f"{actions} actions in the last hour (max_actions_per_hour)"
            return None
        # The least loaded, then the newest: it has the fewest requests to finish and the
        # coldest caches.
        victim = min(mine.warm, key=lambda m: (m.load, -m.since))
        books.last_drain = now
        self._drains.append(now)
        reason = (
            f"target {peak} < {capacity} (warm {warm}, starting {starting}) "
            f"for {now - books.quiet_since:.0f} s at {seen.rate:.1f} req/s; "
            f"{victim.id} has {victim.load} in flight"
        )
        return Action("drain", rtype.name, now, reason, replica=victim.id)

    # ------------------------------------------------------------------ reporting

    def status(self, now: float) -> dict[str, dict[str, object]]:
        """Per type: the last target (and what the sizer asked), how long a need or a quiet
        has lasted, and why a wanted action is held."""
        out: dict[str, dict[str, object]] = {}
        for name, books in self._books.items():
            rtype = self.types[name]
            out[name] = {
                "target": books.target,
                "sizer": books.raw_target,
                "min_count": rtype.min_count,
                "max_count": rtype.max_count,
                "need_for_s": None
                if books.need_since is None
                else round(now - books.need_since, 1),
                "quiet_for_s": None
                if books.quiet_since is None
                else round(now - books.quiet_since, 1),
                "down_after_s": books.down_after,
                "held": books.held or None,
            }
        return out
