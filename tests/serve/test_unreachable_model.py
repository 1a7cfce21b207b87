"""A request that names a model while the only replica is down and its model list was never read:
the router cannot tell the model is unknown, so it answers 503 (the replica is unreachable), not
404."""

from __future__ import annotations

import socket
from typing import Any

import aiohttp

from hetero.serve.app import ServeOptions, Server
from hetero.serve.replicas import Replica
from hetero.serve.router import Router, RouterOptions
from tests.serve.harness import CHAT, PINNED, assert_settled, chat


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _ask(replica: Replica, model: str) -> tuple[int, dict[str, Any]]:
    """The router's answer to one chat request naming ``model``, then the router's teardown."""
    router = Router([replica], RouterOptions(strategy=PINNED))
    server = Server(router, ServeOptions(port=0, health_interval=3600))
    front = await server.start()
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(front + CHAT, json=chat(model=model)) as r,
        ):
            answer = r.status, await r.json()
        assert_settled(router)
        return answer
    finally:
        await server.stop()


async def test_a_model_of_an_unreachable_replica_whose_models_were_never_read_is_503() -> None:
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    status, body = await _ask(Replica("r0", url, None, None, set(), declared_models=False), "m")
    assert status == 503, body
    message = body["error"]["message"]
    assert "'m'" in message and "r0" in message and "unreachable" in message
    assert "never read" in message


async def test_a_model_no_replica_serves_is_still_404() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    status, body = await _ask(Replica("r0", url, None, None, {"m"}, declared_models=True), "x")
    assert status == 404, body
