"""``hetero serve`` in front of replicas that answer too much: oversized numbers on a load page,
SSE lines over aiohttp's limit, model lists and replies of megabytes. Each is a real server on
127.0.0.1 that joins a real router through the admin API; states are waited for, never time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from hetero.serve.app import ServeOptions
from hetero.serve.probes import MAX_MODELS_BODY
from hetero.serve.router import RouterOptions
from tests.serve.harness import CHAT, Fleet, Serve, Spec, chat, mock, wait_for

KEY = "admin-key"
ADMIN = {"Authorization": f"Bearer {KEY}"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Start = Callable[[dict[str, Handler]], Awaitable[str]]
#: An SSE line longer than aiohttp reads as one line (512 KiB).
LONG_LINE = b"data: " + json.dumps({"x": "y" * 600 * 1024}).encode() + b"\n\n"
FIRST_EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'


@pytest.fixture
async def hostile() -> AsyncIterator[Start]:
    """``start({path: handler})``: a server on 127.0.0.1 answering GET or POST on those paths
    (and ``/health``), as a replica that misbehaves; its URL."""
    runners: list[web.AppRunner] = []

    async def ok(request: web.Request) -> web.Response:
        return web.Response()

    async def start(routes: dict[str, Handler]) -> str:
        app = web.Application()
        app.router.add_get("/health", ok)
        for path, handler in routes.items():
            app.router.add_route("*", path, handler)
        runner = web.AppRunner(app, shutdown_timeout=0.01)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


def options(**fields: Any) -> ServeOptions:
    return ServeOptions(port=0, health_interval=3600, admin_key=KEY, **fields)


async def join(fleet: Fleet, url: str, **fields: Any) -> None:
    """Add the replica at ``url`` as "bad" through the admin API (which reads its model list
    unless ``models`` are given, and starts reading its load)."""
    body = {"url": url, "name": "bad", **fields}
    async with fleet.session.post(
        fleet.admin_url + "/admin/replicas", json=body, headers=ADMIN
    ) as r:
        assert r.status == 201, await r.text()


async def stream_text(fleet: Fleet, body: dict[str, Any]) -> tuple[int, str]:
    async with fleet.session.post(fleet.url + CHAT, json=body) as reply:
        return reply.status, (await reply.read()).decode()


def vllm_page(blocks: str, block_size: str) -> bytes:
    return (
        'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
        f'vllm:cache_config_info{{block_size="{block_size}",engine="0",'
        f'num_gpu_blocks="{blocks}"}} 1.0\n'
    ).encode()


async def in_two_parts(
    request: web.Request, data: bytes, reading: asyncio.Event, release: asyncio.Event
) -> web.StreamResponse:
    """Answer ``data`` (JSON): its first 64 KiB, then ``reading`` is set, and the rest once
    ``release`` is."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)
    await response.write(data[:65536])
    reading.set()
    await release.wait()
    with contextlib.suppress(ConnectionError):  # the router read what it reads and hung up
        await response.write(data[65536:])
    return response


# --- numbers no engine publishes ------------------------------------------------------------


async def test_a_4000_digit_cache_config_label_leaves_status_answering(
    serve: Serve, hostile: Start
) -> None:
    reads = 0

    async def metrics(request: web.Request) -> web.Response:
        nonlocal reads
        reads += 1
        return web.Response(body=vllm_page("9" * 4000, "7" * 4000))

    url = await hostile({"/metrics": metrics})
    fleet = await serve(Spec(), serve_options=options())
    await join(fleet, url, models=["m"])
    await wait_for(lambda: reads >= 3, "the page read after its detection")
    await wait_for(lambda: fleet.status_of("bad")["load"]["known"], "its load read")
    async with fleet.session.get(fleet.url + "/status") as reply:
        assert reply.status == 200, await reply.text()
        (bad,) = [r for r in (await reply.json())["replicas"] if r["name"] == "bad"]
    assert bad["load"]["known"] and "kv_tokens" not in bad["load"]  # absent, as unpublished
    async with fleet.session.get(fleet.admin_url + "/admin/replicas", headers=ADMIN) as reply:
        assert reply.status == 200


async def test_under_prefix_affinity_a_400_digit_label_never_stops_the_load_reads(
    serve: Serve, hostile: Start, caplog: pytest.LogCaptureFixture
) -> None:
    page = vllm_page("9" * 400, "16")
    served = 0

    async def metrics(request: web.Request) -> web.Response:
        nonlocal served
        served += 1
        return web.Response(body=page)

    url = await hostile({"/metrics": metrics})
    fleet = await serve(
        Spec(), options=RouterOptions(strategy="prefix_affinity"), serve_options=options()
    )
    await join(fleet, url, models=["m"])
    await wait_for(lambda: served >= 3, "the absurd page read after its detection")
    page = vllm_page("100", "16")  # the engine comes to its senses: read, so still polled
    await wait_for(
        lambda: fleet.status_of("bad")["load"].get("kv_tokens") == 1600, "the sane page read"
    )
    assert all(r.exc_info is None for r in caplog.records if r.name == "hetero.serve")


# --- SSE lines over aiohttp's limit ---------------------------------------------------------


def sse_reply(*chunks: bytes) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A chat route that streams ``chunks`` as they are and ends."""

    async def chat_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        return response

    return chat_stream


async def test_an_sse_line_too_long_before_the_first_event_is_retried_elsewhere(
    serve: Serve, hostile: Start
) -> None:
    url = await hostile({CHAT: sse_reply(LONG_LINE)})
    fleet = await serve(Spec(), serve_options=options())
    await join(fleet, url, models=["m"], speed=100)  # preferred: tried first
    status, text = await stream_text(fleet, chat(stream=True, max_tokens=3))
    assert status == 200, text
    assert text.rstrip().endswith("data: [DONE]")  # served by r0
    assert fleet.status_of("bad")["failed"] == 1 and fleet.mocks[0].stats["completed"] == 1
    assert "sent a line over" in fleet.status_of("bad")["last_error"]


async def test_an_sse_line_too_long_mid_stream_ends_it_with_an_error_event(
    serve: Serve, hostile: Start
) -> None:
    url = await hostile({CHAT: sse_reply(FIRST_EVENT, LONG_LINE)})
    fleet = await serve(Spec(), serve_options=options())
    await join(fleet, url, models=["m"], speed=100)
    status, text = await stream_text(fleet, chat(stream=True, max_tokens=3))
    assert status == 200
    events = [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "a"
    error = json.loads(events[-1])["error"]["message"]
    assert error.startswith("replica bad failed mid-stream") and "sent a line over" in error, error
    assert fleet.status_of("bad")["failed"] == 1


# --- answers of megabytes -------------------------------------------------------------------


async def test_a_model_list_of_megabytes_is_refused_and_404s_stay_small(
    serve: Serve, hostile: Start
) -> None:
    listing = json.dumps(
        {
            "object": "list",
            "data": [{"id": f"model-{i}", "object": "model"} for i in range(100_000)],
        }
    ).encode()
    reading, release = asyncio.Event(), asyncio.Event()

    async def models(request: web.Request) -> web.StreamResponse:
        return await in_two_parts(request, listing, reading, release)

    url = await hostile({"/v1/models": models})
    fifty = mock(models=("m", *(f"extra-{i:02}" for i in range(50))))
    fleet = await serve(Spec(fifty), serve_options=options())
    joining = asyncio.create_task(join(fleet, url))
    await reading.wait()  # the router is reading the hostile list: it still answers
    async with fleet.session.get(fleet.url + "/health") as reply:
        assert reply.status == 200
    release.set()
    await joining
    bad = fleet.status_of("bad")
    assert bad["models"] == [] and f"over {MAX_MODELS_BODY} bytes" in bad["last_error"]
    # Its list unread, a model no one else serves may be its: 503, not 404.
    assert (await fleet.post(chat(model="nope")))[0] == 503
    async with fleet.session.delete(fleet.admin_url + "/admin/replicas/bad", headers=ADMIN) as r:
        assert r.status == 200
    async with fleet.session.post(fleet.url + CHAT, json=chat(model="nope")) as reply:
        assert reply.status == 404
        body = await reply.read()
    assert len(body) < 600, len(body)
    message = json.loads(body)["error"]["message"]
    assert message.endswith("extra-09 and 41 more (GET /v1/models)"), message


async def test_a_reply_over_max_reply_is_a_502_naming_the_limit(
    serve: Serve, hostile: Start
) -> None:
    usage = b', "usage": {"prompt_tokens": 3, "completion_tokens": 7}}'
    fits = b'{"choices": [{"text": "' + b"z" * 512 * 1024 + b'"}]' + usage  # parsed by its shape
    too_long = b'{"choices": [{"text": "' + b"z" * 2 * 2**20 + b'"}]' + usage
    replies = [too_long, fits]
    reading, release = asyncio.Event(), asyncio.Event()

    async def completion(request: web.Request) -> web.StreamResponse:
        return await in_two_parts(request, replies.pop(0), reading, release)

    url = await hostile({CHAT: completion})
    fleet = await serve(Spec(), serve_options=options(max_reply=2**20))
    await join(fleet, url, models=["m"], speed=100)
    refused = asyncio.create_task(fleet.post(chat()))
    await reading.wait()  # the router is reading the reply: it still answers
    async with fleet.session.get(fleet.url + "/health") as reply:
        assert reply.status == 200
    release.set()
    status, answer = await refused
    assert status == 502, answer
    message = answer["error"]["message"]
    assert "bad: answered more than 1048576 bytes" in message and "--max-reply" in message
    assert fleet.status_of("bad")["failed"] == 1
    assert fleet.mocks[0].stats["requests"] == 0  # not tried again elsewhere
    status, _ = await fleet.post(chat())  # half a megabyte: its shape checked, its usage read
    assert status == 200 and fleet.status_of("bad")["output_tokens"] == 7


async def test_the_traffic_log_takes_the_engines_prompt_count_and_not_an_absurd_one(
    serve: Serve, hostile: Start
) -> None:
    # Text unlike English: characters / 4 says 2 tokens; the engine counted 900 (streamed,
    # its usage asked for) and 700 (a whole reply). A count past any context window is a lie
    # or a fault: the estimate stands.
    usage = [900, 700, 10**30, -5]
    tail = b'data: {"choices": [], "usage": {"prompt_tokens": %d, "completion_tokens": 1}}\n\n'

    async def completion(request: web.Request) -> web.StreamResponse:
        prompt = usage.pop(0)
        if (await request.json()).get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(FIRST_EVENT + tail % prompt + b"data: [DONE]\n\n")
            return response
        counts = {"prompt_tokens": prompt, "completion_tokens": 1}
        body = {"choices": [{"message": {"content": "a"}}], "usage": counts}
        return web.json_response(body)

    url = await hostile({CHAT: completion})
    fleet = await serve(Spec(), serve_options=options())
    await join(fleet, url, models=["q"], speed=100)
    asked = {"stream_options": {"include_usage": True}}
    async with fleet.session.post(
        fleet.url + CHAT, json=chat("w1 w2 w3", model="q", stream=True, **asked)
    ) as reply:
        assert reply.status == 200 and b"[DONE]" in await reply.read()
    for _ in range(3):
        assert (await fleet.post(chat("w1 w2 w3", model="q")))[0] == 200
    seen = fleet.router.traffic.traffic(fleet.router.clock.now()).prompt_samples
    assert seen == (900, 700, 2, 2), seen
