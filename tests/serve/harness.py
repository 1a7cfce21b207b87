"""What the router's HTTP tests share: request bodies, quick mock replicas, the fleet that the
``serve`` fixture (conftest.py) starts, and the checks that every request has ended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from hetero.serve.app import ServeOptions, Server
from hetero.serve.emulator.server import MockConfig, MockReplica
from hetero.serve.router import Router, RouterOptions

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

#: A mock that answers at once with 10 tokens (deterministic, no sleeping).
QUICK: dict[str, Any] = {
    "models": ("m",),
    "decode_time": 0.0,
    "prefill_time": 0.0,
    "output_dist": "fixed",
    "output_mean": 10,
}


def chat(content: str = "hello world", model: str = "m", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def mock(**fields: Any) -> MockConfig:
    """``QUICK`` with these fields changed."""
    return MockConfig(**{**QUICK, **fields})


@dataclass
class Spec:
    """One replica of a test fleet: how the mock behaves and what the router is told."""

    config: MockConfig = field(default_factory=mock)
    speed: float | None = 1.0  # declared to the router (None: its URL alone)
    slots: int | None = 4  # declared to the router (None: learned)
    models: set[str] = field(default_factory=set)  # declared (empty: asked at /v1/models)


@dataclass
class Fleet:
    mocks: list[MockReplica]
    router: Router
    server: Server
    url: str
    session: aiohttp.ClientSession

    @property
    def admin_url(self) -> str:
        assert self.server.admin_url is not None
        return self.server.admin_url

    def status_of(self, name: str) -> dict[str, Any]:
        return next(r for r in self.router.status()["replicas"] if r["name"] == name)

    async def replicas(self) -> dict[str, dict[str, Any]]:
        """The replicas as ``GET /status`` lists them, by name."""
        async with self.session.get(self.url + "/status") as reply:
            assert reply.status == 200
            return {r["name"]: r for r in (await reply.json())["replicas"]}

    async def post(
        self, body: Any, path: str = CHAT, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """POST ``body`` (JSON) and return (status, parsed JSON answer)."""
        async with self.session.post(self.url + path, json=body, headers=headers) as reply:
            return reply.status, await reply.json(content_type=None)


class Serve(Protocol):
    def __call__(
        self,
        *specs: Spec,
        options: RouterOptions | None = None,
        serve_options: ServeOptions | None = None,
    ) -> Awaitable[Fleet]: ...


#: Tests that expect a request on a given replica route deterministically, whatever the
#: router's default becomes.
PINNED = "shortest_expected_delay"


async def openai_stream(client: Any, model: str, max_tokens: int) -> tuple[str, Any]:
    """A streamed chat completion through the ``openai`` client: its text and the last
    chunk's usage (asked for with ``include_usage``)."""
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].usage


async def wait_for(check: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    """Poll ``check`` until it holds (``limit`` only bounds a broken test; nothing is timed)."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.005)


def assert_settled(router: Router) -> None:
    """Every admitted request has ended, in the router and in its dispatcher."""
    assert not router.tickets, f"tickets left: {sorted(router.tickets)}"
    router.dispatcher.validate_state()
    assert router.dispatcher.active == 0
    assert router.dispatcher.waiting == 0
    assert not router.dispatcher.records  # keep_finished=False: only live items are kept
    if router.slo_policy is not None:
        assert router.slo_policy.in_flight() == 0


#: The admin key of the router that the ``router_url`` fixture (conftest.py) starts.
KEY = "top-secret"
