"""Emulated speeds, memory limits, the profiler, the status file and placement logs, measured on
real worker processes."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import pytest

import hetero
from hetero.errors import HeteroError, TaskFailed
from hetero.runtime.status import StatusSnapshot, read_statuses
from hetero.testing import emulated_fleet


def test_emulated_devices_deliver_their_declared_relative_speed(tmp_path: Path) -> None:
    speeds = [2.5, 1.0, 0.5]
    work = hetero.task(cost=0.01)(lambda i: i)  # 10 ms of work at speed 1
    with (
        hetero.Context(devices=emulated_fleet(speeds)) as ctx,
        ctx.profile("speeds", tmp_path) as p,
    ):
        assert list(ctx.map(work, range(300), batch_size=1, progress=False)) == list(range(300))
    summary = p.profile.summary()
    rates = {}
    for dev in summary.devices:
        assert dev.busy > 0
        rates[dev.id] = dev.tasks * 0.01 / dev.busy  # work units per busy second
    for i, s in enumerate(speeds):
        assert rates[f"d{i}"] == pytest.approx(s, rel=0.10)
    # The ideal makespan uses the declared speeds: no run can beat it.
    assert summary.efficiency is not None and summary.efficiency <= 1.0


def test_profile_writes_a_chrome_trace_and_an_html_report(tmp_path: Path) -> None:
    with hetero.Context(devices=emulated_fleet([2.0, 1.0])) as ctx:
        with ctx.profile("job", tmp_path) as prof:
            list(ctx.map(hetero.task(cost=0.002)(lambda x: x), range(40), progress=False))
        assert [p.name for p in prof.paths] == ["job.trace.json", "job.html"]
        trace = json.loads((tmp_path / "job.trace.json").read_text())
        complete = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
        assert len(complete) == len(prof.profile.traces) > 0
        assert {t.device for t in prof.profile.traces} == {"d0", "d1"}
        assert all(t.status == "done" and t.ended >= t.started for t in prof.profile.traces)
        assert "d0" in (tmp_path / "job.html").read_text()
        # A second profile of the same name does not overwrite the first.
        with ctx.profile("job", tmp_path):
            ctx.run(lambda: None)
        assert (tmp_path / "job-2.html").exists()


def test_hetero_profile_dir_profiles_every_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HETERO_PROFILE_DIR", str(tmp_path))
    monkeypatch.setenv("HETERO_PROFILE_NAME", "script")
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        ctx.run(lambda: 1)
    assert (tmp_path / "script.html").exists() and (tmp_path / "script.trace.json").exists()


def grab(nbytes: int) -> int:
    block = np.ones(nbytes // 8)
    time.sleep(2)  # long enough for the memory watch to see it
    return int(block.size)


def test_a_task_over_the_memory_limit_fails_with_the_reason() -> None:
    devices = emulated_fleet([1.0], memory="400MB")
    with hetero.Context(devices=devices) as ctx:
        with pytest.raises(TaskFailed, match=r"exceeded the device.s limit 0\.40 GB"):
            ctx.run(hetero.task(retries=0)(grab), 600_000_000)
        assert ctx.run(grab, 8_000_000) == 1_000_000  # the restarted worker carries on


def test_memory_pool_size_caps_every_device_for_placement_and_enforcement() -> None:
    with hetero.Context(devices=emulated_fleet([1.0, 1.0]), memory_pool_size="1GB") as ctx:
        assert [d.memory_bytes for d in ctx.devices] == [10**9, 10**9]
        with pytest.raises(HeteroError, match=r"largest device, d0, has 953\.67 MiB"):
            ctx.submit(hetero.task(memory="2GB")(grab), 1)
        ctx.run(lambda: None)
        usage = hetero.get_memory_usage()
        assert set(usage) == {"d0", "d1"}
        assert all(
            u["total"] == 10**9 and u["used"] + u["free"] == u["total"] for u in usage.values()
        )


def test_a_running_context_publishes_its_status_for_hetero_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HETERO_STATUS_DIR", str(tmp_path))
    config = Path(__file__).parents[2] / "examples" / "mixed_fleet.yaml"
    with hetero.Context(config, time_scale=0.01) as ctx:
        ctx.run(lambda: None)
        snapshot = ctx.status()
        assert snapshot["pid"] == os.getpid()
        assert snapshot["config"] == str(config.resolve())
        assert snapshot["tasks"]["done"] == 1
        assert [d["id"] for d in snapshot["devices"]] == [d.id for d in ctx.devices]
        assert sum(d["done"] for d in snapshot["devices"]) == 1
        found: list[StatusSnapshot] = []
        for _ in range(100):  # the monitor publishes within monitoring_interval (1 s)
            found = [s for s in read_statuses(tmp_path) if s["pid"] == os.getpid()]
            if found:
                break
            time.sleep(0.05)
        assert found and found[0]["config"] == str(config.resolve())
    assert not [s for s in read_statuses(tmp_path) if s["pid"] == os.getpid()]


def test_debug_logging_shows_each_placement_and_why(caplog: pytest.LogCaptureFixture) -> None:
    hetero.set_log_level("DEBUG")
    try:
        with (
            caplog.at_level(logging.DEBUG, logger="hetero"),
            hetero.Context(devices=emulated_fleet([2.0, 1.0])) as ctx,
        ):
            ctx.run(hetero.task(cost=0.01, name="step")(lambda: None))
    finally:
        hetero.set_log_level("WARNING")
    lines = [r.getMessage() for r in caplog.records if "-> d" in r.getMessage()]
    assert lines and "step" in lines[0] and "by tail_budget" in lines[0]
    assert "expected delay" in lines[0] and "next best: d1" in lines[0]


def test_an_emulated_device_busy_with_tasks_reports_its_busy_time_as_utilization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HETERO_STATUS_DIR", str(tmp_path))
    work = hetero.task(cost=0.02)(lambda x: x)  # 20 ms each: the worker sleeps, busy all along
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        list(ctx.map(work, range(130), batch_size=1, progress=False))  # ~2.6 s of work
        (status,) = [s for s in read_statuses(tmp_path) if s["pid"] == os.getpid()]
    (device,) = status["devices"]
    assert device["utilization"] is not None and device["utilization"] > 70
