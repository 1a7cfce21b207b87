"""Failures on real worker processes: killed workers, timeouts, checkpoints, unhealthy devices,
shutdown with work in flight, Ctrl-C and a dying driver."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import hetero
import hetero.runtime.events
from hetero.errors import TaskFailed
from hetero.sched.health import CircuitState, Hold
from hetero.testing import emulated_fleet
from tests.processes import interruptible, wait_for
from tests.runtime.checkpointed import steps_with_checkpoints


def test_a_killed_worker_is_detected_and_the_task_resumes_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pid"
    task = hetero.task(retries=2)(steps_with_checkpoints)
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        f = ctx.submit(task, 10, str(marker))
        wait_for(marker.exists)
        victim = int(marker.read_text())
        first_device = ctx.dispatcher.records[f.task_id].device
        os.kill(victim, signal.SIGKILL)
        start, ran, pid = f.result(timeout=30)
        assert start == 5  # resumed from the checkpoint of step 5, not from the start
        assert ran == list(range(10))  # every step ran exactly once
        assert pid != victim
        # Retried on the other device, which was free.
        assert f.device == ctx.devices[1 - first_device].id
        assert ctx.stats["done"] == 1 and ctx.stats["retried"] == 1
        # The killed device's worker comes back for later work.
        assert ctx.run(hetero.task(devices=[ctx.devices[first_device].id])(os.getpid)) != victim
        ctx.dispatcher.validate_state()


def sleepy(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_a_task_that_times_out_fails_and_others_still_finish_once() -> None:
    slow = hetero.task(timeout=0.3, name="slow")(sleepy)
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        doomed = ctx.submit(slow, 30)
        later = [ctx.submit(sleepy, 0.01) for _ in range(5)]
        with pytest.raises(TaskFailed, match=r"timed out after 0\.3s"):
            doomed.result(timeout=30)
        assert [f.result(timeout=30) for f in later] == [0.01] * 5
        assert ctx.stats["done"] == 5 and ctx.stats["failed"] == 1
        ctx.dispatcher.validate_state()


def die_on(device_id: str) -> str:
    dev = hetero.get_current_device()
    if dev.id == device_id:
        os.kill(os.getpid(), signal.SIGKILL)
    return dev.id


def test_a_device_that_keeps_losing_its_worker_is_marked_down_and_its_work_moves() -> None:
    task = hetero.task(retries=5, cost=0.01)(die_on)
    with hetero.Context(
        devices=emulated_fleet([4.0, 1.0])
    ) as ctx:  # d0 is the one the policy likes
        futures = [ctx.submit(task, "d0") for _ in range(20)]
        assert [f.result(timeout=60) for f in futures] == ["d1"] * 20
        assert not ctx.dispatcher.view.usable[0]
        status = ctx.status()
        assert [d["healthy"] for d in status["devices"]] == [False, True]


def test_a_device_whose_circuit_opened_is_on_trial_after_its_cooldown_and_closes_on_success(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hetero.runtime.events, "RECOVERY_COOLDOWN_S", 2.0)
    task = hetero.task(retries=5, cost=0.01)(die_on)
    with hetero.Context(devices=emulated_fleet([4.0, 1.0])) as ctx:
        breaker = ctx._engine.books.breakers[0]
        # Rounds until three lost workers open d0's circuit: how many tasks one loss takes with
        # it, and how many the retries place on d1 meanwhile, depends on the machine's load.
        for _ in range(10):
            futures = [ctx.submit(task, "d0") for _ in range(6)]
            assert [f.result(timeout=60) for f in futures] == ["d1"] * 6
            if breaker.state is not CircuitState.CLOSED:
                break
        # Open, or already half-open if the cooldown passed meanwhile: never closed by itself.
        assert breaker.state is not CircuitState.CLOSED
        wait_for(lambda: ctx.dispatcher.view.usable[0], timeout=30)  # half-open: on trial
        assert Hold.CIRCUIT_OPEN not in ctx.dispatcher.holds("d0")
        on_d0 = hetero.task(devices="d0", cost=0.01)(die_on)
        assert ctx.run(on_d0, "nowhere") == "d0"
        assert ctx._engine.books.breakers[0].state is CircuitState.CLOSED


def test_the_last_device_in_service_keeps_its_circuit_closed() -> None:
    task = hetero.task(retries=4)(die_on)
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        with pytest.raises(TaskFailed, match="after 5 attempts"):
            ctx.submit(task, "d0").result(timeout=60)
        assert ctx.dispatcher.view.usable[0]
        assert ctx.run(hetero.task(cost=0.01)(die_on), "nowhere") == "d0"


def test_a_task_that_always_kills_its_worker_fails_with_the_reason() -> None:
    task = hetero.task(retries=1)(die_on)
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        f = ctx.submit(task, "d0")
        with pytest.raises(TaskFailed, match="worker of d0 was killed by SIGKILL after 2 attempts"):
            f.result(timeout=60)


def test_close_without_waiting_cancels_work_in_flight_and_ends_every_worker() -> None:
    ctx = hetero.Context(devices=emulated_fleet([1.0, 1.0]))
    futures = [ctx.submit(sleepy, 5) for _ in range(6)]
    wait_for(lambda: any(p is not None for p in ctx.backend.pids()))
    pids = [p for p in ctx.backend.pids() if p is not None]
    t0 = time.monotonic()
    ctx.close(wait=False)
    assert time.monotonic() - t0 < 5
    assert all(f.cancelled() for f in futures)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)


def test_with_block_waits_for_submitted_tasks_on_a_clean_exit() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        futures = [ctx.submit(sleepy, 0.05) for _ in range(4)]
    assert [f.result(timeout=0) for f in futures] == [0.05] * 4


DRIVER = textwrap.dedent(
    """
    import sys, time, hetero
    from hetero.testing import emulated_fleet
    def sleepy(s):
        time.sleep(s)
    ctx = hetero.Context(devices=emulated_fleet([1.0, 1.0]))
    with ctx:
        fs = [ctx.submit(sleepy, 60) for _ in range(4)]
        while not all(ctx.backend.pids()):
            time.sleep(0.01)
        print(*ctx.backend.pids(), flush=True)
        fs[0].result()
    """
)


def start_driver(code: str) -> subprocess.Popen[str]:
    """``code`` run by a Python of its own from the repository, as a user's script is."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
        preexec_fn=interruptible,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_no_worker_outlives_a_driver_stopped_by_ctrl_c_or_killed(sig: signal.Signals) -> None:
    driver = start_driver(DRIVER)
    try:
        line = driver.stdout.readline() if driver.stdout else ""
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, driver.stderr.read() if driver.stderr else ""
        driver.send_signal(sig)
        driver.wait(timeout=30)
        wait_for(lambda: not any(psutil.pid_exists(p) for p in pids), timeout=15)
        if sig == signal.SIGINT:
            # One line for the whole context; the program ends as Ctrl-C ends any.
            err = driver.stderr.read() if driver.stderr else ""
            assert err == "interrupted: 0 of 4 tasks finished, 4 cancelled\n"
            assert driver.returncode == -signal.SIGINT
    finally:
        driver.kill()


MAP_DRIVER = textwrap.dedent(
    """
    import os, time, hetero
    from hetero.testing import emulated_fleet
    def item(x):
        if x >= 6:  # the first six finish; the others run until they are stopped
            os.write(1, b"running\\n")  # one write: the workers share the pipe
            time.sleep(60)
        return x
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        results = list(ctx.map(item, range(40), batch_size=1, progress=False))
    """
)


def test_ctrl_c_during_a_map_says_in_one_line_what_finished_and_what_was_cancelled() -> None:
    driver = start_driver(MAP_DRIVER)
    try:
        assert driver.stdout is not None
        assert driver.stdout.readline() == "running\n"  # an item of the map runs
        driver.send_signal(signal.SIGINT)
        _, err = driver.communicate(timeout=30)
    finally:
        driver.kill()
        driver.wait()
    assert driver.returncode == -signal.SIGINT  # as Ctrl-C ends any program: status 130 in a shell
    match = re.fullmatch(r"interrupted: (\d+) of 40 items finished, (\d+) cancelled\n", err)
    assert match is not None, err  # that one line, no traceback
    finished, cancelled = int(match[1]), int(match[2])
    assert finished <= 6 and finished + cancelled == 40


def test_cancelling_futures_stops_those_tasks_and_no_other_future_hangs() -> None:
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        futures = [ctx.submit(sleepy, 0.002) for _ in range(200)]
        for f in futures[1::2]:
            f.cancel()
        kept = futures[::2]
        assert [f.result(timeout=60) for f in kept] == [0.002] * len(kept)
        assert all(f.cancelled() or f.done() for f in futures[1::2])
        running = ctx.submit(sleepy, 30)
        wait_for(lambda: ctx.stats["done"] >= len(kept) and any(ctx.backend.pids()))
        time.sleep(0.2)
        assert running.cancel() and running.cancelled()
        assert ctx.run(sleepy, 0.01) == 0.01  # the stopped device's worker came back
    assert ctx.stats["submitted"] == 202
    assert ctx.stats["done"] + ctx.stats["cancelled"] == 202


def test_closing_a_map_early_cancels_its_batches() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        it = ctx.map(sleepy, [0.01] * 100, batch_size=1, window=10, progress=False)
        assert next(it) == 0.01
        it.close()
        assert ctx.run(sleepy, 0.0) == 0.0
    assert ctx.stats["done"] + ctx.stats["cancelled"] == ctx.stats["submitted"]


def test_map_runs_the_variant_of_each_device_kind_per_item() -> None:
    @hetero.task(variants={"gpu": lambda x: ("gpu", x), "cpu": lambda x: ("cpu", x)})
    def which(x: int) -> tuple[str, int]:
        return ("default", x)

    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        assert list(ctx.map(which, range(7), batch_size=3)) == [("gpu", x) for x in range(7)]


def test_stopping_a_timed_out_task_costs_the_order_behind_it_no_attempt() -> None:
    slow = hetero.task(timeout=0.3)(sleepy)
    fragile = hetero.task(retries=0)(sleepy)
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:  # one worker: the next order waits
        doomed = ctx.submit(slow, 30)  # in its inbox (prefetch) while this one runs
        behind = ctx.submit(fragile, 0.01)
        with pytest.raises(TaskFailed, match="timed out"):
            doomed.result(timeout=30)
        assert behind.result(timeout=30) == 0.01


def test_retries_are_counted_once_and_the_last_attempt_is_traced_failed(tmp_path: Path) -> None:
    task = hetero.task(retries=1, retry_exceptions=True)(boom)
    with (
        hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx,
        ctx.profile("r", tmp_path) as p,
        pytest.raises(TaskFailed, match="after 2 attempts"),
    ):
        ctx.run(task, 3)
    assert ctx.stats["retried"] == 1 and ctx.stats["failed"] == 1
    assert [t.status for t in p.profile.traces] == ["retried", "failed"]


def boom(x: int) -> int:
    raise ValueError(f"bad value {x}")


def test_workers_started_from_a_thread_that_ends_live_on() -> None:
    import threading

    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        first: list[int] = []
        t = threading.Thread(target=lambda: first.append(ctx.run(os.getpid)))
        t.start()
        t.join()
        time.sleep(0.2)
        assert ctx.run(os.getpid) == first[0]  # the same worker, not a restarted one
