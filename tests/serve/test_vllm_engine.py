"""Smoke tests of the real vLLM CPU engines that the serving tests and benchmarks use: chat
(whole and streamed), the model list and the Prometheus gauges hetero reads. Nothing is timed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from hetero.serve.engines.vllm import parse as parse_vllm
from tests.serve.vllm_fixtures import VllmEndpoint, VllmFleet

# Startup of both engines (30-100 s; torch.compile's first run here is the slow part) counts
# against the first test's limit.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

SIZES = ["small", "large"]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        yield s


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello, who are you?"}],
        "max_tokens": 16,
        "temperature": 0,
        **extra,
    }


@pytest.mark.parametrize("name", SIZES)
async def test_chat(vllm_fleet: VllmFleet, session: aiohttp.ClientSession, name: str) -> None:
    replica: VllmEndpoint = vllm_fleet[name]
    async with session.post(replica.url + "/v1/chat/completions", json=chat(replica.model)) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
    assert body["model"] == replica.model
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert 0 < body["usage"]["completion_tokens"] <= 16
    assert body["usage"]["prompt_tokens"] > 0


@pytest.mark.parametrize("name", SIZES)
async def test_chat_stream(
    vllm_fleet: VllmFleet, session: aiohttp.ClientSession, name: str
) -> None:
    replica = vllm_fleet[name]
    # ignore_eos (a vLLM extension): random weights may pick the end token at any step.
    request = chat(
        replica.model, stream=True, stream_options={"include_usage": True}, ignore_eos=True
    )
    chunks: list[dict[str, Any]] = []
    done = False
    async with session.post(replica.url + "/v1/chat/completions", json=request) as r:
        assert r.status == 200, await r.text()
        assert r.headers["content-type"].startswith("text/event-stream")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
    assert done
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")
    )
    assert text
    assert chunks[-1]["usage"]["completion_tokens"] == 16


async def test_models(vllm_fleet: VllmFleet, session: aiohttp.ClientSession) -> None:
    for replica in vllm_fleet.replicas:
        async with session.get(replica.url + "/v1/models") as r:
            assert r.status == 200
            ids = [m["id"] for m in (await r.json())["data"]]
        assert ids == [replica.model]


async def test_metrics(vllm_fleet: VllmFleet, session: aiohttp.ClientSession) -> None:
    for replica in vllm_fleet.replicas:
        async with session.get(replica.url + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
        labels = f'{{engine="0",model_name="{replica.model}"}}'
        for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            assert f"{gauge}{labels} " in text, f"{gauge} missing from {replica.name}'s /metrics"


async def test_prefix_cache_counters(vllm_fleet: VllmFleet, session: aiohttp.ClientSession) -> None:
    """The counters the router holds its prefix index to (``CacheCheck``): a prompt sent again
    is looked up in full and found cached but for its last block."""
    replica = vllm_fleet["small"]

    async def counters() -> tuple[int, int]:
        async with session.get(replica.url + "/metrics") as r:
            sample = parse_vllm(await r.read())
        assert sample.prefix_queries is not None and sample.prefix_hits is not None
        return sample.prefix_queries, sample.prefix_hits

    text = "A fleet of devices shares one long system prompt, word for word. " * 12
    body = {**chat(replica.model, max_tokens=1), "messages": [{"role": "user", "content": text}]}
    queries, hits = await counters()
    tokens = []
    for _ in range(2):
        async with session.post(replica.url + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            tokens.append((await r.json())["usage"]["prompt_tokens"])
    after_queries, after_hits = await counters()
    assert after_queries - queries == sum(tokens)
    assert 0 < after_hits - hits < tokens[1]  # the second found all but a partial block
