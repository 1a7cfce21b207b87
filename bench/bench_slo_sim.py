"""Routing by the SLO near saturation, simulated: ``--strategy slo`` against
``shortest_expected_delay`` (the default before it) and the fast replica alone, on one model at
three speeds, in virtual time.

- Fleet: Llama 3 8B on an H100-SXM and on two A10G (about 5 : 1 : 1 in memory bandwidth), each
  replica an ``EngineModel`` (continuous batching, chunked prefill, paged KV) in
  ``hetero.sim.engine_fleet``, known to the router by its URL alone (the generic prior, as
  ``hetero serve`` with bare URLs), its capacity learned as the router learns it.
- Traffic: Poisson arrivals for ``--seconds`` at each of ``--rates``; prompts lognormal (median
  1,000 tokens, sigma 0.5, 50 to 3,000: long prompts, so prefill takes a large share of the
  fast engine's time near saturation), outputs lognormal (median 60 tokens, sigma 1, 2 to 512).
  The same arrivals for every configuration.
- SLO: TTFT ≤ 1 s and TPOT ≤ 50 ms.
- Configurations: ``slo`` (the router's ``SloRouting``: each request where its predicted TTFT and
  TPOT meet the SLO); ``shortest_expected_delay`` (the default before ``slo``); **the fast
  replica alone** (no router: every request straight to its engine, which batches as it will).
- Reported per rate: SLO attainment, TTFT and TPOT percentiles, each replica's share; under
  ``slo`` each replica's fitted engine at the end (coefficients, prediction error p50/p90 and
  the median of measured over predicted); per configuration the highest rate with ≥ 98% within
  the SLO; the simulator's wall time.

Prints JSON; ``--out`` saves it.

    python bench/bench_slo_sim.py --out bench/results/slo_sim.json
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from _anchor_policies import NO_ROUTER
from _common import command, emit, revision

from hetero.serve.engine_model import EngineSpec, engine_spec
from hetero.serve.records import RouterOptions
from hetero.sim.engine_fleet import EngineFleetSimulator, FleetResult

MODEL = "llama-3-8b"
FAST, SLOW = "H100-SXM", "A10G"
TTFT, TPOT = 1.0, 0.05
ATTAINED = 0.98
CONFIGS = ("slo", "shortest_expected_delay", "alone")


def arrivals(rate: float, seconds: float, seed: int) -> list[tuple[float, int, int]]:
    rng = np.random.default_rng(seed)
    out: list[tuple[float, int, int]] = []
    t = 0.0
    while (t := t + rng.exponential(1 / rate)) <= seconds:
        prompt = int(np.clip(rng.lognormal(np.log(1000), 0.5), 50, 3000))
        output = int(np.clip(rng.lognormal(np.log(60), 1.0), 2, 512))
        out.append((t, prompt, output))
    return out


def simulate(
    config: str, fleet: list[tuple[str, EngineSpec]], arrived: list[tuple[float, int, int]]
) -> tuple[FleetResult, EngineFleetSimulator]:
    if config == "alone":
        sim = EngineFleetSimulator(fleet[:1], options=NO_ROUTER, capacity="engine")
    elif config == "slo":
        options = RouterOptions(strategy="slo", slo_ttft=TTFT, slo_tpot=TPOT)
        sim = EngineFleetSimulator(fleet, options=options)
    else:
        sim = EngineFleetSimulator(fleet, options=RouterOptions(strategy=config))
    return sim.run(arrived, slo=(TTFT, TPOT)), sim


def summary(result: FleetResult, names: list[str]) -> dict[str, Any]:
    placed = result.replica[result.replica >= 0]
    shares = np.bincount(placed, minlength=len(names)) / max(1, len(placed))

    def pct(values: np.ndarray) -> dict[str, float | None]:
        values = values[np.isfinite(values)]
        if not len(values):
            return {"p50": None, "p99": None}
        return {k: round(float(np.percentile(values, q)), 4) for k, q in (("p50", 50), ("p99", 99))}

    return {
        "requests": result.requests,
        "failed": int((result.status != 1).sum()),
        "slo_attainment": round(result.attainment(TTFT, TPOT), 4),
        "ttft_s": pct(result.ttft),
        "tpot_s": pct(result.tpot),
        "shares": {n: round(float(s), 4) for n, s in zip(names, shares, strict=False)},
        "wall_seconds": round(result.wall_seconds, 2),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="8,12,16,20,24", help="requests/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=120.0, help="of arrivals per run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    fleet = [("fast", engine_spec(MODEL, FAST))] + [
        (f"slow{k}", engine_spec(MODEL, SLOW)) for k in (1, 2)
    ]
    names = [n for n, _ in fleet]
    started = time.perf_counter()
    rows = []
    for rate in rates:
        arrived = arrivals(rate, args.seconds, args.seed)
        row: dict[str, Any] = {"rate_rps": rate, "requests": len(arrived), "configs": {}}
        for config in CONFIGS:
            result, sim = simulate(config, fleet, arrived)
            figures = summary(result, names[:1] if config == "alone" else names)
            if sim.slo is not None:
                figures["fits"] = {n: sim.slo.fits[i].explain() for i, n in enumerate(names)}
            row["configs"][config] = figures
            print(f"{rate:g}/s {config}: {figures['slo_attainment']:.1%}", file=sys.stderr)
        rows.append(row)
    best = {
        config: max(
            (r["rate_rps"] for r in rows if r["configs"][config]["slo_attainment"] >= ATTAINED),
            default=None,
        )
        for config in CONFIGS
    }
    doc = {
        "benchmark": "slo_sim",
        "command": command("bench/bench_slo_sim.py", argv),
        "revision": revision(),
        "fleet": {"model": MODEL, "replicas": {"fast": FAST, "slow1": SLOW, "slow2": SLOW}},
        "priors": "generic (replicas known by URL alone)",
        "workload": {
            "arrivals": "poisson",
            "seconds": args.seconds,
            "seed": args.seed,
            "prompt_tokens": "lognormal, median 1000, sigma 0.5, 50 to 3000",
            "output_tokens": "lognormal, median 60, sigma 1, 2 to 512",
        },
        "slo": {"ttft_s": TTFT, "tpot_s": TPOT, "attained": ATTAINED},
        "rates": rows,
        "highest_rate_attained": best,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
