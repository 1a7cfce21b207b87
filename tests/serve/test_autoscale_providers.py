"""The autoscaler's providers with real processes on 127.0.0.1: mock replicas started and
stopped, starts that fail and are retried, a replica that never answers. Each test ends with
nothing it started still running (``no_leftovers``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import psutil
import pytest

from hetero.errors import ConfigError, ProviderError
from hetero.runtime.fence import Fence
from hetero.serve.autoscale.policy import ReplicaType
from hetero.serve.autoscale.providers import (
    LocalProcessProvider,
    ReplicaHandle,
    ReplicaProcess,
    Retry,
)
from tests.serve.harness import wait_for

MOCK = [sys.executable, "-m", "hetero", "mock-replica", "--host", "{host}", "--port", "{port}"]
MOCK += ["--model", "m"]
CPU = ReplicaType("cpu", startup_s=5, max_count=4)
QUICK_RETRY = Retry(attempts=3, backoff=0.01)


def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def children_running(marker: str) -> list[psutil.Process]:
    """Processes under this one whose command line holds ``marker`` (zombies aside)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and marker in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_until(check: Callable[[], bool], what: str, limit: float = 15.0) -> None:
    """Poll ``check`` until it holds (``limit`` only bounds a broken test)."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def running_children() -> dict[int, psutil.Process]:
    found = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                found[p.pid] = p
        except psutil.Error:
            continue
    return found


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    before = set(running_children())
    yield
    # Bounded: processes a test stopped are gone already; Ray's own end soon after shutdown.
    deadline = time.monotonic() + 15
    while set(running_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for pid, p in running_children().items() if pid not in before]
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def models(http: aiohttp.ClientSession, handle: ReplicaHandle) -> list[str]:
    async with http.get(handle.url + "/v1/models") as reply:
        assert reply.status == 200
        return [m["id"] for m in (await reply.json())["data"]]


async def test_a_mock_replica_starts_warm_and_stops_with_its_whole_group(
    http: aiohttp.ClientSession,
) -> None:
    # A shell in front that leaves a child of its own behind: stopping must end it too.
    marker = "sleep 86399"
    command = ["sh", "-c", f'{marker} & exec "$@"', "sh", *MOCK]
    provider = LocalProcessProvider([CPU], {"cpu": command}, grace=5)
    handle = await provider.start("cpu")
    try:
        assert (handle.type_name, handle.provider, handle.name) == ("cpu", "local", "cpu-1")
        assert handle.url.startswith("http://127.0.0.1:")
        assert await models(http, handle) == ["m"]  # warm: it answers at once
        assert handle.pid is not None and os.getsid(handle.pid) == handle.pid  # own session
        assert children_running(marker)
    finally:
        await provider.stop(handle)
        await provider.close()
    assert group_gone(handle.pid)
    assert not children_running(marker)
    assert provider.processes == {}
    assert list(provider.failures) == []


async def test_a_replica_that_exits_at_once_fails_after_every_retry_quoting_it() -> None:
    script = (
        "import sys; print('loading weights', flush=True); "
        "sys.stderr.write('CUDA error: no CUDA-capable device is detected\\n'); sys.exit(3)"
    )
    gpu = ReplicaType("gpu", startup_s=60, max_count=2)
    provider = LocalProcessProvider(
        [gpu], {"gpu": [sys.executable, "-c", script]}, retry=QUICK_RETRY
    )
    with pytest.raises(ProviderError) as err:
        await provider.start("gpu")
    message = str(err.value)
    assert "could not start a replica of type 'gpu' (3 attempts)" in message
    assert "CUDA error: no CUDA-capable device is detected" in message
    assert "loading weights" in message
    assert message.count("exited with status 3") == 3
    await provider.close()
    assert [(f.type_name, f.attempt) for f in provider.failures] == [
        ("gpu", 1),
        ("gpu", 2),
        ("gpu", 3),
    ]
    assert provider.processes == {}


async def test_a_replica_that_never_answers_times_out_and_is_stopped() -> None:
    marker = "autoscale-test-hung"
    script = f"import time; print('{marker} warming up', flush=True); time.sleep(600)"
    provider = LocalProcessProvider(
        [CPU],
        {"cpu": [sys.executable, "-c", script]},
        retry=Retry(attempts=1),
        timeouts={"cpu": 0.5},
        grace=2,
    )
    with pytest.raises(ProviderError, match=r"attempt 1: not ready after 0\.5 s") as err:
        await provider.start("cpu")
    assert f"its last output:\n{marker} warming up" in str(err.value)
    assert not children_running(marker)
    await provider.close()


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    proc = ReplicaProcess([sys.executable, "-c", script])
    wait_until(lambda: "ready" in proc.output(), "its SIGTERM ignored")
    proc.stop(grace=0.2)
    assert not proc.alive()
    assert proc.why_exited() == "killed by signal 9; its last output:\nready"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_replica_dies_with_the_process_that_started_it() -> None:
    starter = (
        "import sys, time; from hetero.serve.autoscale.providers import ReplicaProcess; "
        "p = ReplicaProcess(['sleep', '86398']); print(p.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    wait_until(lambda: "sleep" in psutil.Process(pid).name(), "the replica's command running")
    parent.kill()  # as hetero serve killed with SIGKILL: nothing of its own runs after
    parent.wait()
    parent.stdout.close()
    wait_until(lambda: not running(pid), "the replica gone with its starter")


# A replica whose engine starts a worker that leaves the replica's process group (as a
# process that calls setpgid does) and ignores SIGTERM: only the session sweep reaches it.
_ENGINE = (
    "import os, signal, subprocess, sys, time; "
    "w = subprocess.Popen([sys.executable, '-c', 'import os, signal, time; os.setpgid(0, 0); "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(86397)']); "
    "print(w.pid, flush=True); time.sleep(600)"
)


def test_an_engine_worker_that_left_the_group_ends_with_its_replica() -> None:
    fence = Fence("hetero-test-replicas", cgroups=False)
    proc = ReplicaProcess([sys.executable, "-c", _ENGINE], fence=fence)
    wait_until(lambda: proc.output().strip().isdigit(), "the engine's worker started")
    worker = int(proc.output().strip())
    wait_until(lambda: os.getpgid(worker) == worker, "the worker in a group of its own")
    proc.stop(grace=0.2)
    wait_until(lambda: not running(worker), "the worker gone with its replica")
    fence.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_engine_worker_ends_when_the_process_that_started_its_replica_is_killed() -> None:
    starter = (
        "import sys, time; from hetero.runtime.fence import Fence; "
        "from hetero.serve.autoscale.providers import ReplicaProcess; "
        f"p = ReplicaProcess([sys.executable, '-c', {_ENGINE!r}], "
        "fence=Fence('t', cgroups=False)); "
        "print(p.pid, flush=True); time.sleep(600)"
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    replica = int(parent.stdout.readline())
    wait_until(lambda: bool(psutil.Process(replica).children()), "the worker started")
    worker = psutil.Process(replica).children()[0].pid
    parent.kill()  # as hetero serve killed with SIGKILL: its sentinel sweeps the session
    parent.wait()
    parent.stdout.close()
    wait_until(lambda: not running(worker), "the engine's worker gone with the starter")
    wait_until(lambda: not running(replica), "the replica gone with the starter")


async def test_one_replica_stops_and_the_other_keeps_serving(http: aiohttp.ClientSession) -> None:
    provider = LocalProcessProvider([CPU], {"cpu": MOCK})
    first, second = await provider.start("cpu"), await provider.start("cpu")
    try:
        assert first.name != second.name and first.url != second.url
        await provider.stop(first)
        assert group_gone(first.pid or 0)
        assert await models(http, second) == ["m"]
    finally:
        await provider.close()
    await wait_for(lambda: group_gone(second.pid or 0), "the second replica gone")


async def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"commands\.cpu: no command for this replica type"):
        LocalProcessProvider([CPU], {})
    with pytest.raises(ConfigError, match=r"commands\.gpu: not a replica type; types: cpu"):
        LocalProcessProvider([CPU], {"cpu": MOCK, "gpu": MOCK})
    with pytest.raises(ConfigError, match=r"commands\.cpu: the command is empty"):
        LocalProcessProvider([CPU], {"cpu": []})
    with pytest.raises(ConfigError, match="attempts: must be >= 1"):
        Retry(attempts=0)
    provider = LocalProcessProvider([CPU], {"cpu": MOCK})
    with pytest.raises(ConfigError, match="unknown replica type 'tpu'; types: cpu"):
        await provider.start("tpu")


def test_the_back_off_doubles_up_to_its_cap() -> None:
    retry = Retry(attempts=6, backoff=1.0, max_backoff=5.0)
    assert [retry.wait(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.slow
async def test_a_ray_actor_starts_and_stops_a_mock_replica(http: aiohttp.ClientSession) -> None:
    ray = pytest.importorskip("ray")
    from hetero.serve.autoscale.providers import RayPlacement, RayProvider

    if ray.is_initialized():
        pytest.skip("this process is connected to a Ray cluster already")
    # address="local": a cluster of its own, not one another run on this machine started
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        provider = RayProvider(
            [CPU],
            {"cpu": MOCK},
            placements={"cpu": RayPlacement(num_cpus=1)},
            host="127.0.0.1",
            retry=QUICK_RETRY,
        )
        handle = await provider.start("cpu")
        try:
            assert handle.provider == "ray" and handle.url.startswith("http://127.0.0.1:")
            assert await models(http, handle) == ["m"]
        finally:
            await provider.stop(handle)
        assert handle.pid is not None and group_gone(handle.pid)
        assert provider.actors == {}
        # A type pinned to an accelerator no node has: its actor is never placed, and the
        # start fails once the readiness timeout is over.
        pinned = RayProvider(
            [CPU],
            {"cpu": MOCK},
            placements={"cpu": RayPlacement(accelerator="NO-SUCH-GPU")},
            retry=Retry(attempts=1),
            timeouts={"cpu": 1.0},
        )
        with pytest.raises(ProviderError, match="actor was not placed within 1 s"):
            await pinned.start("cpu")
    finally:
        ray.shutdown()
