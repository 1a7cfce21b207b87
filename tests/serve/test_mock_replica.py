"""The emulated replica: OpenAI wire format, pacing, slots, faults, and its command line."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import json
import math
import random
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from hetero.cli import app
from hetero.errors import ConfigError
from hetero.serve.emulator.server import (
    EMBEDDING_DIM,
    OUTPUT_DISTS,
    MockConfig,
    MockReplica,
    draw_output_length,
)
from hetero.serve.emulator.slots import _Slots
from tests.serve.harness import openai_stream, wait_for

Start = Callable[..., Awaitable[tuple[MockReplica, str]]]

CHAT = "/v1/chat/completions"
INSTANT = {"decode_time": 0.0, "prefill_time": 0.0}
FIXED = {"output_dist": "fixed", "output_mean": 10}


def chat(content: str = "hello world!", **extra: Any) -> dict[str, Any]:
    return {"model": "mock-llm", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Start replicas of ``MockConfig(**fields)``; every one is stopped after the test."""
    replicas: list[MockReplica] = []

    async def start(**fields: Any) -> tuple[MockReplica, str]:
        replica = MockReplica(MockConfig(**fields))
        replicas.append(replica)
        return replica, await replica.start()

    yield start
    for replica in replicas:
        await replica.stop()
        stats = replica.stats
        assert (stats["in_flight"], stats["waiting"]) == (0, 0), "a slot leaked"


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    events = [e for e in text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events), events
    return [e.removeprefix("data: ") for e in events]


async def cancel(*tasks: asyncio.Task[Any]) -> None:
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- wire format -------------------------------------------------------------------------------


async def test_chat_completion_shape(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(**INSTANT, **FIXED)
    async with http.post(url + CHAT, json=chat("x" * 40, max_tokens=50)) as r:
        assert r.status == 200
        body = await r.json()
    assert body["object"] == "chat.completion" and body["model"] == "mock-llm"
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": " tok" * 10}
    assert choice["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20}


async def test_text_completion_shape(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(**INSTANT, **FIXED)
    prompt = {"model": "mock-llm", "prompt": ["ab" * 10, "cd" * 10]}
    async with http.post(url + "/v1/completions", json=prompt) as r:
        body = await r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == " tok" * 10
    assert body["usage"]["prompt_tokens"] == 10  # 40 characters, about 4 a token
    tokens = {"model": "mock-llm", "prompt": [1, 2, 3]}
    async with http.post(url + "/v1/completions", json=tokens) as r:
        assert (await r.json())["usage"]["prompt_tokens"] == 3


async def test_chat_stream_shape(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(decode_time=0.002, **FIXED)
    request = chat(stream=True, stream_options={"include_usage": True})
    async with http.post(url + CHAT, json=request) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        events = sse_events(await r.text())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    *tokens, finish, usage = chunks
    assert len(tokens) == 10  # one token a chunk at 2 ms a token
    assert tokens[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == " tok" * 10
    assert finish["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10


async def test_text_stream_without_usage(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(**INSTANT, **FIXED)
    request = {"model": "mock-llm", "prompt": "hi", "stream": True, "max_tokens": 4}
    async with http.post(url + "/v1/completions", json=request) as r:
        events = sse_events(await r.text())
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == " tok" * 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in c for c in chunks)


async def test_openai_client_parses_every_route(start: Start) -> None:
    openai = pytest.importorskip("openai", reason="the openai client is not installed")
    _, url = await start(**INSTANT, **FIXED)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    try:
        messages = [{"role": "user", "content": "hello"}]
        done = await client.chat.completions.create(model="mock-llm", messages=messages)
        assert done.choices[0].message.content == " tok" * 10
        assert done.usage is not None and done.usage.completion_tokens == 10
        text, usage = await openai_stream(client, "mock-llm", max_tokens=3)
        assert text == " tok" * 3 and usage is not None
        completion = await client.completions.create(model="mock-llm", prompt="hi", max_tokens=2)
        assert completion.choices[0].finish_reason == "length"
        embedded = await client.embeddings.create(model="mock-llm", input=["a", "b"])
        assert [len(d.embedding) for d in embedded.data] == [EMBEDDING_DIM] * 2
        models = await client.models.list()
        assert [m.id for m in models.data] == ["mock-llm"]
    finally:
        await client.close()


# --- lengths and pacing ------------------------------------------------------------------------


async def test_max_tokens_caps_the_output(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(**INSTANT, output_dist="fixed", output_mean=50, default_max_tokens=20)
    cases = [
        ({"max_tokens": 10}, 10, "length"),
        ({"max_completion_tokens": 12}, 12, "length"),
        ({"max_tokens": 100}, 50, "stop"),
        ({}, 20, "length"),  # default_max_tokens
        ({"max_tokens": 100, "ignore_eos": True}, 100, "length"),
    ]
    for extra, tokens, reason in cases:
        async with http.post(url + CHAT, json=chat(**extra)) as r:
            body = await r.json()
        assert body["usage"]["completion_tokens"] == tokens, extra
        assert body["choices"][0]["finish_reason"] == reason, extra


async def test_output_lengths_repeat_for_a_seed(start: Start, http: aiohttp.ClientSession) -> None:
    async def lengths(seed: int) -> list[int]:
        _, url = await start(**INSTANT, seed=seed, output_mean=40, default_max_tokens=10_000)
        out = []
        for _ in range(8):
            async with http.post(url + CHAT, json=chat()) as r:
                out.append((await r.json())["usage"]["completion_tokens"])
        return out

    first = await lengths(3)
    assert first == await lengths(3)
    assert first != await lengths(4)
    assert len(set(first)) > 1  # lognormal: lengths vary


async def test_a_requests_seed_fixes_its_length_on_every_replica(
    start: Start, http: aiohttp.ClientSession
) -> None:
    _, one = await start(**INSTANT, output_mean=40, default_max_tokens=10_000)
    _, two = await start(**INSTANT, output_mean=40, default_max_tokens=10_000, speed=3.0)

    async def length(url: str, seed: int) -> int:
        async with http.post(url + CHAT, json={**chat(), "seed": seed}) as r:
            return int((await r.json())["usage"]["completion_tokens"])

    on_one = [await length(one, k) for k in range(6)]
    # The other replica, in another order, after unrelated requests: the same lengths.
    await length(two, 99)
    assert [await length(two, k) for k in reversed(range(6))] == on_one[::-1]
    assert len(set(on_one)) > 1


@pytest.mark.parametrize("dist", OUTPUT_DISTS)
def test_output_length_distributions_have_the_mean(dist: str) -> None:
    rng = random.Random(0)
    draws = [draw_output_length(rng, dist, 100) for _ in range(20_000)]
    assert min(draws) >= 1
    # Pareto with alpha 1.5 has no variance: its sample mean wanders, so its bound is loose.
    tolerance = 0.3 if dist == "pareto" else 0.05
    assert sum(draws) / len(draws) == pytest.approx(100, rel=tolerance)


async def test_service_time_scales_with_speed(start: Start, http: aiohttp.ClientSession) -> None:
    async def service_time(speed: float) -> float:
        _, url = await start(speed=speed, decode_time=0.02, prefill_time=0.0, **FIXED)
        t0 = time.perf_counter()
        async with http.post(url + CHAT, json=chat()) as r:
            await r.read()
        return time.perf_counter() - t0

    slow, fast = await service_time(1.0), await service_time(4.0)  # 0.2 s and 0.05 s
    assert fast >= 0.04 and slow > 2 * fast


async def test_one_slot_serves_one_request_at_a_time(
    start: Start, http: aiohttp.ClientSession
) -> None:
    async def overlap(slots: int) -> bool:
        """Whether the second of two streams got its first chunk before the first ended."""
        replica, url = await start(slots=slots, decode_time=0.01, prefill_time=0.0, **FIXED)
        log: list[str] = []

        async def stream(name: str) -> None:
            async with http.post(url + CHAT, json=chat(stream=True)) as r:
                await r.content.readline()
                log.append(f"{name} first")
                await r.read()
                log.append(f"{name} done")

        first = asyncio.create_task(stream("a"))
        await wait_for(lambda: replica.stats["in_flight"] == 1, "one request in flight")
        await asyncio.gather(first, stream("b"))
        return log.index("b first") < log.index("a done")

    assert not await overlap(slots=1)
    assert await overlap(slots=2)


# --- admission and faults ----------------------------------------------------------------------


async def test_full_queue_answers_429(start: Start, http: aiohttp.ClientSession) -> None:
    replica, url = await start(slots=1, queue_limit=1, decode_time=1.0, **FIXED)
    running = asyncio.create_task(http.post(url + CHAT, json=chat()))
    await wait_for(lambda: replica.stats["in_flight"] == 1, "one request in flight")
    waiting = asyncio.create_task(http.post(url + CHAT, json=chat()))
    await wait_for(lambda: replica.stats["waiting"] == 1, "one request waiting")
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 429 and r.headers["Retry-After"] == "1"
        assert (await r.json())["error"]["type"] == "rate_limit_error"
    await cancel(running, waiting)


async def test_fail_rate_one_answers_500(start: Start, http: aiohttp.ClientSession) -> None:
    replica, url = await start(fail_rate=1.0)
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 500
        assert (await r.json())["error"]["type"] == "server_error"
    assert replica.stats["failed"] == 1 and replica.stats["completed"] == 0


async def test_garbage_rate_one_answers_broken_bodies(
    start: Start, http: aiohttp.ClientSession
) -> None:
    _, url = await start(garbage_rate=1.0)
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 200
        with pytest.raises(ValueError):
            json.loads(await r.text())
    async with http.post(url + CHAT, json=chat(stream=True)) as r:
        assert r.status == 200
        events = sse_events(await r.text())
    assert "[DONE]" not in events
    with pytest.raises(ValueError):
        json.loads(events[0])


async def test_configure_at_run_time(start: Start, http: aiohttp.ClientSession) -> None:
    replica, url = await start(**INSTANT)
    replica.configure(fail_rate=1.0)
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 500
    async with http.post(url + "/mock/config", json={"fail_rate": 0, "speed": 3}) as r:
        assert r.status == 200 and (await r.json())["speed"] == 3
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 200
    with pytest.raises(ConfigError, match=r"slowdown: must be a positive .*got -1"):
        replica.configure(slowdown=-1)
    async with http.post(url + "/mock/config", json={"slots": 2}) as r:
        assert r.status == 400 and "settable: speed" in (await r.json())["error"]["message"]
    async with http.post(url + "/mock/config", json={"garbage_rate": 2}) as r:
        assert r.status == 400 and "from 0 to 1" in (await r.json())["error"]["message"]
    assert replica.config.speed == 3 and replica.config.slowdown == 1
    async with http.get(url + "/mock/stats") as r:
        assert await r.json() == replica.stats


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"model": "mock-llm"}).encode(), "'messages' must be a non-empty list"),
        (json.dumps(chat(max_tokens=0)).encode(), "'max_tokens' must be an integer >= 1, got 0"),
        (json.dumps(chat(stream="yes")).encode(), "'stream' must be true or false"),
        (json.dumps({"messages": []}).encode(), "'model' must be a string"),
    ],
)
async def test_bad_requests_answer_400(
    start: Start, http: aiohttp.ClientSession, body: bytes, message: str
) -> None:
    _, url = await start()
    async with http.post(url + CHAT, data=body) as r:
        assert r.status == 400
        error = (await r.json())["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]


async def test_unknown_model_answers_404(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(models=("a", "b"))
    async with http.post(url + CHAT, json=dict(chat(), model="c")) as r:
        assert r.status == 404
        error = (await r.json())["error"]
    assert error["code"] == "model_not_found" and "serves: a, b" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
async def test_client_that_leaves_frees_its_slot(start: Start, stream: bool) -> None:
    replica, url = await start(slots=1, decode_time=0.2, prefill_time=0.0, **FIXED)
    async with aiohttp.ClientSession() as leaving:
        if stream:  # hang up after the first chunk
            response = await leaving.post(url + CHAT, json=chat(stream=True))
            await response.content.readline()
            response.close()
        else:  # hang up while waiting for the answer
            request = asyncio.create_task(leaving.post(url + CHAT, json=chat()))
            await wait_for(lambda: replica.stats["in_flight"] == 1, "one request in flight")
            await cancel(request)
    await wait_for(lambda: replica.stats["in_flight"] == 0, "no request in flight")
    assert replica.stats["cancelled"] == 1 and replica.stats["completed"] == 0
    replica.configure(speed=1000)  # the next one is quick: the slot is free again
    async with aiohttp.ClientSession() as http, http.post(url + CHAT, json=chat()) as r:
        assert r.status == 200


@pytest.mark.parametrize("release_first", [False, True])
async def test_slot_handed_to_a_waiter_as_it_is_cancelled_is_not_lost(release_first: bool) -> None:
    # The race a disconnect can hit: the slot frees and the waiter is cancelled in one loop step.
    slots = _Slots(1)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await wait_for(lambda: slots.waiting == 1, "one waiter")
    if release_first:
        slots.release()
        waiter.cancel()
    else:
        waiter.cancel()
        slots.release()
    await cancel(waiter)
    assert (slots.free, slots.waiting) == (1, 0)
    await slots.acquire()  # and it can be had again at once


async def test_stop_cuts_requests_in_flight(start: Start, http: aiohttp.ClientSession) -> None:
    replica, url = await start(slots=1, decode_time=1.0, **FIXED)  # 10 s a request
    requests = [asyncio.create_task(http.post(url + CHAT, json=chat())) for _ in range(3)]
    await wait_for(lambda: replica.stats["waiting"] == 2, "two requests waiting")
    t0 = time.perf_counter()
    await replica.stop()
    assert time.perf_counter() - t0 < 2
    for request in requests:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await request
    assert replica.stats["cancelled"] == 3


# --- other routes ------------------------------------------------------------------------------


async def test_embeddings(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(**INSTANT)
    request = {"model": "mock-llm", "input": ["hello", "world", "hello"]}
    async with http.post(url + "/v1/embeddings", json=request) as r:
        body = await r.json()
    vectors = [d["embedding"] for d in body["data"]]
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    assert all(len(v) == EMBEDDING_DIM for v in vectors)
    assert all(math.isclose(math.hypot(*v), 1.0) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    request = {"model": "mock-llm", "input": "hello", "encoding_format": "base64"}
    async with http.post(url + "/v1/embeddings", json=request) as r:
        packed = base64.b64decode((await r.json())["data"][0]["embedding"])
    assert struct.unpack(f"<{EMBEDDING_DIM}f", packed) == pytest.approx(vectors[0], rel=1e-6)
    async with http.post(url + "/v1/embeddings", json={"model": "mock-llm", "input": 3}) as r:
        assert r.status == 400


async def test_models_health_and_worker_info(start: Start, http: aiohttp.ClientSession) -> None:
    replica, url = await start(models=["big", "small"], slots=1, decode_time=1.0, **FIXED)
    async with http.get(url + "/v1/models") as r:
        listed = await r.json()
    assert listed["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [
        ("big", "model", "hetero-mock"),
        ("small", "model", "hetero-mock"),
    ]
    for path in ("/health", "/health_generate"):
        async with http.get(url + path) as r:
            assert r.status == 200
    for path in ("/get_server_info", "/get_model_info"):
        async with http.get(url + path) as r:
            assert (await r.json())["model_path"] == "big"
    busy = asyncio.create_task(http.post(url + CHAT, json=dict(chat("x" * 40), model="big")))
    await wait_for(lambda: replica.stats["in_flight"] == 1, "one request in flight")
    async with http.get(url + "/get_load") as r:
        (load,) = await r.json()
    # Its 10 prompt tokens, and the output generated so far (a token a second).
    assert load["num_reqs"] == 1 and 10 <= load["num_tokens"] <= 20
    await cancel(busy)


def test_config_lists_every_bad_field() -> None:
    with pytest.raises(ConfigError) as caught:
        MockConfig(speed=0, slots=0, output_dist="normal", queue_limit=-1)
    fields = [field for field, _ in caught.value.problems]
    assert fields == ["speed", "slots", "output_dist", "queue_limit"]
    assert "output_dist: must be one of lognormal, pareto" in str(caught.value)
    assert "got 'normal'" in str(caught.value)


def test_config_rejects_unknown_engines_and_faults() -> None:
    bad = {"engine": "tgi", "kv_tokens": 0, "load_fault": "flaky", "load_delay": -1}
    with pytest.raises(ConfigError) as caught:
        MockConfig(**bad)  # type: ignore[arg-type]
    assert [field for field, _ in caught.value.problems] == list(bad)
    message = str(caught.value)
    assert "engine: must be one of sglang, vllm, openai, got 'tgi'" in message
    assert "load_fault: must be one of none, garbage, nan, negative, huge, slow, error" in message
    assert "got 'flaky'" in message
    assert MockConfig(slots=4).kv_capacity == 4 * 2048
    assert MockConfig(slots=4, kv_tokens=100).kv_capacity == 100


# --- the engines' load endpoints ---------------------------------------------------------------

#: What each engine answers besides the OpenAI API and /health (a GET of each gives 200).
ENGINE_PATHS = {
    "sglang": [
        "/health_generate",
        "/get_server_info",
        "/server_info",
        "/get_model_info",
        "/model_info",
        "/get_load",
        "/v1/loads",
        "/metrics",
    ],
    "vllm": ["/metrics", "/version", "/load"],
    "openai": [],
}
ALL_PATHS = sorted({p for paths in ENGINE_PATHS.values() for p in paths})
#: The endpoints load_fault breaks, by engine (all answer 200 without it).
LOAD_PATHS = {
    "sglang": ["/metrics", "/get_load", "/v1/loads", "/get_server_info", "/server_info"],
    "vllm": ["/metrics", "/load"],
}
SLOW = {"slots": 2, "decode_time": 1.0, "prefill_time": 0.0, **FIXED}  # 10 s a request


def families(text: str) -> dict[str, Any]:
    """The metric families of a Prometheus page, by name (prometheus_client's parser)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the one sample named ``name`` whose labels include ``labels``."""
    found = [
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, (name, labels, found)
    return float(found[0])


async def load_figures(
    http: aiohttp.ClientSession, url: str, engine: str
) -> list[tuple[float, float, float]]:
    """``(running, waiting, KV usage)`` as each of the engine's load endpoints reports them."""
    async with http.get(url + "/metrics") as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
        page = await r.text()
    if engine == "vllm":
        async with http.get(url + "/load") as r:
            in_flight = (await r.json())["server_load"]
        running = sample(page, "vllm:num_requests_running", engine="0", model_name="mock-llm")
        waiting = sample(page, "vllm:num_requests_waiting")
        assert in_flight == running + waiting
        assert sample(page, "vllm:num_requests_waiting_by_reason", reason="capacity") == waiting
        return [(running, waiting, sample(page, "vllm:kv_cache_usage_perc"))]
    async with http.get(url + "/v1/loads") as r:
        (load,) = (await r.json())["loads"]
    async with http.get(url + "/get_load") as r:
        (legacy,) = await r.json()
    assert legacy["num_tokens"] == load["num_total_tokens"]
    return [
        (
            sample(page, "sglang:num_running_reqs", tp_rank="0", model_name="mock-llm"),
            sample(page, "sglang:num_queue_reqs"),
            sample(page, "sglang:token_usage"),
        ),
        (load["num_running_reqs"], load["num_waiting_reqs"], load["token_usage"]),
        (legacy["num_reqs"] - legacy["num_waiting_reqs"], legacy["num_waiting_reqs"], math.nan),
    ]


@pytest.mark.parametrize("engine", ["sglang", "vllm", "openai"])
async def test_each_engine_answers_its_endpoints_and_404_the_rest(
    start: Start, http: aiohttp.ClientSession, engine: str
) -> None:
    _, url = await start(engine=engine, **INSTANT, **FIXED)
    for path in ("/health", "/v1/models"):
        async with http.get(url + path) as r:
            assert r.status == 200, path
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 200
    for path in ALL_PATHS:
        async with http.get(url + path) as r:
            expected = 200 if path in ENGINE_PATHS[engine] else 404
            assert r.status == expected, (engine, path)


async def test_sglang_bodies_have_sglangs_shape(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(slots=6, kv_tokens=5000, **INSTANT, **FIXED)
    async with http.get(url + "/get_server_info") as r:
        info = await r.json()
    assert info["version"] == "0.5.23" and info["max_running_requests"] == 6
    assert info["max_total_num_tokens"] == 5000
    (state,) = info["internal_states"]
    assert state["effective_max_running_requests_per_dp"] == 6
    assert state["memory_usage"]["token_capacity"] == 5000
    async with http.get(url + "/v1/loads") as r:
        loads = await r.json()
    assert set(loads) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    (load,) = loads["loads"]
    assert (load["dp_rank"], load["max_running_requests"], load["max_total_num_tokens"]) == (
        0,
        6,
        5000,
    )
    assert {"memory", "disaggregation", "queues"} <= set(load)
    async with http.get(url + "/v1/loads", params={"include": "core"}) as r:
        (core,) = (await r.json())["loads"]
    assert "memory" not in core and core["num_running_reqs"] == 0
    async with http.get(url + "/v1/loads", params={"dp_rank": "1"}) as r:
        assert (await r.json())["loads"] == []
    async with http.get(url + "/v1/loads", params={"include": "gpu"}) as r:
        assert r.status == 400 and "Invalid include sections" in (await r.json())["detail"]
    async with http.get(url + "/v1/loads", params={"format": "prometheus"}) as r:
        page = await r.text()
    assert sample(page, "sglang_max_running_requests", dp_rank="0") == 6
    assert sample(page, "sglang_memory_token_capacity") == 5000
    async with http.get(url + "/get_load") as r:
        (legacy,) = await r.json()
    assert set(legacy) == {
        "dp_rank",
        "num_reqs",
        "num_waiting_reqs",
        "num_tokens",
        "num_pending_tokens",
        "ts_tic",
    }
    async with http.get(url + "/model_info") as r:
        assert (await r.json())["served_model_name"] == "mock-llm"


async def test_vllm_version_and_labels(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(engine="vllm", models=["org/model-7b"], **INSTANT, **FIXED)
    async with http.get(url + "/version") as r:
        assert await r.json() == {"version": "0.33.0"}
    async with http.get(url + "/metrics") as r:
        page = await r.text()
    found = families(page)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert found[name].type == "gauge"
        (series,) = found[name].samples
        assert series.labels == {"engine": "0", "model_name": "org/model-7b"}
    for name in (
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    ):
        assert found[name].type == "counter", name
        assert sample(page, name + "_total") == 0
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert found[name].type == "histogram"
        assert sample(page, name + "_count") == 0


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_gauges_follow_the_load(
    start: Start, http: aiohttp.ClientSession, engine: str
) -> None:
    replica, url = await start(engine=engine, kv_tokens=1000, **SLOW)
    for running, waiting, usage in await load_figures(http, url, engine):
        assert (running, waiting) == (0, 0) and (math.isnan(usage) or usage == 0)
    # Two hold the slots and three wait: each holds its 10 prompt tokens, then its output.
    requests = [asyncio.create_task(http.post(url + CHAT, json=chat("x" * 40))) for _ in range(5)]
    await wait_for(lambda: replica.stats["waiting"] == 3, "three requests waiting")
    for running, waiting, usage in await load_figures(http, url, engine):
        assert (running, waiting) == (2, 3)
        assert math.isnan(usage) or 0.02 <= usage <= 0.04  # 20 to 40 of 1000 tokens
    await cancel(*requests)
    await wait_for(lambda: replica.stats["in_flight"] == 0, "no request in flight")
    for running, waiting, usage in await load_figures(http, url, engine):
        assert (running, waiting) == (0, 0) and (math.isnan(usage) or usage == 0)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_kv_usage_is_held_tokens_over_capacity(
    start: Start, http: aiohttp.ClientSession, engine: str
) -> None:
    # decode_time 10 s: a request holds its prompt alone for as long as the test looks.
    replica, url = await start(engine=engine, kv_tokens=40, slots=1, decode_time=10.0, **FIXED)
    busy = asyncio.create_task(http.post(url + CHAT, json=chat("x" * 40)))  # 10 tokens
    await wait_for(lambda: replica.stats["in_flight"] == 1, "one request in flight")
    (_, _, usage), *_ = await load_figures(http, url, engine)
    assert usage == 0.25
    await cancel(busy)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_counters_and_histograms_count_completions(
    start: Start, http: aiohttp.ClientSession, engine: str
) -> None:
    _, url = await start(engine=engine, **INSTANT, **FIXED)
    for stream in (False, True, False):
        async with http.post(url + CHAT, json=chat("x" * 40, stream=stream)) as r:
            await r.read()
    async with http.get(url + "/metrics") as r:
        page = await r.text()
    if engine == "vllm":
        assert sample(page, "vllm:prompt_tokens_total") == 30
        assert sample(page, "vllm:generation_tokens_total") == 30
        assert sample(page, "vllm:request_success_total", finished_reason="stop") == 3
        assert sample(page, "vllm:e2e_request_latency_seconds_count") == 3
        assert sample(page, "vllm:time_to_first_token_seconds_bucket", le="+Inf") == 3
    else:
        assert sample(page, "sglang:num_requests_total", is_streaming="false") == 2
        assert sample(page, "sglang:generation_tokens_total", is_streaming="true") == 10
        assert sample(page, "sglang:e2e_request_latency_seconds_count", is_streaming="false") == 2


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
async def test_load_faults(start: Start, http: aiohttp.ClientSession, engine: str) -> None:
    replica, url = await start(engine=engine, **INSTANT, **FIXED)
    paths = LOAD_PATHS[engine]

    async def bodies() -> dict[str, tuple[int, str]]:
        out = {}
        for path in paths:
            async with http.get(url + path) as r:
                out[path] = (r.status, await r.text())
        # The API is never affected.
        async with http.post(url + CHAT, json=chat()) as r:
            assert r.status == 200
        return out

    replica.configure(load_fault="error")
    assert {status for status, _ in (await bodies()).values()} == {500}

    replica.configure(load_fault="garbage")
    for path, (status, text) in (await bodies()).items():
        assert status == 200, path
        with pytest.raises(ValueError):  # neither a Prometheus page nor JSON
            if path == "/metrics":
                list(text_string_to_metric_families(text))
            else:
                json.loads(text)

    gauges = {
        "vllm": ["vllm:num_requests_running", "vllm:num_requests_waiting"],
        "sglang": ["sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"],
    }[engine]
    for fault, bad in (("nan", math.isnan), ("negative", lambda v: v < 0)):
        replica.configure(load_fault=fault)  # type: ignore[arg-type]
        got = await bodies()
        page = got["/metrics"][1]
        assert all(bad(sample(page, name)) for name in gauges), (fault, page)
        if engine == "sglang":
            (load,) = json.loads(got["/v1/loads"][1])["loads"]
            assert bad(load["num_running_reqs"]) and bad(load["token_usage"])
            (legacy,) = json.loads(got["/get_load"][1])
            assert bad(legacy["num_reqs"])
        else:
            assert bad(json.loads(got["/load"][1])["server_load"])

    replica.configure(load_fault="huge")
    status, page = (await bodies())["/metrics"]
    assert status == 200 and len(page) >= 10 * 1024 * 1024
    assert page.startswith("# hetero mock padding 0")
    real = page[page.index(f"# HELP {gauges[0]}") :]
    assert sample(real, gauges[0]) == 0  # the page proper follows the padding
    list(text_string_to_metric_families(page[:100_000].rsplit("\n", 1)[0]))  # the padding parses

    replica.configure(load_fault="slow", load_delay=60)
    for path in paths:
        with pytest.raises(TimeoutError):
            await http.get(url + path, timeout=aiohttp.ClientTimeout(total=0.2))
    async with http.post(url + CHAT, json=chat()) as r:
        assert r.status == 200

    replica.configure(load_fault="none")
    assert {status for status, _ in (await bodies()).values()} == {200}


async def test_load_fault_over_http(start: Start, http: aiohttp.ClientSession) -> None:
    _, url = await start(engine="vllm", load_fault="error", **INSTANT)
    async with http.get(url + "/metrics") as r:
        assert r.status == 500
    async with http.post(url + "/mock/config", json={"load_fault": "none"}) as r:
        assert r.status == 200 and (await r.json())["load_fault"] == "none"
    async with http.get(url + "/metrics") as r:
        assert r.status == 200
    async with http.post(url + "/mock/config", json={"load_fault": "flaky"}) as r:
        message = (await r.json())["error"]["message"]
    assert r.status == 400 and "load_fault: must be one of none, garbage" in message
    async with http.post(url + "/mock/config", json={"engine": "sglang"}) as r:
        assert r.status == 400 and "settable: speed" in (await r.json())["error"]["message"]


# --- command line ------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_help_names_every_option() -> None:
    result = runner.invoke(app, ["mock-replica", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    options = ("--model", "--speed", "--slots", "--port", "--queue-limit", "--output-dist")
    for option in (*options, "--engine", "--kv-tokens", "--load-fault", "--load-delay"):
        assert option in result.stdout
    assert "Example: `hetero mock-replica" in result.stdout


def test_cli_defaults_match_the_config() -> None:
    from hetero.commands.mock_replica import mock_replica

    fields = {"max_tokens": "default_max_tokens", "model": None, "host": None, "port": None}
    config = MockConfig()
    for name, param in inspect.signature(mock_replica).parameters.items():
        field = fields.get(name, name)
        if field is not None:
            assert getattr(config, field) == param.default, name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--speed", "-1"], "--speed: must be a positive finite number, got -1.0"),
        (["--output-dist", "normal"], "--output-dist: must be one of lognormal"),
        (["--max-tokens", "0"], "--max-tokens: must be an integer >= 1, got 0"),
        (["--engine", "tgi"], "--engine: must be one of sglang, vllm, openai, got 'tgi'"),
        (["--load-fault", "flaky"], "--load-fault: must be one of none, garbage, nan"),
    ],
)
def test_cli_bad_value_is_a_clear_error(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["mock-replica", *args])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output


def test_cli_serves_until_sigterm() -> None:
    args = ["--port", "0", "--model", "m1", "--speed", "2.5", "--slots", "4"]
    args += ["--decode-time", "0", "--prefill-time", "0"]
    command = [sys.executable, "-m", "hetero", "mock-replica", *args]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            match = re.fullmatch(
                r"hetero mock-replica listening on (http://127\.0\.0\.1:\d+) "
                r"\(model m1, speed 2\.5, slots 4\)\n",
                line,
            )
            assert match, line
            request = urllib.request.Request(
                match[1] + "/v1/completions",
                data=json.dumps({"model": "m1", "prompt": "hi", "max_tokens": 3}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=5) as r:
                assert json.load(r)["usage"]["completion_tokens"] == 3
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=5)
            assert proc.returncode == 0
            assert out == "" and err == ""  # the one line, then nothing: no traceback, no noise
        finally:
            proc.kill()  # a no-op once it has exited
