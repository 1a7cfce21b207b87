"""The autoscaler's policy driving the engine-faithful fleet simulator instead of real replicas:
``on_tick`` for :class:`hetero.sim.engine_fleet.EngineFleetSimulator`, so a day of traffic is
autoscaled in minutes with the same decisions ``hetero serve --autoscale`` would take."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping

from hetero.serve.autoscale.policy import (
    RISE_WINDOW,
    Member,
    ScalePolicy,
    Traffic,
    TypeFleet,
    observed_rate,
)
from hetero.serve.engine_model import EngineSpec
from hetero.sim.engine_fleet import Action, Add, Drain, FleetSnapshot

__all__ = ["SimulatedAutoscaler", "replica_name", "type_of"]

_SEP = "#"


def replica_name(type_name: str, k: int) -> str:
    """The simulator's name of the ``k``-th replica of a type."""
    return f"{type_name}{_SEP}{k}"


def type_of(name: str) -> str:
    return name.rsplit(_SEP, 1)[0]


class SimulatedAutoscaler:
    """Each tick: the traffic of the last ``window`` seconds and the fleet as the simulator
    reports it, to ``policy.decide``; its starts become ``Add`` (warm after the type's
    ``startup_s``), its drains ``Drain``. ``actions`` keeps every one, with its time. With
    ``slo_given`` (the run was given ``slo=``) the traffic carries the window's attainment."""

    def __init__(
        self,
        policy: ScalePolicy,
        specs: Mapping[str, EngineSpec],
        window: float = 60.0,
        slo_given: bool = True,
    ) -> None:
        self.policy = policy
        self.slo_given = slo_given  # the run counts requests within the SLO (run(slo=...))
        self.specs = dict(specs)
        self.window = window
        self._seen: deque[FleetSnapshot] = deque()
        self._since: dict[str, float] = {}  # replica -> when its current state began
        self._state: dict[str, str] = {}
        self._numbers = {name: itertools.count() for name in specs}
        self.actions: list[tuple[float, str, str, str]] = []  # (time, kind, type, reason)

    def initial(self, type_name: str) -> str:
        """A name for a replica of ``type_name`` in service from the start."""
        return replica_name(type_name, next(self._numbers[type_name]))

    def __call__(self, now: float, snap: FleetSnapshot) -> list[Action]:
        self._seen.append(snap)
        while self._seen and self._seen[0].now <= now - self.window:
            self._seen.popleft()
        seconds = sum(s.interval for s in self._seen)
        arrivals = sum(s.arrivals for s in self._seen)
        finished = sum(s.finished for s in self._seen)
        met = sum(s.met for s in self._seen)
        recent, recent_seconds = 0, 0.0  # the last ticks covering RISE_WINDOW (or the last one)
        for s in reversed(self._seen):
            if recent_seconds >= RISE_WINDOW:
                break
            recent += s.arrivals
            recent_seconds += s.interval
        traffic = Traffic(
            rate=observed_rate(arrivals, seconds, recent, recent_seconds),
            window=seconds,
            prompt_tokens=sum(s.prompt_tokens for s in self._seen) / max(arrivals, 1),
            output_tokens=sum(s.output_tokens for s in self._seen) / max(arrivals, 1),
            # The simulator counts requests within the SLO when its run was given one.
            attainment=met / finished if self.slo_given and finished else None,
            judged=finished,
        )
        by_type: dict[str, dict[str, list[Member]]] = {}
        for r in snap.replicas:
            if self._state.get(r.name) != r.state:
                self._state[r.name] = r.state
                self._since[r.name] = now
            states = by_type.setdefault(type_of(r.name), {})
            member = Member(r.name, self._since[r.name], r.running)
            states.setdefault(r.state, []).append(member)
        fleet = {
            name: TypeFleet(
                starting=tuple(states.get("warming", ())),
                warm=tuple(states.get("serving", ())),
                draining=tuple(states.get("draining", ())),
            )
            for name, states in by_type.items()
        }
        out: list[Action] = []
        for action in self.policy.decide(now, traffic, fleet):
            self.actions.append((now, action.kind, action.type_name, action.reason))
            if action.kind == "drain":
                out.append(Drain(action.replica))
                continue
            startup = self.policy.types[action.type_name].startup_s
            for _ in range(action.count):
                name = replica_name(action.type_name, next(self._numbers[action.type_name]))
                out.append(Add(name, self.specs[action.type_name], warm_after=startup))
        return out
