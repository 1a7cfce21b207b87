from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from hetero.commands.top import _watch, register
from hetero.runtime.status import StatusWriter, status_dir
from tests.cli_apps import command_app
from tests.processes import interruptible, wait_for
from tests.rendering import assert_whole, flat, headers
from tests.runtime.status_snapshots import snapshot

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "mixed_fleet.yaml"

app = command_app(register)


runner = CliRunner()


@pytest.fixture
def status_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETERO_STATUS_DIR", str(tmp_path / "status"))
    return tmp_path / "status"


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["top", *args], env={"COLUMNS": "80"})
    return result.exit_code, result.stdout, result.stderr


def publish(pid: int, started: float = 0.0, config: str | None = None) -> StatusWriter:
    """Write the status file of a Context in process ``pid`` (a live one: this or its parent)."""
    writer = StatusWriter(status_dir() / f"{pid}.json")
    status = snapshot(pid, started=started or time.time(), config=config)
    status["devices"].append({**status["devices"][0], "id": "v100-32gb:0", "model": "V100-32GB"})
    writer.write(status)
    return writer


def test_once_shows_the_running_context(status_home: Path) -> None:
    publish(os.getpid(), config=str(EXAMPLE))
    code, out, _ = invoke("--once")
    assert code == 0, out
    assert f"hetero Context {os.getpid()}" in out and str(EXAMPLE) in flat(out)
    assert "tasks: 3 submitted, 1 done, 0 failed, 1 running, 1 waiting" in out
    assert_whole(out, 80, ["a100-80gb:0", "v100-32gb:0", "240 / 250", "55%"])
    # One table: the columns that do not fit at 80 are left out, and named under it.
    shown = ["id", "model", "health", "speed", "run", "queue", "done", "util"]
    assert headers(out) == [shown]
    assert "not shown at 80 columns: fail, memory, temp" in flat(out)


def test_pid_picks_a_context_and_the_newest_is_the_default(status_home: Path) -> None:
    publish(os.getppid(), started=1.0)
    publish(os.getpid(), started=2.0)
    assert f"hetero Context {os.getpid()}" in invoke("--once")[1]
    assert f"hetero Context {os.getppid()}" in invoke("--once", "--pid", str(os.getppid()))[1]


def test_unknown_pid_is_a_usage_error(status_home: Path) -> None:
    publish(os.getpid())
    code, _, err = invoke("--once", "--pid", "999999999")
    assert code == 2
    assert "--pid 999999999: no running hetero Context" in err and str(os.getpid()) in err


def test_snapshot_of_a_config_when_no_context_runs(status_home: Path) -> None:
    code, out, _ = invoke("--once", "--config", str(EXAMPLE))
    assert code == 0, out
    assert f"no running hetero Context found; showing a snapshot of {EXAMPLE}" in flat(out)
    ids = ["a100-80gb:0", "a100-80gb:1", "v100-32gb:0", "v100-32gb:1", "cpu:0"]
    assert_whole(out, 80, [*ids, "— / 80 GiB", "5 devices"])


def test_snapshot_of_this_machine_without_config(status_home: Path) -> None:
    code, out, _ = invoke("--once")
    assert code == 0, out
    assert "no running hetero Context found; showing a snapshot of this machine" in flat(out)
    assert "cpu:0" in out


def test_config_picks_the_context_running_it(status_home: Path, tmp_path: Path) -> None:
    publish(os.getpid(), config=str(tmp_path / "other.yaml"))
    code, out, _ = invoke("--once", "--config", str(EXAMPLE))
    assert code == 0 and "showing a snapshot of" in out
    assert f"other Contexts are running (watch one with --pid): {os.getpid()}" in flat(out)
    publish(os.getpid(), config=str(EXAMPLE))
    relative = os.path.relpath(EXAMPLE)
    assert f"hetero Context {os.getpid()}" in invoke("--once", "--config", relative)[1]


@pytest.mark.parametrize("interval", ["0", "-1", "nan"])
def test_bad_interval_is_a_usage_error(status_home: Path, interval: str) -> None:
    code, _, err = invoke("--once", "--interval", interval)
    assert code == 2 and "--interval must be a positive number of seconds" in err


def test_bad_config_is_a_usage_error(status_home: Path, tmp_path: Path) -> None:
    code, _, err = invoke("--once", "--config", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read config" in err and "nope.yaml" in err


def test_live_view_follows_the_context_until_it_ends(status_home: Path) -> None:
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=80)
    writer = publish(os.getpid())

    def context() -> None:
        wait_for(lambda: "a100-80gb:0" in out.getvalue())
        later = snapshot(os.getpid())
        later["tasks"]["done"] = 7321
        writer.write(later)
        wait_for(lambda: "7,321 done" in out.getvalue())
        writer.close()

    thread = threading.Thread(target=context)
    thread.start()
    _watch(terminal, os.getpid(), interval=0.01)
    thread.join()
    assert out.getvalue().rstrip().endswith(f"hetero Context {os.getpid()} has ended")


def test_ctrl_c_leaves_cleanly(status_home: Path) -> None:
    writer = publish(os.getpid())
    # TTY_COMPATIBLE makes rich treat the pipe as a terminal, so `top` runs its live view.
    env = {**os.environ, "TTY_COMPATIBLE": "1", "COLUMNS": "80"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetero", "top", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
        preexec_fn=interruptible,
    )
    try:
        assert proc.stdout is not None
        seen = b""
        deadline = time.monotonic() + 60
        while b"a100-80gb:0" not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, seen
            if select.select([proc.stdout], [], [], 0.1)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert b"Aborted" not in err and b"Traceback" not in err
    finally:
        proc.kill()
        proc.wait()
        writer.close()
