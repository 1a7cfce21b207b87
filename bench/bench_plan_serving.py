"""Serving plans with a model (``hetero.plan.serving``) in the regimes Mélange reports, and the
planner's time on a large menu.

- **Regimes** (Mélange, Griggs et al. 2024: request size, SLO and rate decide which GPU is most
  cost-efficient): Llama 3 8B (the paper used Llama 2 7B) on its four GPUs (L4, A10G,
  A100-80GB, H100-SXM-80GB) at catalog prices; short chats (prompts and outputs of a few
  hundred tokens, as in Chatbot Arena) or long documents (prompts of thousands, as in PubMed
  summaries); a loose (120 ms) or tight (40 ms) TPOT SLO; a low (1 request/s) or high
  (32 requests/s) rate. For each: the cheapest mix, the cheapest fleet of each GPU alone, and
  the mix's saving over the best single type.
- **Tokens per dollar by request size**: one replica of each GPU at the capacity the engine
  model gives within the SLO, for requests of one size (Mélange's Figure 2 in kind).
- **Planning time**: 8 GPU types × TP 1, 2, 4, 8 × 20 length buckets, the whole plan (the mix
  and every GPU alone), median of ``--repeats``.

Prints JSON; ``--out`` saves it.

    python bench/bench_plan_serving.py --out bench/results/plan_serving.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import emit, revision

from hetero.devices.catalog import get_catalog
from hetero.errors import InfeasiblePlan
from hetero.plan.replica_capacity import replica_capacity
from hetero.plan.serving import plan_serving
from hetero.plan.serving_spec import ServingPlanSpec, parse_serving_plan
from hetero.serve.engine_model import engine_spec

MODEL = "llama-3.1-8b"  # a 128k context: long documents fit
MELANGE_GPUS = ["L4", "A10G", "A100-80GB", "H100-SXM-80GB"]
# $ per GPU-hour in Mélange's Table 1 (on-demand cloud prices of 2024); the catalog's are newer
# and put the H100 at $2.99.
MELANGE_PRICES = {"L4": 0.70, "A10G": 1.01, "A100-80GB": 3.67, "H100-SXM-80GB": 7.516}
PRICES = {"catalog": None, "melange": MELANGE_PRICES}
LARGE_MENU = ["T4", "L4", "A10G", "L40S", "A100-40GB", "A100-80GB", "H100-SXM-80GB", "H200-141GB"]
SIZES = {
    "short": ({"dist": "lognormal", "mean": 250, "sigma": 0.9}, 250),
    "long": ({"dist": "lognormal", "mean": 3000, "sigma": 0.5}, 200),
    "mixed": ({"dist": "lognormal", "mean": 1200, "sigma": 1.4}, 250),
}
TPOT = {"loose": 0.12, "tight": 0.04}
RATES = {"low": 1.0, "high": 32.0}


def spec(
    size: str, tpot: str, rate: str, menu: list[str], prices: dict[str, float] | None
) -> ServingPlanSpec:
    prompt, output = SIZES[size]
    devices: list[dict[str, Any]] = [{"model": m, "tensor_parallel": [1]} for m in menu]
    if prices:
        for d in devices:
            d["price"] = prices[d["model"]]
    return parse_serving_plan(
        {
            "model": MODEL,
            "workload": {
                "rate": RATES[rate],
                "prompt_tokens": prompt,
                "output_tokens": {"dist": "lognormal", "mean": output, "sigma": 0.8},
            },
            # Mélange's SLO is on TPOT; TTFT is kept loose enough not to decide.
            "slo": {"ttft": 1.0 if size == "short" else 5.0, "tpot": TPOT[tpot]},
            "devices": devices,
        }
    )


def regime(size: str, tpot: str, rate: str, prices: str) -> dict[str, Any]:
    case = {"size": size, "tpot": tpot, "rate": rate, "prices": prices}
    try:
        plan = plan_serving(spec(size, tpot, rate, MELANGE_GPUS, PRICES[prices]))
    except InfeasiblePlan as exc:
        return {**case, "infeasible": str(exc)}
    alone = {g: v for g, v in plan.single_type.items() if isinstance(v, float)}
    best = min(alone.values()) if alone else None
    return {
        **case,
        "mix": plan.devices,
        "price_per_hour": plan.price_per_hour,
        "alone": dict(plan.single_type),
        "saving_vs_best_single": 1 - plan.price_per_hour / best if best else None,
        "saving_vs_worst_single": 1 - plan.price_per_hour / max(alone.values()) if alone else None,
    }


def tokens_per_dollar(tpot: float, prices: dict[str, float] | None) -> dict[str, dict[str, float]]:
    """Tokens (prompt and output) per dollar of one replica at its capacity within ``tpot``,
    for requests of equal prompt and output length."""
    out: dict[str, dict[str, float]] = {}
    for gpu in MELANGE_GPUS:
        engine = engine_spec(MODEL, gpu)
        price = prices[gpu] if prices else get_catalog().get(gpu).price_per_hour
        assert price is not None
        row = {}
        for tokens in (50, 100, 250, 500, 1000, 2000):
            cap = replica_capacity(engine, tokens, tokens, ttft=2.0, tpot=tpot)
            row[str(tokens)] = cap.rate * 2 * tokens * 3600 / price if cap.eligible else 0.0
        out[gpu] = row
    return out


def planning_time(repeats: int) -> dict[str, Any]:
    large = parse_serving_plan(
        {
            "model": "llama-3.1-70b",
            "workload": {
                "rate": 50,
                "prompt_tokens": {"dist": "lognormal", "mean": 1000, "sigma": 1.0},
                "output_tokens": {"dist": "lognormal", "mean": 250, "sigma": 0.8},
                "prompt_buckets": 4,
                "output_buckets": 5,
            },
            "slo": {"ttft": 2.0, "tpot": 0.08},
            "devices": [{"model": m} for m in LARGE_MENU],
        }
    )
    plan_serving(large)  # imports scipy, draws the lengths
    seconds = []
    for _ in range(repeats):
        fresh = large.model_copy()  # its bucket draw is cached per spec: plan from scratch
        started = time.perf_counter()
        plan = plan_serving(fresh)
        seconds.append(time.perf_counter() - started)
    return {
        "gpus": len(LARGE_MENU),
        "tensor_parallel": [1, 2, 4, 8],
        "buckets": len(plan.buckets),
        "seconds_median": statistics.median(seconds),
        "seconds": seconds,
        "target_seconds": 2.0,
        "mix": plan.devices,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="save the JSON here")
    args = parser.parse_args()
    started = time.perf_counter()
    regimes = [regime(s, t, r, p) for p in PRICES for s in SIZES for t in TPOT for r in RATES]
    doc = {
        "benchmark": "plan_serving",
        "revision": revision(),
        "command": "python bench/bench_plan_serving.py"
        + (f" --out {args.out}" if args.out else ""),
        "model": MODEL,
        "gpus": MELANGE_GPUS,
        "regimes": regimes,
        "prices": {"melange": MELANGE_PRICES},
        "tokens_per_dollar": {
            f"{p}/{name}": tokens_per_dollar(v, PRICES[p])
            for p in PRICES
            for name, v in TPOT.items()
        },
        "planning_time": planning_time(args.repeats),
        "seconds": time.perf_counter() - started,
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
