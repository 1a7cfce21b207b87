from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.errors import HeteroError
from hetero.telemetry import (
    PROFILE_DIR_ENV,
    PROFILE_NAME_ENV,
    DeviceInfo,
    Profile,
    TaskTrace,
)
from hetero.telemetry.report_html import MAX_ROWS, PLOT_W

runner = CliRunner()

DEVICES = [
    DeviceInfo("gpu:0", "A100-80GB", "gpu", 4.0, True),
    DeviceInfo("gpu:1", "V100-32GB", "gpu", 2.0, True),
    DeviceInfo("cpu:0", "CPU", "cpu", 2.0, False),
]
EVIL = "<script>alert(1)</script>"


def _trace(
    task_id: int,
    device: str,
    cost: float,
    submitted: float,
    started: float,
    ended: float,
    *,
    name: str = "step",
    attempt: int = 1,
    status: str = "done",
    **extra: object,
) -> TaskTrace:
    fields: dict[str, object] = {"status": status}
    if status in ("failed", "retried"):
        fields["error"] = "boom"
    fields.update(extra)
    return TaskTrace(
        task_id, name, device, attempt, cost, submitted, submitted, started, ended, **fields
    )


def _run() -> Profile:
    """Three devices, Σ speed 8, a 10 s window from t=100; 48 units of work done.

    gpu:0 runs two tasks back to back (busy 8 s), gpu:1 one attempt that is retried and a task
    (busy 6 s), cpu:0 the retry and a zero-length task that fails (busy 4 s).
    """
    traces = [
        _trace(
            1,
            "gpu:0",
            16,
            100,
            101,
            105,
            transfer_in=0.25,
            transfer_out=0.25,
            bytes_in=1000,
            bytes_out=2000,
        ),
        _trace(2, "gpu:0", 16, 100, 105, 109, transfer_in=0.5, bytes_in=500),
        _trace(3, "gpu:1", 8, 100, 100, 102, name="retry-me", status="retried"),
        _trace(4, "gpu:1", 8, 102, 102, 106),
        _trace(3, "cpu:0", 8, 102, 103, 107, name="retry-me", attempt=2),
        _trace(5, "cpu:0", 4, 100, 107, 107, name=EVIL, status="failed"),
    ]
    return Profile(traces, list(DEVICES), started=100.0, ended=110.0, name="demo")


def test_summary_of_a_known_run() -> None:
    s = _run().summary()
    assert s.makespan == 10.0
    assert s.work == 48.0
    assert s.ideal_makespan == 6.0  # 48 units / 8 units per second
    assert s.efficiency == 0.6
    assert s.load_balance == pytest.approx(0.75)  # mean(8/8, 6/8, 4/8)
    assert (s.done, s.failed, s.retried, s.cancelled) == (4, 1, 1, 0)
    by_id = {d.id: d for d in s.devices}
    assert [d.id for d in s.devices] == ["gpu:0", "gpu:1", "cpu:0"]
    gpu0, gpu1, cpu0 = by_id["gpu:0"], by_id["gpu:1"], by_id["cpu:0"]
    assert (gpu0.tasks, gpu0.attempts, gpu0.busy, gpu0.utilization) == (2, 2, 8.0, 0.8)
    assert (gpu1.tasks, gpu1.attempts, gpu1.busy, gpu1.utilization) == (1, 2, 6.0, 0.6)
    assert (cpu0.tasks, cpu0.attempts, cpu0.busy, cpu0.utilization) == (1, 2, 4.0, 0.4)
    assert (gpu0.compute, gpu0.transfer, gpu0.wait) == (8.0, 1.0, 3.0)  # waits 1 s and 5 s
    assert (gpu1.compute, gpu1.transfer, gpu1.wait) == (6.0, 0.0, 0.0)
    assert (cpu0.compute, cpu0.transfer, cpu0.wait) == (4.0, 0.0, 4.0)  # waits 1 s and 7 s
    assert (gpu0.bytes_in, gpu0.bytes_out) == (1500, 2000)
    assert json.loads(json.dumps(s.to_dict()))["devices"][2]["id"] == "cpu:0"


def test_idle_unknown_and_overlapping_devices() -> None:
    idle = DeviceInfo("gpu:2", "T4", "gpu", 1.0, True)
    traces = [
        _trace(1, "gpu:0", 4, 0, 0, 4),
        _trace(2, "gpu:0", 4, 0, 2, 6),  # a second slot: overlaps the first, busy counts once
        _trace(3, "npu:9", 3, 0, 0, 3),  # a device the profile was not told about
    ]
    s = Profile(traces, [DEVICES[0], idle], started=0.0, ended=8.0).summary()
    by_id = {d.id: d for d in s.devices}
    assert [d.id for d in s.devices] == ["gpu:0", "gpu:2", "npu:9"]
    assert (by_id["gpu:0"].busy, by_id["gpu:0"].compute, by_id["gpu:0"].utilization) == (
        6.0,
        8.0,
        0.75,
    )
    assert (by_id["gpu:2"].attempts, by_id["gpu:2"].busy, by_id["gpu:2"].wait) == (0, 0.0, 0.0)
    assert (by_id["npu:9"].model, by_id["npu:9"].speed) == ("unknown", 0.0)
    assert s.ideal_makespan == 11 / 5  # the unknown device adds no speed
    assert s.load_balance == pytest.approx(0.5)  # mean(6/6, 0/6, 3/6): the idle gpu:2 counts


def test_empty_and_degenerate_profiles() -> None:
    empty = Profile([], list(DEVICES), started=5.0, ended=5.0).summary()
    assert (empty.makespan, empty.ideal_makespan, empty.efficiency) == (0.0, 0.0, None)
    assert empty.load_balance is None
    assert all(d.utilization == 0.0 and d.wait == 0.0 for d in empty.devices)
    assert Profile([], [], 0.0, 0.0).summary().ideal_makespan is None

    # Only zero-length tasks and an empty window: the makespan comes from the traces.
    zero = Profile([_trace(1, "gpu:0", 0, 3, 4, 4)], list(DEVICES), 7.0, 7.0).summary()
    assert zero.makespan == 1.0  # first submit (3) to last end (4)
    assert zero.load_balance is None  # no device was busy at all
    assert zero.efficiency == 0.0


def test_chrome_trace(tmp_path: Path) -> None:
    path = _run().write_chrome_trace(tmp_path / "t.trace.json")
    events = json.loads(path.read_text("utf-8"))["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads == {1: "gpu:0 A100-80GB", 2: "gpu:1 V100-32GB", 3: "cpu:0 CPU"}
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == 6
    first = complete[0]
    assert (first["tid"], first["ts"], first["dur"]) == (1, 1_000_000.0, 4_000_000.0)
    assert first["args"] == {
        "task_id": 1,
        "attempt": 1,
        "cost": 16,
        "status": "done",
        "bytes_in": 1000,
        "bytes_out": 2000,
        "queue_wait_s": 1,
        "transfer_in_s": 0.25,
        "transfer_out_s": 0.25,
    }
    retried = next(e for e in complete if e["args"]["status"] == "retried")
    assert retried["name"] == "retry-me [retried]" and retried["cname"] == "bad"
    assert (retried["tid"], retried["ts"], retried["args"]["error"]) == (2, 0.0, "boom")
    failed = next(e for e in complete if e["args"]["status"] == "failed")
    assert failed["dur"] == 0.0 and failed["cname"] == "terrible"
    running = [(e["ts"], e["args"]["attempts"]) for e in events if e["ph"] == "C"]
    assert running[:3] == [(0.0, 1), (1_000_000.0, 2), (2_000_000.0, 2)]
    assert running[-1] == (9_000_000.0, 0)


def test_html_report(tmp_path: Path) -> None:
    text = _run().write_html(tmp_path / "r.html").read_text("utf-8")
    assert "<svg" in text and ">ideal</text>" in text
    for device in ("gpu:0", "gpu:1", "cpu:0", "A100-80GB"):
        assert device in text
    assert EVIL not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # Attempts wide enough to see keep their own bar, even back to back.
    assert "(task 1, attempt 1, done)" in text and "(task 2, attempt 1, done)" in text
    assert "60.0%" in text and "0.75" in text  # efficiency and load balance
    assert "http" not in text.replace("http://www.w3.org/2000/svg", "")  # no network


def test_html_of_a_large_run_caps_what_it_draws(tmp_path: Path) -> None:
    devices = [DeviceInfo(f"gpu:{i}", "L4", "gpu", 1.0, True) for i in range(MAX_ROWS + 5)]
    # 100k attempts of 1 ms with 1 ms gaps on four devices, and a failure among them.
    traces = [
        _trace(i, f"gpu:{i % 4}", 1, 0, i // 4 * 0.002, i // 4 * 0.002 + 0.001)
        for i in range(100_000)
    ]
    traces[500].status = "failed"
    text = Profile(traces, devices, 0.0, 50.0).write_html(tmp_path / "big.html").read_text()
    timeline = text.split("<h2>Timeline</h2>")[1].split("<h2>Devices</h2>")[0]
    assert timeline.count("<rect") <= MAX_ROWS + 4 * 2 * (PLOT_W + 1)  # 2 statuses on 4 rows
    assert "(task 500, attempt 1, failed)" in timeline  # a lone failure keeps its own rect
    assert f"first {MAX_ROWS} of {MAX_ROWS + 5} devices" in text
    assert f"gpu:{MAX_ROWS + 4}" in text  # still in the table


def test_save_writes_both_files(tmp_path: Path) -> None:
    trace, report = _run().save(tmp_path / "a" / "b")
    assert (trace.name, report.name) == ("demo.trace.json", "demo.html")
    assert trace.parent == tmp_path / "a" / "b" and trace.is_file() and report.is_file()
    other = _run().save(tmp_path, name="other")[1]
    assert other == tmp_path / "other.html"
    assert "<title>hetero profile: other</title>" in other.read_text("utf-8")


def test_save_to_an_unwritable_place_names_it(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(HeteroError, match=f"cannot write the profile to {blocker / 'sub'}"):
        _run().save(blocker / "sub")
    with pytest.raises(HeteroError, match=str(blocker / "r.html")):
        _run().write_html(blocker / "r.html")


# The engine is not there yet: the scripts stand in for a Context saving its report.
_SCRIPT = """
import os, sys
from pathlib import Path
out = Path(os.environ["{dir_env}"])
out.mkdir(parents=True, exist_ok=True)
name = os.environ["{name_env}"]
(out / f"{{name}}.html").write_text("<html></html>")
(out / f"{{name}}.trace.json").write_text("{{}}")
print("argv", sys.argv[1:])
sys.exit(int(sys.argv[2]) if sys.argv[1:2] == ["--exit"] else None)
"""


def _script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    path = tmp_path / name
    path.write_text(
        textwrap.dedent(body).format(dir_env=PROFILE_DIR_ENV, name_env=PROFILE_NAME_ENV)
    )
    return path


def test_cli_profile_reports_where_the_report_is(tmp_path: Path) -> None:
    script = _script(tmp_path, _SCRIPT)
    out = tmp_path / "reports"
    result = runner.invoke(app, ["profile", "--out", str(out), str(script), "--epochs", "3"])
    assert result.exit_code == 0, result.output
    assert "argv ['--epochs', '3']" in result.stdout  # options after SCRIPT are the script's
    assert str(out / "job.html") in result.stdout
    assert str(out / "job.trace.json") in result.stdout
    assert PROFILE_DIR_ENV not in os.environ and PROFILE_NAME_ENV not in os.environ

    named = runner.invoke(
        app, ["profile", "--out", str(out), "--name", "n", str(script), "--exit", "4"]
    )
    assert named.exit_code == 4  # the script's exit status, after the report is listed
    assert str(out / "n.html") in named.stdout and "job.html" not in named.stdout


def test_cli_profile_without_a_context(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('no hetero here')\n")
    out = tmp_path / "reports"
    out.mkdir()
    (out / "job.html").write_text("an earlier run's")  # not this run's: not listed
    result = runner.invoke(app, ["profile", "--out", str(out), str(script)])
    assert result.exit_code == 0, result.output
    assert "created no hetero.Context" in result.stderr
    assert "job.html" not in result.stdout


def test_cli_profile_missing_script(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    result = runner.invoke(app, ["profile", str(missing)])
    assert result.exit_code == 2
    assert f"{missing}: no such script" in result.stderr
