"""hetero serve in 20 seconds: three emulated replicas of speeds 1, 2.5 and 6, given to the router
by their URLs alone (it learns their speed and capacity), the same burst of chat requests sent
through the router and round robin straight to the replicas, side by side.

The same set-up from a shell, with real processes::

    hetero mock-replica --model demo-llm --speed 1 --slots 4 --port 9001 &
    hetero mock-replica --model demo-llm --speed 2.5 --slots 10 --port 9002 &
    hetero mock-replica --model demo-llm --speed 6 --slots 20 --port 9003 &
    hetero serve --port 8080 -r http://127.0.0.1:9001 -r http://127.0.0.1:9002 \\
        -r http://127.0.0.1:9003
    hetero top --serve http://127.0.0.1:8080

Run: ``python examples/serve_demo.py`` (``--requests N`` for a longer run).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import time

import aiohttp
from rich.console import Console
from rich.table import Table

from hetero.commands.top_serve import serve_view
from hetero.serve.app import ServeOptions, Server
from hetero.serve.replicas import Replica
from hetero.serve.router import Router, RouterOptions
from hetero.testing import MockConfig, MockReplica

FLEET = [("t4", 1.0, 4), ("l40s", 2.5, 10), ("h100", 6.0, 20)]  # name, speed, slots
MODEL = "demo-llm"
DECODE_TIME = 0.004  # seconds per output token at speed 1
PREFILL_TIME = 0.0005  # seconds per prompt token at speed 1 (the mock's default)


async def send_all(urls: list[str], rate: float, count: int, seed: int) -> list[float]:
    """Poisson arrivals at ``rate``/s; each request to the next URL of ``urls`` (one URL: the
    router). Returns the latencies."""
    rng = random.Random(seed)
    targets = itertools.cycle(urls)
    latencies: list[float] = []
    async with aiohttp.ClientSession() as session:

        async def one(url: str, words: int) -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "tell me about GPUs " * words}],
                "max_tokens": 200,
            }
            start = time.monotonic()
            async with session.post(url + "/v1/chat/completions", json=body) as reply:
                await reply.read()
                assert reply.status == 200, reply.status
            latencies.append(time.monotonic() - start)

        tasks = []
        for _ in range(count):
            await asyncio.sleep(rng.expovariate(rate))
            tasks.append(asyncio.create_task(one(next(targets), rng.randint(5, 200))))
        await asyncio.gather(*tasks)
    return latencies


async def main(count: int) -> None:
    console = Console()
    mocks = [
        MockReplica(
            MockConfig(models=(MODEL,), speed=speed, slots=slots, decode_time=DECODE_TIME, seed=i)
        )
        for i, (_, speed, slots) in enumerate(FLEET)
    ]
    urls = [await m.start() for m in mocks]
    # URLs alone: speeds are learned from the replies, capacity from each mock's published cap.
    replicas = [
        Replica(name, url, None, None, {MODEL}, True)
        for (name, _, _), url in zip(FLEET, urls, strict=True)
    ]
    # The mock's own scale and prompt cost, so that learned speeds read like declared ones.
    server = Server(
        Router(
            replicas,
            RouterOptions(unit_rate=1 / DECODE_TIME, prefill_weight=PREFILL_TIME / DECODE_TIME),
        ),
        ServeOptions(port=0),
    )
    router_url = await server.start()
    # 85% of what the fleet can do: slots x speed / seconds per request at speed 1.
    per_request = DECODE_TIME * 100  # the mock's mean output is about 100 tokens after the cap
    rate = 0.85 * sum(speed * slots for _, speed, slots in FLEET) / per_request
    console.print(f"router on {router_url}; {count} requests at {rate:.0f}/s, twice")
    try:
        routed = await send_all([router_url], rate, count, seed=1)
        direct = await send_all(urls, rate, count, seed=1)
        console.print(serve_view(server.router.status(), router_url))
    finally:
        await server.stop()
        for mock in mocks:
            await mock.stop()
    table = Table(title="latency, seconds (same requests, same arrival times)")
    for column in ("routing", "mean", "p50", "p99"):
        table.add_column(column, justify="left" if column == "routing" else "right")
    for name, values in (("hetero serve", routed), ("round robin, no router", direct)):
        cuts = statistics.quantiles(values, n=100)
        table.add_row(name, f"{statistics.fmean(values):.2f}", f"{cuts[49]:.2f}", f"{cuts[98]:.2f}")
    console.print(table)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=240, help="requests per run")
    asyncio.run(main(parser.parse_args().requests))
