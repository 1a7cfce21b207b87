"""The engine under faults that Python code cannot answer: a task stuck in C code holding the GIL
past its timeout, a driver killed with SIGKILL, a task whose child processes take the memory,
and a status directory that another user could have made (issue 21, points 8 to 11); processes a
task started, daemons included, that would outlive the context or a killed driver."""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import hetero
from hetero.errors import HeteroError, TaskFailed
from hetero.runtime.device_probe import sample_device
from hetero.runtime.serialize import segment_dir
from hetero.runtime.status import StatusWriter, read_statuses
from hetero.testing import emulated_fleet
from tests.processes import gone, wait_for

ROOT = Path(__file__).parents[2]


def hold_the_gil(seconds: int) -> None:
    """Sleep in C without releasing the GIL (``PyDLL`` keeps it): no other thread of the worker
    runs meanwhile, as with a long C extension call or a catastrophic regex."""
    ctypes.PyDLL(None).sleep(seconds)


# --- point 8: a timed-out task is stopped -----------------------------------------------------


def test_a_task_stuck_in_c_past_its_timeout_is_killed_and_the_tasks_behind_it_run() -> None:
    stuck = hetero.task(timeout=0.5, retries=0)(hold_the_gil)
    with hetero.Context(devices=emulated_fleet([1.0])).start() as ctx:  # one worker: nowhere else
        (worker,) = ctx.backend.pids()
        assert worker is not None
        doomed = ctx.submit(stuck, 30)
        behind = [ctx.submit(os.getpid) for _ in range(5)]  # the first is prefetched behind it
        with pytest.raises(TaskFailed, match=r"timed out after 0\.5s"):
            doomed.result(timeout=10)
        t0 = time.monotonic()
        wait_for(lambda: gone(worker), timeout=5)  # killed after the grace period
        assert time.monotonic() - t0 < 3
        pids = [f.result(timeout=10) for f in behind]
        assert worker not in pids and len(set(pids)) == 1  # all on the one restarted worker
        assert ctx.stats["failed"] == 1 and ctx.stats["done"] == 5
        assert ctx.stats["retried"] == 0  # the orders lost with the worker were not charged
        ctx.dispatcher.validate_state()


def test_no_task_is_sent_to_a_worker_being_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A grace period longer than a loaded machine takes to wake this thread after the timeout,
    # so that the tasks below are submitted while the worker is still being stopped.
    monkeypatch.setattr(hetero.runtime.local, "STOP_GRACE_S", 4.0)
    # A second to be holding the GIL when its timeout comes: a worker told to stop a task that
    # has not reached the C call yet ends itself at once, and there would be no grace period.
    stuck = hetero.task(timeout=1.0, retries=0, devices=["d0"])(hold_the_gil)
    on_d0 = hetero.task(devices=["d0"])(os.getpid)
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])).start() as ctx:
        old = ctx.run(on_d0)  # the worker warm, its first order behind it
        assert old == ctx.backend.pids()[0]
        doomed = ctx.submit(stuck, 30)
        with pytest.raises(TaskFailed, match="timed out"):
            doomed.result(timeout=10)
        assert not gone(old)  # still in its grace period: its slot is not free yet
        with ctx.profile("stop", tmp_path) as p:
            later = [ctx.submit(on_d0) for _ in range(4)]
            pids = [f.result(timeout=10) for f in later]
        assert gone(old) and old not in pids
        ids = {f.task_id for f in later}
        # Each ran once, on the new worker: none went to the old one only to be lost with it.
        assert [t.status for t in p.profile.traces if t.task_id in ids] == ["done"] * 4


# --- point 9: workers die with their driver; its shared memory is reclaimed ---------------------

DRIVER = textwrap.dedent(
    """
    import ctypes, sys, time, numpy, hetero
    from hetero.testing import emulated_fleet
    def hold_the_gil(seconds):
        ctypes.PyDLL(None).sleep(seconds)
    def big(n):
        return numpy.ones(n)
    ctx = hetero.Context(devices=emulated_fleet([1.0, 1.0])).start()
    kept = [ctx.run(big, 1 << 18) for _ in range(3)]  # 2 MiB results, held in shared memory
    fs = [ctx.submit(hetero.task(devices=[d])(hold_the_gil), 60) for d in ("d0", "d1")]
    time.sleep(0.5)  # both workers are in the C call now
    print(*ctx.backend.pids(), flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def killed_driver() -> Iterator[tuple[int, list[int]]]:
    """A driver whose two workers hold the GIL, killed with SIGKILL: ``(its pid, the workers)``."""
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert driver.stdout is not None and driver.stderr is not None
        line = driver.stdout.readline()
        workers = [int(p) for p in line.split()]
        assert len(workers) == 2, driver.stderr.read()
        driver.kill()
        driver.wait(timeout=10)
        yield driver.pid, workers
        for pid in workers:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()


def test_workers_stuck_in_c_die_with_a_killed_driver(killed_driver: tuple[int, list[int]]) -> None:
    _, workers = killed_driver
    wait_for(lambda: all(gone(p) for p in workers), timeout=3)


def test_the_next_start_reclaims_the_shared_memory_of_a_killed_driver(
    killed_driver: tuple[int, list[int]],
) -> None:
    pid, _ = killed_driver
    left = list(segment_dir().glob(f"hetero-{pid}-*"))
    assert left  # the results it held: nobody was left to remove them
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        ctx.run(os.getpid)
    assert not [p for p in left if p.exists()]


# --- point 10: the memory limit covers a task's child processes ---------------------------------

CHILD = "import time; block = b'x' * (400 << 20); time.sleep(8)"


def spawn_hungry_child(marker: str) -> int:
    """Start a child process that holds 400 MB for 8 s, and wait for it."""
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    Path(marker).write_text(str(child.pid))
    return child.wait()


def test_a_task_whose_child_process_goes_over_the_memory_limit_fails_and_the_child_dies(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "child"
    task = hetero.task(retries=0)(spawn_hungry_child)
    with hetero.Context(devices=emulated_fleet([1.0], memory="200MB")) as ctx:
        f = ctx.submit(task, str(marker))
        with pytest.raises(TaskFailed, match=r"exceeded the device.s limit 0\.20 GB"):
            f.result(timeout=7)
        wait_for(marker.exists)
        child = int(marker.read_text())
        wait_for(lambda: gone(child), timeout=3)


def test_an_emulated_device_counts_the_memory_of_its_workers_children() -> None:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {CHILD!r}])",
        ]
    )
    try:
        wait_for(lambda: len(psutil.Process(parent.pid).children()) == 1)
        device = emulated_fleet([1.0])[0]
        wait_for(lambda: (sample_device(device, parent.pid).memory_used or 0) > 400 << 20)
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()


# --- nothing a task started outlives its context, or a killed driver ----------------------------

DAEMON = textwrap.dedent(
    """
    import os, signal, sys, time
    if os.fork() == 0:  # a daemon: fork, a session of its own, fork again, and the parent ends
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(sys.argv[1] + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(sys.argv[1] + ".tmp", sys.argv[1])
            time.sleep(60)
        os._exit(0)
    os.wait()
    """
)
V1_CPU = Path("/sys/fs/cgroup/cpu")
#: Where a test's workers get their cgroups: the hierarchy hetero finds, v1's cpu controller
#: (this machine's kind), none.
CGROUPS = [
    pytest.param(True, id="found"),
    pytest.param(V1_CPU, id="v1-cpu"),
    pytest.param(False, id="none"),
]


def start_a_daemon(marker: str) -> None:
    """Start a process that leaves this one's tree and session as a daemon does and ignores
    SIGTERM; it writes its pid to ``marker``."""
    subprocess.run([sys.executable, "-c", DAEMON, marker], check=True, stdout=subprocess.DEVNULL)


def usable(cgroups: bool | Path) -> None:
    """Skip where ``cgroups`` cannot be had here."""
    from hetero.runtime.cgroups import writable_root

    if cgroups is True and writable_root() is None:
        pytest.skip("no cgroup hierarchy is writable here")
    if isinstance(cgroups, Path) and not os.access(cgroups, os.W_OK):
        pytest.skip(f"{cgroups} is not writable here")
    if cgroups is False and not sys.platform.startswith("linux"):
        pytest.skip("without a cgroup, only Linux keeps a daemon (PR_SET_CHILD_SUBREAPER)")


def read_pid(marker: Path) -> int:
    wait_for(marker.exists)
    return int(marker.read_text())


@pytest.mark.parametrize("cgroups", CGROUPS)
def test_a_daemon_a_task_started_does_not_outlive_the_context(
    tmp_path: Path, cgroups: bool | Path
) -> None:
    from hetero.runtime.local import LocalBackend

    usable(cgroups)
    marker = tmp_path / "daemon"
    backend = LocalBackend() if cgroups is True else LocalBackend(cgroups=cgroups)
    with hetero.Context(devices=emulated_fleet([1.0]), backend=backend) as ctx:
        ctx.run(start_a_daemon, str(marker))
        daemon = read_pid(marker)
        (worker,) = ctx.backend.pids()
        if cgroups is False:  # adopted by its worker rather than by init
            wait_for(lambda: psutil.Process(daemon).ppid() == worker)
    try:
        wait_for(lambda: gone(daemon), timeout=5)
    finally:
        if not gone(daemon):
            os.kill(daemon, signal.SIGKILL)


ORPHANS_DRIVER = textwrap.dedent(
    """
    import subprocess, sys, time, hetero
    from pathlib import Path
    from hetero.runtime.local import LocalBackend
    from hetero.testing import emulated_fleet
    cgroups, daemon, marker = sys.argv[1], sys.argv[2], sys.argv[3]  # "True", "False" or a path
    def start(marker):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        subprocess.run([sys.executable, "-c", daemon, marker], check=True)
        return child.pid
    options = {} if cgroups == "True" else {"cgroups": cgroups != "False" and Path(cgroups)}
    ctx = hetero.Context(devices=emulated_fleet([1.0]), backend=LocalBackend(**options))
    print(ctx.run(start, marker), *ctx.backend.pids(), flush=True)
    time.sleep(60)  # killed meanwhile
    """
)


@pytest.mark.parametrize("cgroups", CGROUPS)
def test_what_a_task_started_dies_with_a_killed_driver(
    tmp_path: Path, cgroups: bool | Path
) -> None:
    """The worker dies with its driver (the kernel kills it), and the processes its task started
    with it (the fence's sentinel kills them): all of them in a cgroup; without one, those
    still in the worker's session (a daemon, which left it, is out of reach)."""
    usable(cgroups)
    marker = tmp_path / "daemon"
    driver = subprocess.Popen(
        [sys.executable, "-c", ORPHANS_DRIVER, str(cgroups), DAEMON, str(marker)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    left: list[int] = []
    try:
        assert driver.stdout is not None
        child, worker = (int(p) for p in driver.stdout.readline().split())
        left += [child, read_pid(marker)]
        driver.kill()
        driver.wait(timeout=10)
        wait_for(lambda: gone(worker) and gone(child), timeout=5)
        if cgroups is not False:
            wait_for(lambda: gone(left[1]), timeout=5)
    finally:
        driver.kill()
        driver.wait()
        for pid in left:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


# --- point 11: the status directory is private ---------------------------------------------------


def foreign_dir(tmp_path: Path) -> Path:
    """A directory this user does not own (made and given away when running as root)."""
    if os.getuid() != 0:
        return Path("/")
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 65534, 65534)
    return path


def test_a_status_directory_owned_by_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    theirs = foreign_dir(tmp_path)
    monkeypatch.setenv("HETERO_STATUS_DIR", str(theirs))
    with pytest.raises(
        HeteroError, match=rf"{re.escape(str(theirs))} is owned by .*uid {theirs.stat().st_uid}"
    ):
        StatusWriter().write({})  # type: ignore[typeddict-item]
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert read_statuses() == []
    assert f"{theirs}" in caplog.text and "not reading" in caplog.text


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_a_status_directory_others_may_write_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    monkeypatch.setenv("HETERO_STATUS_DIR", str(shared))
    with pytest.raises(
        HeteroError, match=rf"{re.escape(str(shared))} has mode {mode:o}.*expected .* mode 0700"
    ):
        StatusWriter().write({})  # type: ignore[typeddict-item]
    assert list(shared.iterdir()) == []


def test_the_status_directory_is_made_0700_under_xdg_runtime_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HETERO_STATUS_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    writer = StatusWriter()
    assert writer.path.parent == tmp_path / "hetero"
    writer.write({"pid": os.getpid(), "started": 0, "updated": time.time()})  # type: ignore[typeddict-item]
    assert (tmp_path / "hetero").stat().st_mode & 0o777 == 0o700
    writer.close()


def test_a_context_runs_without_publishing_into_a_refused_status_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("HETERO_STATUS_DIR", str(shared))
    with (
        caplog.at_level(logging.WARNING, logger="hetero"),
        hetero.Context(devices=emulated_fleet([1.0])) as ctx,
    ):
        assert ctx.run(os.getpid) != os.getpid()
    assert list(shared.iterdir()) == []
    assert len([r for r in caplog.records if str(shared) in r.getMessage()]) == 1  # said once


class Quiet:
    """Backend events nobody listens to: no worker is started here."""

    def replies(self, device: int, messages: list[tuple[object, ...]]) -> None: ...
    def worker_lost(self, device: int, reason: str) -> None: ...
    def device_gone(self, device: int, reason: str) -> None: ...


def test_many_more_devices_than_cores_warn_with_the_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hetero.runtime.local import LocalBackend

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for count, warned in ((8, False), (30, True)):
        caplog.clear()
        backend = LocalBackend()
        with caplog.at_level(logging.WARNING, logger="hetero.runtime"):
            backend.start(emulated_fleet([1.0] * count), Quiet())
        backend.close()
        text = caplog.text
        assert (
            f"{count} devices start up to {count} worker processes on 2 CPU cores" in text
        ) is warned
