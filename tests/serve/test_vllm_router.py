"""``hetero serve`` in front of two real vLLM CPU engines about ten times apart in speed, given
their URLs alone: the engine detected and its gauges read, each replica's speed and capacity
learned from what it shows, a replica killed mid-stream, and an engine whose load page lies.
Every load is bounded in requests; nothing is timed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hetero.serve.app import ServeOptions, Server
from hetero.serve.replicas import Replica
from hetero.serve.router import DEFAULT_STRATEGY, Router, RouterOptions
from tests.serve.harness import PINNED, assert_settled, wait_for
from tests.serve.vllm_fixtures import MODEL, VllmEndpoint, VllmFleet

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

Start = Callable[..., Awaitable[tuple[Router, str]]]


@pytest.fixture
async def routed() -> AsyncIterator[Start]:
    """``start(*urls)``: a router given those URLs alone, with the default strategy (or
    ``strategy``)."""
    servers: list[Server] = []

    async def start(
        *urls: str, strategy: str = DEFAULT_STRATEGY, **names: str
    ) -> tuple[Router, str]:
        replicas = [
            Replica(names.get(f"r{i}", f"r{i}"), url, None, None, set(), False)
            for i, url in enumerate(urls)
        ]
        router = Router(replicas, RouterOptions(strategy=strategy, max_retries=1))
        server = Server(router, ServeOptions(port=0, health_interval=1.0))
        servers.append(server)
        return router, await server.start()

    yield start
    for server in servers:
        await wait_for(lambda s=server: not s.router.tickets, "every request ended", 60)  # type: ignore[misc]
        assert_settled(server.router)
        await server.stop()


def body(max_tokens: int = 32, stream: bool = True, words: int = 30) -> dict[str, Any]:
    content = " ".join(f"word{k}" for k in range(words))
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # random weights may end at any step
        "temperature": 0,
    }
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    return request


async def stream(session: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> list[Any]:
    """A streamed chat through the router: its events, parsed (``"[DONE]"`` as a string)."""
    async with session.post(url + "/v1/chat/completions", json=request) as reply:
        assert reply.status == 200, await reply.text()
        events: list[Any] = []
        async for line in reply.content:
            text = line.decode().strip()
            if text.startswith("data:"):
                payload = text[5:].strip()
                events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def by_name(router: Router) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in router.status()["replicas"]}


async def test_urls_alone_learn_engine_speed_and_capacity(
    vllm_fleet: VllmFleet, routed: Start
) -> None:
    # The capacity a strategy that counts slots learns (the default predicts engines instead).
    router, url = await routed(
        vllm_fleet["small"].url, vllm_fleet["large"].url, strategy=PINNED, r0="small", r1="large"
    )
    await wait_for(lambda: all(s.engine == "vllm" for s in router.replicas), "vLLM detected", 30)
    status = by_name(router)
    assert all(r["load"]["known"] and r["models"] == [MODEL] for r in status.values())
    assert all(r["speed"] is None and r["declared_slots"] is None for r in status.values())
    seen_running: set[str] = set()

    async def watch() -> None:  # the engine's gauges, read in the background, during the load
        while True:
            for name, r in by_name(router).items():
                if r["load"].get("running"):
                    seen_running.add(name)
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        # A few dozen requests, eight at a time.
        for _ in range(6):
            events = await asyncio.gather(*(stream(session, url, body()) for _ in range(8)))
            assert all(
                e[-1] == "[DONE]" and e[-2]["usage"]["completion_tokens"] == 32 for e in events
            )
    watcher.cancel()
    status = by_name(router)
    small, large = status["small"], status["large"]
    # Speeds: the small model is about ten times faster per token alone; learned, not declared.
    # The learned figure is per request at the batch the replica ran, which on a CPU core
    # slows each request as it grows, so only the order is stable (1.7x and 3.5x in two runs).
    assert small["learned_speed"] > large["learned_speed"]
    assert small["completed"] > large["completed"]
    # The replica that took most of the load moved from the starting guess of 8 by what its
    # replies showed (the large one may never have been full).
    assert small["capacity"]["why"] != "initial" and small["slots"] > 1
    assert seen_running, "the engines' running gauges were read during the load"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Sidecar:
    """A pass-through in front of a real engine, part of its replica as a sidecar proxy is,
    answering ``routes`` itself. Once ``hold`` is set, a stream it passes on is never ended by
    it (the engine's ``[DONE]`` and the end of the answer are kept back), so a stream that has
    begun is under way for certain until ``kill`` ends the engine and, with it, cuts every
    connection of the sidecar. Without that, a small engine could finish a stream before a
    loaded router has read its first event, and a kill that followed would find nothing under
    way."""

    def __init__(self, target: str, routes: dict[str, Handler] | None = None) -> None:
        self.target = target
        self.routes = routes or {}
        self.hold = False
        self._killed = asyncio.Event()
        self._client = aiohttp.ClientSession()
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        for path, handler in self.routes.items():
            app.router.add_get(path, handler)
        app.router.add_route("*", "/{tail:.*}", self._through)
        self._runner = web.AppRunner(app, shutdown_timeout=0.01)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _through(self, request: web.Request) -> web.StreamResponse:
        async with self._client.request(
            request.method,
            self.target + request.path_qs,
            data=await request.read(),
            headers={"Content-Type": "application/json"},
        ) as reply:
            out = web.StreamResponse(
                status=reply.status, headers={"Content-Type": reply.content_type}
            )
            await out.prepare(request)
            # Streams only: health checks and load reads pass as they come.
            held = self.hold and reply.content_type == "text/event-stream"
            with contextlib.suppress(aiohttp.ClientError):  # the engine killed under it
                async for line in reply.content:
                    if held and line.startswith(b"data: [DONE]"):
                        break
                    await out.write(line)
        if held:
            await self._killed.wait()
            assert request.transport is not None
            request.transport.abort()  # as the replica's death cuts it
            return out
        await out.write_eof()
        return out

    async def kill(self, engine: VllmEndpoint) -> None:
        """The replica's death: its engine killed, then every connection cut and the port
        closed."""
        proc = engine.process.proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)
        self._killed.set()
        await self.close()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._client.close()


async def test_a_replica_killed_mid_stream_ends_its_streams_and_the_next_go_elsewhere(
    vllm_fleet: VllmFleet, routed: Start
) -> None:
    victim = vllm_fleet["small"]
    sidecar = Sidecar(victim.url)
    front = await sidecar.start()
    try:
        router, url = await routed(front, vllm_fleet["large"].url, r0="small", r1="large")
        await wait_for(
            lambda: all(s.engine == "vllm" for s in router.replicas), "vLLM detected", 30
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            for _ in range(3):  # the small one proves the faster: it takes most of what follows
                await asyncio.gather(*(stream(session, url, body(8)) for _ in range(4)))
            sidecar.hold = True
            streams = [asyncio.create_task(stream(session, url, body(2000))) for _ in range(4)]
            small = router.by_name["small"].index
            # Its first chunks are out: the stream is committed to that replica (not placed
            # again when it dies), and under way there until the kill, which the sidecar holds.
            await wait_for(
                lambda: any(t.answering and t.replica == small for t in router.tickets.values()),
                "a stream answering from small",
                60,
            )
            await sidecar.kill(victim)
            ended = await asyncio.gather(*streams)
            broken = [e for e in ended if e[-1] != "[DONE]"]
            assert broken, "a stream was on the killed replica"
            for events in broken:
                assert "error" in events[-1] and "small" in events[-1]["error"]["message"]
            # The next requests are served by the other replica.
            before = by_name(router)["large"]["completed"]
            after = await asyncio.gather(*(stream(session, url, body(8)) for _ in range(3)))
            assert all(e[-1] == "[DONE]" for e in after)
            assert by_name(router)["large"]["completed"] >= before + 3
    finally:
        await sidecar.close()
        victim.process.stop()
        victim.process.start()  # later tests of the run use it again
        await asyncio.to_thread(victim.process.wait)


async def test_an_engine_whose_load_page_lies_is_shown_and_still_served(
    vllm_fleet: VllmFleet, routed: Start
) -> None:
    # A front that passes the API through to a real engine but answers its load pages badly.
    async def garbage_metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running lots\nvllm:num_requests_waiting 0\n")

    async def broken(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    liar = Sidecar(vllm_fleet["large"].url, {"/metrics": garbage_metrics, "/get_load": broken})
    front = await liar.start()
    try:
        router, url = await routed(front, r0="liar")
        await wait_for(
            lambda: "no numeric value" in by_name(router)["liar"]["load"].get("why", ""),
            "shown",
            30,
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            events = await asyncio.gather(*(stream(session, url, body(8)) for _ in range(4)))
        assert all(e[-1] == "[DONE]" for e in events)
        assert by_name(router)["liar"]["load"]["known"] is False
    finally:
        await liar.close()
