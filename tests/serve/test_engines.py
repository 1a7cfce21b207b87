"""Engine adapters: contract tests on bodies recorded from the engines (``data/``), bad
answers refused with a clear reason, and the router reading real mock engines in the
background: engine detected, capacity learned, faults shown as "load unknown"."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from pathlib import Path

import aiohttp
import pytest

from hetero.serve.emulator.server import MockReplica
from hetero.serve.engines import VLLM, LoadError, OpenAIServer, SGLang, detect
from hetero.serve.engines.prometheus import samples
from hetero.serve.engines.sglang import _server_caps
from hetero.serve.engines.vllm import parse as parse_vllm
from tests.serve.harness import Serve, Spec, chat, mock, wait_for

DATA = Path(__file__).parent / "data"


def body(name: str) -> bytes:
    return (DATA / name).read_bytes()


# --- contracts: recorded bodies -------------------------------------------------------------


def test_vllm_idle_page() -> None:
    load = parse_vllm(body("vllm-0.32.0-metrics.txt"))
    assert (load.running, load.waiting, load.cap) == (0, 0, None)
    assert load.kv_usage == 0.0


def test_vllm_busy_page() -> None:
    load = parse_vllm(body("vllm-0.32.0-metrics-busy.txt"))
    # num_requests_waiting_by_reason shares the name's start and is not counted
    assert (load.running, load.waiting) == (4, 8)
    assert load.kv_usage is not None and 0 < load.kv_usage < 1
    assert load.prefix_hit_rate == 0.0


def test_vllm_kv_capacity_is_read_from_its_cache_config() -> None:
    assert parse_vllm(body("vllm-0.32.0-metrics.txt")).kv_tokens == 1365 * 128
    page = (
        b'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
        b'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        b'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="50"} 1.0\n'
    )
    assert parse_vllm(page).kv_tokens == 150 * 16  # data-parallel engines: summed
    unknown = page.replace(b'num_gpu_blocks="50"', b'num_gpu_blocks="None"')
    assert parse_vllm(unknown).kv_tokens is None


def test_vllm_older_names_are_read() -> None:
    page = (
        b'vllm:num_requests_running{model_name="m"} 3.0\n'
        b'vllm:num_requests_waiting{model_name="m"} 1.0\n'
        b'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        b'vllm:gpu_prefix_cache_queries_total{model_name="m"} 10.0\n'
        b'vllm:gpu_prefix_cache_hits_total{model_name="m"} 4.0\n'
    )
    load = parse_vllm(page)
    assert (load.running, load.waiting, load.kv_usage, load.prefix_hit_rate) == (3, 1, 0.5, 0.4)
    assert (load.prefix_queries, load.prefix_hits) == (10, 4)  # the counters themselves


def test_vllm_data_parallel_engines_are_summed() -> None:
    page = (
        b'vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="1"} 2\n'
        b'vllm:num_requests_waiting{engine="0"} 0\nvllm:num_requests_waiting{engine="1"} 4\n'
    )
    assert (parse_vllm(page).running, parse_vllm(page).waiting) == (5, 4)


def test_sglang_v1_loads() -> None:
    load = SGLang()._loads(body("sglang-0.5.23-loads.json"))
    assert (load.running, load.waiting, load.cap, load.kv_tokens) == (12, 3, 2048, 428735)
    assert load.kv_usage == pytest.approx(0.0977) and load.prefix_hit_rate == pytest.approx(0.4132)


def test_sglang_get_load_of_older_releases() -> None:
    engine = SGLang()
    engine.cap = 64
    load = engine._get_load(body("sglang-0.5.20-get_load.json"))
    assert (load.running, load.waiting, load.cap) == (12, 3, 64)


def test_sglang_server_info_cap_is_the_scheduler_s() -> None:
    import json

    info = json.loads(body("sglang-0.5.23-server_info.json"))
    assert info["max_running_requests"] is None  # the launch argument, not the cap in force
    cap, tokens = _server_caps(info)
    assert cap == info["internal_states"][0]["effective_max_running_requests_per_dp"]
    assert tokens == 428735


# --- bad answers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (b"<html>hello</html>", "not vLLM's page now"),
        (b"vllm:num_requests_running -3\nvllm:num_requests_waiting 0\n", "cannot be negative"),
        (b"vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n", "expected a count"),
        (b"vllm:num_requests_running +Inf\nvllm:num_requests_waiting 0\n", "expected a count"),
        (b"vllm:num_requests_running 1\nvllm:num_requests_waiting x\n", "no numeric value"),
        (b'vllm:num_requests_running{a="1" 1\nvllm:num_requests_waiting 0\n', "closing brace"),
        (
            b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
            b"vllm:kv_cache_usage_perc 7\n",
            "fraction from 0 to 1",
        ),
        (
            b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
            b"vllm:prefix_cache_queries_total 1\nvllm:prefix_cache_hits_total 5\n",
            "is more than",
        ),
        (b"\xff\xfe", "not text"),
    ],
)
def test_a_vllm_page_that_lies_is_refused_with_the_reason(page: bytes, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        parse_vllm(page)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"not json", "/v1/loads is not JSON"),
        (b"[" * 10_000, "/v1/loads is not JSON"),
        (b'{"loads": 3}', "no list of loads"),
        (b'{"loads": [{"num_running_reqs": -1, "num_waiting_reqs": 0}]}', "cannot be negative"),
        (b'{"loads": [{"num_running_reqs": 1}]}', "num_waiting_reqs is None"),
        (
            b'{"loads": [{"num_running_reqs": 1, "num_waiting_reqs": 0, "token_usage": 2}]}',
            "fraction",
        ),
    ],
)
def test_sglang_loads_that_lie_are_refused(text: bytes, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        SGLang()._loads(text)


def test_prometheus_scan_takes_only_whole_names_on_sample_lines() -> None:
    # A family's samples are consecutive lines (the text format's rule).
    page = (
        b"# HELP m_total counts m_total\n# TYPE m_total counter\nm_total_more 9\nm_total 4\n"
        b'm_total{x="a b}"} 5 1700000000\nm_total NaN\nm_totalish 1\nm_total 7'
    )
    found = samples(page, ["m_total", "absent"])
    assert found["m_total"][:2] == [4.0, 5.0] and math.isnan(found["m_total"][2])
    assert len(found["m_total"]) == 3  # the family ended at m_totalish
    assert found["absent"] == []
    assert samples(b"m_total 2\n", ["m_total"]) == {"m_total": [2.0]}  # at the page's start


# --- detection and reads against real servers -------------------------------------------------


async def test_detect_each_engine_the_mock_speaks() -> None:
    mocks = {e: MockReplica(mock(engine=e)) for e in ("sglang", "vllm", "openai")}
    try:
        async with aiohttp.ClientSession() as session:
            for name, replica in mocks.items():
                url = await replica.start()
                engine = await detect(session, url, 2.0)
                assert engine.name == name
                if not isinstance(engine, OpenAIServer):
                    load = await engine.read(session, url, 2.0)
                    assert (load.running, load.waiting) == (0, 0)
                    assert isinstance(engine, VLLM if name == "vllm" else SGLang)
    finally:
        for replica in mocks.values():
            await replica.stop()


async def test_a_replica_given_by_url_alone_learns_its_engine_cap(serve: Serve) -> None:
    fleet = await serve(
        Spec(mock(slots=6, engine="sglang"), speed=None, slots=None),
        Spec(mock(slots=3, engine="openai"), speed=None, slots=None),
    )
    router = fleet.router
    await wait_for(lambda: router.replicas[0].engine == "sglang", "sglang detected")
    await wait_for(lambda: fleet.status_of("r0")["slots"] == 6, "the engine's cap learned")
    r0 = fleet.status_of("r0")
    assert r0["capacity"]["engine_cap"] == 6 and r0["load"]["known"]
    assert r0["speed"] is None and r0["declared_slots"] is None
    await wait_for(lambda: router.replicas[1].engine == "openai", "openai detected")
    r1 = fleet.status_of("r1")
    assert r1["slots"] == 1 and not r1["load"]["known"]  # the starting guess, no load page
    assert "publishes no load" in r1["load"]["why"]
    assert all(s == 200 for s, _ in await asyncio.gather(*(fleet.post(chat()) for _ in range(8))))


async def test_capacity_follows_the_engine_queue(serve: Serve) -> None:
    # vLLM publishes no cap: the router starts at the declared 8 and learns 2 when the engine
    # queues.
    engine = mock(slots=2, engine="vllm", decode_time=0.01, output_mean=60)
    fleet = await serve(Spec(engine, speed=None, slots=8))
    await wait_for(lambda: fleet.router.replicas[0].engine == "vllm", "vllm detected")
    answers = asyncio.gather(*(fleet.post(chat(f"q{i}")) for i in range(8)))
    await wait_for(lambda: fleet.status_of("r0")["slots"] == 2, "capacity learned from the queue")
    assert fleet.status_of("r0")["capacity"]["why"].startswith("engine queued")
    assert [s for s, _ in await answers] == [200] * 8


@pytest.mark.parametrize(
    ("fault", "why"),
    [
        ("garbage", "not vLLM's page"),
        ("nan", "expected a count"),
        ("negative", "cannot be negative"),
        ("huge", "over 2 MB"),
        ("slow", "did not answer within"),
        ("error", "HTTP 500"),
    ],
)
async def test_an_engine_that_lies_gives_a_clear_status_and_loses_no_request(
    serve: Serve, fault: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "hetero.serve")
    fleet = await serve(Spec(mock(engine="vllm", load_fault=fault, load_delay=3.0), slots=None))
    await wait_for(lambda: why in fleet.status_of("r0")["load"].get("why", ""), f"{fault} shown")
    assert fleet.status_of("r0")["load"]["known"] is False
    assert any(why in r.getMessage() for r in caplog.records), "logged"
    assert all("Traceback" not in r.getMessage() for r in caplog.records)
    assert [s for s, _ in await asyncio.gather(*(fleet.post(chat()) for _ in range(4)))] == [
        200
    ] * 4
    async with fleet.session.get(fleet.url + "/metrics") as reply:
        text = await reply.text()
    assert re.search(r'hetero_serve_load_known\{engine="\w+",replica="r0"\} 0.0', text)


async def test_a_replica_that_restarts_on_another_engine_is_read_in_its_new_language(
    serve: Serve,
) -> None:
    fleet = await serve(Spec(mock(engine="vllm"), slots=None))
    await wait_for(lambda: fleet.router.replicas[0].engine == "vllm", "vllm detected")
    old = fleet.mocks[0]
    port = int(fleet.router.replicas[0].replica.url.rsplit(":", 1)[1])
    await old.stop()
    await wait_for(lambda: not fleet.status_of("r0")["load"]["known"], "the dead engine noticed")
    new = MockReplica(mock(engine="sglang", slots=5), port=port)
    fleet.mocks.append(new)
    await new.start()
    await wait_for(lambda: fleet.router.replicas[0].engine == "sglang", "sglang detected", 20)
    await wait_for(lambda: fleet.status_of("r0")["slots"] == 5, "its cap read", 20)
    assert (await fleet.post(chat()))[0] == 200


async def test_a_url_that_is_not_an_http_server_is_a_status_not_a_traceback(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    async def babble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"220 hello, this is not HTTP\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(babble, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        fleet = await serve(Spec(mock(engine="vllm")))
        await fleet.server.poller.stop()  # type: ignore[union-attr]
        # Point a second replica at the babbling port through the admin path's own code.
        from hetero.serve.replicas import Replica

        state = fleet.router.add(
            Replica("bad", f"http://127.0.0.1:{port}", None, None, {"m"}, True)
        )
        assert fleet.server.poller is not None
        fleet.server.poller.watch(state)
        await wait_for(lambda: fleet.status_of("bad")["load"]["why"] != "not read yet", "read")
        assert "/get_server_info" in fleet.status_of("bad")["load"]["why"]
        assert all(r.exc_info is None for r in caplog.records if r.name == "hetero.serve")
    finally:
        server.close()
        await server.wait_closed()
