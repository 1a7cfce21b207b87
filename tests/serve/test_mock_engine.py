"""The emulated replica under the continuous engine model, end to end on 127.0.0.1: chat whole
and streamed, its vLLM ``/metrics`` as hetero's vLLM adapter reads it, clients that leave, and
its command line. Nothing is timed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.serve.emulator.server import MockConfig, MockReplica
from hetero.serve.engine_model import BLOCK_SIZE
from hetero.serve.engines.vllm import parse

CHAT = "/v1/chat/completions"
SYSTEM = "You are a careful assistant. " * 80  # 2320 characters: 36 blocks of 64


def chat(user: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return {"model": "mock-llm", "messages": messages, **extra}


@pytest.fixture
async def replica() -> AsyncIterator[tuple[MockReplica, str]]:
    config = MockConfig(
        engine="vllm",
        engine_model="continuous",
        output_dist="fixed",
        output_mean=6,
        slots=8,
    )
    rep = MockReplica(config)
    url = await rep.start()
    yield rep, url
    await rep.stop()
    stats = rep.stats
    assert (stats["in_flight"], stats["waiting"]) == (0, 0), "a request stayed in the engine"


async def test_chat_whole_and_streamed(
    replica: tuple[MockReplica, str], http: aiohttp.ClientSession
) -> None:
    rep, url = replica
    async with http.post(url + CHAT, json=chat("first question, " * 8)) as r:
        assert r.status == 200
        body = await r.json()
    assert body["choices"][0]["message"]["content"] == " tok" * 6
    assert body["usage"]["completion_tokens"] == 6
    request = chat("second question, " * 8, stream=True, stream_options={"include_usage": True})
    async with http.post(url + CHAT, json=request) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [e.removeprefix("data: ") for e in (await r.text()).split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == " tok" * 6
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert rep.stats["completed"] == 2 and rep.stats["tokens_out"] == 12


async def test_metrics_publish_the_engines_cache_as_vllm_does(
    replica: tuple[MockReplica, str], http: aiohttp.ClientSession
) -> None:
    rep, url = replica
    spec = rep.config.engine_spec
    assert spec is not None
    prompts = []
    for user in ("what is a fleet? " * 5, "what is a replica? " * 5):
        async with http.post(url + CHAT, json=chat(user)) as r:
            assert r.status == 200
            prompts.append((await r.json())["usage"]["prompt_tokens"])
    async with http.get(url + "/metrics") as r:
        page = await r.read()
    sample = parse(page)
    assert sample.kv_tokens == spec.kv_tokens == spec.num_blocks * BLOCK_SIZE
    # The second request found the system prompt's 36 full blocks cached.
    hits = len(SYSTEM) // 64 * BLOCK_SIZE
    assert sample.prefix_hit_rate == pytest.approx(hits / sum(prompts))
    assert (sample.prefix_queries, sample.prefix_hits) == (sum(prompts), hits)
    assert (sample.running, sample.waiting, sample.kv_usage) == (0, 0, 0.0)
    assert b'vllm:num_preemptions_total{engine="0",model_name="mock-llm"} 0.0' in page


async def test_concurrent_requests_share_the_batch(
    replica: tuple[MockReplica, str], http: aiohttp.ClientSession
) -> None:
    rep, url = replica

    async def one(i: int) -> int:
        async with http.post(url + CHAT, json=chat(f"question {i}, " * 8)) as r:
            return r.status

    assert await asyncio.gather(*(one(i) for i in range(12))) == [200] * 12
    model = rep._state.engine.model  # type: ignore[union-attr]
    assert model.prefix_hits > 0 and model.steps < 12 * 6  # batched, not one after another


async def test_a_client_that_leaves_frees_its_place_in_the_engine(
    http: aiohttp.ClientSession,
) -> None:
    rep = MockReplica(MockConfig(engine_model="continuous", output_dist="fixed", output_mean=5000))
    url = await rep.start()
    try:
        task = asyncio.create_task(http.post(url + CHAT, json=chat("hi", max_tokens=5000)))
        while rep.stats["in_flight"] == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while rep.stats["in_flight"]:
            await asyncio.sleep(0.01)
        assert rep._state.engine.model.used_blocks == 0  # type: ignore[union-attr]
    finally:
        await rep.stop()


async def test_a_request_longer_than_the_model_is_refused(
    replica: tuple[MockReplica, str], http: aiohttp.ClientSession
) -> None:
    _, url = replica
    async with http.post(url + CHAT, json=chat("x" * 40_000)) as r:
        assert r.status == 400
        message = (await r.json())["error"]["message"]
    assert "maximum context length is 8192 tokens" in message


runner = CliRunner()


def test_cli_help_explains_the_continuous_model() -> None:
    result = runner.invoke(app, ["mock-replica", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for option in (
        "--engine-model",
        "--model-shape",
        "--device",
        "--compute-efficiency",
        "--bandwidth-efficiency",
        "--step-overhead",
        "--request-overhead",
        "--max-num-batched-tokens",
    ):
        assert option in result.stdout
    assert "continuous batching" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "H900"], "--device: unknown device 'H900'"),
        (["--model-shape", "llama-9"], "--model-shape: unknown model shape 'llama-9'"),
        (["--compute-efficiency", "0"], "--compute-efficiency: must be a fraction of the peak"),
        (["--engine-model", "paged"], "--engine-model: must be one of simple, continuous"),
    ],
)
def test_cli_bad_engine_values_are_clear_errors(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["mock-replica", "--engine-model", "continuous", *args])
    assert result.exit_code == 2
    assert message in result.stderr and "Traceback" not in result.output
