from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hetero.runtime.status import StatusWriter, read_statuses, status_dir
from tests.runtime.status_snapshots import snapshot


@pytest.fixture
def status_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETERO_STATUS_DIR", str(tmp_path / "status"))
    return tmp_path / "status"


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_dir_precedence() -> None:
    assert status_dir({"HETERO_STATUS_DIR": "/a", "XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/a")
    assert status_dir({"XDG_RUNTIME_DIR": "/run/user/7"}) == Path("/run/user/7/hetero")
    assert status_dir({"HETERO_STATUS_DIR": ""}) == Path(f"/tmp/hetero-{os.getuid()}")


def test_write_read_close_round_trip(status_home: Path) -> None:
    writer = StatusWriter()
    assert writer.path == status_home / f"{os.getpid()}.json"
    first = snapshot(os.getpid())
    writer.write(first)
    assert read_statuses() == [first]
    assert stat.S_IMODE(status_home.stat().st_mode) == 0o700
    second = snapshot(os.getpid(), started=first["started"])
    second["tasks"]["done"] = 2
    writer.write(second)
    assert read_statuses() == [second]
    assert [p.name for p in status_home.iterdir()] == [f"{os.getpid()}.json"]  # no temp left
    writer.close()
    assert read_statuses() == [] and not writer.path.exists()
    writer.close()  # closing twice is harmless


def test_statuses_oldest_first(tmp_path: Path) -> None:
    # Two live processes: this one and its parent.
    old, new = snapshot(os.getppid(), started=1.0), snapshot(os.getpid(), started=2.0)
    StatusWriter(tmp_path / f"{os.getpid()}.json").write(new)
    StatusWriter(tmp_path / f"{os.getppid()}.json").write(old)
    assert [s["pid"] for s in read_statuses(tmp_path)] == [os.getppid(), os.getpid()]


def test_status_of_an_exited_process_is_dropped_and_deleted(status_home: Path) -> None:
    pid = dead_pid()
    stale = StatusWriter(status_home / f"{pid}.json")
    stale.write(snapshot(pid))
    StatusWriter().write(snapshot(os.getpid()))
    assert [s["pid"] for s in read_statuses()] == [os.getpid()]
    assert not stale.path.exists()


def test_status_of_a_reused_pid_is_dropped(status_home: Path) -> None:
    # Last updated long before this process started: its pid belonged to another process.
    old = snapshot(os.getpid(), started=1000.0)
    old["updated"] = 2000.0
    StatusWriter().write(old)
    assert read_statuses() == []
    assert not (status_home / f"{os.getpid()}.json").exists()


def test_invalid_files_are_skipped(status_home: Path) -> None:
    status_home.mkdir()
    half = status_home / f"{os.getpid()}.json"
    half.write_text('{"pid": 1, "star')
    (status_home / f"{os.getppid()}.json").write_text(json.dumps({"pid": os.getppid()}))
    (status_home / "notes.json").write_text("{}")
    (status_home / f"{dead_pid()}.txt").write_text("not a status file")
    assert read_statuses() == []
    assert half.exists()  # its process is alive: it may still write it whole
    half.write_text(json.dumps(snapshot(os.getpid())))
    assert [s["pid"] for s in read_statuses()] == [os.getpid()]


def test_missing_directory_reads_as_no_statuses(tmp_path: Path) -> None:
    assert read_statuses(tmp_path / "absent") == []
