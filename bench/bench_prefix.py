"""Decision cost of ``prefix_affinity``: hashing a prompt into blocks, and a pick that matches
it against every replica's index, scores, and records the placement.

Each fleet size gets a view with random load (as ``bench_decisions.py`` builds it) and an index
warmed with earlier requests; requests are multi-turn chats: one of ``--systems`` system
prompts of about 2k tokens, then turns that bring the prompt to about ``--tokens`` tokens.
The view's load does not change with the placements, so requests gather on the replica it
favours, whose index runs at its capacity: each request's new blocks evict as many old ones,
the costliest case for recording a placement. Times are medians over repeats of the mean per
request. Prints JSON; ``--out`` saves it.

    python bench/bench_prefix.py --out bench/results/prefix.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from _common import emit
from bench_decisions import make_view

from hetero.sched import WorkItem, make_policy
from hetero.sched.prefix import BLOCK_CHARS, Prefix, prefix_blocks

CHARS_PER_TOKEN = 4
WORDS = [
    "fleet",
    "speed",
    "memory",
    "replica",
    "prefill",
    "decode",
    "cache",
    "block",
    "token",
    "queue",
]


def text(rng: np.random.Generator, chars: int) -> str:
    words = rng.choice(WORDS, size=chars // 6 + 1)
    return " ".join(words.tolist())[:chars]


def prompts(rng: np.random.Generator, count: int, heads: list[str], tokens: int) -> list[str]:
    out = []
    for _ in range(count):
        head = heads[int(rng.integers(len(heads)))]
        out.append(head + text(rng, tokens * CHARS_PER_TOKEN - len(head)))
    return out


def measure(n: int, tokens: int, systems: int, requests: int, repeats: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    view = make_view(n, rng)
    policy = make_policy("prefix_affinity")
    policy.bind(view)
    block_work = BLOCK_CHARS / CHARS_PER_TOKEN * 0.5
    heads = [text(rng, 2048 * CHARS_PER_TOKEN) for _ in range(systems)]  # the system prompts
    warm = prompts(rng, 4 * n, heads, tokens)
    for p in warm:
        policy.pick(
            WorkItem(cost=float(tokens), prefix=Prefix(prefix_blocks(p), block_work)), view, None
        )
    texts = prompts(rng, requests, heads, tokens)
    hash_runs, pick_runs = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        blocks = [prefix_blocks(t) for t in texts]
        hash_runs.append((time.perf_counter() - started) / requests * 1e6)
        items = [WorkItem(cost=float(tokens), prefix=Prefix(b, block_work)) for b in blocks]
        pick = policy.pick
        started = time.perf_counter()
        for item in items:
            pick(item, view, None)
        pick_runs.append((time.perf_counter() - started) / requests * 1e6)
    hashing, picking = statistics.median(hash_runs), statistics.median(pick_runs)
    return {
        "devices": n,
        "prompt_tokens": tokens,
        "blocks_per_prompt": len(blocks[0]),
        "us_hash": round(hashing, 2),
        "us_pick": round(picking, 2),
        "us_per_request": round(hashing + picking, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devices", default="8,64,256")
    parser.add_argument("--tokens", type=int, default=8192, help="prompt length in tokens")
    parser.add_argument("--systems", type=int, default=20, help="distinct system prompts")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a small run, for a smoke test")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.devices, args.requests, args.repeats = "8", 50, 1
    rows = []
    for n in (int(x) for x in args.devices.split(",")):
        rows.append(measure(n, args.tokens, args.systems, args.requests, args.repeats, args.seed))
        print(json.dumps(rows[-1]), file=sys.stderr)
    return emit({"benchmark": "prefix affinity decision cost", "results": rows}, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
