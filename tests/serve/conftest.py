"""Fixtures of the router's HTTP tests: real mock replicas and a real ``Server`` on 127.0.0.1
(what they share besides fixtures is in harness.py).

``serve(...)`` starts one ``MockReplica`` per spec and a router in front of them; after the test
every request must have ended (no ticket left, the dispatcher's invariants hold, nothing active)
and everything is stopped. ``router_url`` is one replica behind a router on a thread of its own,
for the CLI's tests; ``http`` a client session.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from hetero.serve.app import ServeOptions, Server
from hetero.serve.emulator.server import MockConfig, MockReplica
from hetero.serve.replicas import Replica
from hetero.serve.router import Router, RouterOptions
from tests.serve.harness import KEY, PINNED, Fleet, Serve, Spec, assert_settled, wait_for
from tests.serve.vllm_fixtures import vllm_fleet  # noqa: F401  (a fixture)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    fleets: list[Fleet] = []
    mocks: list[MockReplica] = []

    async def start(
        *specs: Spec,
        options: RouterOptions | None = None,
        serve_options: ServeOptions | None = None,
    ) -> Fleet:
        started = [MockReplica(s.config) for s in specs]
        mocks.extend(started)
        urls = [await m.start() for m in started]
        replicas = [
            Replica(f"r{i}", url, s.speed, s.slots, set(s.models), bool(s.models))
            for i, (url, s) in enumerate(zip(urls, specs, strict=True))
        ]
        router = Router(replicas, options or RouterOptions(strategy=PINNED))
        # Health checks only when a test asks for them: they would race with its faults.
        server = Server(router, serve_options or ServeOptions(port=0, health_interval=3600))
        url = await server.start()
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        fleet = Fleet(started, router, server, url, session)
        fleets.append(fleet)
        return fleet

    yield start
    try:
        for fleet in fleets:
            await fleet.session.close()
            await wait_for(lambda f=fleet: not f.router.tickets, "every request ended")  # type: ignore[misc]
            assert_settled(fleet.router)
    finally:
        for fleet in fleets:
            await fleet.server.stop()
        for m in mocks:
            await m.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A client session, closed after the test."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def router_url() -> Iterator[str]:
    """A mock replica and a router on their own event loop thread; yields the router's URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[MockReplica, Server, str]:
        mock = MockReplica(MockConfig(models=("m",), speed=2.0, slots=4, decode_time=0.001))
        mock_url = await mock.start()
        server = Server(
            Router([Replica("fast", mock_url, 2.0, 4, set(), False)]),
            ServeOptions(port=0, admin_key=KEY),
        )
        url = await server.start()
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "prompt": "hello", "max_tokens": 3}
            async with session.post(url + "/v1/completions", json=body) as reply:
                assert reply.status == 200
        return mock, server, url

    mock, server, url = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    yield url

    async def stop() -> None:
        await server.stop()
        await mock.stop()

    asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
