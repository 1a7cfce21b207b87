"""``hetero serve`` end to end: real mock replicas and a real router on 127.0.0.1, real clients.

Orders and counts are asserted, never durations: slow replicas only make overlaps certain.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from typer.testing import CliRunner

from hetero.cli import app
from hetero.serve.app import ServeOptions
from hetero.serve.emulator.server import MockReplica
from hetero.serve.replicas import Replica
from hetero.serve.router import RouterOptions
from tests.serve.harness import (
    CHAT,
    COMPLETIONS,
    PINNED,
    Fleet,
    Serve,
    Spec,
    chat,
    mock,
    openai_stream,
    wait_for,
)

ADMIN_KEY = "sekret"


def sse_data(text: str) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    events = [e for e in text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events), events
    return [e.removeprefix("data: ") for e in events]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def occupy(fleet: Fleet) -> aiohttp.ClientResponse:
    """Start a stream that holds a slot until the caller closes it (then the router ends it)."""
    body = chat("blocker", stream=True, max_tokens=100_000, ignore_eos=True)
    reply = await fleet.session.post(fleet.url + CHAT, json=body)
    assert reply.status == 200
    assert (await reply.content.readline()).startswith(b"data: {")
    return reply


# --- requests the router refuses ---------------------------------------------------------------


async def test_malformed_requests_answer_400_naming_the_problem(serve: Serve) -> None:
    fleet = await serve(Spec())
    session = fleet.session
    cases: list[tuple[Any, dict[str, str], str]] = [
        (b"{not json", {}, "not valid JSON"),
        (b"[1, 2]", {}, "must be a JSON object"),
        (json.dumps({"messages": []}).encode(), {}, "field 'model' is required"),
        (json.dumps({"model": ""}).encode(), {}, "field 'model' is required"),
        (json.dumps(chat()).encode(), {"x-priority": "high"}, "x-priority must be an integer"),
        (json.dumps(chat(max_tokens=-3)).encode(), {}, "max_tokens must be an integer from 0"),
        (json.dumps(chat(max_tokens="ten")).encode(), {}, "max_tokens"),
        (json.dumps(chat(max_completion_tokens=1.5)).encode(), {}, "max_completion_tokens"),
    ]
    for body, headers, message in cases:
        async with session.post(fleet.url + CHAT, data=body, headers=headers) as reply:
            answer = await reply.json()
        assert reply.status == 400, body
        assert message in answer["error"]["message"], (body, answer)
        assert answer["error"]["type"] == "invalid_request_error"
    assert fleet.mocks[0].stats["requests"] == 0  # none of them reached a replica


async def test_body_over_max_body_answers_413(serve: Serve) -> None:
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, max_body=2000))
    status, answer = await fleet.post(chat("x" * 4000))
    assert status == 413 and "2000 bytes" in answer["error"]["message"]
    status, _ = await fleet.post(chat("x" * 100))
    assert status == 200


async def test_unknown_model_answers_404_listing_the_served_ones(serve: Serve) -> None:
    fleet = await serve(Spec(mock(models=("m", "other"))))
    status, answer = await fleet.post(chat(model="nope"))
    assert status == 404
    assert answer["error"]["message"] == "model 'nope' is not served here; models: m, other"


async def test_full_queue_answers_429_with_retry_after(serve: Serve) -> None:
    one = mock(decode_time=0.005, slots=1)
    fleet = await serve(Spec(one, slots=1), options=RouterOptions(strategy=PINNED, queue_size=1))
    dispatcher = fleet.router.dispatcher
    running = await occupy(fleet)
    waiting = asyncio.create_task(fleet.post(chat()))
    await wait_for(lambda: dispatcher.waiting == 1, "the second request waits")
    async with fleet.session.post(fleet.url + CHAT, json=chat()) as reply:
        answer = await reply.json()
        assert reply.status == 429 and reply.headers["Retry-After"] == "1"
    assert "queue is full (1 waiting)" in answer["error"]["message"]
    running.close()
    assert (await waiting)[0] == 200


async def test_rate_limit_per_api_key_answers_429(serve: Serve) -> None:
    # 0.01 requests a second in bursts of 1: a second request is refused for 100 s.
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, rate_limit=0.01))
    assert (await fleet.post(chat(), headers=bearer("alice")))[0] == 200
    async with fleet.session.post(fleet.url + CHAT, json=chat(), headers=bearer("alice")) as r:
        answer = await r.json()
        assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
    assert answer["error"]["type"] == "rate_limit_error"
    # A key of its own, new to the router: charged to its client address (another one here).
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with (
        aiohttp.ClientSession(connector=other) as session,
        session.post(fleet.url + CHAT, json=chat(), headers=bearer("bob")) as reply,
    ):
        assert reply.status == 200
    assert fleet.mocks[0].stats["requests"] == 2


async def test_every_replica_of_a_model_drained_answers_503(serve: Serve) -> None:
    fleet = await serve(Spec(), Spec())
    fleet.router.drain("r0")
    assert (await fleet.post(chat()))[0] == 200  # r1 serves it
    fleet.router.drain("r1")
    status, answer = await fleet.post(chat())
    assert status == 503
    assert "r0 draining" in answer["error"]["message"]
    assert "r1 draining" in answer["error"]["message"]
    async with fleet.session.get(fleet.url + "/health") as reply:
        assert reply.status == 503
    fleet.router.undrain("r1")
    assert (await fleet.post(chat()))[0] == 200


# --- the admin API -----------------------------------------------------------------------------


async def test_admin_api_adds_drains_undrains_and_removes_replicas(serve: Serve) -> None:
    paced = mock(decode_time=0.004)  # a speed-1 replica; learned speeds tell them apart
    fleet = await serve(Spec(paced), serve_options=ServeOptions(port=0, admin_key=ADMIN_KEY))
    admin = fleet.admin_url + "/admin/replicas"
    session = fleet.session
    assert admin.split("/admin")[0] != fleet.url  # a listener of its own
    async with session.get(admin) as r:
        assert r.status == 401 and "missing" in (await r.json())["error"]["message"]
    async with session.get(admin, headers=bearer("guess")) as r:
        assert r.status == 401 and "wrong" in (await r.json())["error"]["message"]
    async with session.post(admin, json={"url": "http://x:1", "speed": 1}) as r:
        assert r.status == 401
    async with session.post(fleet.url + "/admin/replicas") as r:
        assert r.status == 404  # not on the front

    added = MockReplica(mock(decode_time=0.004, speed=10.0))
    url = await added.start()
    try:
        body = {"url": url, "speed": 10, "slots": 2}
        async with session.post(admin, json=body, headers=bearer(ADMIN_KEY)) as r:
            assert r.status == 201
            name = (await r.json())["added"]
        assert name == url.removeprefix("http://")
        async with session.post(admin, json=body, headers=bearer(ADMIN_KEY)) as r:
            assert (
                r.status == 409 and "already in the fleet" in (await r.json())["error"]["message"]
            )
        async with session.post(admin, json={"url": "ftp://h"}, headers=bearer(ADMIN_KEY)) as r:
            assert r.status == 400 and "expected http://" in (await r.json())["error"]["message"]
        async with session.get(admin, headers=bearer(ADMIN_KEY)) as r:
            listed = {x["name"]: x for x in (await r.json())["replicas"]}
        assert listed[name]["models"] == ["m"] and listed[name]["slots"] == 2

        # Ten times as fast as r0: it takes the work.
        for _ in range(4):
            assert (await fleet.post(chat()))[0] == 200
        assert added.stats["requests"] > 0

        async with session.post(f"{admin}/{name}/drain", headers=bearer(ADMIN_KEY)) as r:
            assert r.status == 200 and await r.json() == {"drain": name}
        assert fleet.status_of(name)["state"] == "draining"
        before = added.stats["requests"]
        for _ in range(6):
            assert (await fleet.post(chat()))[0] == 200
        assert added.stats["requests"] == before

        async with session.post(f"{admin}/{name}/undrain", headers=bearer(ADMIN_KEY)) as r:
            assert r.status == 200
        assert fleet.status_of(name)["state"] == "up"
        for _ in range(4):
            assert (await fleet.post(chat()))[0] == 200
        assert added.stats["requests"] > before

        async with session.delete(f"{admin}/{name}", headers=bearer(ADMIN_KEY)) as r:
            assert r.status == 200 and await r.json() == {"remove": name}
        async with session.get(fleet.url + "/status") as r:
            assert [x["name"] for x in (await r.json())["replicas"]] == ["r0"]
        before = added.stats["requests"]
        assert (await fleet.post(chat()))[0] == 200
        assert added.stats["requests"] == before
        async with session.post(f"{admin}/{name}/drain", headers=bearer(ADMIN_KEY)) as r:
            assert r.status == 404 and "unknown replica" in (await r.json())["error"]["message"]
    finally:
        await added.stop()


async def test_no_admin_api_without_an_admin_key(serve: Serve) -> None:
    fleet = await serve(Spec())
    assert fleet.server.admin_url is None
    async with fleet.session.get(fleet.url + "/admin/replicas", headers=bearer("x")) as r:
        assert r.status == 404


# --- failures of replicas ----------------------------------------------------------------------


async def test_replica_killed_under_load_loses_no_request(serve: Serve) -> None:
    paced = mock(decode_time=0.005, output_mean=20)
    fleet = await serve(Spec(paced), Spec(paced), Spec(paced))
    victim = fleet.mocks[1]
    requests = [asyncio.create_task(fleet.post(chat(f"request {i}"))) for i in range(30)]
    await wait_for(lambda: victim.stats["requests"] >= 2, "the victim serves requests")
    await victim.stop()
    answers = await asyncio.gather(*requests)
    assert [status for status, _ in answers] == [200] * 30
    assert all(a["usage"]["completion_tokens"] == 20 for _, a in answers)
    assert victim.stats["completed"] < 30  # it did die under load
    assert fleet.status_of("r1")["failed"] > 0


async def test_stream_whose_replica_dies_ends_with_an_error_event(serve: Serve) -> None:
    long = mock(decode_time=0.01, output_mean=2000, slots=1)
    fleet = await serve(Spec(long, slots=1))
    body = chat(stream=True, max_tokens=2000)
    timeout = aiohttp.ClientTimeout(total=20)
    async with fleet.session.post(fleet.url + CHAT, json=body, timeout=timeout) as reply:
        assert reply.status == 200
        first = await reply.content.readline()
        assert first.startswith(b"data: {")
        await fleet.mocks[0].stop()
        rest = (await reply.content.read()).decode()  # returns: the stream ended
    events = sse_data(first.decode() + rest)
    assert "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert "replica r0 failed mid-stream" in error["message"]
    assert all("choices" in json.loads(e) for e in events[:-1])
    assert fleet.status_of("r0")["failed"] == 1


async def test_client_that_leaves_mid_stream_ends_its_request(serve: Serve) -> None:
    long = mock(decode_time=0.01, output_mean=2000)
    fleet = await serve(Spec(long))
    async with aiohttp.ClientSession() as session:
        body = chat(stream=True, max_tokens=2000)
        reply = await session.post(fleet.url + CHAT, json=body)
        assert reply.status == 200
        assert (await reply.content.readline()).startswith(b"data: {")
        reply.close()  # the client goes away
    await wait_for(lambda: not fleet.router.tickets, "the router ends the request")
    await wait_for(lambda: fleet.mocks[0].stats["cancelled"] == 1, "the replica's work is cut")
    assert fleet.status_of("r0")["failed"] == 0  # not the replica's fault
    assert (await fleet.post(chat(max_tokens=2)))[0] == 200  # and the router goes on


async def test_replica_that_answers_429_is_held_and_the_request_served_elsewhere(
    serve: Serve,
) -> None:
    # The router thinks the fast replica has 4 slots; it has 1 and no queue, so it refuses
    # (it publishes no load that would tell the router so).
    full = mock(
        decode_time=0.01, output_mean=20, slots=1, queue_limit=0, speed=10.0, engine="openai"
    )
    fleet = await serve(Spec(full, speed=10.0, slots=4), Spec(mock(decode_time=0.002)))
    answers = await asyncio.gather(*(fleet.post(chat(f"request {i}")) for i in range(4)))
    assert [status for status, _ in answers] == [200] * 4
    assert fleet.mocks[0].stats["failed"] >= 1  # it did answer 429
    assert fleet.status_of("r0")["failed"] == 0  # busy is not failed
    assert fleet.status_of("r0")["circuit"] == "closed"
    assert fleet.mocks[0].stats["completed"] + fleet.mocks[1].stats["completed"] == 4


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("fault", ["garbage_rate", "fail_rate"])
async def test_faulty_replica_is_retried_elsewhere_and_its_circuit_opens(
    serve: Serve, fault: str, stream: bool
) -> None:
    # The faulty replica answers at once and is declared far faster than the good one has
    # proven to be, so the router keeps trying it first.
    fleet = await serve(Spec(mock(**{fault: 1.0}), speed=100.0), Spec(mock(decode_time=0.002)))
    for i in range(8):
        body = chat(f"request {i}", stream=stream, stream_options={"include_usage": True})
        async with fleet.session.post(fleet.url + CHAT, json=body) as reply:
            assert reply.status == 200
            text = await reply.text()
        if stream:  # nothing of the broken attempt reached the client
            events = sse_data(text)
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            assert all("error" not in c for c in chunks)
            assert chunks[-1]["usage"]["completion_tokens"] == 10
        else:
            assert json.loads(text)["usage"]["completion_tokens"] == 10
    bad = fleet.status_of("r0")
    assert bad["circuit"] == "open" and bad["state"] == "down"
    assert bad["failed"] == 3 and bad["completed"] == 0  # breaker_threshold
    assert fleet.mocks[0].stats["requests"] == 3  # nothing sent after the circuit opened
    assert fleet.status_of("r1")["completed"] == 8


class GateReplica:
    """A replica that holds its completion requests until ``gate`` is set, then answers 500:
    a fake of the real interface, to order a failure against the router's own steps."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.requests = 0
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "m"}]})

        async def completion(request: web.Request) -> web.Response:
            self.requests += 1
            await self.gate.wait()
            return web.json_response({"error": {"message": "boom"}}, status=500)

        application = web.Application()
        application.router.add_get("/v1/models", models)
        application.router.add_post(CHAT, completion)
        self.runner = web.AppRunner(application, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_request_stopped_before_its_handler_woke_goes_where_it_was_placed_again(
    serve: Serve,
) -> None:
    """The replica's failure that opens its circuit first starts the request queued behind it
    there, then stops it and places it elsewhere, all in one step: its handler, woken after,
    must follow the new placement, not forward it to the dead replica (and blame the other)."""
    fleet = await serve(Spec(), options=RouterOptions(strategy=PINNED, breaker_threshold=1))
    gate = GateReplica()
    url = await gate.start()
    try:
        fleet.router.add(Replica("gate", url, 10.0, 1, {"m"}, True))
        first = asyncio.create_task(fleet.post(chat("first")))
        await wait_for(lambda: gate.requests == 1, "the first request reaches the gate")
        second = asyncio.create_task(fleet.post(chat("second")))
        await wait_for(lambda: fleet.status_of("gate")["queued"] == 1, "the second waits there")
        gate.gate.set()
        answers = await asyncio.gather(first, second)
        assert [status for status, _ in answers] == [200, 200], answers
        assert gate.requests == 1
        good = fleet.status_of("r0")
        assert good["failed"] == 0 and good["circuit"] == "closed" and good["completed"] == 2
    finally:
        await gate.stop()


async def test_request_timeout_answers_504(serve: Serve) -> None:
    slow = mock(decode_time=0.05, output_mean=200)
    fleet = await serve(Spec(slow), options=RouterOptions(strategy=PINNED, timeout=0.3))
    status, answer = await fleet.post(chat())
    assert status == 504
    assert answer["error"]["message"].startswith("request failed: timed out after 0.3s")
    # A stream that has begun ends with an error event instead.
    async with fleet.session.post(fleet.url + CHAT, json=chat(stream=True)) as reply:
        assert reply.status == 200
        events = sse_data(await reply.text())
    assert "choices" in json.loads(events[0])
    error = json.loads(events[-1])["error"]
    assert error["type"] == "timeout" and "timed out after 0.3s" in error["message"]
    # The replica's work was cut when the router gave up on it.
    await wait_for(lambda: fleet.mocks[0].stats["in_flight"] == 0, "the replica is free")
    # The reply that never came counts against the replica (a hung one is found so); the
    # stream under way does not: that replica was answering.
    assert fleet.status_of("r0")["failed"] == 1


# --- placement ---------------------------------------------------------------------------------


async def test_high_priority_request_is_served_before_earlier_low_priority_ones(
    serve: Serve,
) -> None:
    one = mock(decode_time=0.005, output_mean=10, slots=1)
    fleet = await serve(Spec(one, slots=1))
    dispatcher = fleet.router.dispatcher
    finished: list[str] = []

    async def send(name: str, priority: int) -> None:
        status, _ = await fleet.post(chat(name), headers={"x-priority": str(priority)})
        assert status == 200
        finished.append(name)

    busy = await occupy(fleet)
    tasks = []
    for i, (name, priority) in enumerate([("low1", 0), ("low2", 0), ("low3", -1), ("high", 5)]):
        tasks.append(asyncio.create_task(send(name, priority)))
        await wait_for(lambda n=i + 1: dispatcher.waiting == n, f"{name} waits")  # type: ignore[misc]
    busy.close()  # the slot frees: the queue is served in priority order
    await asyncio.gather(*tasks)
    assert finished == ["high", "low1", "low2", "low3"]


async def test_speeds_are_learned_from_completions(serve: Serve) -> None:
    # Declared alike; the second mock is six times as fast.
    fleet = await serve(
        Spec(mock(speed=1.0, decode_time=0.01, output_mean=20, slots=2), slots=2),
        Spec(mock(speed=6.0, decode_time=0.01, output_mean=20, slots=2), slots=2),
    )
    for _ in range(4):
        answers = await asyncio.gather(*(fleet.post(chat()) for _ in range(8)))
        assert {status for status, _ in answers} == {200}
    listed = await fleet.replicas()
    slow, fast = listed["r0"], listed["r1"]
    assert slow["speed"] == fast["speed"] == 1.0
    assert fast["learned_speed"] > 2 * slow["learned_speed"]
    assert fast["completed"] > slow["completed"]


async def test_gray_failure_is_detected_and_drained(serve: Serve) -> None:
    paced = mock(decode_time=0.002, output_mean=10)
    fleet = await serve(
        Spec(paced),
        Spec(paced),
        Spec(mock(decode_time=0.002, output_mean=10, slowdown=8.0)),
        options=RouterOptions(strategy=PINNED, gray_min_done=4),
    )
    sent = 0
    while fleet.status_of("r2")["state"] != "gray":
        assert sent < 600, fleet.router.status()
        answers = await asyncio.gather(*(fleet.post(chat()) for _ in range(12)))
        assert {status for status, _ in answers} == {200}
        sent += 12
    listed = await fleet.replicas()
    assert [listed[n]["state"] for n in ("r0", "r1", "r2")] == ["up", "up", "gray"]
    before = fleet.mocks[2].stats["requests"]
    assert {s for s, _ in await asyncio.gather(*(fleet.post(chat()) for _ in range(8)))} == {200}
    assert fleet.mocks[2].stats["requests"] == before  # drained: no new work
    fleet.router.undrain("r2")
    assert fleet.status_of("r2")["state"] == "up"


async def test_metrics_count_requests_and_show_each_replica(serve: Serve) -> None:
    fleet = await serve(Spec(), Spec())
    for _ in range(3):
        assert (await fleet.post(chat()))[0] == 200
    assert (await fleet.post({**chat(), "model": "nope"}))[0] == 404  # refused: replica "-"
    async with fleet.session.get(fleet.url + "/metrics") as reply:
        assert reply.status == 200
        text = await reply.text()
    counts = {
        m[1]: float(m[2])
        for m in re.finditer(
            r'hetero_serve_requests_total\{code="200",replica="(\w+)"\} (\S+)', text
        )
    }
    assert sum(counts.values()) == 3
    for name in ("r0", "r1"):
        for gauge in ("in_flight", "queued", "learned_speed", "circuit_state"):
            assert f'hetero_serve_{gauge}{{replica="{name}"}}' in text
        assert f'hetero_serve_circuit_state{{replica="{name}"}} 0.0' in text
    assert "hetero_serve_pending 0.0" in text
    assert 'hetero_serve_requests_total{code="404",replica="-"} 1.0' in text


async def test_status_and_models_endpoints(serve: Serve) -> None:
    fleet = await serve(Spec(mock(models=("m", "b"))), Spec(mock(models=("m",))))
    async with fleet.session.get(fleet.url + "/v1/models") as reply:
        assert [m["id"] for m in (await reply.json())["data"]] == ["b", "m"]
    async with fleet.session.get(fleet.url + "/health") as reply:
        assert reply.status == 200
    status, answer = await fleet.post({"model": "b", "prompt": "hi", "max_tokens": 3}, COMPLETIONS)
    assert status == 200 and answer["choices"][0]["text"] == " tok" * 3
    assert fleet.mocks[0].stats["completed"] == 1  # the only replica serving b
    status, answer = await fleet.post({"model": "m", "input": ["a", "b"]}, "/v1/embeddings")
    assert status == 200 and len(answer["data"]) == 2
    async with fleet.session.get(fleet.url + "/status") as reply:
        state = await reply.json()
    assert state["active"] == 0 and state["closing"] is False
    assert [r["models"] for r in state["replicas"]] == [["b", "m"], ["m"]]


async def test_drain_finishes_admitted_requests_and_refuses_new_ones(serve: Serve) -> None:
    slow = mock(decode_time=0.01, output_mean=30)
    fleet = await serve(Spec(slow))
    admitted = [asyncio.create_task(fleet.post(chat())) for _ in range(4)]
    await wait_for(lambda: sum(fleet.router.decisions.values()) == 4, "four requests placed")
    draining = asyncio.create_task(fleet.server.drain())
    await wait_for(lambda: fleet.router.closing, "the server drains")
    status, answer = await fleet.post(chat())
    assert status == 503 and "shutting down" in answer["error"]["message"]
    assert [status for status, _ in await asyncio.gather(*admitted)] == [200] * 4
    await draining
    with pytest.raises(aiohttp.ClientConnectionError):
        await fleet.post(chat())  # stopped


# --- real clients ------------------------------------------------------------------------------


async def test_openai_client_against_the_router(serve: Serve) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    fleet = await serve(Spec(mock(decode_time=0.001)), Spec(mock(decode_time=0.001)))
    client = openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0)
    try:
        messages = [{"role": "user", "content": "hello"}]
        done = await client.chat.completions.create(model="m", messages=messages, max_tokens=5)
        assert done.choices[0].message.content == " tok" * 5
        assert done.usage is not None and done.usage.completion_tokens == 5
        text, usage = await openai_stream(client, "m", max_tokens=4)
        assert text == " tok" * 4
        assert usage is not None and usage.completion_tokens == 4
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m"]
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="nope", messages=messages)
    finally:
        await client.close()


# --- the command line --------------------------------------------------------------------------

runner = CliRunner()


def test_cli_help() -> None:
    result = runner.invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    assert "--replica" in result.output and "--admin-key" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--replica: no replicas"),
        (["-r", "http://127.0.0.1:9="], "--replica: expected URL or URL=GPU or URL=speed:N"),
        (["-r", "http://127.0.0.1:9=A100-80"], "closest catalog names: A100-80GB"),
        (["-r", "http://127.0.0.1:9=speed:2,color=red"], "bad option 'color=red'"),
        (["-r", "http://127.0.0.1:9=speed:1", "--strategy", "best"], "unknown strategy 'best'"),
        (["-r", "http://127.0.0.1:9=speed:1", "--queue-size", "0"], "queue_size: must be >= 1"),
        (
            ["-r", "http://127.0.0.1:9", "--load-interval", "0"],
            "load_interval: must be a number > 0",
        ),
        (["-r", "http://127.0.0.1:9", "--load-reads", "-1"], "load_reads: must be a number > 0"),
        (
            ["-r", "http://127.0.0.1:9", "--loop", "tokio"],
            "--loop: 'tokio' is not an event loop; allowed: auto, asyncio, uvloop",
        ),
        (
            ["-r", "http://127.0.0.1:9", "--capacity-tolerance", "1"],
            "capacity_tolerance: must be a number > 1, got 1.0",
        ),
        (
            ["-r", "http://127.0.0.1:9", "--capacity-initial", "0"],
            "capacity_initial: must be an integer >= 1",
        ),
    ],
)
def test_cli_bad_setup_is_a_clear_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["serve", *args])
    assert result.exit_code == 1, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)


def test_cli_process_without_replicas_exits_1_without_a_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hetero", "serve", "-r", "http://127.0.0.1:9=speed:-2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: --replica: 'http://127.0.0.1:9=speed:-2': speed:")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_cli_on_a_port_in_use_says_so_and_closes_what_it_opened() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["-r", "http://127.0.0.1:9", "--host", "127.0.0.1", "--port", str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "hetero", "serve", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Unclosed" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("loop", ["auto", "asyncio"])  # auto: uvloop where installed
async def test_cli_serves_and_drains_on_sigterm(tmp_path: Path, loop: str) -> None:
    replica = MockReplica(mock())
    url = await replica.start()
    access = tmp_path / "access.jsonl"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hetero",
        "serve",
        "--port",
        "0",
        "--health-interval",
        "3600",
        "--loop",
        loop,
        "-r",
        f"{url}=speed:2",
        "--access-log",
        str(access),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        match = re.fullmatch(
            r"hetero serve listening on (http://127\.0\.0\.1:\d+) "
            r"\(1 replicas?, strategy slo\)\n",
            line,
        )
        assert match, line
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
            session.post(match[1] + CHAT, json=chat(max_tokens=3)) as reply,
        ):
            assert reply.status == 200
            assert (await reply.json())["usage"]["completion_tokens"] == 3
        # Ours, and the one short request the router times a replica known by URL with.
        assert replica.stats["completed"] == 2
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        err = (await proc.stderr.read()).decode()
        assert "draining 0 requests" in err and "Traceback" not in err
        assert await proc.stdout.read() == b""
        (entry,) = [json.loads(line) for line in access.read_text().splitlines()]
        assert entry["path"] == CHAT and entry["status"] == 200 and entry["output_tokens"] == 3
        assert entry["replica"] == url.removeprefix("http://") and entry["attempts"] == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await replica.stop()
