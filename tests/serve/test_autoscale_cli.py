"""``hetero serve --autoscale FILE`` in a real process: the first replica started through the
provider, a burst of traffic growing the fleet by the serving planner, quiet shrinking it, and
every process gone after SIGTERM. Engine-faithful mock replicas on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.serve.harness import CHAT, chat

MOCK = [sys.executable, "-m", "hetero", "mock-replica", "--engine", "vllm"]
MOCK += ["--engine-model", "continuous", "--model-shape", "llama-3.1-8b", "--model", "m"]
MOCK += ["--host", "{host}", "--port", "{port}"]


def write_files(tmp_path: Path) -> Path:
    (tmp_path / "plan.yaml").write_text(
        json.dumps(
            {
                "model": "llama-3.1-8b",
                "workload": {"rate": 1, "prompt_tokens": 100, "output_tokens": 4},
                "slo": {"ttft": 1.0, "tpot": 0.1},
                "devices": [{"model": "L4", "max_count": 3}],
            }
        )
    )
    config = {
        "plan": "plan.yaml",
        "interval": 0.2,
        "types": {
            "l4": {
                "gpu": "L4",
                "command": [*MOCK, "--device", "L4"],
                "startup_s": 5,
                "max_count": 3,
                "initial": 1,
            }
        },
        "policy": {"up_after": 0, "down_after": 1, "cooldown": 0},
    }
    path = tmp_path / "autoscale.yaml"
    path.write_text(json.dumps(config))
    return path


async def start(*args: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hetero",
        "serve",
        "--port",
        "0",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), 120)).decode()
        assert line, "hetero serve ended before listening"
        match = re.match(r"hetero serve listening on (http://127\.0\.0\.1:\d+) ", line)
        if match:
            return proc, match[1]


async def status(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/status") as reply:
        data: dict[str, Any] = await reply.json()
        return data


async def until(check: Any, what: str, limit: float = 90.0) -> Any:
    """Poll the async ``check`` until it gives something true (``limit`` bounds a broken
    test; nothing is timed)."""
    deadline = asyncio.get_running_loop().time() + limit
    while not (value := await check()):
        assert asyncio.get_running_loop().time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.1)
    return value


async def until_or_none(check: Any, limit: float) -> Any:
    """``check``'s first true value within ``limit`` seconds, else None (the caller acts
    again and asks anew: a deadline here decides nothing)."""
    deadline = asyncio.get_running_loop().time() + limit
    while not (value := await check()):
        if asyncio.get_running_loop().time() >= deadline:
            return None
        await asyncio.sleep(0.1)
    return value


async def burst(session: aiohttp.ClientSession, url: str, n: int) -> None:
    async def one() -> None:
        async with session.post(url + CHAT, json=chat(max_tokens=2)) as reply:
            assert reply.status == 200

    await asyncio.gather(*(one() for _ in range(n)))


async def test_a_burst_grows_the_fleet_and_quiet_shrinks_it_back(tmp_path: Path) -> None:
    proc, url = await start("--autoscale", str(write_files(tmp_path)))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            first = await status(session, url)
            assert first["autoscale"]["types"]["l4"]["warm"] == 1
            assert first["strategy"] == "slo"  # routes by the plan's SLO

            async def grown() -> Any:
                s = await status(session, url)
                return s if s["autoscale"]["types"]["l4"]["warm"] >= 2 else None

            # Bursts of 60 (more than one L4 carries) until a second replica is warm: the need
            # lasts while the test waits for it, however slowly a loaded machine starts the
            # replica (a single burst could leave the window before it was warm, and the
            # quiet that follows drain it between two reads of /status).
            grew = None
            for _ in range(40):  # bounds a broken test
                await burst(session, url, 60)
                if (grew := await until_or_none(grown, 5.0)) is not None:
                    break
            assert grew is not None, "never happened: a second replica warm"
            assert len(grew["replicas"]) >= 2
            starts = [d for d in grew["autoscale"]["decisions"] if d["kind"] == "start"]
            assert starts and "target" in starts[0]["reason"]

            async def shrunk() -> Any:
                s = await status(session, url)
                types = s["autoscale"]["types"]["l4"]
                return s if types["warm"] == 1 and types["draining"] == 0 else None

            quiet = await until(shrunk, "back to one replica once quiet")
            assert len(quiet["replicas"]) == 1  # the drained one is out of the router
            drains = [d for d in quiet["autoscale"]["decisions"] if d["kind"] == "drain"]
            assert drains
            await burst(session, url, 3)  # the one left serves
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert proc.stderr is not None
        err = (await proc.stderr.read()).decode()
        assert "Traceback" not in err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_dry_run_decides_and_starts_nothing(tmp_path: Path) -> None:
    proc, url = await start("--autoscale", str(write_files(tmp_path)), "--autoscale-dry-run")
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await burst(session, url, 60)

            async def decided() -> Any:
                s = await status(session, url)
                return s if any(d["kind"] == "start" for d in s["autoscale"]["decisions"]) else None

            seen = await until(decided, "a start decided")
            assert seen["autoscale"]["dry_run"] is True
            assert seen["autoscale"]["types"]["l4"]["warm"] == 1
            assert seen["autoscale"]["types"]["l4"]["starting"] == 0
            assert len(seen["replicas"]) == 1
        top = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "hetero", "top", "--serve", url, "--once"),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "COLUMNS": "200"},
        )
        shown = (await asyncio.wait_for(top.communicate(), 60))[0].decode()
        assert top.returncode == 0 and "autoscale (dry run)" in shown and "start l4" in shown
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"types": {}}, "types"),
        ({"plan": "missing.yaml"}, "missing.yaml"),
        ({"types": {"x": {"gpu": "T4", "command": ["a"], "initial": 1}}}, "types.x.gpu"),
    ],
)
def test_a_bad_autoscale_file_names_the_field(
    tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    import subprocess

    path = write_files(tmp_path)
    data = {**json.loads(path.read_text()), **change}
    path.write_text(json.dumps(data))
    done = subprocess.run(
        [sys.executable, "-m", "hetero", "serve", "--autoscale", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and field in done.stderr and "Traceback" not in done.stderr


def test_a_started_replica_is_predicted_as_its_menu_entry_s_profile_measured_it(
    tmp_path: Path,
) -> None:
    # The router's prior for a replica the autoscaler started: the plan's engine model with
    # the calibration the entry's profile measured (the catalog's defaults only without one).
    from hetero.serve.autoscale.config import load_autoscale
    from hetero.serve.autoscale.providers import ReplicaHandle
    from hetero.serve.engine_model import Calibration, engine_spec
    from tests.plan.profiles import save_profile

    measured = Calibration(
        compute_efficiency=0.05,
        bandwidth_efficiency=0.1,
        step_overhead=0.015,
        request_overhead=7e-4,
    )
    save_profile(tmp_path / "l4.json", "llama-3.1-8b", "L4", measured)
    path = write_files(tmp_path)
    handle = ReplicaHandle("l4-1", "l4", "http://127.0.0.1:9", "local")
    unprofiled = load_autoscale(path).describe(handle).prior
    assert unprofiled == engine_spec("llama-3.1-8b", "L4").prior()

    plan = json.loads((tmp_path / "plan.yaml").read_text())
    plan["devices"][0]["profile"] = "l4.json"
    (tmp_path / "plan.yaml").write_text(json.dumps(plan))
    prior = load_autoscale(path).describe(handle).prior
    assert prior == engine_spec("llama-3.1-8b", "L4", calibration=measured).prior()
    assert prior is not None and unprofiled is not None
    assert prior.step_per_request > 10 * unprofiled.step_per_request
