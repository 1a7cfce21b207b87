"""Nodes that leave or join a Ray cluster while a job runs: nothing lost, nothing duplicated,
and the fleet, the dispatcher's membership and the policy follow."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import hetero
from hetero.errors import TaskFailed
from hetero.runtime.ray_cluster import local_cluster
from tests.processes import wait_for
from tests.ray.fleets import add_node, write_fleet
from tests.runtime.checkpointed import steps_with_checkpoints

TIME_SCALE = 0.05


def emulated(model: str, speed: float, count: int = 1) -> dict[str, Any]:
    return {"type": "gpu", "model": model, "emulate": True, "speed": speed, "count": count}


@hetero.task(cost=lambda x: 1.0)
def double(x: int) -> int:
    return x * 2


@pytest.fixture
def two_nodes(tmp_path: Path) -> Any:
    """A head with a V100 and a second node with a fast H100 (which takes work first)."""
    head = write_fleet(tmp_path, "head", [emulated("V100-32GB", 1.0)])
    fast = write_fleet(tmp_path, "fast", [emulated("H100-SXM-80GB", 4.0)])
    with local_cluster([head, fast]) as cluster:
        yield cluster


def fast_node(cluster: Any) -> Any:
    (node,) = cluster.worker_nodes
    return node


def test_a_node_killed_mid_map_loses_and_duplicates_nothing(two_nodes: Any) -> None:
    n = 200
    with hetero.Context(backend="ray", address=two_nodes.address, time_scale=TIME_SCALE) as ctx:
        results: list[int] = []
        killed = threading.Event()
        for value in ctx.map(double, range(n), batch_size=4, progress=False):
            results.append(value)
            if len(results) == n // 4 and not killed.is_set():
                two_nodes.remove_node(fast_node(two_nodes), allow_graceful=False)
                killed.set()
        assert results == [2 * x for x in range(n)]  # every item once, in order
        fast = [d.id for d in ctx.devices if d.model == "H100-SXM-80GB"]
        wait_for(lambda: not set(fast) & set(ctx.dispatcher.members), timeout=60)
        assert ctx.stats["failed"] == 0 and ctx.stats["done"] == n // 4
        ctx.dispatcher.validate_state()


def test_a_task_on_a_node_that_dies_resumes_elsewhere_from_its_checkpoint(
    two_nodes: Any, tmp_path: Path
) -> None:
    marker = tmp_path / "pid"
    task = hetero.task(retries=2)(steps_with_checkpoints)
    with hetero.Context(backend="ray", address=two_nodes.address, time_scale=TIME_SCALE) as ctx:
        f = ctx.submit(task, 10, str(marker))
        wait_for(marker.exists, timeout=60)
        first = ctx.dispatcher.view.ids[ctx.dispatcher.records[f.task_id].device]
        assert first.endswith("h100-sxm-80gb:0")  # the fastest device took it
        two_nodes.remove_node(fast_node(two_nodes), allow_graceful=False)
        start, ran, _ = f.result(timeout=120)
        assert start == 5 and ran == list(range(10))  # resumed, every step once
        assert f.device is not None and f.device.endswith("v100-32gb:0")


def test_a_task_only_a_departed_node_could_run_fails_with_the_reason(two_nodes: Any) -> None:
    with hetero.Context(backend="ray", address=two_nodes.address, time_scale=TIME_SCALE) as ctx:
        only_fast = hetero.task(devices=["H100-SXM-80GB"])(double)
        assert ctx.run(only_fast, 1) == 2
        two_nodes.remove_node(fast_node(two_nodes), allow_graceful=False)
        wait_for(lambda: len(ctx.dispatcher.members) == 1, timeout=60)
        with pytest.raises(hetero.NoCapableDevice, match="no device it may use is left"):
            ctx.submit(only_fast, 2)
        assert ctx.run(double, 3) == 6  # the rest of the fleet works on


def test_waiting_tasks_fail_rather_than_hang_when_their_last_device_leaves(
    two_nodes: Any,
) -> None:
    slow = hetero.task(devices=["H100-SXM-80GB"], cost=lambda x: 40.0)(double)
    with hetero.Context(backend="ray", address=two_nodes.address, time_scale=TIME_SCALE) as ctx:
        futures = [ctx.submit(slow, i) for i in range(4)]  # 0.5 s each, queued on one device
        wait_for(lambda: ctx.status()["tasks"]["running"] > 0, timeout=60)
        two_nodes.remove_node(fast_node(two_nodes), allow_graceful=False)
        for f in futures:
            with pytest.raises(TaskFailed, match="no device it may use is left"):
                f.result(timeout=120)


@hetero.task(cost=lambda item: 1.0)
def double_past_the_gate(item: tuple[int, str]) -> int:
    """``2 x``; from the 20th item on, once the file ``gate`` exists (at most 120 s)."""
    x, gate = item
    deadline = time.monotonic() + 120
    while x >= 20 and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)
    return x * 2


def test_a_node_that_joins_mid_map_receives_work(tmp_path: Path) -> None:
    """The map cannot end before the node has joined: its items past the 20th wait for a gate
    the test opens once the node's devices are members (under load, the head alone used to
    finish the map first)."""
    head = write_fleet(tmp_path, "head", [emulated("V100-32GB", 1.0)])
    extra = write_fleet(tmp_path, "extra", [emulated("A100-80GB", 2.5, count=2)])
    gate = tmp_path / "gate"
    n = 200
    with (
        local_cluster([head]) as cluster,
        hetero.Context(backend="ray", address=cluster.address, time_scale=TIME_SCALE) as ctx,
    ):
        assert len(ctx.devices) == 1
        results = []
        items = [(x, str(gate)) for x in range(n)]
        for value in ctx.map(double_past_the_gate, items, batch_size=2, progress=False):
            results.append(value)
            if len(results) == 20:
                add_node(cluster, extra)
                wait_for(lambda: len(ctx.dispatcher.members) == 3, timeout=120)
                gate.touch()
        assert results == [2 * x for x in range(n)]
        joined = [d for d in ctx.devices if d.model == "A100-80GB"]
        assert len(joined) == 2 and len(ctx.dispatcher.members) == 3
        done = {d["id"]: d["done"] for d in ctx.status()["devices"]}
        assert all(done[d.id] > 0 for d in joined), done
