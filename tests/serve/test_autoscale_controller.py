"""The autoscaler's controller on a real ``Router`` and ``Server``, with mock replicas started
as processes on 127.0.0.1 by the ``LocalProcessProvider``: a replica starts and joins, then is
drained and removed while a streamed request it holds runs to its end. Timings are fractions
of a second; every wait is on a state, bounded."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from hetero.errors import BackendError
from hetero.serve.app import ServeOptions, Server
from hetero.serve.autoscale.controller import AutoscaleController, ControllerOptions, url_only
from hetero.serve.autoscale.policy import PolicyOptions, ReplicaType, ScalePolicy, Traffic
from hetero.serve.autoscale.providers import LocalProcessProvider, ReplicaHandle, Retry
from hetero.serve.replicas import Replica
from hetero.serve.router import Router, RouterOptions
from tests.serve.harness import CHAT, PINNED, assert_settled, chat, wait_for

CPU = ReplicaType("cpu", startup_s=5, max_count=3)
TOKENS = 60
# 60 tokens at 0.05 s each: a stream of 3 s, long enough to be in flight when its replica's
# drain begins.
MOCK = [sys.executable, "-m", "hetero", "mock-replica", "--host", "{host}", "--port", "{port}"]
MOCK += ["--model", "m", "--decode-time", "0.05", "--prefill-time", "0", "--output-dist"]
MOCK += ["fixed", "--output-mean", str(TOKENS), "--slots", "4"]
FAST = PolicyOptions(up_after=0.2, down_after=0.3, cooldown=0.3)
START_LIMIT = 60.0  # a mock replica's process starts in a second or two; a loaded machine


class Target:
    def __init__(self, **wanted: int) -> None:
        self.wanted = wanted

    def __call__(self, traffic: Traffic) -> Mapping[str, int]:
        return self.wanted


def traffic() -> Traffic:
    return Traffic(rate=4.2, window=10, prompt_tokens=12, output_tokens=TOKENS)


def group_gone(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@dataclass
class Stack:
    provider: LocalProcessProvider
    first: ReplicaHandle
    router: Router
    server: Server
    url: str
    http: aiohttp.ClientSession


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    """One mock replica started through the provider, a router and server in front of it."""
    provider = LocalProcessProvider([CPU], {"cpu": MOCK}, grace=5)
    first = await provider.start("cpu")
    router = Router([url_only(first)], RouterOptions(strategy=PINNED))
    server = Server(router, ServeOptions(port=0, health_interval=3600))
    try:
        url = await server.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            yield Stack(provider, first, router, server, url, http)
        await wait_for(lambda: not router.tickets, "every request ended")
        assert_settled(router)
    finally:
        await server.stop()
        await provider.close()


async def stream(s: Stack) -> tuple[int, int]:
    """A streamed chat completion through the router: its status and its content chunks."""
    body = chat(stream=True, max_tokens=TOKENS)
    chunks = 0
    async with s.http.post(s.url + CHAT, json=body) as reply:
        async for line in reply.content:
            text = line.decode().strip()
            if text.startswith("data: {"):
                event = json.loads(text.removeprefix("data: "))
                assert "error" not in event, event
                chunks += bool(event["choices"] and event["choices"][0]["delta"].get("content"))
        return reply.status, chunks


def shown(router: Router, name: str) -> dict[str, Any]:
    return next(r for r in router.status()["replicas"] if r["name"] == name)


def in_flight(router: Router, name: str) -> int:
    return int(shown(router, name)["in_flight"])


def slots(router: Router, name: str) -> int:
    return int(shown(router, name)["slots"])


def placed(router: Router) -> int:
    """Requests running on some replica."""
    return sum(r["in_flight"] for r in router.status()["replicas"])


async def test_a_replica_joins_then_leaves_by_drain_without_cutting_its_request(
    stack: Stack,
) -> None:
    s = stack
    sizer = Target(cpu=2)
    controller = AutoscaleController(
        s.router,
        ScalePolicy([CPU], sizer, FAST),
        s.provider,
        traffic,
        options=ControllerOptions(interval=0.05, drain_poll=0.02),
        added=s.server.replica_added,  # what the admin API does for a replica it adds
    )
    controller.adopt(s.first)
    controller.start()
    try:
        # Up: a second replica starts, joins the router, and is learned as serving "m".
        await wait_for(
            lambda: len(controller.fleet()["cpu"].warm) == 2, "a second warm replica", START_LIMIT
        )
        (second,) = [n for n in controller.managed if n != s.first.name]
        state = s.router.state_of(second)
        assert state.replica.models == {"m"} and state.models_read
        (start,) = [d for d in controller.policy.log if d.kind == "start"]
        assert start.reason.startswith("target 2 > 1 (warm 1, starting 0) for 0 s at 4.2 req/s")

        # Slow streamed requests until each replica runs one (the router's choice: once the
        # newcomer's engine is read, its slots are the first's and both are idle).
        await wait_for(lambda: slots(s.router, second) == 4, "the newcomer's slots read")
        requests: list[asyncio.Task[tuple[int, int]]] = []
        while not (in_flight(s.router, s.first.name) and in_flight(s.router, second)):
            assert len(requests) < 6, "the router never used both replicas"
            requests.append(asyncio.create_task(stream(s)))
            await wait_for(lambda: placed(s.router) == len(requests), "the request placed")
        handles = {n: m.handle for n, m in controller.managed.items()}

        # Down: the least loaded (then the newest) replica is drained; its requests still run.
        sizer.wanted = {"cpu": 1}
        await wait_for(lambda: any(d.kind == "drain" for d in controller.policy.log), "a drain")
        (drain,) = [d for d in controller.policy.log if d.kind == "drain"]
        victim = drain.replica
        (kept,) = {s.first.name, second} - {victim}
        assert s.router.state_of(victim).draining and victim in controller.managed
        held = in_flight(s.router, victim)
        assert held >= 1 and drain.reason.endswith(f"{victim} has {held} in flight")
        assert not any(r.done() for r in requests)
        # What comes now goes to the other replica; the requests it held end whole, and only
        # then does it leave the router, and its process end.
        assert await stream(s) == (200, TOKENS)
        assert await asyncio.gather(*requests) == [(200, TOKENS)] * len(requests)
        assert s.router.by_name[victim].completed == held
        assert s.router.by_name[kept].completed == len(requests) - held + 1
        await wait_for(lambda: victim not in controller.managed, "the drained replica stopped")
        assert {r["name"] for r in s.router.status()["replicas"]} == {kept}
        assert group_gone(handles[victim].pid)  # type: ignore[union-attr]

        shown = controller.status()
        assert shown["types"]["cpu"] == {
            "warm": 1,
            "starting": 0,
            "draining": 0,
            "replicas": {kept: "warm"},
            "target": 1,
            "sizer": 1,
            "min_count": 0,
            "max_count": 3,
            "need_for_s": None,
            "quiet_for_s": None,
            "down_after_s": 0.3,
            "held": None,
        }
        assert [d["kind"] for d in shown["decisions"]] == ["start", "drain"]
        assert shown["traffic"] == {
            "rate": 4.2,
            "window": 10,
            "prompt_tokens": 12,
            "output_tokens": TOKENS,
            "attainment": None,
            "judged": None,
        }
        assert (shown["provider"], shown["failures"], shown["last_error"]) == ("local", [], None)
    finally:
        await controller.close()
    assert controller.managed == {}
    assert all(group_gone(h.pid) for h in handles.values() if h is not None)


class FakeProvider:
    """A provider that records what it is asked and fails every start."""

    name = "fake"

    def __init__(self) -> None:
        self.started: list[str] = []
        self.stopped: list[str] = []

    async def start(self, type_name: str) -> ReplicaHandle:
        self.started.append(type_name)
        raise BackendError(f"fake provider could not start a replica of type {type_name!r}")

    async def stop(self, handle: ReplicaHandle) -> None:
        self.stopped.append(handle.name)


def static_router() -> Router:
    """A router with one replica the autoscaler does not manage (never contacted here)."""
    return Router([Replica("static", "http://127.0.0.1:9", 1.0, 4, {"m"}, True)])


async def test_a_dry_run_decides_and_records_but_changes_nothing() -> None:
    provider = FakeProvider()
    router = static_router()
    controller = AutoscaleController(
        router,
        ScalePolicy([CPU], Target(cpu=2), PolicyOptions(up_after=0)),
        provider,
        traffic,
        options=ControllerOptions(dry_run=True),
    )
    (action,) = await controller.tick()
    assert (action.kind, action.count) == ("start", 2)
    assert await controller.tick() != []  # decided again: nothing came of the first
    assert provider.started == [] and controller.managed == {}
    assert [r["name"] for r in router.status()["replicas"]] == ["static"]
    shown = controller.status()
    assert shown["dry_run"] is True and len(shown["decisions"]) == 2
    assert shown["types"]["cpu"]["warm"] == 0


async def test_a_failed_start_is_reported_and_the_need_is_tried_again() -> None:
    broken = [sys.executable, "-c", "import sys; sys.exit('weights not found')"]
    provider = LocalProcessProvider([CPU], {"cpu": broken}, retry=Retry(2, backoff=0.01))
    controller = AutoscaleController(
        static_router(),
        ScalePolicy([CPU], Target(cpu=1), PolicyOptions(up_after=0)),
        provider,
        traffic,
        options=ControllerOptions(interval=0.05),
    )
    controller.start()
    try:
        await wait_for(lambda: len(controller.failures) >= 2, "two failed starts", 30)
    finally:
        await controller.close()
        await provider.close()
    failure = controller.status()["failures"][0]
    assert (failure["type"], failure["action"]) == ("cpu", "start")
    assert "(2 attempts)" in failure["reason"] and "weights not found" in failure["reason"]
    assert len(provider.failures) >= 4  # two attempts each
    assert controller.managed == {} and provider.processes == {}


async def test_a_failing_sizer_skips_a_tick_and_says_why() -> None:
    def sizer(traffic: Traffic) -> Mapping[str, int]:
        raise RuntimeError("the planner found no fleet")

    controller = AutoscaleController(
        static_router(), ScalePolicy([CPU], sizer), FakeProvider(), traffic
    )
    assert await controller.tick() == []
    shown: dict[str, Any] = controller.status()
    assert shown["last_error"] == "RuntimeError: the planner found no fleet"
