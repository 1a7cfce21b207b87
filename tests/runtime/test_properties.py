"""Whatever workers are killed and when, every submitted task ends exactly once."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hetero
from hetero.errors import TaskFailed
from hetero.testing import emulated_fleet


def counted(i: int, seconds: float, log: str) -> int:
    """Appends its index to ``log`` when it completes (an attempt killed mid-way does not)."""
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{i}\n")
    return i


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    durations=st.lists(st.sampled_from([0.0, 0.005, 0.02]), min_size=5, max_size=25),
    kills=st.lists(st.tuples(st.floats(0.0, 0.15), st.integers(0, 2)), min_size=0, max_size=4),
    retries=st.integers(0, 3),
)
def test_every_task_ends_exactly_once_under_random_kills(
    tmp_path_factory, durations: list[float], kills: list[tuple[float, int]], retries: int
) -> None:
    log = tmp_path_factory.mktemp("log") / "done"
    task = hetero.task(retries=retries)(counted)
    with hetero.Context(devices=emulated_fleet([1.0, 1.0, 1.0])) as ctx:
        futures = [ctx.submit(task, i, s, str(log)) for i, s in enumerate(durations)]
        start = time.monotonic()
        for at, device in sorted(kills):
            time.sleep(max(0.0, start + at - time.monotonic()))
            pid = ctx.backend.pids()[device]
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        outcomes = {}
        for i, f in enumerate(futures):
            try:
                outcomes[i] = f.result(timeout=60)
            except TaskFailed as exc:
                outcomes[i] = exc
        ctx.dispatcher.validate_state()
        assert ctx.dispatcher.active == 0 and not ctx.dispatcher.records  # nothing in limbo
        stats = dict(ctx.stats)
    assert len(outcomes) == len(durations)
    done = [i for i, o in outcomes.items() if not isinstance(o, TaskFailed)]
    assert all(outcomes[i] == i for i in done)
    assert stats["done"] == len(done) and stats["failed"] == len(durations) - len(done)
    assert stats["submitted"] == len(durations) and stats["cancelled"] == 0
    # A task's function may have completed more than once only if its reply was lost with a
    # killed worker; every task reported done completed at least once.
    finished = [int(x) for x in Path(log).read_text().split()] if Path(log).exists() else []
    assert set(done) <= set(finished)
    failures = [o for o in outcomes.values() if isinstance(o, TaskFailed)]
    assert all("killed by SIGKILL" in str(o) for o in failures)
