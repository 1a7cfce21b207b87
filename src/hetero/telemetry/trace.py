"""What the engine records about every task attempt: the profiler's and `hetero top`'s input.

Times are ``time.monotonic()`` seconds (one system-wide clock on Linux, so the parent's and the
workers' stamps compare directly).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["DeviceInfo", "TaskTrace"]


@dataclass(slots=True)
class TaskTrace:
    """One attempt of one task on one device.

    ``submitted`` is when the task was handed to the engine, ``sent`` when its arguments were
    packed and sent to the worker, ``started``/``ended`` bracket the function itself on the
    worker (emulation pacing included), ``transfer_in``/``transfer_out`` are the seconds spent
    packing and unpacking arguments and result, ``bytes_in``/``bytes_out`` their sizes.
    ``status`` is ``done``, ``failed`` (ended for good), ``retried`` (this attempt failed and
    another follows) or ``cancelled``.
    """

    task_id: int
    name: str
    device: str
    attempt: int
    cost: float
    submitted: float
    sent: float
    started: float
    ended: float
    transfer_in: float = 0.0
    transfer_out: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0
    status: str = "done"
    error: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class DeviceInfo:
    """A device as the profiler shows it: its id, model, kind and speed in cost units per second
    (measured when the engine has observed it, else the catalog prior)."""

    id: str
    model: str
    kind: str
    speed: float
    emulated: bool
