"""Profiles of one real vLLM CPU replica against the rate it really carries within an SLO.

- Engine: ``bench_autoscale_real``'s replica (vLLM's CPU build serving the small test model of
  ``tests/vllm_engine.py``, one OpenMP thread, ``--share`` of a core by a cgroup CPU quota).
- Profiles: ``--profiles`` profiles in turn of the same running replica (``hetero
  profile-engine``'s probes, each with prompts of its own), each fitted twice to the same
  measurements: with every probe, and with the single-request probes alone (the probe plan
  before the closed loops joined it). For each fit, one replica's capacity as the planner
  reads it (``replica_capacity``: requests of ``--prompt`` + ``--output`` tokens within a TTFT
  of 1 s and a TPOT of 0.1 s, as ``bench_autoscale_real`` plans; before the plan's 60 % cap).
- Measured: open-loop Poisson streams of completions (``--prompt`` random token ids,
  ``--output`` tokens each, ignore_eos) at each of ``--rates`` for ``--seconds`` each, one after
  another (each rate's requests all answered before the next starts); per rate the share of
  requests within the SLO, mean TTFT and time between tokens. The highest rate at which it and
  every rate below keep 99 % within the SLO is the capacity measured.
- Reported: each profile's probes as measured, each fit's capacity, the spread of the fits
  (largest over smallest) with the loops and without, and each fit's capacity over the
  measured one.

Bounded: about ten minutes. Skips (exit 0, a message) where vLLM cannot run. Prints JSON;
``--out`` saves it.

    python bench/bench_profile_real.py --out bench/results/profile_real.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from dataclasses import asdict, replace
from typing import Any

import aiohttp
from _cgexec import cleanup
from _common import emit, header
from bench_autoscale_real import ROOT, TPOT, TTFT, one_replica, profile, vllm_version

from hetero.plan.engine_profile import EngineProfile, ProbeClient, Timing, calibrate
from hetero.plan.replica_capacity import replica_capacity
from hetero.serve.engine_model import Calibration

sys.path.insert(0, str(ROOT))
from tests import vllm_engine


def capacity(measured: EngineProfile, calibration: Calibration, prompt: int, output: int) -> float:
    engine = measured.emulator().spec(calibration)
    return replica_capacity(engine, prompt, output, ttft=TTFT, tpot=TPOT).rate


def fits(measured: EngineProfile, prompt: int, output: int) -> dict[str, Any]:
    """The profile's fit, and the fit of its single-request probes alone, each with its
    calibration and capacity."""
    small = replace(measured.plan, load_clients=())
    real = {(p.kind, p.size): p.real for p in measured.probes}
    alone, _ = calibrate(measured.emulator(), {k: real[k] for k in small.schedule()}, small)
    return {
        name: {"calibration": asdict(c), "capacity": capacity(measured, c, prompt, output)}
        for name, c in (("with_loops", measured.calibration), ("without_loops", alone))
    }


async def ladder(
    client: ProbeClient, rate: float, seconds: float, prompt: int, output: int, rng: random.Random
) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` for ``seconds``; every request's TTFT and TPOT."""
    tasks: list[asyncio.Task[Timing]] = []
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        tasks.append(asyncio.create_task(client.complete(prompt, output)))
        await asyncio.sleep(rng.expovariate(rate))
    done = await asyncio.gather(*tasks)
    within = sum(t.first <= TTFT and t.itl <= TPOT for t in done)
    return {
        "rate": rate,
        "requests": len(done),
        "within_slo": within / len(done),
        "ttft_mean": statistics.mean(t.first for t in done),
        "itl_mean": statistics.mean(t.itl for t in done),
        "itl_p90": statistics.quantiles([t.itl for t in done], n=10)[-1],
    }


def spread(values: list[float]) -> float:
    return max(values) / min(values) if min(values) > 0 else float("inf")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    model = vllm_engine.make_model(vllm_engine.models_dir() / "small", size="small")
    profiles: list[dict[str, Any]] = []
    rates: list[dict[str, Any]] = []
    async with one_replica(model, args.share) as url:
        for number in range(args.profiles):
            measured = await profile(url, model)
            probes = {f"{p.kind}:{p.size}": p.real for p in measured.probes}
            profiles.append(
                {
                    "worst_error": measured.worst_error,
                    "probes": probes,
                    **fits(measured, args.prompt, args.output),
                }
            )
            print(f"profile {number + 1}: {profiles[-1]}", file=sys.stderr, flush=True)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            vocab = measured.emulator().shape.vocab
            client = ProbeClient(session, url, measured.model, vocab=vocab, timeout=300)
            rng = random.Random(args.seed)
            for rate in args.rates:
                rates.append(
                    await ladder(client, rate, args.seconds, args.prompt, args.output, rng)
                )
                print(f"rate {rates[-1]}", file=sys.stderr, flush=True)
    cleanup()
    carried = 0.0
    for row in rates:
        if row["within_slo"] < 0.99:
            break
        carried = row["rate"]
    out: dict[str, Any] = {"profiles": profiles, "rates": rates, "capacity_measured": carried}
    for name in ("with_loops", "without_loops"):
        caps = [p[name]["capacity"] for p in profiles]
        out[name] = {
            "capacities": caps,
            "spread": spread(caps),
            "over_measured": [c / carried for c in caps] if carried else None,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--share", type=float, default=0.5, help="of a core for the replica")
    parser.add_argument("--profiles", type=int, default=3, help="profiles of the one replica")
    parser.add_argument(
        "--rates",
        type=lambda text: [float(r) for r in text.split(",")],
        default=[10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0],
        help="requests/s to measure, comma-separated, in rising order",
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="at each rate")
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="save the JSON here")
    args = parser.parse_args()
    if args.profiles < 1 or args.seconds <= 0 or not args.rates:
        parser.error("--profiles must be >= 1, --seconds > 0 and --rates non-empty")
    why = vllm_engine.vllm_available()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    started = time.perf_counter()
    doc = {
        **header("profile_real", args.out),
        "engine": {"vllm": vllm_version(), "model": "small", "share": args.share},
        "workload": {"prompt": args.prompt, "output": args.output, "ttft": TTFT, "tpot": TPOT},
        **asyncio.run(main_async(args)),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    sys.exit(main())
