"""The driver's side of a device's actor (``hetero.runtime.ray_actor.DeviceActor``): starting
one pinned to its node, and an order's way to it.

An actor holds one of its node's ``hetero:<model>`` resources, and a GPU for a real one. An
order's arguments ride inside it,
except large ones, which go into Ray's object store once and are passed by reference (a retry
or a steal reuses that object); a function goes into the object store once and each actor
fetches it with its first order of it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from dataclasses import dataclass, field
from typing import Any

from hetero.devices.spec import Device, DeviceKind
from hetero.runtime.ray_cluster import resource_name
from hetero.runtime.ray_nodes import RayNode
from hetero.runtime.serialize import Packed
from hetero.runtime.worker import PROTOCOL, TaskOrder, WorkerSetup

__all__ = ["ARG_REF_BYTES", "ActorHandle", "deliver", "first_line", "start_actor"]

#: Arguments at least this large (pickled) go through the object store by reference; smaller
#: ones ride inside the order (Ray inlines those itself).
ARG_REF_BYTES = 100 * 1024
_EMPTY = Packed(b"")


@dataclass(eq=False)
class ActorHandle:
    """One device's actor: Ray's handle, which of the device's actors it is (``generation``:
    a reply from an earlier one is stale), the functions it was sent, its process id once
    it answered, the tasks it was told to stop and not yet let go of (task id -> when it is
    killed if it has not), and whether it was killed for that."""

    handle: Any
    generation: int
    functions: set[str] = field(default_factory=set)
    pid: int | None = None
    stopping: dict[int, float] = field(default_factory=dict)
    killed: bool = False


def start_actor(
    device: Device, node: RayNode, index: int, time_scale: float, generation: int
) -> ActorHandle:
    """Start the actor of ``device`` (the ``index``-th of the fleet) on ``node``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from hetero.runtime.ray_actor import DeviceActor

    real_gpu = device.kind is DeviceKind.GPU and not device.emulated
    options: dict[str, Any] = {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node.id, soft=False),
        # An emulated device mostly sleeps: it holds no CPU of the node.
        "num_cpus": 1 if device.kind is DeviceKind.CPU and not device.emulated else 0,
        "num_gpus": 1 if real_gpu else 0,
    }
    resource = resource_name(device.model)
    if node.resources.get(resource):
        options["resources"] = {resource: 1}
    setup = WorkerSetup(
        device=device,
        prefix=f"hetero-ray-{os.getpid()}-{index}",
        time_scale=time_scale,
        memory_limit=device.memory_limit,
        inline=True,
    )
    handle = DeviceActor.options(**options).remote(setup, PROTOCOL)
    actor = ActorHandle(handle, generation)

    def ready(future: Any) -> None:
        with contextlib.suppress(Exception):
            actor.pid = future.result()

    handle.ready.remote().future().add_done_callback(ready)
    return actor


def deliver(
    ray: Any,
    actor: ActorHandle,
    order: TaskOrder,
    function: tuple[str, bytes],
    fn_refs: dict[str, Any],
) -> Any:
    """Send ``order`` and its ``function`` to ``actor``; returns the reference of its reply.
    ``fn_refs`` holds the functions put in the object store, by key."""
    key, blob = function
    fn = None
    if key not in actor.functions:
        actor.functions.add(key)
        fn = fn_refs.get(key)
        if fn is None:
            fn = fn_refs[key] = ray.put(blob)
    args = _args_ref(ray, order)
    if args is not None:
        order.args = _EMPTY  # they travel beside it, by reference
    blob = pickle.dumps((order, key), protocol=5)
    if args is None and fn is None:
        return actor.handle.run_inline.remote(blob)
    return actor.handle.run.remote(blob, args, fn)


def _args_ref(ray: Any, order: TaskOrder) -> Any:
    """The object store reference of large arguments (``None``: they ride in the order)."""
    packed = order.args
    if isinstance(packed, list) or len(packed.data) < ARG_REF_BYTES:
        return None  # a batch's calls ride in the order (each is sent once)
    if packed.handle is None:  # once per task: retries and steals reuse the object
        packed.handle = ray.put(packed)
    return packed.handle


def first_line(exc: BaseException) -> str:
    """``exc`` in one line, as a device's failure is reported: its type and first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
