"""The Ray backend on a three-node cluster: the local backend's API, placed by hetero."""

from __future__ import annotations

import ctypes
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import hetero
from hetero.errors import TaskFailed
from tests.cli_apps import hetero_cli
from tests.ray.fleets import FLEETS

TIME_SCALE = 0.05


@hetero.task(cost=lambda x: 1.0)
def double(x: int) -> int:
    return x * 2


def where() -> tuple[str, int]:
    return hetero.get_current_device().id, os.getpid()


def add(a: Any, b: Any) -> Any:
    return a + b


def total(a: np.ndarray) -> float:
    return float(a.sum())


@pytest.fixture(scope="module")
def ctx(cluster: Any) -> Any:
    with hetero.Context(backend="ray", address=cluster.address, time_scale=TIME_SCALE) as c:
        yield c


def test_the_fleet_is_every_nodes_declared_devices_under_unique_ids(ctx: Any) -> None:
    models = sorted(d.model for d in ctx.devices)
    declared = sorted(
        e["model"] for devices in FLEETS.values() for e in devices for _ in range(e.get("count", 1))
    )
    assert models == declared
    ids = [d.id for d in ctx.devices]
    assert len(set(ids)) == len(ids) == 5
    assert len({d.node for d in ctx.devices}) == 3  # three nodes
    assert all(d.emulated for d in ctx.devices)


def test_run_submit_and_task_graphs_work_as_on_the_local_backend(ctx: Any) -> None:
    assert ctx.run(double, 21) == 42
    a = ctx.submit(add, 1, 2)
    b = ctx.submit(add, 10, 20)
    c = ctx.submit(add, a, b)  # waits for both, on whichever device
    assert c.result(timeout=60) == 33
    assert c.device in {d.id for d in ctx.devices}


def test_each_task_runs_in_its_devices_actor_on_that_devices_node(ctx: Any) -> None:
    seen = {}
    for d in ctx.devices:
        device, pid = ctx.run(hetero.task(devices=[d.id])(where))
        assert device == d.id
        seen[d.id] = pid
    assert len(set(seen.values())) == len(ctx.devices)  # one actor per device


def test_a_map_spreads_over_every_node_by_speed_and_returns_results_in_order(ctx: Any) -> None:
    before = {d["id"]: d["done"] for d in ctx.status()["devices"]}
    out = list(ctx.map(double, range(300), progress=False))
    assert out == [2 * x for x in range(300)]
    done = {d["id"]: d["done"] - before[d["id"]] for d in ctx.status()["devices"]}
    assert all(n > 0 for n in done.values()), done
    fast = [d.id for d in ctx.devices if d.model == "A100-80GB"]
    slow = [d.id for d in ctx.devices if d.model == "T4"]
    assert min(done[i] for i in fast) > max(done[i] for i in slow)


def test_unordered_map_streams_results_as_they_finish(ctx: Any) -> None:
    out = list(ctx.map(double, range(50), ordered=False, progress=False))
    assert sorted(out) == [2 * x for x in range(50)]


def test_large_arguments_and_results_cross_the_object_store_intact(ctx: Any) -> None:
    big = np.arange(2_000_000, dtype=np.float64)  # 16 MB: by reference, not inside the order
    assert ctx.run(total, big) == float(big.sum())
    assert np.array_equal(ctx.run(add, big, 1.0), big + 1.0)


def test_a_task_error_fails_its_future_with_the_remote_exception(ctx: Any) -> None:
    with pytest.raises(TaskFailed, match="ZeroDivisionError") as info:
        ctx.run(divide, 1, 0)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def divide(a: int, b: int) -> float:
    return a / b


def sleep_then(seconds: float) -> str:
    time.sleep(seconds)
    return "slept"


def test_cancelling_a_running_task_stops_it_and_its_device_takes_more_work(ctx: Any) -> None:
    target = ctx.devices[0].id
    f = ctx.submit(hetero.task(devices=[target])(sleep_then), 60)
    deadline = time.monotonic() + 30
    while ctx.status()["tasks"]["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f.cancel()
    assert ctx.run(hetero.task(devices=[target])(where))[0] == target


def pid_then_hold_the_gil(marker: str, seconds: int) -> None:
    """Write this actor's pid to ``marker``, then sleep in C holding the GIL: the actor's
    control thread, which ends it to stop a task, cannot run."""
    Path(marker).write_text(str(os.getpid()))
    ctypes.PyDLL(None).sleep(seconds)


@pytest.mark.slow
def test_an_actor_stuck_in_c_past_its_timeout_is_killed_and_its_device_runs_again(
    ctx: Any, tmp_path: Path
) -> None:
    from tests.processes import gone, wait_for

    on = ctx.devices[0].id
    assert ctx.run(hetero.task(devices=[on])(where))[0] == on  # its actor up: no start to wait
    marker = tmp_path / "pid"
    stuck = hetero.task(devices=[on], timeout=1.0, retries=0)(pid_then_hold_the_gil)
    with pytest.raises(TaskFailed, match="timed out"):
        ctx.run(stuck, str(marker), 60)
    pid = int(marker.read_text())
    wait_for(lambda: gone(pid), timeout=15)  # killed after the grace period, not in 60 s
    assert ctx.run(hetero.task(devices=[on])(where))[0] == on


def test_profile_and_status_cover_the_cluster(ctx: Any, tmp_path: Path) -> None:
    with ctx.profile("ray", tmp_path) as p:
        list(ctx.map(double, range(40), progress=False))
    assert (tmp_path / "ray.html").exists() and (tmp_path / "ray.trace.json").exists()
    traced = {t.device for t in p.profile.traces}
    assert traced <= {d.id for d in ctx.devices} and len(traced) >= 2
    status = ctx.status()
    assert len(status["devices"]) == 5 and status["tasks"]["running"] == 0


def test_checkpoints_reach_every_node_and_a_retry_resumes_from_the_last(
    ctx: Any, tmp_path: Path
) -> None:
    from tests.processes import wait_for
    from tests.runtime.checkpointed import steps_with_checkpoints

    marker = tmp_path / "pid"
    task = hetero.task(retries=2)(steps_with_checkpoints)
    f = ctx.submit(task, 10, str(marker))
    wait_for(marker.exists)
    os.kill(int(marker.read_text()), 9)  # the actor's process, mid-task
    start, ran, _ = f.result(timeout=60)
    assert start == 5 and ran == list(range(10))


def test_hetero_devices_ray_lists_the_whole_cluster_by_node(cluster: Any) -> None:
    done = hetero_cli("devices", "--ray", "--address", cluster.address, "--json")
    assert done.returncode == 0, done.stderr
    nodes = json.loads(done.stdout)
    assert len(nodes) == 3
    by_count = sorted(len(n["devices"]) for n in nodes)
    assert by_count == [1, 2, 2]
    shown = hetero_cli("devices", "--ray", "--address", cluster.address)
    assert shown.returncode == 0 and "Ray cluster: 3 nodes, 5 devices" in shown.stdout
    assert shown.stdout.count("node ") >= 3


def test_hetero_top_shows_a_context_on_the_cluster(ctx: Any) -> None:
    list(ctx.map(double, range(20), progress=False))
    time.sleep(2 * ctx.monitoring_interval)  # a status snapshot is written each interval
    shown = hetero_cli("top", "--once", "--pid", str(os.getpid()))
    assert shown.returncode == 0, shown.stderr
    assert all(d.id in shown.stdout for d in ctx.devices)


@pytest.mark.timeout(180)
def test_the_ray_cluster_example_survives_a_node_leaving_and_one_joining() -> None:
    from tests.example_runs import run_example

    out = run_example("ray_cluster.py", "--items", "1500", "--quick", timeout=170)
    assert "cluster of 3 nodes up" in out
    assert "1500 results, every one once and in order" in out
    rows = dict(re.findall(r"^(\S+/\S+) +\d+  (yes|left)$", out, re.M))
    assert sorted(rows.values()) == ["left", "left", "yes", "yes", "yes", "yes"]
    joined = [d for d in rows if "h100" in d]
    assert joined and rows[joined[0]] == "yes"


def test_every_device_is_read_where_it_is_even_on_other_nodes(ctx: Any) -> None:
    ctx.start()  # an actor on every device
    usage = ctx.memory_usage()
    assert set(usage) == {d.id for d in ctx.devices}
    # An emulated device's memory is its actor's: read on each node by the actor itself.
    assert all(u["used"] > 0 and u["total"] >= u["used"] for u in usage.values()), usage
    assert sum(ctx.backend.on_this_machine()) == 2  # the head's two A100s; the rest elsewhere
    assert len(ctx.backend.remote_samples()) == 3


def total_dying_once(a: np.ndarray, marker: str) -> float:
    """Ends its actor on the first attempt; the retry computes."""
    if not os.path.exists(marker):
        Path(marker).write_text("died once")
        os._exit(1)
    return float(a.sum())


def test_a_large_argument_enters_the_object_store_once_however_often_it_is_sent(
    ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    puts: list[int] = []
    real_put = ray.put

    def counting_put(value: Any, **kwargs: Any) -> Any:
        puts.append(len(getattr(value, "data", b"")))
        return real_put(value, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    big = np.ones(1_000_000)  # 8 MB
    task = hetero.task(retries=2)(total_dying_once)
    assert ctx.run(task, big, str(tmp_path / "marker")) == 1_000_000.0
    assert ctx.stats["retried"] >= 1  # sent twice: once to the actor that died, once more
    assert len([n for n in puts if n > 8_000_000]) == 1, puts
