"""What the router's ``GET /status`` shows: its queue, and each replica's load, capacity,
speed and state in one word (``state_word``); without the admin key (when one is set), only
what is no secret of the deployment (``full=False``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hetero.sched.health import CircuitState, Hold
from hetero.serve.records import ReplicaState

if TYPE_CHECKING:
    from hetero.serve.router import Router

__all__ = ["ADMIN_ONLY", "router_status", "state_word"]

#: A replica's fields shown with the admin key only: where it is, what last went wrong there
#: (connection errors name hosts and ports, engines' answers their internals), and what its
#: engine and GPU are. The rest (its name, state, models, speeds, counts, load figures) is
#: public, and enough for ``hetero top --serve``.
ADMIN_ONLY = ("url", "device", "engine", "capacity", "last_error", "engine_model")


def router_status(router: Router, full: bool = True) -> dict[str, Any]:
    """The router's queue and every replica in the fleet (not removed), as ``GET /status``
    answers; ``full=False`` leaves out the ``ADMIN_ONLY`` fields and why a load is unknown."""
    d = router.dispatcher
    view = d.view
    speeds = router.learned_speeds()
    now = router.clock.now()
    replicas = []
    for s in router.replicas:
        i, r = s.index, s.replica
        if s.removed:
            continue
        queued = int(view.in_flight[i]) - int(view.running[i])
        capacity = s.capacity
        replicas.append(
            {
                "name": r.name,
                "url": r.url,
                "device": r.device_model,
                "engine": s.engine,
                "models": sorted(r.models),
                "slots": int(view.slots[i]),
                "declared_slots": r.slots,
                "capacity": {
                    "limit": round(capacity.limit, 2),
                    "why": capacity.reason,
                    "engine_cap": capacity.cap,
                },
                "speed": r.speed,
                "learned_speed": round(float(speeds[i]), 4),
                "load": _load_status(router, s, now, full),
                "in_flight": int(view.running[i]),
                "queued": queued,
                "completed": s.completed,
                "failed": s.failed,
                "output_tokens": s.output_tokens,
                "mean_latency_s": round(s.latency_sum / s.completed, 4) if s.completed else None,
                "circuit": str(s.breaker.state),
                "state": state_word(router, s),
                "last_error": s.breaker.last_error or None,
            }
        )
        if router.slo_policy is not None:
            # What the engine model makes of it: fitted figures, predictions, their error.
            replicas[-1]["engine_model"] = router.slo_policy.explain(i, view)
        if not full:
            for key in ADMIN_ONLY:
                replicas[-1].pop(key, None)
    return {
        "strategy": router.options.strategy,
        "uptime_s": round(time.time() - router.started, 1),
        "waiting": d.waiting,
        "pending": d.waiting - d.queued_total,
        "active": d.active,
        "queue_size": router.options.queue_size,
        "closing": router.closing,
        "replicas": replicas,
    }


def _load_status(router: Router, state: ReplicaState, now: float, full: bool) -> dict[str, Any]:
    stale = router.load_stale(state, now)
    if stale:  # why: a read's error, naming the replica's address or its engine's answer
        return {"known": False, "why": stale} if full else {"known": False}
    assert state.load is not None
    return {"known": True, "age_s": round(now - state.load_at, 3), **state.load.as_dict()}


def state_word(router: Router, s: ReplicaState) -> str:
    """The replica's state in one word: gray, draining, down, failing (kept in service
    however it fails), busy (a 429's hold) or up."""
    if s.gray:
        return "gray"
    if s.draining:
        return "draining"
    if s.breaker.state is CircuitState.OPEN:
        return "down"
    if s.breaker.state is CircuitState.CLOSED and s.breaker.failures >= s.breaker.threshold:
        return "failing"  # kept in service: the last replica of a model
    if Hold.SATURATED in s.holds:
        return "busy"
    return "up" if router.dispatcher.view.usable[s.index] else "down"
