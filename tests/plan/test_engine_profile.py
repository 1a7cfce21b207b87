"""``hetero profile-engine`` and ``hetero.plan.engine_profile``: the engine-faithful mock replica
(a real process on 127.0.0.1 running the engine model with a known calibration) profiled, the
profile saved and read back, bad profile files and bad command lines."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.commands.launch import free_port
from hetero.errors import ConfigError
from hetero.plan.engine_profile import (
    Emulator,
    EngineProfile,
    ProbePlan,
    ProbeResult,
    Timing,
    calibrate,
)
from hetero.serve.engine_model import Calibration

runner = CliRunner()

# A 3B Llama on an L4: steps of 40-50 ms while decoding and up to ~0.2 s for a 1536-token
# prefill, long enough for a real-time mock to be measured on a busy machine, short enough that
# the probes take some ten seconds.
SHAPE, DEVICE = "llama-3.2-3b", "L4"
TRUTH = Calibration(
    compute_efficiency=0.4, bandwidth_efficiency=0.6, step_overhead=0.005, request_overhead=0.001
)
LIMITS = {"max_num_batched_tokens": 2048, "max_num_seqs": 16}
KV_TOKENS = 65536


@pytest.fixture(scope="module")
def mock_url() -> Iterator[str]:
    """A mock replica speaking vLLM's endpoints, running the engine model with ``TRUTH``."""
    command = [sys.executable, "-m", "hetero", "mock-replica", "--engine", "vllm"]
    command += ["--engine-model", "continuous", "--model-shape", SHAPE, "--device", DEVICE]
    command += ["--port", "0", "--model", "m3", "--slots", str(LIMITS["max_num_seqs"])]
    command += ["--max-num-batched-tokens", str(LIMITS["max_num_batched_tokens"])]
    command += ["--kv-tokens", str(KV_TOKENS)]
    for name, value in (
        ("--compute-efficiency", TRUTH.compute_efficiency),
        ("--bandwidth-efficiency", TRUTH.bandwidth_efficiency),
        ("--step-overhead", TRUTH.step_overhead),
        ("--request-overhead", TRUTH.request_overhead),
    ):
        command += [name, str(value)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None and proc.stderr is not None
            line = proc.stdout.readline()  # blocks until it listens (or exits)
            match = re.search(r"listening on (http://127\.0\.0\.1:\d+) ", line)
            assert match, f"mock-replica did not start: {line!r} {proc.stderr.read()}"
            yield match[1]
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.mark.slow
def test_profiling_the_mock_recovers_its_engine(mock_url: str, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    args = [mock_url, "--model-shape", SHAPE, "--device", DEVICE.lower(), "--repeats", "1"]
    args += ["--max-batched-tokens", str(LIMITS["max_num_batched_tokens"])]
    args += ["--max-num-seqs", str(LIMITS["max_num_seqs"]), "--out", str(out)]
    # A process of its own, as a user runs it, so that the load loop's clients do not share the
    # interpreter the whole suite ran in (late in a suite run, in it, they once read the loop's
    # first tokens 15% off the mock's own).
    command = [sys.executable, "-m", "hetero", "profile-engine", *args]
    result = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"}, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "first token, 1,536-token prompt" in result.stdout
    assert "between tokens, 8 decoding" in result.stdout
    assert "between tokens, 16 clients looping 256+32-token requests" in result.stdout
    assert "calibration: compute efficiency" in result.stdout and f"saved to {out}" in result.stdout

    profile = EngineProfile.load(out)
    assert (profile.model, profile.engine, profile.device) == ("m3", "vllm", DEVICE)
    assert profile.kv_tokens == KV_TOKENS  # read from the mock's /metrics
    assert (profile.max_num_batched_tokens, profile.max_num_seqs) == tuple(LIMITS.values())
    # The loops of 32 and 64 clients are one of 16, all the mock runs at once.
    assert profile.plan == ProbePlan(load_clients=(16,))
    assert [(p.kind, p.size) for p in profile.probes] == profile.plan.schedule()
    assert profile.worst_error < 0.15, result.stdout  # the fit against the measurements
    # The fitted engine against the mock's own on every probe whose time the engine sets: the
    # time between tokens, and the first token of the longer prompts (that of a short one is
    # mostly the step and the HTTP path, which the fit may split either way).
    emulator = Emulator(SHAPE, DEVICE, kv_tokens=KV_TOKENS, **LIMITS)
    fitted = emulator.replay(profile.calibration, profile.plan, profile.http_s)
    truth = emulator.replay(TRUTH, profile.plan)
    errors = {k: fitted[k] / truth[k] - 1 for k in truth if k[0] != "ttft" or k[1] >= 512}
    assert max(map(abs, errors.values())) < 0.15, (errors, result.stdout)
    # The prefill rate was learned (the long prompts' first tokens are bound by compute).
    assert abs(profile.calibration.compute_efficiency / TRUTH.compute_efficiency - 1) < 0.3
    assert profile.emulator().spec(profile.calibration).kv_tokens == KV_TOKENS


def prefix_counters(url: str) -> tuple[int, int]:
    """The engine's prefix-cache (queries, hits) in tokens, as the router reads its /metrics."""
    import urllib.request

    from hetero.serve.engines.vllm import parse

    with urllib.request.urlopen(url + "/metrics", timeout=10) as reply:
        load = parse(reply.read())
    assert load.prefix_queries is not None and load.prefix_hits is not None, load
    return load.prefix_queries, load.prefix_hits


@pytest.mark.slow
def test_a_second_profile_of_one_engine_finds_none_of_its_prompts_cached(mock_url: str) -> None:
    import asyncio

    from hetero.plan.engine_profile import profile_engine

    plan = ProbePlan(ttft_prompts=(1024,), itl_batches=(2,), load_clients=())

    def profile() -> None:
        asyncio.run(profile_engine(mock_url, SHAPE, DEVICE, repeats=1, plan=plan, **LIMITS))

    profile()
    queries, hits = prefix_counters(mock_url)
    profile()  # the same probes again: a fixed seed sent the same prompts
    more_queries, more_hits = prefix_counters(mock_url)
    assert more_queries > queries
    # Random token ids share no 16-token block by chance: a hit is a prompt sent before.
    assert (more_hits - hits) / (more_queries - queries) < 0.05


# --- the emulator's clients and the fit, on its simulated clock ---------------------------------


def an_emulator() -> Emulator:
    return Emulator(SHAPE, DEVICE, kv_tokens=KV_TOKENS, **LIMITS)


def test_requests_sent_together_reach_the_engine_one_after_another() -> None:
    emulator = an_emulator()
    (alone,) = emulator.clients(TRUTH, 1, 1, 512, 8, http_s=0.01)
    engine_s = alone.first - 0.01  # the HTTP path, half each way, is the client's view
    firsts = sorted(t.first for t in emulator.clients(TRUTH, 4, 1, 512, 8, http_s=0.01))
    # The first finds the engine idle and starts a step alone; the other three join the next,
    # three prompts' prefill after it.
    assert firsts[0] == pytest.approx(alone.first, abs=1e-6)
    assert firsts[1] == pytest.approx(firsts[3], abs=1e-6)
    assert firsts[1] - firsts[0] > 2.5 * engine_s


def test_closed_loop_clients_send_their_next_request_as_the_last_one_ends() -> None:
    done = an_emulator().clients(TRUTH, 3, 4, 256, 16, http_s=0.004)
    assert len(done) == 12
    assert all(t.last > t.first > 0.004 and t.tokens == 16 for t in done)
    # Three in flight at a time: no request waits behind more than the other two.
    (alone,) = an_emulator().clients(TRUTH, 1, 1, 256, 16, http_s=0.004)
    assert max(t.last for t in done) < 4 * alone.last


def test_the_fit_recovers_an_engine_whose_attention_runs_slower() -> None:
    emulator, plan = an_emulator(), ProbePlan()
    truth = replace(TRUTH, attention_efficiency=0.05)
    measured = emulator.replay(truth, plan, 0.003)
    calibration, http_s = calibrate(emulator, measured, plan)
    fitted = emulator.replay(calibration, plan, http_s)
    assert max(abs(fitted[k] / measured[k] - 1) for k in measured) < 0.02
    assert calibration.attention == pytest.approx(0.05, rel=0.3)
    assert calibration.compute_efficiency == pytest.approx(0.4, rel=0.3)


@pytest.mark.parametrize("seed", range(3))
def test_the_loops_pin_the_capacity_through_noisy_probes(seed: int) -> None:
    # An engine whose steps cost a large fixed overhead, as a CPU engine's do, measured with
    # errors of up to 6%: the fit may trade the overhead for bandwidth (the small probes barely
    # tell them apart; without the loops such draws put the capacity 6% under to 11% over),
    # but the loops hold what matters, the batch a replica runs within its SLO.
    import random

    from hetero.plan.replica_capacity import replica_capacity

    emulator, plan = an_emulator(), ProbePlan()
    truth = Calibration(
        compute_efficiency=0.4, bandwidth_efficiency=0.3, step_overhead=0.02, request_overhead=0.002
    )

    def capacity(calibration: Calibration) -> float:
        engine = emulator.spec(calibration)
        return replica_capacity(engine, 256, 32, ttft=2.0, tpot=0.15).rate

    rng = random.Random(seed)
    measured = {k: v * rng.uniform(0.94, 1.06) for k, v in emulator.replay(truth, plan).items()}
    calibration, _ = calibrate(emulator, measured, plan)
    assert capacity(calibration) == pytest.approx(capacity(truth), rel=0.03)


class _Bursting:
    """A client of an engine whose server sends its first ``bursts`` streamed replies in one
    burst each (every token at once), then at 10 ms a token."""

    url = "http://127.0.0.1:9"

    def __init__(self, bursts: int) -> None:
        self.bursts = bursts

    async def complete(self, prompt: int, output: int) -> Timing:
        pace = 0.01
        if output > 2 and self.bursts > 0:  # a decode; a first-token probe asks for 2
            self.bursts -= 1
            pace = 1e-5
        return Timing(0.05, 0.05 + pace * (output - 1), output)


def test_a_probe_streamed_in_a_burst_runs_again_and_one_that_keeps_bursting_is_refused() -> None:
    import asyncio

    from hetero.errors import BackendError
    from hetero.plan.engine_profile import BURST_TRIES, probe

    plan = ProbePlan(ttft_prompts=(32,), itl_batches=(1,), load_clients=())
    measured = asyncio.run(probe(_Bursting(BURST_TRIES - 1), plan, 1))  # type: ignore[arg-type]
    assert measured["itl", 1] == pytest.approx(0.01)
    with pytest.raises(BackendError, match=f"in bursts {BURST_TRIES} times .* idle machine"):
        asyncio.run(probe(_Bursting(BURST_TRIES), plan, 1))  # type: ignore[arg-type]


# --- the saved file ----------------------------------------------------------------------------


def a_profile() -> EngineProfile:
    return EngineProfile(
        model_shape=SHAPE,
        device=DEVICE,
        calibration=TRUTH,
        http_s=0.002,
        probes=(
            ProbeResult("ttft", 32, 0.05, 0.051),
            ProbeResult("itl", 8, 0.04, 0.036),
            ProbeResult("load_ttft", 16, 0.3, 0.31),
            ProbeResult("load_itl", 16, 0.06, 0.058),
        ),
        model="m3",
        url="http://127.0.0.1:8000",
        taken_at="2026-01-02T03:04:05+00:00",
        kv_tokens=KV_TOKENS,
        engine="vllm",
        plan=ProbePlan(ttft_prompts=(32,), itl_batches=(8,), load_clients=(16,)),
        **LIMITS,
    )


def test_a_profile_saved_loads_back_the_same(tmp_path: Path) -> None:
    profile = a_profile()
    path = tmp_path / "p.json"
    profile.save(path)
    assert EngineProfile.load(path) == profile
    saved = json.loads(path.read_text())
    assert saved["worst_error"] == pytest.approx(0.1)  # written for readers, derived on load
    assert saved["probes"][1] == {"kind": "itl", "size": 8, "real": 0.04, "emulated": 0.036}
    unknown = replace(profile, kv_tokens=None)  # an engine that does not say
    unknown.save(path)
    assert EngineProfile.load(path) == unknown
    # Saved before attention had an efficiency of its own: it reads as the compute's.
    del saved["calibration"]["attention_efficiency"]
    path.write_text(json.dumps(saved))
    old = EngineProfile.load(path)
    assert old == profile and old.calibration.attention == TRUTH.compute_efficiency
    # Saved before the loops were probed: its plan had none.
    for key in ("load_clients", "load_prompt", "load_output", "load_rounds"):
        del saved["plan"][key]
    saved["probes"] = saved["probes"][:2]
    path.write_text(json.dumps(saved))
    assert EngineProfile.load(path).plan == replace(profile.plan, load_clients=())


def test_a_bad_profile_file_names_every_bad_field(tmp_path: Path) -> None:
    data: dict[str, Any] = a_profile().to_dict()
    del data["model"]
    data["device"] = "H900"
    data["tensor_parallel"] = "2"
    data["calibration"]["compute_efficiency"] = 1.5
    data["calibration"]["step_overhead"] = "fast"
    data["calibration"]["attention_efficiency"] = "slow"
    data["probes"][0]["real"] = -1
    data["probes"][1]["kind"] = "e2e"
    data["extra"] = 1
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        EngineProfile.load(path)
    problems = dict(err.value.problems)
    where = f"{path}: "
    assert problems[where + "model"] == "required field is missing"
    assert "unknown device 'H900'" in problems[where + "device"]
    assert problems[where + "tensor_parallel"] == "must be an integer >= 1, got '2'"
    assert problems[where + "calibration.step_overhead"] == "must be a number, got 'fast'"
    assert problems[where + "calibration.attention_efficiency"] == (
        "must be null or a number, got 'slow'"
    )
    assert problems[where + "probes[0].real"] == "must be a number of seconds > 0, got -1"
    assert problems[where + "probes[1].kind"] == (
        "must be one of 'ttft', 'itl', 'load_ttft', 'load_itl', got 'e2e'"
    )
    assert "unknown key" in problems[where + "extra"]
    assert len(problems) == 8  # compute_efficiency waits for the calibration to be whole

    data["calibration"]["step_overhead"] = 0.002  # now Calibration.problems() speaks
    data["calibration"]["attention_efficiency"] = None
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError) as err:
        EngineProfile.load(path)
    assert (
        "fraction of the peak in (0, 1], got 1.5"
        in dict(err.value.problems)[where + "calibration.compute_efficiency"]
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [("[1, 2]", "expected a mapping (a saved profile), got [1, 2]"), ("{", "invalid JSON")],
)
def test_a_file_that_is_no_profile_is_one_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message)):
        EngineProfile.load(path)


# --- the command line --------------------------------------------------------------------------


def profile_cli(*args: str) -> Any:
    return runner.invoke(app, ["profile-engine", *args], env={"COLUMNS": "200"})


def test_nothing_listening_is_one_line_and_exit_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = profile_cli(url, "--model-shape", SHAPE, "--device", DEVICE, "--timeout", "5")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot read {url}/v1/models ("), lines
    assert "Traceback" not in result.output


@pytest.fixture
def not_openai() -> Iterator[str]:
    """An HTTP server that answers 404 to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_is_not_openai_is_one_line_and_exit_1(not_openai: str) -> None:
    result = profile_cli(not_openai, "--model-shape", SHAPE, "--device", DEVICE)
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "/v1/models (/v1/models answered HTTP 404)" in lines[0], lines
    assert "OpenAI-compatible" in lines[0]


def test_bad_arguments_are_named_before_any_request() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # never asked: the arguments fail first
    result = profile_cli(url, "--model-shape", "llama-9", "--device", "L5")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: --model-shape: unknown model shape 'llama-9'; built-in:")
    assert lines[1].startswith("error: --device: unknown device 'L5'; closest: L4")
    assert len(lines) == 2
    result = profile_cli("localhost:8000", "--model-shape", SHAPE, "--device", DEVICE)
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: URL: must be http://HOST:PORT, got 'localhost:8000'"


def test_help_explains_and_gives_examples() -> None:
    result = profile_cli("--help")
    assert result.exit_code == 0
    for option in ("--model-shape", "--device", "--tensor-parallel", "--out", "--repeats"):
        assert option in result.stdout
    assert "hetero profile-engine http://" in result.stdout
