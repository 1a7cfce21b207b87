"""Where ``hetero serve``'s CPU goes per request: the router under cProfile, in front of an
instant mock replica (its own process), loaded by a closed loop of clients (another process).

cProfile slows Python code about twofold, so read the shares, not the microseconds; the
unprofiled CPU per request is measured by ``bench_serve.py --only overhead``.

    python bench/profile_serve.py --out bench/results/serve_profile.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hetero.serve.app import ServeOptions, Server
from hetero.serve.records import RouterOptions
from hetero.serve.replicas import Replica
from hetero.serve.router import Router

ROOT = Path(__file__).resolve().parents[1]
LOAD = """
import asyncio, json, sys, time, aiohttp
url, seconds, clients = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 64}],
                   "max_tokens": 64}).encode()
async def main():
    done = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        end = time.monotonic() + seconds
        async def client():
            nonlocal done
            while time.monotonic() < end:
                async with session.post(url + "/v1/chat/completions", data=body,
                                        headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    done += r.status == 200
        await asyncio.gather(*(client() for _ in range(clients)))
    print(done)
asyncio.run(main())
"""

# (label, file name, function): the parts of one request, from the router's point of view.
PARTS = (
    ("whole request in the handler", "app.py", "_completion"),
    ("admission: Router.admit (cost, submit)", "router.py", "admit"),
    ("  Dispatcher.submit (the policy's pick)", "dispatcher.py", "submit"),
    ("forward to the replica", "proxy.py", "forward"),
    ("  Upstream.post: the request out, the answer's head in", "upstream.py", "post"),
    ("  the answer's body", "bounded.py", "read_at_most"),
    ("completion: learn, free the slot", "router.py", "complete"),
    ("  Dispatcher.complete", "dispatcher.py", "complete"),
    ("metrics and access log", "app.py", "_answered"),
    ("JSON decoding (request and reply)", "decoder.py", "raw_decode"),
    ("aiohttp server: reading requests", "web_protocol.py", "data_received"),
    ("event loop, all in all", "base_events.py", "_run_once"),
)


async def profile(
    seconds: float, clients: int, strategy: str | None
) -> tuple[pstats.Stats, int, float]:
    mock = subprocess.Popen(
        [
            *(sys.executable, "-m", "hetero", "mock-replica", "--model", "m", "--slots", "1024"),
            *("--decode-time", "0", "--prefill-time", "0", "--port", "0"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mock.stdout is not None
        found = re.search(r"http://\S+", mock.stdout.readline())
        assert found, "the mock replica did not start"
        replica = Replica("instant", found[0], 1.0, 1024, {"m"}, True)
        options = RouterOptions() if strategy is None else RouterOptions(strategy=strategy)
        server = Server(Router([replica], options), ServeOptions(port=0))
        url = await server.start()
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        load = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            LOAD,
            url,
            str(seconds),
            str(clients),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await load.communicate()
        profiler.disable()
        wall = time.perf_counter() - started
        await server.stop()
    finally:
        mock.terminate()
        mock.wait(10)
    return pstats.Stats(profiler), int(out), wall


def breakdown(stats: pstats.Stats, requests: int) -> list[dict[str, Any]]:
    table: dict[tuple[str, str], tuple[int, float, float]] = {}
    for (file, _, function), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        key = (Path(file).name, function)
        old = table.get(key, (0, 0.0, 0.0))
        table[key] = (old[0] + calls, old[1] + own, old[2] + cumulative)
    whole = table.get(("base_events.py", "_run_once"), (0, 0.0, 0.0))[2]
    rows = []
    for label, file, function in PARTS:
        calls, own, cumulative = table.get((file, function), (0, 0.0, 0.0))
        rows.append(
            {
                "part": label,
                "function": f"{file}:{function}",
                "us_per_request": round(cumulative / requests * 1e6, 1),
                "share_of_loop": round(cumulative / whole, 3) if whole else None,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of the load")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients")
    parser.add_argument("--strategy", help="the router's strategy (its default when not given)")
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    stats, requests, wall = asyncio.run(profile(args.seconds, args.clients, args.strategy))
    doc = {
        "benchmark": "serve_profile",
        "command": "python bench/profile_serve.py " + " ".join(sys.argv[1:]),
        "note": "cProfile inflates Python time about twofold: read the shares",
        "requests": requests,
        "requests_per_second_profiled": round(requests / wall, 1),
        "parts": breakdown(stats, requests),
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
