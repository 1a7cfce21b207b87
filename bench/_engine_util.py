"""What bench_engine.py's figures share: summaries of repeated timings, emulated fleets, a fake
backend that answers every order in-process, and a local Ray session.

Task functions live in bench_engine.py itself: workers unpickle ``__main__`` functions by value,
but could not import this module (``bench/`` is not on their path).
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, wait
from typing import Any

import numpy as np

from hetero.config import HeteroConfig, parse_config
from hetero.devices.spec import Device
from hetero.runtime.backend import Backend, BackendEvents
from hetero.runtime.serialize import pack
from hetero.runtime.worker import TaskOrder, TaskReply

MODEL = "A100-80GB"  # the catalog model emulated devices carry; their speed is set explicitly


def summary(values: Sequence[float], digits: int = 1) -> dict[str, Any]:
    """Repeated measurements: each run, the median, min, max and spread ((max - min) / median)."""
    median = statistics.median(values)

    def r(v: float) -> float:
        return round(v, digits) if digits else round(v)

    return {
        "runs": [r(v) for v in values],
        "median": r(median),
        "min": r(min(values)),
        "max": r(max(values)),
        "spread": round((max(values) - min(values)) / median, 3) if median else None,
    }


def latency(seconds: Sequence[float]) -> dict[str, Any]:
    """Milliseconds of timed calls: median, p90, min, max and the count."""
    ms = np.asarray(seconds) * 1e3
    return {
        "median_ms": round(float(np.median(ms)), 3),
        "p90_ms": round(float(np.percentile(ms, 90)), 3),
        "min_ms": round(float(ms.min()), 3),
        "max_ms": round(float(ms.max()), 3),
        "samples": len(ms),
    }


def emulated_config(speeds: Sequence[float]) -> HeteroConfig:
    """A fleet of emulated devices ``d0``, ``d1``… with the given relative speeds."""
    return parse_config(
        {
            "devices": [
                {"type": "gpu", "model": MODEL, "emulate": True, "speed": s, "name": f"d{i}"}
                for i, s in enumerate(speeds)
            ]
        }
    )


def lognormal_costs(n: int, mean: float, sigma: float, seed: int) -> list[float]:
    """``n`` lognormal costs whose expected value is ``mean``."""
    rng = np.random.default_rng(seed)
    return [float(c) for c in rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, n)]


def wait_all(futures: Sequence[Future[Any]]) -> None:
    """Wait for every future; raise the first failure (a benchmark of failed tasks is void)."""
    wait(futures)
    for f in futures:
        f.result()


class FakeBackend(Backend):
    """Every order answered in-process from ``flush``, with ``None`` as its result: what is left
    of a task's cost is the engine's own (submit, dispatcher, futures, reply handling)."""

    def __init__(self) -> None:
        self._events: BackendEvents | None = None
        self._outbox: list[tuple[int, TaskOrder]] = []
        self._flushing = False
        self._n = 0

    def start(self, devices: Sequence[Device], events: BackendEvents) -> None:
        self._events, self._n = events, len(devices)

    def send(self, device: int, order: TaskOrder, function: tuple[str, bytes]) -> None:
        self._outbox.append((device, order))

    def flush(self) -> None:
        # The engine calls flush again from inside ``replies``; the outer call drains what
        # that adds, so the stack stays flat however many tasks follow.
        if self._flushing or self._events is None:
            return
        self._flushing = True
        try:
            while self._outbox:
                batch, self._outbox = self._outbox, []
                by_device: dict[int, list[tuple[Any, ...]]] = {}
                for device, order in batch:
                    now = time.monotonic()
                    reply = TaskReply(order.task_id, order.attempt, now, now)
                    reply.result = pack(None, "hetero-bench-fake")
                    by_device.setdefault(device, []).append(("done", reply))
                for device, messages in by_device.items():
                    self._events.replies(device, messages)
        finally:
            self._flushing = False

    def warm(self, timeout: float | None) -> None:
        pass  # nothing to start

    def cancel(self, device: int, task_id: int) -> None:
        pass

    def restart(self, device: int) -> None:
        pass

    def pids(self) -> list[int | None]:
        return [None] * self._n

    def close(self, timeout: float = 5.0) -> None:
        pass


def ray_module() -> tuple[Any, str | None]:
    """``(ray, None)``, or ``(None, why not)`` when Ray cannot be imported."""
    try:
        import ray
    except Exception as exc:  # ImportError, or a broken install
        return None, f"import ray failed: {type(exc).__name__}: {exc}"
    return ray, None


@contextlib.contextmanager
def ray_session(ray: Any) -> Iterator[Any]:
    """A local Ray on this machine's 2 cores for one figure (``None`` without Ray), shut down
    and given a moment to exit after it. Idle, its processes take about 5% of a core while
    hetero is measured in turn with it."""
    if ray is None:
        yield None
        return
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        time.sleep(1.0)
