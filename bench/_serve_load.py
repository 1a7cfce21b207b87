"""The load generator of bench_serve.py, run in processes of its own so its CPU is not the
router's and several can share a load.

    python bench/_serve_load.py SPEC.json OUT.json PART PARTS

SPEC (written by ``run_load``):

- ``mode``: ``open`` (requests sent at ``send_at`` seconds from the start, whatever came back:
  Poisson times fixed in advance) or ``closed`` (``concurrency`` clients, each sending its next
  request when the last one is answered, for ``duration`` seconds);
- ``targets``: base URLs; request i goes to ``targets[i % len(targets)]`` (round robin: with one
  URL, all to it); ``path``; ``bodies`` (one JSON text per request, used in turn);
- ``grace``: seconds to wait after the last send (open) or after ``duration`` (closed) for what
  is still in flight; what is not back by then is cancelled and recorded as unfinished;
- ``usage``: parse each response for ``usage`` (else only the status is checked);
- ``stream`` (optional, default false): the bodies ask for a stream (``"stream": true`` with
  ``stream_options.include_usage``); each reply is read as server-sent events, ``ttft`` records
  the time to its first chunk with content, ``chunks`` how many chunks had content (an engine
  that falls behind sends several tokens in one), and ``usage`` comes from its last chunk.

This process takes every PARTS-th request from PART (open) or ``concurrency / PARTS`` clients
(closed). It prints ``ready`` once its session is up, then reads the start time (``time.time()``,
shared by all parts) from stdin, so every part starts the same schedule at once.

Latency in the open loop counts from the scheduled send time, so a generator that falls behind
shows up as latency, not as a lighter load.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

UNFINISHED = 0  # status of a request cancelled at the end of the grace period
NO_RESPONSE = -1  # status of a request whose connection failed
MAX_ERRORS = 20  # error messages kept per part


class Recorder:
    """Column lists of what happened to each request."""

    def __init__(self) -> None:
        self.index: list[int] = []
        self.target: list[int] = []
        self.status: list[int] = []
        self.start: list[float] = []  # seconds from the start: scheduled (open), sent (closed)
        self.latency: list[float | None] = []
        self.lag: list[float] = []  # sent - scheduled (open)
        self.prompt_tokens: list[int | None] = []
        self.completion_tokens: list[int | None] = []
        self.ttft: list[float | None] = []  # to the first content chunk (streams only)
        self.chunks: list[int] = []  # chunks with content (streams only)
        self.errors: dict[str, int] = {}
        self.samples: list[str] = []

    def add(self, i: int, target: int, start: float) -> int:
        self.index.append(i)
        self.target.append(target)
        self.status.append(UNFINISHED)
        self.start.append(start)
        self.latency.append(None)
        self.lag.append(0.0)
        self.prompt_tokens.append(None)
        self.completion_tokens.append(None)
        self.ttft.append(None)
        self.chunks.append(0)
        return len(self.index) - 1

    def error(self, kind: str, detail: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.samples) < MAX_ERRORS:
            self.samples.append(f"{kind}: {detail[:300]}")

    def columns(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "target": self.target,
            "status": self.status,
            "start": [round(s, 6) for s in self.start],
            "latency": [None if v is None else round(v, 6) for v in self.latency],
            "lag": [round(v, 6) for v in self.lag],
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft": [None if v is None else round(v, 6) for v in self.ttft],
            "chunks": self.chunks,
            "errors": self.errors,
            "error_samples": self.samples,
        }


class Generator:
    def __init__(self, spec: dict[str, Any], part: int, parts: int) -> None:
        self.spec, self.part, self.parts = spec, part, parts
        self.urls = [t.rstrip("/") + spec["path"] for t in spec["targets"]]
        self.bodies = [b.encode() for b in spec["bodies"]]
        self.usage = bool(spec.get("usage", True))
        self.stream = bool(spec.get("stream", False))
        self.rec = Recorder()
        self.headers = {"Content-Type": "application/json"}

    async def one(self, session: aiohttp.ClientSession, i: int, row: int, t0: float) -> None:
        """Request ``i``; its latency counts from ``t0`` (the scheduled or actual send time)."""
        if self.stream:
            await self.one_stream(session, i, row, t0)
            return
        rec = self.rec
        try:
            async with session.post(
                self.urls[i % len(self.urls)],
                data=self.bodies[i % len(self.bodies)],
                headers=self.headers,
            ) as resp:
                payload = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, OSError) as exc:
            rec.status[row] = NO_RESPONSE
            rec.latency[row] = time.monotonic() - t0
            rec.error("connection", f"{type(exc).__name__}: {exc}")
            return
        rec.latency[row] = time.monotonic() - t0
        rec.status[row] = status
        if status != 200:
            rec.error(f"http {status}", payload.decode(errors="replace"))
            return
        if self.usage:
            try:
                usage = json.loads(payload)["usage"]
                rec.prompt_tokens[row] = int(usage["prompt_tokens"])
                rec.completion_tokens[row] = int(usage["completion_tokens"])
            except (ValueError, KeyError, TypeError) as exc:
                rec.status[row] = NO_RESPONSE  # a 200 without a usable body is no answer
                rec.error("bad body", f"{type(exc).__name__}: {payload[:200]!r}")

    async def one_stream(self, session: aiohttp.ClientSession, i: int, row: int, t0: float) -> None:
        """Request ``i`` as a stream: ``ttft`` at its first content chunk, ``usage`` from the
        chunk that carries it, and the latency when the stream ends."""
        rec = self.rec
        usage: dict[str, Any] | None = None
        done = False
        try:
            async with session.post(
                self.urls[i % len(self.urls)],
                data=self.bodies[i % len(self.bodies)],
                headers=self.headers,
            ) as resp:
                status = resp.status
                if status != 200:
                    payload = await resp.read()
                    rec.latency[row] = time.monotonic() - t0
                    rec.status[row] = status
                    rec.error(f"http {status}", payload.decode(errors="replace"))
                    return
                async for raw in resp.content:  # one line of the event stream at a time
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:  # a router's word that the stream broke
                        rec.status[row] = NO_RESPONSE
                        rec.latency[row] = time.monotonic() - t0
                        rec.error("stream error", data.decode(errors="replace"))
                        return
                    if any(
                        (c.get("delta") or {}).get("content") or c.get("text")
                        for c in chunk.get("choices") or ()
                    ):
                        rec.chunks[row] += 1
                        if rec.ttft[row] is None:
                            rec.ttft[row] = time.monotonic() - t0
                    if chunk.get("usage"):
                        usage = chunk["usage"]
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            rec.status[row] = NO_RESPONSE
            rec.latency[row] = time.monotonic() - t0
            rec.error("connection", f"{type(exc).__name__}: {exc}")
            return
        rec.latency[row] = time.monotonic() - t0
        if not done or usage is None:
            # A stream cut short, or one without its usage chunk, is no answer.
            rec.status[row] = NO_RESPONSE
            rec.error("bad stream", "no [DONE]" if not done else "no usage chunk")
            return
        rec.status[row] = status
        try:
            rec.prompt_tokens[row] = int(usage["prompt_tokens"])
            rec.completion_tokens[row] = int(usage["completion_tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            rec.status[row] = NO_RESPONSE
            rec.error("bad usage", f"{type(exc).__name__}: {usage!r}"[:300])

    async def open_loop(self, session: aiohttp.ClientSession, start: float) -> None:
        send_at: list[float] = self.spec["send_at"]
        tasks = []
        for i in range(self.part, len(send_at), self.parts):
            due = start + send_at[i]
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            row = self.rec.add(i, i % len(self.urls), send_at[i])
            self.rec.lag[row] = time.monotonic() - due
            tasks.append(asyncio.create_task(self.one(session, i, row, due)))
        end = start + (send_at[-1] if send_at else 0.0) + self.spec["grace"]
        await self._finish(tasks, end)

    async def closed_loop(self, session: aiohttp.ClientSession, start: float) -> None:
        duration: float = self.spec["duration"]
        stop = start + duration
        counter = itertools.count()

        async def client() -> None:
            while time.monotonic() < stop:
                i = next(counter) * self.parts + self.part
                sent = time.monotonic()
                row = self.rec.add(i, i % len(self.urls), sent - start)
                await self.one(session, i, row, sent)

        n = self.spec["concurrency"] // self.parts + (
            self.part < self.spec["concurrency"] % self.parts
        )
        await self._finish(
            [asyncio.create_task(client()) for _ in range(n)], stop + self.spec["grace"]
        )

    async def _finish(self, tasks: Sequence[asyncio.Task[None]], end: float) -> None:
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, end - time.monotonic()))
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def run(self) -> dict[str, Any]:
        # No connection limit in the open loop: a limit would make requests wait for a
        # connection inside the generator, turning the open loop into a closed one.
        limit = 0 if self.spec["mode"] == "open" else self.spec["concurrency"]
        connector = aiohttp.TCPConnector(limit=limit, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            print("ready", flush=True)
            line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            # The shared wall-clock start, on this process's monotonic clock.
            start = time.monotonic() + (float(line) - time.time())
            await asyncio.sleep(max(0.0, start - time.monotonic()))
            cpu0 = time.process_time()
            if self.spec["mode"] == "open":
                await self.open_loop(session, start)
            else:
                await self.closed_loop(session, start)
            cpu = time.process_time() - cpu0
        return {
            "part": self.part,
            "parts": self.parts,
            "cpu_seconds": round(cpu, 3),
            "wall_seconds": round(time.monotonic() - start, 3),
            **self.rec.columns(),
        }


def main(argv: Sequence[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    spec_path, out_path, part, parts = argv
    spec = json.loads(Path(spec_path).read_text())
    loop = "asyncio"
    with contextlib.suppress(ImportError):  # a cheaper event loop where one is installed
        import uvloop  # type: ignore[import-not-found]

        uvloop.install()
        loop = "uvloop"
    result = asyncio.run(Generator(spec, int(part), int(parts)).run())
    result["event_loop"] = loop
    Path(out_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
