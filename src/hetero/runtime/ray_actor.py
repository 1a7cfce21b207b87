"""What runs on the nodes of a Ray cluster: a node's probe (its fleet and NICs), and one actor
per device.

The actor is the Ray counterpart of the local worker process: it runs its device's tasks one at
a time with the same code (``run_order``: pacing for emulated devices, checkpoints, errors), and
a second thread answers cancellations (a task not yet started is dropped; a running one ends the
actor, the only way to stop Python code, and the engine starts another). Imported only where
Ray is (the driver's Ray backend and Ray's workers).
"""

from __future__ import annotations

import os
import pickle
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ray

from hetero.devices.network import Nic, read_nics
from hetero.devices.spec import Device
from hetero.errors import ConfigError, HeteroError
from hetero.runtime import current
from hetero.runtime.device_probe import DeviceSample, sample_devices
from hetero.runtime.ray_cluster import NODE_CONFIG_ENV
from hetero.runtime.serialize import Packed
from hetero.runtime.worker import (
    PROTOCOL,
    WorkerSetup,
    _limit_frameworks,
    _State,
    _watch_memory,
    run_order,
)

if TYPE_CHECKING:
    from hetero.config import HeteroConfig

__all__ = ["DeviceActor", "NodeProbe", "probe_node"]


@dataclass(frozen=True, slots=True)
class NodeProbe:
    """What a node reports when asked: its devices and its NICs, or (``devices`` None) why its
    fleet config cannot be used."""

    devices: list[Device] | None
    nics: list[Nic] = field(default_factory=list)
    problem: str = ""


def _probe_node() -> NodeProbe:
    """This node's devices and NICs: those of the fleet config ``HETERO_NODE_CONFIG`` names
    (the NICs its ``nodes:`` section declares), else those detected and read here."""
    from hetero.config import load_config
    from hetero.devices.discovery import get_device_list
    from hetero.devices.fleet import build_fleet

    path = os.environ.get(NODE_CONFIG_ENV)
    try:
        config = load_config(path) if path else None
        devices = build_fleet(config) if config is not None else get_device_list()
        declared = _declared_nics(config) if config is not None else []
    except (HeteroError, OSError) as exc:
        return NodeProbe(None, problem=f"{NODE_CONFIG_ENV}={path}: {exc}")
    return NodeProbe(devices, declared or read_nics())


def _declared_nics(config: HeteroConfig) -> list[Nic]:
    """The NICs a node's own config declares. Every entry of its ``nodes:`` section names this
    one machine, so only one of them may declare NICs."""
    declaring = [name for name, node in config.nodes.items() if node.nics]
    if len(declaring) > 1:
        raise ConfigError(
            [
                (
                    "nodes",
                    f"NICs are declared for {', '.join(declaring)}, but a Ray node's config "
                    "describes that one node; declare its NICs under one entry",
                )
            ]
        )
    return [Nic(n.name, n.fabric, n.gbps) for name in declaring for n in config.nodes[name].nics]


class _DeviceActor:
    """One device's worker on its node."""

    def __init__(self, setup: WorkerSetup, protocol: int) -> None:
        if protocol != PROTOCOL:
            raise HeteroError(
                f"this node runs another version of hetero (protocol {PROTOCOL}) than the "
                f"driver (protocol {protocol}); install the same version on every node"
            )
        device = setup.device
        if device.type == "gpu" and not device.emulated:
            # Ray counted a GPU for this actor; this device's own is the one to use.
            visible = str(device.uuid or device.local_index or 0)
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["HIP_VISIBLE_DEVICES"] = visible
        self._state = _State(None, setup=setup)
        self._cancelled: set[int] = set()
        self._lock = threading.Lock()  # a cancellation sees a task either queued or running
        current.set_device(device)
        _limit_frameworks(device, setup.memory_limit)
        if setup.memory_limit is not None and (device.emulated or device.type == "cpu"):
            threading.Thread(
                target=_watch_memory,
                args=(self._state, setup.memory_limit, setup.rss_interval),
                daemon=True,
                name="hetero-rss",
            ).start()

    def ready(self) -> int:
        return os.getpid()

    def run(self, order_blob: bytes, args: Packed | None, fn_blob: bytes | None) -> bytes:
        """One attempt: ``order_blob`` pickles ``(TaskOrder, function key)``, with the
        arguments inside unless they came by reference as ``args``. Returns its messages,
        pickled, as the local worker sends them (warnings, then ``("done" | "error", reply)``,
        or ``("dropped", task_id)`` if it was cancelled before it began). Plain bytes both
        ways: Ray ships bytes for a fraction of what pickling each object itself costs."""
        order, fn_key = pickle.loads(order_blob)
        state = self._state
        if fn_blob is not None and fn_key not in state.functions:
            state.raw_functions[fn_key] = fn_blob
        with self._lock:
            if order.task_id in self._cancelled:
                self._cancelled.discard(order.task_id)
                return pickle.dumps([("dropped", order.task_id)], protocol=5)
            state.running, state.attempt = order.task_id, order.attempt
        if args is not None:
            order.args = args
        try:
            tag, reply = run_order(state, order)
        finally:
            state.running = -1
        out, state.notes = state.notes, []
        out.append((tag, reply))
        return pickle.dumps(out, protocol=5)

    def run_inline(self, order_blob: bytes) -> bytes:
        """``run`` with everything inside the order: one argument for Ray to pass, the common
        case (a call's cost in the driver grows with its arguments)."""
        return self.run(order_blob, None, None)

    @ray.method(concurrency_group="control")
    def sample(self, targets: list[tuple[Device, int | None]]) -> list[DeviceSample]:
        """The live state of devices of this node (each with its worker's pid), read here:
        memory, utilization, health; one call per node and monitoring round."""
        return sample_devices(targets)

    @ray.method(concurrency_group="control")
    def cancel(self, task_id: int) -> None:
        with self._lock:
            if self._state.running == task_id:
                os._exit(3)
            self._cancelled.add(task_id)


# Made remote here rather than by decorators, which Ray's type stubs do not describe.
probe_node: Any = ray.remote(num_cpus=0)(_probe_node)
DeviceActor: Any = ray.remote(concurrency_groups={"control": 1}, max_restarts=0)(_DeviceActor)  # type: ignore[call-overload]
