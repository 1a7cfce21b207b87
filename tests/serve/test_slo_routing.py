"""Strategy ``slo`` behind the real router: emulated engines and clients on 127.0.0.1.

What is asserted is what the router learned and shows, never how long anything took."""

from __future__ import annotations

import asyncio
import re
import sys
from typing import Any

import aiohttp
import pytest

from hetero.commands.top_serve import serve_view
from hetero.errors import ConfigError
from hetero.serve.app import LOAD_INTERVAL, SLO_LOAD_INTERVAL, ServeOptions
from hetero.serve.emulator.server import MockReplica
from hetero.serve.engines import LoadSample
from hetero.serve.replicas import Replica
from hetero.serve.router import Router, RouterOptions
from tests.rendering import render
from tests.serve.harness import CHAT, Fleet, Serve, Spec, chat, mock

ENGINE = {
    "engine": "vllm",
    "engine_model": "continuous",
    "model_shape": "llama-3-8b",
    "device": "A100-80GB",
    "output_dist": "lognormal",
    "output_mean": 12,
}


async def stream(fleet: Fleet, content: str, max_tokens: int = 24) -> tuple[int, str]:
    body = chat(content, max_tokens=max_tokens, stream=True)
    body["stream_options"] = {"include_usage": True}
    async with fleet.session.post(fleet.url + CHAT, json=body) as reply:
        return reply.status, await reply.text()


async def test_streamed_replies_teach_each_replica_s_engine_model(serve: Serve) -> None:
    specs = [Spec(mock(**ENGINE), speed=None, slots=None) for _ in range(2)]
    fleet = await serve(*specs, options=RouterOptions(strategy="slo", slo_ttft=2.0, slo_tpot=0.2))
    answers = await asyncio.gather(*(stream(fleet, f"question {k} " * 60) for k in range(16)))
    assert all(status == 200 and "[DONE]" in text for status, text in answers)
    replicas = await fleet.replicas()
    fitted = [r["engine_model"]["replies_fitted"] for r in replicas.values()]
    assert sum(f["ttft"] for f in fitted) == 16
    assert sum(f["tpot"] for f in fitted) >= 1  # one-token replies teach no step time
    for r in replicas.values():
        model: dict[str, Any] = r["engine_model"]
        assert model["slo"] == {"ttft_s": 2.0, "tpot_s": 0.2}
        assert model["predicted_ttft_s"] > 0 and model["predicted_tpot_s"] > 0
        assert model["running"] == 0 and model["kv_tokens_held"] == 0
        assert model["recent_misses"] == 0  # replies within a lax SLO
        assert model["widened"] is False and model["slow_start_full"] is False  # idle now
        assert r["slots"] >= 256  # no slot count of the router's own stands in front
    # hetero top --serve shows the same, one row per replica.
    text = render(serve_view(fleet.router.status(), fleet.url), 220)
    assert "engine model (strategy slo)" in text
    rows = [line for line in text.splitlines() if line.startswith("│ r")]
    assert len(rows) == 4 and all(" / 2.00 " in row for row in rows[2:])


async def test_each_replica_is_timed_with_one_lone_request_before_it_is_sent_any(
    serve: Serve,
) -> None:
    """A replica known by its URL alone is measured as the router starts (one short streamed
    request): a replica five times slower is predicted slower before a user's request."""
    fast = Spec(mock(**ENGINE, speed=1.0), speed=None, slots=None)
    slow = Spec(mock(**ENGINE, speed=0.2), speed=None, slots=None)
    fleet = await serve(fast, slow, options=RouterOptions(strategy="slo", slo_ttft=2.0))
    assert [m.stats["completed"] for m in fleet.mocks] == [1, 1]
    models = [r["engine_model"] for r in (await fleet.replicas()).values()]
    assert all(m["replies_fitted"] == {"ttft": 0, "tpot": 0} for m in models)
    ttft = [m["predicted_ttft_s"] for m in models]
    tpot = [m["predicted_tpot_s"] for m in models]
    assert 3 < ttft[1] / ttft[0] < 8 and 3 < tpot[1] / tpot[0] < 8


async def test_no_probe_is_sent_under_another_strategy(serve: Serve) -> None:
    fleet = await serve(Spec(mock(**ENGINE), speed=None, slots=None))
    assert fleet.mocks[0].stats["requests"] == 0


async def test_the_engines_load_is_read_less_often_under_slo(serve: Serve) -> None:
    """Its own books track each replica; a read of vLLM's /metrics costs the engine's server."""
    by_slo = await serve(Spec(mock(**ENGINE)), options=RouterOptions(strategy="slo"))
    other = await serve(Spec(mock(**ENGINE)))
    told = await serve(
        Spec(mock(**ENGINE)),
        options=RouterOptions(strategy="slo"),
        serve_options=ServeOptions(port=0, load_interval=0.25),
    )
    intervals = [f.server.poller.interval for f in (by_slo, other, told) if f.server.poller]
    assert intervals == [SLO_LOAD_INTERVAL, LOAD_INTERVAL, 0.25]


async def test_failed_attempts_give_back_what_they_held(serve: Serve) -> None:
    broken = Spec(mock(**ENGINE, fail_rate=1.0), speed=None, slots=None)
    good = Spec(mock(**ENGINE), speed=None, slots=None)
    fleet = await serve(broken, good, options=RouterOptions(strategy="slo"))
    answers = await asyncio.gather(*(stream(fleet, f"q {k}") for k in range(8)))
    assert all(status == 200 for status, _ in answers)
    policy = fleet.router.slo_policy
    assert policy is not None
    assert policy.in_flight() == 0
    assert all(load.running == 0 for load in policy.loads)


async def test_the_engine_s_kv_size_reaches_the_model(serve: Serve) -> None:
    fleet = await serve(Spec(mock(**ENGINE)), options=RouterOptions(strategy="slo"))
    state = fleet.router.replicas[0]
    fleet.router.load_read(state, "vllm", LoadSample(running=0, waiting=0, kv_tokens=4096))
    assert (await fleet.replicas())["r0"]["engine_model"]["kv_tokens"] == 4096
    # A hostile page is not believed.
    fleet.router.load_read(state, "vllm", LoadSample(running=0, waiting=0, kv_tokens=10**40))
    assert (await fleet.replicas())["r0"]["engine_model"]["kv_tokens"] == 4096


@pytest.mark.parametrize("field", ["slo_ttft", "slo_tpot"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), 1e9])
def test_an_absurd_slo_is_refused_naming_it(field: str, bad: float) -> None:
    with pytest.raises(ConfigError, match=field):
        RouterOptions(strategy="slo", **{field: bad})  # type: ignore[arg-type]


@pytest.mark.parametrize("flags", [["--slo-ttft", "2"], ["--slo-tpot", "0.1", "--slo-ttft", "1"]])
async def test_an_slo_given_without_a_strategy_routes_by_it(flags: list[str]) -> None:
    replica = MockReplica(mock())
    url = await replica.start()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "hetero", "serve", "--port", "0", "-r", url, *flags),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        found = re.search(r"listening on (http://\S+)", line)
        assert found, line
        async with aiohttp.ClientSession() as client, client.get(found[1] + "/status") as reply:
            status = await reply.json()
        assert status["strategy"] == "slo"
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)
        await replica.stop()


def test_an_slo_given_to_another_strategy_is_refused() -> None:
    replica = Replica("r0", "http://127.0.0.1:1", None, None, {"m"}, True)
    with pytest.raises(ConfigError, match="strategy 'slo'"):
        Router([replica], RouterOptions(strategy="shortest_expected_delay", slo_ttft=1.0))
