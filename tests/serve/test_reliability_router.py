"""``hetero serve`` under partial failures, bad input and resource exhaustion (issue 21, router).

Real mock replicas and a real router on 127.0.0.1 (in this process, or as ``hetero serve`` in a
child process with a small descriptor limit); counts and orders are asserted, never durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import resource
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from hetero.commands.launch import free_port
from hetero.commands.top_serve import serve_view
from hetero.serve.app import ServeOptions
from hetero.serve.cost import prompt_tokens
from hetero.serve.emulator.server import MockReplica
from hetero.serve.health import gray_replicas
from hetero.serve.ratelimit import RateLimiter
from hetero.serve.replicas import Replica
from hetero.serve.router import RouterOptions
from hetero.serve.router_status import ADMIN_ONLY
from tests.rendering import render
from tests.serve.harness import CHAT, PINNED, Fleet, Serve, Spec, chat, mock, wait_for

#: A replica that takes about 20 ms a request (so a slowdown shows in its learned speed).
PACED = mock(decode_time=0.002, output_mean=10)


async def wave(fleet: Fleet, n: int, **body: object) -> list[int]:
    """Send ``n`` requests at once; their statuses."""
    answers = await asyncio.gather(*(fleet.post(chat(f"request {i}", **body)) for i in range(n)))
    return [status for status, _ in answers]


def sse_events(text: str) -> list[str]:
    return [e.removeprefix("data: ") for e in text.split("\n\n") if e.strip()]


# --- 1. a partial failure never becomes an outage ---------------------------------------------


async def test_the_last_live_replica_is_never_drained_as_gray(serve: Serve) -> None:
    """Kill one of two replicas, then slow the other 8x: the dead one's last speed does not
    count, and the survivor, the last replica of its model, keeps serving."""
    fleet = await serve(
        Spec(PACED),
        Spec(PACED),
        options=RouterOptions(strategy="round_robin", gray_min_done=4, breaker_threshold=2),
    )
    assert await wave(fleet, 16) == [200] * 16
    assert fleet.status_of("r1")["completed"] >= 4
    await fleet.mocks[1].stop()
    while fleet.status_of("r1")["circuit"] != "open":
        assert await wave(fleet, 4) == [200] * 4  # retried on r0
    fleet.mocks[0].configure(slowdown=8.0)
    for _ in range(6):
        assert await wave(fleet, 8) == [200] * 8
    survivor = fleet.status_of("r0")
    assert survivor["state"] == "up" and survivor["completed"] >= 48


def test_gray_failure_compares_live_peers_declared_alike_with_their_true_median() -> None:
    done = [20] * 5
    # Of two, the median is their mean: 4x slower is not gray at 0.35, 8x is.
    assert gray_replicas([1.0, 0.25], ["A", "A"], done[:2], 0.35, 20) == []
    assert [i for i, _ in gray_replicas([1.0, 0.125], ["A", "A"], done[:2], 0.35, 20)] == [1]
    # A T4 is compared with T4s only, never with A100s through their catalog speeds.
    classes = ["A100", "A100", "T4", "T4", "T4"]
    assert gray_replicas([3.0, 3.0, 0.3, 1.0, 1.0], classes, done, 0.35, 20) == [(2, 0.3)]
    assert gray_replicas([3.0, 3.0, 0.3], classes[:3], done[:3], 0.35, 20) == []
    # No class (a replica known by its URL alone): never compared.
    assert gray_replicas([1.0, 1.0, 0.1], [None, None, None], done[:3], 0.35, 20) == []


async def test_gray_replica_returns_to_service_by_itself_once_it_recovers(serve: Serve) -> None:
    fleet = await serve(
        Spec(PACED),
        Spec(PACED),
        Spec(mock(decode_time=0.002, output_mean=10, slowdown=8.0)),
        options=RouterOptions(strategy="round_robin", gray_min_done=4, gray_cooldown=0.2),
    )
    while fleet.status_of("r2")["state"] != "gray":
        assert await wave(fleet, 12) == [200] * 12
        assert fleet.status_of("r0")["completed"] < 200, fleet.router.status()
    fleet.mocks[2].configure(slowdown=1.0)  # it recovers
    await wait_for(lambda: fleet.status_of("r2")["state"] == "up", "r2 back in service")
    before = fleet.mocks[2].stats["completed"]
    for _ in range(8):
        assert await wave(fleet, 12) == [200] * 12
    assert fleet.mocks[2].stats["completed"] >= before + 16  # served, and judged again
    assert fleet.status_of("r2")["state"] == "up"


async def test_under_strategy_slo_a_replica_slow_a_request_is_never_held_gray(
    serve: Serve,
) -> None:
    """Per-request speeds compare replicas only at like loads, which strategy slo does not give
    them (a replica just started takes the backlog); its engine fit judges each replica's
    replies against the batch it runs. Here the router learns r2 as far slower a request than
    its peers, as a replica running a batch eight times theirs is: under round_robin's rule
    (the test above) that is gray; under slo it stays in service."""
    fleet = await serve(
        Spec(PACED),
        Spec(PACED),
        Spec(PACED),
        options=RouterOptions(strategy="slo", slo_ttft=2.0, slo_tpot=0.2, gray_min_done=4),
    )
    router = fleet.router
    slots = router.dispatcher.view.slots
    for i, seconds in ((0, 1.0), (1, 1.0), *[(2, 8.0)] * 8):
        router.perf.observe(i, "default", 1.0, seconds, concurrency=slots[i])
    speeds = router.learned_speeds()
    assert speeds[2] < 0.35 * min(speeds[0], speeds[1])  # gray by the per-request rule
    for state in router.replicas:
        state.judged_from = -100  # as if each had done enough to be judged
    router._check_gray()  # as the router does every 16 replies of a replica
    assert fleet.status_of("r2")["state"] == "up", router.status()


async def test_last_replica_keeps_its_circuit_closed_however_its_requests_fail(
    serve: Serve,
) -> None:
    fleet = await serve(
        Spec(mock(fail_rate=1.0)), options=RouterOptions(strategy=PINNED, breaker_threshold=1)
    )
    for _ in range(3):
        status, answer = await fleet.post(chat())
        assert status == 502, answer  # its own answer, never "no healthy replica"
    last = fleet.status_of("r0")
    assert last["circuit"] == "closed" and last["failed"] == 3 * 3  # each tried 3 times
    assert last["state"] == "failing"  # and says so
    fleet.mocks[0].configure(fail_rate=0.0)
    assert (await fleet.post(chat()))[0] == 200  # back at once: no cooldown to wait out


# --- 2. a circuit stops new requests, never a stream under way ---------------------------------


async def test_opening_a_circuit_never_cuts_a_stream_under_way(serve: Serve) -> None:
    long = mock(decode_time=0.005, output_mean=200)
    fleet = await serve(
        Spec(long, speed=100.0),  # preferred, so the failing requests go there first
        Spec(),
        options=RouterOptions(strategy=PINNED, breaker_threshold=1),
    )
    body = chat("a long one", stream=True, max_tokens=200)
    async with fleet.session.post(fleet.url + CHAT, json=body) as reply:
        assert reply.status == 200
        first = await reply.content.readline()
        fleet.mocks[0].configure(fail_rate=1.0)  # new requests fail there from now on
        assert (await fleet.post(chat()))[0] == 200  # retried on r1
        assert fleet.status_of("r0")["circuit"] == "open"
        rest = (await reply.content.read()).decode()
    events = sse_events(first.decode() + rest)
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == " tok" * 200
    stream_replica = fleet.status_of("r0")
    assert stream_replica["completed"] == 1 and stream_replica["circuit"] == "open"


# --- 3. timeouts count, and a hung replica is found ---------------------------------------------


async def test_hung_replica_is_found_though_its_health_check_answers(serve: Serve) -> None:
    fleet = await serve(
        Spec(mock(decode_time=0.01, slowdown=100_000.0)),  # hung: ~10^4 s a request
        Spec(),
        options=RouterOptions(strategy=PINNED, timeout=0.4, breaker_threshold=2),
        serve_options=ServeOptions(port=0, health_interval=0.05),  # and its probes pass
    )
    hung = fleet.mocks[0]
    statuses = await wave(fleet, 8)
    assert set(statuses) <= {200, 504} and 504 in statuses
    down = fleet.status_of("r0")
    assert down["circuit"] == "open" and down["failed"] >= 2
    sent = hung.stats["requests"]
    assert await wave(fleet, 8) == [200] * 8
    assert hung.stats["requests"] == sent  # nothing new went to it
    await wait_for(lambda: hung.stats["in_flight"] == 0, "the timed-out requests are cut there")


async def test_request_started_on_a_replica_as_its_circuit_opens_moves_elsewhere(
    serve: Serve,
) -> None:
    """The timeout that opens a hung replica's circuit frees a slot there, which starts the
    request queued behind: that one goes elsewhere instead of hanging too."""
    fleet = await serve(
        Spec(mock(decode_time=0.01, slowdown=100_000.0, slots=1), speed=100.0, slots=1),
        Spec(),
        options=RouterOptions(strategy=PINNED, timeout=0.6, breaker_threshold=1),
    )
    first = asyncio.create_task(fleet.post(chat("first")))
    await wait_for(lambda: fleet.mocks[0].stats["in_flight"] == 1, "the first one hangs there")
    await asyncio.sleep(0.2)  # so that the second one has time left when the first times out
    second = asyncio.create_task(fleet.post(chat("second")))
    await wait_for(lambda: fleet.status_of("r0")["queued"] == 1, "the second waits there")
    assert (await first)[0] == 504
    assert (await second)[0] == 200
    assert fleet.mocks[0].stats["requests"] == 1
    assert fleet.status_of("r0")["circuit"] == "open"


# --- 4. bad input is a 400, never a 500 --------------------------------------------------------


async def test_absurd_numbers_and_deep_nesting_answer_400_naming_the_problem(
    serve: Serve,
) -> None:
    fleet = await serve(Spec())
    deep_json = b"[" * 10_000 + b"]" * 10_000
    cases: list[tuple[bytes, dict[str, str], str]] = [
        (json.dumps(chat(max_tokens=10**400)).encode(), {}, "max_tokens must be an integer"),
        (json.dumps(chat(max_completion_tokens=-(10**400))).encode(), {}, "max_completion"),
        (json.dumps(chat(max_tokens=1e400)).encode(), {}, "max_tokens"),  # Infinity
        (deep_json, {}, "nested too deeply"),
        (b'{"model": "m", "x": ' + deep_json + b"}", {}, "nested too deeply"),
        (json.dumps(chat()).encode(), {"x-priority": "9" * 400}, "x-priority"),
    ]
    for body, headers, message in cases:
        async with fleet.session.post(fleet.url + CHAT, data=body, headers=headers) as reply:
            answer = await reply.json()
        assert reply.status == 400, (body[:60], answer)
        assert message in answer["error"]["message"], answer
        assert len(answer["error"]["message"]) < 300  # the bad value is shown, shortened
    assert fleet.mocks[0].stats["requests"] == 0


def test_prompt_of_parts_nested_deeper_than_python_recursion_is_estimated() -> None:
    nested: object = "x" * 40
    for _ in range(5000):
        nested = [nested]
    assert prompt_tokens({"messages": [{"role": "user", "content": nested}]}) == 10


# --- 5. a client that hangs up ends its request upstream ---------------------------------------


async def test_client_that_hangs_up_cancels_its_request_upstream(serve: Serve) -> None:
    slow = mock(decode_time=0.05, output_mean=100, slots=1)  # about 5 s a request
    fleet = await serve(Spec(slow, slots=1))
    replica = fleet.mocks[0]
    async with aiohttp.ClientSession() as leaving:
        request = asyncio.create_task(leaving.post(fleet.url + CHAT, json=chat("abandoned")))
        await wait_for(lambda: replica.stats["in_flight"] == 1, "it runs on the replica")
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
    await wait_for(lambda: replica.stats["cancelled"] == 1, "the replica's work is cut", 3.0)
    await wait_for(lambda: not fleet.router.tickets, "the router ends the request")
    assert fleet.status_of("r0")["failed"] == 0  # not the replica's fault
    assert (await fleet.post(chat(max_tokens=1)))[0] == 200  # the slot is free


# --- 6. connections and descriptors ------------------------------------------------------------


async def _half_open_request(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends part of a request's headers and then nothing."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    await writer.drain()
    return reader, writer


async def test_connection_whose_headers_do_not_arrive_in_time_is_closed(serve: Serve) -> None:
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, header_timeout=0.2))
    reader, writer = await _half_open_request(fleet.url)
    try:
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the router
    finally:
        writer.close()
    assert (await fleet.post(chat()))[0] == 200


async def test_connections_over_the_cap_are_refused_at_once(serve: Serve) -> None:
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, max_connections=4))
    idle = [await _half_open_request(fleet.url) for _ in range(4)]
    timeout = aiohttp.ClientTimeout(total=5)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with contextlib.suppress(aiohttp.ClientConnectionError):  # or reset before reading
                async with session.post(fleet.url + CHAT, json=chat()) as reply:
                    assert reply.status == 503
                    assert "connections" in (await reply.json())["error"]["message"]
    finally:
        for _, writer in idle:
            writer.close()
    for _ in range(100):  # served once the idle ones are gone
        with contextlib.suppress(aiohttp.ClientConnectionError):
            if (await fleet.post(chat()))[0] == 200:
                break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("never served again")


def _open_descriptors() -> set[int]:
    """This process's open file descriptors (not the one that lists them)."""
    fds = set()
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own, closed by now
            os.fstat(int(name))
            fds.add(int(name))
    return fds


@contextlib.contextmanager
def descriptors_left(n: int) -> Iterator[None]:
    """Lower this process's descriptor limit so that only ``n`` more can be opened."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = _open_descriptors()
    free = [fd for fd in range(max(used) + n + 2) if fd not in used]
    resource.setrlimit(resource.RLIMIT_NOFILE, (free[n - 1] + 1 if n else free[0], hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _exhausted(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The router's own warnings that it ran out of descriptors (the load poller's "load
    unknown", logged once per reason, may name the same error)."""
    return [r.getMessage() for r in caplog.records if "ran out of resources" in r.getMessage()]


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="needs /proc")


@needs_proc
async def test_router_out_of_descriptors_answers_503_and_blames_no_replica(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = await serve(Spec(), options=RouterOptions(strategy=PINNED, breaker_threshold=1))
    fresh = MockReplica(mock())  # no pooled connection to it: the router must open one
    url = await fresh.start()
    caplog.set_level(logging.WARNING, "hetero.serve")
    try:
        fleet.router.add(Replica("fresh", url, 100.0, 4, {"m"}, True))
        async with aiohttp.ClientSession() as client:
            with descriptors_left(2):  # this request's connection, and the router's accept
                async with client.post(fleet.url + CHAT, json=chat()) as reply:
                    status, answer = reply.status, await reply.json()
        assert status == 503, answer
        assert "Too many open files" in answer["error"]["message"]
        for name in ("r0", "fresh"):
            assert fleet.status_of(name)["circuit"] == "closed"
            assert fleet.status_of(name)["failed"] == 0
        assert len(_exhausted(caplog)) == 1
        assert (await fleet.post(chat()))[0] == 200
    finally:
        await fresh.stop()


@needs_proc
async def test_health_checks_failing_for_want_of_descriptors_blame_no_replica(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    fleet = await serve(
        Spec(),
        options=RouterOptions(strategy=PINNED, breaker_threshold=1),
        serve_options=ServeOptions(port=0, health_interval=0.01),
    )
    fresh = MockReplica(mock())
    url = await fresh.start()
    caplog.set_level(logging.WARNING, "hetero.serve")
    try:
        with descriptors_left(0):
            fleet.router.add(Replica("fresh", url, 1.0, 4, {"m"}, True))
            await wait_for(lambda: _exhausted(caplog), "a failed health check", 10)
            await asyncio.sleep(0.2)  # its health checks fail, over and over
        listed = fleet.status_of("fresh")
        assert listed["circuit"] == "closed" and listed["failed"] == 0, listed
        assert len(_exhausted(caplog)) == 1, _exhausted(caplog)  # logged once
    finally:
        await fresh.stop()


@contextlib.asynccontextmanager
async def router_process(
    replica_url: str, nofile: int, *flags: str
) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``hetero serve`` in a child process whose descriptor limit is ``nofile``; its URL."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hetero",
        "serve",
        "--port",
        "0",
        "--health-interval",
        "3600",
        "-r",
        f"{replica_url}=speed:1",
        *flags,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        preexec_fn=limit,
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        match = re.search(r"listening on (http://\S+)", line)
        assert match, line
        yield match[1], proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


async def test_idle_connections_cannot_exhaust_the_routers_descriptors() -> None:
    """Far more idle connections than the router has descriptors: the ones over its cap are
    refused at once, the rest are closed when their headers do not come, and real requests
    are then served; the replica is never blamed and the log stays short."""
    replica = MockReplica(mock())
    url = await replica.start()
    idle: list[asyncio.StreamWriter] = []
    try:
        async with router_process(url, 128, "--header-timeout", "0.5") as (front, proc):
            for _ in range(200):
                idle.append((await _half_open_request(front))[1])
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
                served = 0
                for _ in range(400):  # refused while the idle ones hold the cap
                    with contextlib.suppress(aiohttp.ClientConnectionError):
                        async with s.post(front + CHAT, json=chat()) as reply:
                            assert reply.status in (200, 503), await reply.text()
                            served += reply.status == 200
                    if served == 5:
                        break
                    await asyncio.sleep(0.02)
                assert served == 5
                async with s.get(front + "/status") as reply:
                    (status,) = (await reply.json())["replicas"]
            assert status["circuit"] == "closed" and status["failed"] == 0
            proc.terminate()
            assert proc.stderr is not None
            err = (await asyncio.wait_for(proc.stderr.read(), 30)).decode()
        assert "out of system resource" not in err and "Too many open files" not in err, err
        assert err.count("Traceback") == 0 and len(err) < 5000, err[:2000]
    finally:
        for writer in idle:
            writer.close()
        await replica.stop()


@needs_proc
async def test_a_repeated_error_is_logged_once_per_interval(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    """With no descriptor left, accept() fails over and over (asyncio logs each failure
    with its traceback, a hundred a loop turn): the router writes it once."""
    fleet = await serve(Spec())
    caplog.set_level(logging.ERROR, "asyncio")
    async with aiohttp.ClientSession() as client:
        with descriptors_left(1):  # this request's own connection: none for the router
            request = asyncio.create_task(client.post(fleet.url + CHAT, json=chat()))
            await wait_for(lambda: len(caplog.records) > 0, "accept() fails")
            await asyncio.sleep(0.2)
        async with await request as reply:  # accepted once there is room again
            assert reply.status == 200
    floods = [r for r in caplog.records if "out of system resource" in r.getMessage()]
    assert len(floods) == 1, len(floods)


# --- 7. the rate limit -------------------------------------------------------------------------


async def test_rate_limit_cannot_be_bypassed_by_inventing_keys(serve: Serve) -> None:
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, rate_limit=0.01))
    statuses = []
    for i in range(5):
        status, answer = await fleet.post(chat(), headers={"Authorization": f"Bearer key{i}"})
        statuses.append(status)
    assert statuses == [200, 429, 429, 429, 429]
    assert "client address" in answer["error"]["message"]
    assert (await fleet.post(chat()))[0] == 429  # no key: the same address's bucket
    # Another address has a bucket of its own.
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with (
        aiohttp.ClientSession(connector=other) as session,
        session.post(fleet.url + CHAT, json=chat(), headers={"x-api-key": "new"}) as reply,
    ):
        assert reply.status == 200
    assert fleet.mocks[0].stats["requests"] == 2


async def test_keys_invented_at_the_address_pace_add_nothing_to_its_rate(serve: Serve) -> None:
    """25 keys invented over 5 s at a limit of 5 requests/s (one each 0.2 s: the address's own
    pace), then each used again: only the address's burst is left, never a bucket per key."""
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, rate_limit=5.0))
    now = 0.0
    fleet.server.limiter = RateLimiter(5.0, clock=lambda: now)  # time is the test's

    async def served(key: str, session: aiohttp.ClientSession = fleet.session) -> bool:
        headers = {"x-api-key": key} if key else {}
        async with session.post(fleet.url + CHAT, json=chat(), headers=headers) as reply:
            return reply.status == 200

    invented = []
    for i in range(25):
        now += 0.2
        invented.append(await served(f"key{i}"))
    assert all(invented)
    reused = [await served(f"key{i}") for i in range(25)]
    assert sum(reused) == 4  # 5 s at 5/s in bursts of 5: 29 in all, not 125
    assert not await served("")  # no key: the same address's bucket
    # A key is charged to the address it was first seen from; another address's new key to
    # that one's own bucket.
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=other) as session:
        assert not await served("key0", session)
        assert await served("new", session)


def test_rate_limit_state_is_bounded() -> None:
    limiter = RateLimiter(rate=1.0, max_entries=100)
    for i in range(10_000):
        limiter.take(f"key{i}" * 100, f"10.0.{i // 256}.{i % 256}")  # long keys, many clients
    assert len(limiter) <= 200
    # The most recent key is still held (it has no token left), the first long forgotten.
    assert limiter.take("key9999" * 100, "10.0.39.15") > 0


# --- 8. the admin key and what it guards --------------------------------------------------------


async def raw_get(url: str, path: str, key: bytes) -> tuple[int, bytes]:
    """GET ``path`` with ``Authorization: Bearer`` and ``key``'s bytes as they are (a client
    library would refuse some); the status and body."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n"
        % (path.encode(), key)
    )
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_an_admin_key_that_is_not_utf8_is_refused_like_a_wrong_one(serve: Serve) -> None:
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, admin_key="clé"))
    status, body = await raw_get(fleet.admin_url, "/admin/replicas", b"\xff\xfe")
    assert status == 401 and b"wrong admin API key" in body, body
    assert (await raw_get(fleet.admin_url, "/admin/replicas", "clé".encode()))[0] == 200
    status, body = await raw_get(fleet.url, "/status", b"\xff")
    assert status == 200 and b'"url"' not in body  # what is public


async def test_without_the_admin_key_no_replica_address_is_shown(serve: Serve) -> None:
    """Where the replicas are, and what went wrong there, is the admin key's: ``/status``
    without it leaves both out, and no answer to a client names a replica's host and port."""
    key = {"Authorization": "Bearer k"}
    fleet = await serve(Spec(), serve_options=ServeOptions(port=0, admin_key="k"))
    admin = fleet.admin_url + "/admin/replicas"
    ports = [free_port(), free_port()]  # nothing listens there
    async with fleet.session.post(
        admin, json={"url": f"http://127.0.0.1:{ports[0]}", "name": "dead"}, headers=key
    ) as reply:
        assert reply.status == 201  # its model list could not be read
    status, answer = await fleet.post(chat(model="x"))
    assert status == 503 and "model list of dead was never read" in answer["error"]["message"]
    bodies = [json.dumps(answer)]
    body = {"url": f"http://127.0.0.1:{ports[1]}", "name": "gone", "models": ["only"]}
    async with fleet.session.post(admin, json=body, headers=key) as reply:
        assert reply.status == 201
    status, answer = await fleet.post(chat(model="only"))
    assert status == 502 and "gone: cannot connect (Connection refused)" in str(answer)
    bodies.append(json.dumps(answer))
    async with fleet.session.get(fleet.url + "/status") as reply:
        public = await reply.json()
    bodies.append(json.dumps(public))
    for text in bodies:
        assert not any(str(port) in text for port in ports), text
    assert not any(set(r) & set(ADMIN_ONLY) for r in public["replicas"])
    render(serve_view(public, fleet.url), 200)  # all that hetero top --serve needs
    async with fleet.session.get(fleet.url + "/status", headers=key) as reply:
        full = {r["name"]: r for r in (await reply.json())["replicas"]}
    assert full["gone"]["url"].endswith(str(ports[1])) and full["gone"]["last_error"]
    # Without an admin key, the front shows every field as before.
    plain = await serve(Spec())
    assert "url" in (await plain.replicas())["r0"]
