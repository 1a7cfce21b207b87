"""The request path's HTTP client against replicas that answer byte by byte as written here: a
raw asyncio server on 127.0.0.1 that reads one request at a time and writes the answer it is
given, in the pieces it is given. Framing (length, chunked, to the end), reuse of connections,
and every malformed answer a replica may send."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero.serve.bounded import read_at_most
from hetero.serve.upstream import (
    LINE_LIMIT,
    AnswerCut,
    BadAnswer,
    CannotConnect,
    LineTooLong,
    Upstream,
    UpstreamReply,
)

pytestmark = pytest.mark.timeout(60)

Answer = Callable[[bytes], list[bytes]]  # request bytes -> the pieces written back


@dataclass
class Replica:
    """A server whose next answers are ``answers`` (one per request, in turn); ``close``
    after an answer closes that connection. ``peers`` logs which connection took each."""

    answers: list[tuple[list[bytes], bool]] = field(default_factory=list)
    requests: list[bytes] = field(default_factory=list)
    peers: list[int] = field(default_factory=list)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("peername")[1]
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                self.requests.append(head + await reader.readexactly(length))
                self.peers.append(port)
                pieces, close = self.answers.pop(0)
                for piece in pieces:
                    writer.write(piece)
                    await writer.drain()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


@pytest.fixture
async def replica() -> AsyncIterator[Replica]:
    r = Replica()
    server = await asyncio.start_server(r.handle, "127.0.0.1", 0)
    r.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/base"
    yield r
    server.close()


def ok(body: bytes, *headers: bytes) -> bytes:
    extra = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def chunked(*chunks: bytes) -> list[bytes]:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    return [head, *(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks), b"0\r\n\r\n"]


async def lines(reply: UpstreamReply) -> list[bytes]:
    got = []
    while line := await reply.readline():
        got.append(line)
    return got


async def test_a_post_carries_its_path_host_and_body_and_reads_a_sized_answer(
    replica: Replica,
) -> None:
    replica.answers.append(([ok(b'{"a": 1}', b"Retry-After: 3")], False))
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/v1/chat", b'{"q": 2}')
    assert (reply.status, reply.headers["retry-after"]) == (200, "3")
    assert await read_at_most(reply, 100) == b'{"a": 1}'
    reply.release()
    request = replica.requests[0]
    assert request.startswith(b"POST /base/v1/chat HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"Content-Type: application/json\r\n" in request and request.endswith(b'{"q": 2}')
    await upstream.close()


async def test_a_connection_is_reused_once_its_answer_was_read_to_the_end(
    replica: Replica,
) -> None:
    replica.answers += [([ok(b"1")], False), (chunked(b"2", b"3"), False), ([ok(b"4")], False)]
    upstream = Upstream()
    for want in (b"1", b"23", b"4"):
        reply = await upstream.post(replica.url, "/x", b"{}")
        assert await read_at_most(reply, 100) == want
        reply.release()
    assert len(set(replica.peers)) == 1
    await upstream.close()


async def test_a_connection_is_not_reused_when_the_answer_was_not_read_or_says_close(
    replica: Replica,
) -> None:
    replica.answers += [
        ([ok(b"x" * 50)], False),  # read only in part: over the bound
        ([ok(b"y", b"Connection: close")], False),
        ([ok(b"z")], False),
    ]
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await read_at_most(reply, 10) == b"x" * 11  # the bound and one byte more: over
    reply.release()
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await read_at_most(reply, 10) == b"y"
    reply.release()
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await read_at_most(reply, 10) == b"z"
    reply.release()
    assert len(set(replica.peers)) == 3
    await upstream.close()


async def test_an_idle_connection_past_its_time_is_not_reused(replica: Replica) -> None:
    replica.answers += [([ok(b"1")], False), ([ok(b"2")], False)]
    upstream = Upstream(idle_timeout=0.0)
    for want in (b"1", b"2"):
        reply = await upstream.post(replica.url, "/x", b"{}")
        assert await read_at_most(reply, 10) == want
        reply.release()
    assert len(set(replica.peers)) == 2
    await upstream.close()


async def test_idle_connections_past_their_time_are_closed_whoever_gets_the_next_request(
    replica: Replica,
) -> None:
    """A replica that gets no more requests (removed, drained) does not keep its connections:
    they are swept once past their idle time."""
    replica.answers += [([ok(b"1")], False), ([ok(b"2")], False)]
    upstream = Upstream(idle_timeout=0.0)
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await read_at_most(reply, 10) == b"1"
    reply.release()
    assert not upstream._origins  # its connection closed, the replica forgotten
    reply = await upstream.post(replica.url, "/x", b"{}")  # and met again as new
    assert await read_at_most(reply, 10) == b"2"
    reply.release()
    await upstream.close()


async def test_a_connection_the_replica_closed_while_idle_is_not_reused(
    replica: Replica,
) -> None:
    replica.answers += [([ok(b"1")], True), ([ok(b"2")], False)]
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await read_at_most(reply, 10) == b"1"
    reply.release()
    kept = next(iter(upstream._origins.values())).idle[0]
    for _ in range(5000):  # until the replica's close has reached this side (a state)
        if kept.reader.at_eof():
            break
        await asyncio.sleep(0.001)
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await read_at_most(reply, 10) == b"2"
    reply.release()
    assert len(set(replica.peers)) == 2
    await upstream.close()


async def test_streamed_lines_come_whole_across_chunks_and_interim_answers_are_skipped(
    replica: Replica,
) -> None:
    pieces = chunked(b"data: a", b"bc\n\nda", b"ta: d\n", b"\n", b"tail")
    replica.answers.append(([b"HTTP/1.1 100 Continue\r\n\r\n", *pieces], False))
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await lines(reply) == [b"data: abc\n", b"\n", b"data: d\n", b"\n", b"tail"]
    reply.release()
    await upstream.close()


async def test_has_line_tells_whether_a_whole_line_waits_in_what_came(replica: Replica) -> None:
    """The proxy writes lines that came together in one write to the client: ``has_line``
    says whether the next ``readline`` has one without waiting for the replica."""
    replica.answers.append((chunked(b"data: a\n\ndata: b\n\n", b"data: c\n\n"), False))
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    waiting = []
    while await reply.readline():
        waiting.append(reply.has_line())
    assert waiting == [True, True, True, False, True, False]
    reply.release()
    await upstream.close()


async def test_an_answer_without_a_length_is_read_to_the_connections_end(
    replica: Replica,
) -> None:
    replica.answers.append(([b"HTTP/1.1 200 OK\r\n\r\n", b"one\ntw", b"o"], True))
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    assert await lines(reply) == [b"one\n", b"two"]
    reply.release()
    assert not next(iter(upstream._origins.values())).idle  # closed, not kept
    await upstream.close()


@pytest.mark.parametrize(
    ("pieces", "error", "message"),
    [
        ([b"SSH-2.0-OpenSSH\r\n\r\n"], BadAnswer, "not HTTP/1.1"),
        ([b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"], BadAnswer, "a header that is not one"),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: -4\r\n\r\n"], BadAnswer, "Content-Length"),
        ([b"HTTP/1.1 200 OK\r\nX: " + b"h" * 70_000 + b"\r\n\r\n"], LineTooLong, "65536"),
        ([b"HTTP/1.1 200 OK\r\n"], AnswerCut, "before the answer's end"),
    ],
)
async def test_a_malformed_head_is_the_replicas_fault_named(
    replica: Replica, pieces: list[bytes], error: type[Exception], message: str
) -> None:
    replica.answers.append((pieces, True))
    upstream = Upstream()
    with pytest.raises(error, match=message):
        await upstream.post(replica.url, "/x", b"{}")
    await upstream.close()


@pytest.mark.parametrize(
    ("pieces", "error", "message"),
    [
        ([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"], BadAnswer, "size"),
        (
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabcd\r\n"],
            BadAnswer,
            "does not end where its size says",
        ),
        ([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], AnswerCut, "answer's end"),
        (
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"data: " * 100_000],
            LineTooLong,
            str(LINE_LIMIT),
        ),
    ],
)
async def test_a_malformed_body_is_the_replicas_fault_named(
    replica: Replica, pieces: list[bytes], error: type[Exception], message: str
) -> None:
    replica.answers.append((pieces, True))
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    with pytest.raises(error, match=message):
        await lines(reply)
    reply.release()
    await upstream.close()


async def test_a_line_over_the_limit_is_refused_within_a_chunk_too(replica: Replica) -> None:
    replica.answers.append((chunked(b"x" * (LINE_LIMIT + 10) + b"\n"), True))
    upstream = Upstream()
    reply = await upstream.post(replica.url, "/x", b"{}")
    with pytest.raises(LineTooLong, match=str(LINE_LIMIT)):
        await reply.readline()
    reply.release()
    await upstream.close()


async def test_nothing_listening_cannot_connect_and_the_message_names_no_address() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    upstream = Upstream()
    with pytest.raises(CannotConnect) as caught:
        await upstream.post(f"http://127.0.0.1:{port}", "/x", b"{}")
    assert str(caught.value) == "cannot connect (Connection refused)"
    assert caught.value.errno > 0


def test_a_replica_url_that_is_not_http_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'ftp://h': expected http"):
        asyncio.run(Upstream().post("ftp://h", "/x", b""))


@settings(max_examples=40, deadline=None)
@given(
    text=st.lists(st.sampled_from([b"data: x", b"\n", b"y" * 7, b"\r\n", b"z"]), max_size=30),
    cuts=st.lists(st.integers(1, 12), min_size=1, max_size=8),
    pieces=st.integers(1, 6),
)
def test_any_chunking_and_any_fragmenting_give_back_the_same_lines_and_body(
    text: list[bytes], cuts: list[int], pieces: int
) -> None:
    """However a body is cut into chunks, and those into TCP writes, ``readline`` returns its
    lines and ``read`` its bytes, and the connection is reused after each."""
    body = b"".join(text)
    chunks, at = [], 0
    for i in range(len(body)):
        if i - at >= cuts[i % len(cuts)]:
            chunks.append(body[at:i])
            at = i
    chunks.append(body[at:])
    wire = b"".join(chunked(*(c for c in chunks if c)))
    step = max(1, len(wire) // pieces)
    fragments = [wire[i : i + step] for i in range(0, len(wire), step)]

    async def run() -> None:
        replica = Replica(answers=[(fragments, False), (fragments, False)])
        server = await asyncio.start_server(replica.handle, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        upstream = Upstream()
        reply = await upstream.post(url, "/x", b"{}")
        assert b"".join(await lines(reply)) == body
        assert await lines(reply) == []
        reply.release()
        reply = await upstream.post(url, "/x", b"{}")
        assert await read_at_most(reply, len(body) + 5) == body
        reply.release()
        assert len(set(replica.peers)) == 1
        await upstream.close()
        server.close()

    asyncio.run(run())
