"""What the ``slo`` strategy's engine model costs per request, beside its budget, as the fleet
grows: the pick (a TTFT and a TPOT prediction for every replica) and the learning (the first
token's and the end's updates of the fits and the load books).

Each fleet holds replicas of generic priors at speeds spread over 1-6x (the fits past their
slow start: each first taught by 64 replies); requests of lognormal prompts (mean 1,000
tokens) and outputs (mean 200); each request is answered (first token, then its end) once
``2 × replicas`` are in flight, so every replica holds a batch; its first token comes 5 ms
after it was sent and its decode takes the rest of its flight, its pace reported as the router
reports a stream's (at 8, 16, 32... chunks: each a TPOT observation). The clock is a fake one moved
by 10 ms a request. With ``--chat`` each request is a turn of a conversation with its prompt's
blocks (``Prefix``): 32 conversations in progress, each on one of 4 system prompts of 6 blocks,
each turn 2 blocks longer than the last, 6 turns, so that the pick matches every prompt against
the prefix index and weighs a replica holding it (the cache wait, 38cacbd). With ``--derived``
no SLO is given (``hetero serve``'s default): the targets are derived from the fleet, each
replica first timed by one lone request as the router's probe times it. Medians of repeats
of the mean µs per request, in this thread's CPU time
(``time.thread_time``): the cost is CPU, and on a shared machine the wall clock adds the time
other work held the core.

    python bench/bench_slo_cost.py --out bench/results/slo_cost.json

``--tree PATH`` measures another checkout's model in turns with this one's (the same loop, its
``hetero`` first on the path), so that a change is compared with what it replaces in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from _common import emit, revision, short_commit

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.sched import FleetView, ManualClock, PerfModel, WorkItem
from hetero.sched.engine_fit import EnginePrior
from hetero.sched.item import Tokens
from hetero.sched.policies.slo import FIRST_PACE_REPORT, SloRouting
from hetero.sched.prefix import Prefix
from hetero.serve.engine_probe import PROMPT_TOKENS

#: The pick and the learning together, per request, at 64 replicas: what the router's request
#: path can afford of its whole CPU target (250 µs a request, issue #33).
BUDGET_US = 50.0
BUDGET_AT = 64


def fleet(
    n: int, rng: np.random.Generator, derived: bool = False
) -> tuple[SloRouting, FleetView, ManualClock]:
    spec = get_catalog().get("A100-80GB")
    devices = [Device(id=f"r{i}", spec=spec, emulated=True) for i in range(n)]
    clock = ManualClock()
    view = FleetView(devices, PerfModel(devices), clock)
    policy = SloRouting() if derived else SloRouting(ttft=1.0, tpot=0.05)
    for i, speed in enumerate(rng.uniform(1.0, 6.0, n).tolist()):
        policy.set_prior(i, EnginePrior.generic(speed))
    policy.bind(view)
    if derived:  # the router's probe of each replica, which it finds 1.2x slower than guessed
        for i, fit in enumerate(policy.fits[:n]):
            prior = fit.prior
            ttft = 1.2 * (prior.ttft_base + prior.prefill_s * PROMPT_TOKENS)
            tpot = 1.2 * (prior.step_base + prior.step_per_request)
            policy.measured(i, PROMPT_TOKENS, ttft, tpot, 0.0)
    return policy, view, clock


def chat_prefix(k: int) -> Prefix:
    """Request ``k``'s prompt blocks as a turn of one of 32 conversations in progress."""
    conversation, turn = k % 32, (k // 32) % 6
    started = k - 32 * turn  # the request that opened this conversation
    system = tuple(hash(("system", conversation % 4, j)) for j in range(6))
    history = tuple(hash(("conversation", started, j)) for j in range(2 * turn))
    return Prefix(system + history, 1.0)


def measure(
    n: int, requests: int, seed: int, chat: bool = False, derived: bool = False
) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    policy, view, clock = fleet(n, rng, derived)
    prompts = np.maximum(1, rng.lognormal(np.log(800), 0.6, requests + 64 * n)).astype(int)
    outputs = np.maximum(1, rng.lognormal(np.log(120), 1.0, requests + 64 * n)).astype(int)
    items = [
        WorkItem(
            cost=1.0,
            id=k,
            tokens=Tokens(int(p), float(o)),
            prefix=chat_prefix(k) if chat else None,
        )
        for k, (p, o) in enumerate(zip(prompts.tolist(), outputs.tolist(), strict=True))
    ]
    flying: deque[tuple[int, int, float]] = deque()
    picking = learning = 0.0
    timed = 0
    for k, item in enumerate(items):
        clock.advance(0.01)
        started = time.thread_time()
        picked = policy.pick(item, view, None)
        middle = time.thread_time()
        if picked is not None:
            flying.append((k, int(outputs[k]), clock.now()))
        if len(flying) > 2 * n or picked is None:
            # Its first token 5 ms after it was sent, its decode paced over the rest of its
            # flight (a decode faster than engine_fit's BURST_PACE would teach nothing).
            done, output, sent = flying.popleft()
            now = clock.now()
            first = sent + 0.005
            policy.first_token(done, first)
            # The stream's pace as the router reports it: at 8, 16, 32... chunks.
            mark = FIRST_PACE_REPORT
            while mark < output:
                policy.progress(done, first + (now - first) * mark / output, mark)
                mark *= 2
            policy.finished(done, now, output)
        ended = time.thread_time()
        if k >= 64 * n:  # past every replica's slow start
            picking += middle - started
            learning += ended - middle
            timed += 1
    return {"pick_us": picking / timed * 1e6, "learn_us": learning / timed * 1e6}


def measure_in(
    tree: str, n: int, requests: int, seed: int, chat: bool, derived: bool
) -> dict[str, float]:
    """``measure`` with another checkout's ``hetero`` (its ``src/`` first on the path), in a
    process of its own: the same loop, that checkout's model."""
    env = {**os.environ, "PYTHONPATH": str(Path(tree, "src"))}
    argv = [sys.executable, __file__, "--measure", f"{n},{requests},{seed}"]
    argv += ["--chat"] if chat else []
    argv += ["--derived"] if derived else []
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def row(n: int, runs: list[dict[str, float]]) -> dict[str, Any]:
    pick = statistics.median(r["pick_us"] for r in runs)
    learn = statistics.median(r["learn_us"] for r in runs)
    return {
        "replicas": n,
        "pick_us": round(pick, 1),
        "learn_us": round(learn, 1),
        "total_us": round(pick + learn, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", default="3,16,64,256", help="fleet sizes")
    parser.add_argument("--requests", type=int, default=4000, help="timed requests per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        help="another checkout whose model is measured in turns with this one's; repeatable",
    )
    parser.add_argument(
        "--chat", action="store_true", help="multi-turn requests carrying their prompt's blocks"
    )
    parser.add_argument(
        "--derived",
        action="store_true",
        help="no SLO given (hetero serve's default): targets derived from the fleet, each "
        "replica timed by one lone request first",
    )
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # N,REQUESTS,SEED: one run, JSON
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    if args.measure:
        n, requests, seed = (int(x) for x in args.measure.split(","))
        print(json.dumps(measure(n, requests, seed, args.chat, args.derived)))
        return 0
    rows: list[dict[str, Any]] = []
    others: dict[str, list[dict[str, Any]]] = {tree: [] for tree in args.tree}
    for n in (int(x) for x in args.devices.split(",")):
        runs: list[dict[str, float]] = []
        theirs: dict[str, list[dict[str, float]]] = {tree: [] for tree in args.tree}
        for seed in range(args.repeats):  # in turns, so that the machine's drift hits both
            runs.append(measure(n, args.requests, seed, args.chat, args.derived))
            for tree in args.tree:
                theirs[tree].append(
                    measure_in(tree, n, args.requests, seed, args.chat, args.derived)
                )
        rows.append(row(n, runs))
        print(f"{n} replicas: {rows[-1]}", file=sys.stderr)
        for tree, measured in theirs.items():
            others[tree].append(row(n, measured))
            print(f"  {short_commit(Path(tree))}: {others[tree][-1]}", file=sys.stderr)
    at = next((r for r in rows if r["replicas"] == BUDGET_AT), None)
    doc = {
        "benchmark": "slo_cost",
        "revision": revision(),
        "command": "python bench/bench_slo_cost.py " + " ".join(sys.argv[1:]),
        "budget": {"us_per_request": BUDGET_US, "replicas": BUDGET_AT},
        "within_budget": None if at is None else at["total_us"] <= BUDGET_US,
        "rows": rows,
        "trees": [{"commit": short_commit(Path(t)), "rows": r} for t, r in others.items()],
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
