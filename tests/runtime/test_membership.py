"""Devices that join or leave while tasks run (a cluster's nodes), through the engine's backend
events: every task ends exactly once, and fails only when no device is left to run it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import hetero
from hetero.devices.spec import Device
from hetero.errors import TaskFailed
from hetero.runtime.backend import Backend, BackendEvents
from hetero.runtime.serialize import pack
from hetero.runtime.worker import TaskOrder, TaskReply
from hetero.testing import emulated_fleet


class ClusterBackend(Backend):
    """Orders wait per device until the test answers them: a cluster played by hand."""

    shared_memory = False

    def __init__(self, fleet: Sequence[Device]) -> None:
        self.fleet = list(fleet)
        self.events: BackendEvents | None = None
        self.orders: dict[int, list[TaskOrder]] = {}
        self.dropped: list[tuple[int, int]] = []
        self.gone: set[int] = set()

    def discover(self) -> list[Device]:
        return list(self.fleet)

    def start(self, devices: Sequence[Device], events: BackendEvents) -> None:
        self.events = events

    def send(self, device: int, order: TaskOrder, function: tuple[str, bytes]) -> None:
        assert device not in self.gone, "an order for a device that left"
        self.orders.setdefault(device, []).append(order)

    def flush(self) -> None:
        pass

    def warm(self, timeout: float | None) -> None:
        pass

    def cancel(self, device: int, task_id: int) -> None:
        queued = self.orders.get(device, [])
        for order in queued:
            if order.task_id == task_id:
                queued.remove(order)
                self.dropped.append((device, task_id))
                return

    def restart(self, device: int) -> None:
        pass

    def pids(self) -> list[int | None]:
        return [None] * (len(self.fleet))

    def close(self, timeout: float = 5.0) -> None:
        pass

    # ------------------------------------------------------------------- the test's hand

    def answer(self, device: int) -> bool:
        """The oldest order of ``device`` completes (its result: its task id)."""
        assert self.events is not None
        for dev, task_id in self.dropped:
            self.events.replies(dev, [("dropped", task_id)])
        self.dropped.clear()
        queued = self.orders.get(device)
        if not queued or device in self.gone:
            return False
        order = queued.pop(0)
        reply = TaskReply(order.task_id, order.attempt, 0.0, 0.001)
        reply.result = pack(order.task_id, "unused", inline=True)
        self.events.replies(device, [("done", reply)])
        return True

    def join(self, device: Device) -> None:
        assert self.events is not None
        self.fleet.append(device)
        index = self.events.device_added(device)
        assert index == len(self.fleet) - 1

    def leave(self, device: int) -> None:
        assert self.events is not None
        if device in self.gone:
            return
        self.gone.add(device)
        self.orders.pop(device, None)  # what it held is lost with it
        self.events.device_gone(device, f"node of device {device} left")

    def live(self) -> list[int]:
        return [i for i in range(len(self.fleet)) if i not in self.gone]


def noop() -> None:
    """Never runs: the test answers for it."""


Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("answer"), st.integers(0, 7)),
        st.tuples(st.just("submit"), st.integers(1, 4)),
        st.tuples(st.just("join"), st.just(0)),
        st.tuples(st.just("leave"), st.integers(0, 7)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(initial=st.integers(1, 3), actions=steps)
def test_every_task_ends_once_however_devices_come_and_go(
    initial: int, actions: list[Step]
) -> None:
    backend = ClusterBackend(emulated_fleet([1.0] * initial))
    futures: list[Future[Any]] = []
    joined = 0
    emptied = False  # the fleet was empty at some point: what waited then has failed
    with hetero.Context(backend=backend, checkpoint_dir=False).start() as ctx:
        for what, n in actions:
            live = backend.live()
            if what == "submit":
                if live:
                    futures += [ctx.submit(noop) for _ in range(n)]
            elif what == "answer" and live:
                backend.answer(live[n % len(live)])
            elif what == "join":
                joined += 1
                backend.join(dataclasses.replace(backend.fleet[0], id=f"joined-{joined}"))
            elif what == "leave" and live:
                backend.leave(live[n % len(live)])
                emptied |= not backend.live()
        # Whatever is left runs where it can; with no device left it has failed already.
        while any(backend.answer(i) for i in backend.live()):
            pass
        assert all(f.done() for f in futures)
        ctx.dispatcher.validate_state()
        assert ctx.dispatcher.active == 0
        assert set(ctx.dispatcher.members) == {ctx.devices[i].id for i in backend.live()}
        stats = dict(ctx.stats)
    failed = [f for f in futures if f.exception() is not None]
    for f in futures:
        if f.exception() is None:
            assert f.result() == f.task_id  # type: ignore[attr-defined]
    for f in failed:
        assert isinstance(f.exception(), TaskFailed)
        assert "no device it may use is left" in str(f.exception())
    if not emptied:
        assert not failed  # leaving charges no attempt: only an empty fleet fails work
    assert stats["done"] + stats["failed"] == stats["submitted"] == len(futures)
