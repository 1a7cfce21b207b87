"""The Ray backend: one long-lived actor per device on every node of a Ray cluster.

Placement stays the engine's: ``Context`` drives the dispatcher exactly as with local worker
processes and hands this backend each order for a device; the backend only delivers it to that
device's actor (``hetero.runtime.ray_actor.DeviceActor``, pinned to its node and holding one of
the node's ``hetero:<model>`` resources, a GPU for a real one) and reports back. What Ray
schedules is only where each actor lives.

Data: an order goes to its actor as ``hetero.runtime.ray_handles`` sends it (its large
arguments and its function through Ray's object store, each put there once); results come back
in the reply, as each finishes (``ObjectRef.future``: no polling).

Stopping a task: the actor's control thread drops it, or ends the actor if it runs it. A task in
C code holding the GIL leaves that thread no way to run: its actor is killed (``ray.kill``)
``STOP_GRACE_S`` seconds after it was told to stop, as the local backend kills such a worker.

Membership: a thread watches the cluster's nodes. A node that joins is asked for its fleet (its
``HETERO_NODE_CONFIG`` or its detected devices) and its NICs (``node_topology``: how the nodes
reach each other), and its devices join the engine's fleet; a node that leaves takes its devices
with it (``device_gone``: what ran there is placed elsewhere). An actor that dies on a live node
is a lost worker, as with a local process. The nodes' records and probes are
``hetero.runtime.ray_nodes``'s; the connection to the cluster ``hetero.runtime.ray_connect``'s.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import pickle
import queue
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hetero.devices.network import read_nics
from hetero.devices.spec import Device
from hetero.devices.topology import NodeTopology
from hetero.errors import BackendError, HeteroError
from hetero.runtime.backend import (
    STOP_GRACE_S,
    Backend,
    BackendEvents,
    killed_for_overrun,
    overdue,
    stops_over,
)
from hetero.runtime.device_probe import DeviceSample
from hetero.runtime.ray_cluster import import_ray
from hetero.runtime.ray_connect import connect
from hetero.runtime.ray_handles import ActorHandle, deliver, first_line, start_actor
from hetero.runtime.ray_nodes import RayNode, head_first, probe_nodes, short_id
from hetero.runtime.worker import TaskOrder

if TYPE_CHECKING:
    from hetero.runtime.ray_actor import NodeProbe

__all__ = ["RayBackend", "ray_fleet", "ray_node_topology"]

log = logging.getLogger("hetero.runtime")

#: How long a monitoring round waits for the actors' readings.
_SAMPLE_SECONDS = 0.5


class RayBackend(Backend):
    """Devices on the nodes of a Ray cluster.

    Args:
        address: the cluster (``"auto"``, ``"host:port"``, ``"ray://host:port"``); ``None``:
            join a running cluster if there is one, else start a local Ray instance (as
            ``ray.init()`` does). Unused when this process is connected to Ray already.
        time_scale: emulated durations are multiplied by it.
        fleet: the devices of a local Ray instance this backend starts itself (a node started
            elsewhere declares its own).
        poll_interval: seconds between looks at the cluster's nodes.
        connect_timeout: seconds to wait for the cluster's address to answer.
    """

    shared_memory = False

    def __init__(
        self,
        address: str | None = None,
        *,
        time_scale: float = 1.0,
        fleet: Sequence[Device] | None = None,
        poll_interval: float = 1.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self._ray = import_ray()
        self.address = address
        self.time_scale = time_scale
        self.poll_interval = poll_interval
        self.connect_timeout = connect_timeout
        self._own_fleet = list(fleet) if fleet is not None else None
        self._owns_connection = False
        self._started_local = False
        self._nodes: dict[str, RayNode] = {}
        self._devices: list[Device] = []
        self._node_of: list[RayNode] = []
        self._actors: list[ActorHandle | None] = []
        self._events: BackendEvents | None = None
        self._lock = threading.Lock()
        self._outbox: list[tuple[Any, ...]] = []
        # Replies as they arrive: (device, actor generation, Ray's future); a future of None
        # only wakes the reader to a new stop's deadline; None ends the reader.
        self._arrived: queue.SimpleQueue[tuple[int, int, Any] | None] = queue.SimpleQueue()
        self._fn_refs: dict[str, Any] = {}
        self._generation = 0
        self._closed = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._driver_node = ""

    # ------------------------------------------------------------------------ discovery

    def discover(self) -> list[Device]:
        """Connect to the cluster and return every node's devices (ids ``<node>/<device>``)."""
        if self._nodes:  # discovered already
            return list(self._devices)
        self._connect()
        ray = self._ray
        self._driver_node = ray.get_runtime_context().get_node_id()
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if self._started_local and self._own_fleet is not None:
            from hetero.runtime.ray_actor import NodeProbe

            (node,) = nodes  # this machine
            found = {node["NodeID"]: NodeProbe(list(self._own_fleet), read_nics())}
        else:
            if self._own_fleet is not None:
                log.warning(
                    "the %d device(s) given to the Context are not used: the nodes of the Ray "
                    "cluster declare their own (HETERO_NODE_CONFIG, else detection)",
                    len(self._own_fleet),
                )
            found = probe_nodes(ray, nodes)
        problems = [f"node {short_id(nid)}: {p.problem}" for nid, p in found.items() if p.problem]
        if problems:
            self.close()
            raise HeteroError(
                "a node's fleet config is invalid: " + "; ".join(problems) + " (fix the file "
                "that node's HETERO_NODE_CONFIG names, or start the node without it)"
            )
        for info in sorted(nodes, key=head_first):
            self._adopt(info, found[info["NodeID"]])
        if not self._devices:
            self.close()
            raise HeteroError("the Ray cluster has no devices hetero can use")
        return list(self._devices)

    def _connect(self) -> None:
        if self._ray.is_initialized():
            return
        self._started_local = connect(self._ray, self.address, self.connect_timeout)
        self._owns_connection = True

    def _adopt(self, info: dict[str, Any], probe: NodeProbe) -> list[int]:
        """Add a node, its NICs and its devices (ids made unique across the cluster): their
        indices."""
        nid = info["NodeID"]
        address = info.get("NodeManagerAddress", "?")
        node = RayNode(nid, short_id(nid), address, info["Resources"], nics=list(probe.nics))
        with self._lock:
            self._nodes[nid] = node
            for d in probe.devices or []:
                node.devices.append(len(self._devices))
                self._devices.append(node.own(d))
                self._node_of.append(node)
                self._actors.append(None)
        return list(node.devices)

    def nodes(self) -> list[dict[str, Any]]:
        """Each node with its address and devices (for ``hetero devices --ray``)."""
        return [
            {
                "node_id": n.id,
                "address": n.address,
                "alive": n.alive,
                "devices": [self._devices[i] for i in n.devices],
            }
            for n in self._nodes.values()
        ]

    def node_topology(self) -> NodeTopology:
        """How the live nodes reach each other, from the NICs each reported (those its
        ``HETERO_NODE_CONFIG`` declares, else those read there); nodes are named as their
        devices' ``Device.node``, so ``rank_order`` can take it."""
        with self._lock:
            alive = [n for n in self._nodes.values() if n.alive]
        return NodeTopology.from_nics({n.name: n.nics for n in alive})

    # ---------------------------------------------------------------------------- Backend

    def start(self, devices: Sequence[Device], events: BackendEvents) -> None:
        self.discover()
        if len(devices) != len(self._devices):
            raise BackendError("the Ray backend runs the devices it discovered, not others")
        self._devices = list(devices)  # the engine's copies (memory limits set on them)
        self._events = events
        for target, name in ((self._read, "hetero-ray-replies"), (self._watch, "hetero-ray-nodes")):
            thread = threading.Thread(target=target, daemon=True, name=name)
            thread.start()
            self._threads.append(thread)

    def send(self, device: int, order: TaskOrder, function: tuple[str, bytes]) -> None:
        with self._lock:
            self._outbox.append((device, order, function))

    def cancel(self, device: int, task_id: int) -> None:
        with self._lock:
            self._outbox.append((device, None, task_id))
        self.flush()

    def flush(self) -> None:
        with self._lock:
            if not self._outbox or self._closed:
                return
            batch, self._outbox = self._outbox, []
        for device, order, extra in batch:
            if not self._node_of[device].alive:
                continue  # the engine was told: what it sent there is placed elsewhere
            if order is None:
                self._stop_task(device, extra)
                continue
            try:
                self._deliver(device, order, extra)
            except Exception as exc:  # Ray refused the call: the worker is as good as lost
                log.warning("cannot send a task to %s: %s", self._devices[device].id, exc)
                if self._events is not None:
                    self._events.worker_lost(device, f"cannot reach its actor: {exc}")

    def _stop_task(self, device: int, task_id: int) -> None:
        """Tell the actor of ``device`` to stop ``task_id``, and the reader when to kill it if
        it has not."""
        with self._lock:
            actor = self._actors[device]
            if actor is None:
                return
            actor.stopping[task_id] = time.monotonic() + STOP_GRACE_S
        actor.handle.cancel.remote(task_id)
        self._arrived.put((device, actor.generation, None))

    def _deliver(self, device: int, order: TaskOrder, function: tuple[str, bytes]) -> None:
        actor = self._actors[device] or self._spawn(device)
        ref = deliver(self._ray, actor, order, function, self._fn_refs)
        arrived = functools.partial(self._on_arrival, device, actor.generation)
        ref.future().add_done_callback(arrived)

    def _spawn(self, index: int) -> ActorHandle:
        with self._lock:
            existing = self._actors[index]
            if existing is not None:
                return existing
            if self._closed:
                raise BackendError("the backend is closed")
            device, node = self._devices[index], self._node_of[index]
            self._generation += 1
            actor = start_actor(device, node, index, self.time_scale, self._generation)
            self._actors[index] = actor
        log.debug("started the actor of %s on node %s", device.id, node.short)
        return actor

    def warm(self, timeout: float | None) -> None:
        actors = [
            (i, self._actors[i] or self._spawn(i))
            for i in range(len(self._devices))
            if self._node_of[i].alive
        ]
        if timeout is None:
            return
        refs = {a.handle.ready.remote(): i for i, a in actors}
        ready, late = self._ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        failed = []
        for ref in ready:
            try:
                self._ray.get(ref)
            except Exception as exc:
                failed.append(f"{self._devices[refs[ref]].id} ({first_line(exc)})")
        failed += [self._devices[refs[r]].id for r in late]
        if failed:
            raise BackendError(f"actors not ready after {timeout:g} s: {', '.join(failed)}")

    def restart(self, device: int) -> None:
        with self._lock:
            actor, self._actors[device] = self._actors[device], None
        if actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(actor.handle, no_restart=True)

    def pids(self) -> list[int | None]:
        here = self.on_this_machine()
        return [a.pid if a is not None and here[i] else None for i, a in enumerate(self._actors)]

    def on_this_machine(self) -> list[bool]:
        return [node.id == self._driver_node for node in self._node_of]

    def remote_samples(self) -> list[DeviceSample]:
        """The devices of every other node, read there by one of its actors (one call per
        node: NVML and the actors' processes are that node's)."""
        ray = self._ray
        by_node: dict[str, tuple[Any, list[tuple[Device, int | None]]]] = {}
        for i, actor in enumerate(list(self._actors)):
            node = self._node_of[i]
            if actor is None or actor.pid is None or node.id == self._driver_node or not node.alive:
                continue
            by_node.setdefault(node.id, (actor.handle, []))[1].append((self._devices[i], actor.pid))
        refs = [reader.sample.remote(targets) for reader, targets in by_node.values()]
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=_SAMPLE_SECONDS)
        samples: list[DeviceSample] = []
        for ref in ready:
            with contextlib.suppress(Exception):  # its actor died meanwhile
                samples += ray.get(ref)
        return samples

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            actors = [a for a in self._actors if a is not None]
            self._actors = [None] * len(self._actors)
        self._stop.set()
        self._arrived.put(None)
        for thread in self._threads:
            thread.join(timeout)
        for actor in actors:
            with contextlib.suppress(Exception):
                self._ray.kill(actor.handle, no_restart=True)
        self._fn_refs.clear()
        if self._owns_connection:
            with contextlib.suppress(Exception):
                self._ray.shutdown()

    # --------------------------------------------------------------------------- threads

    def _on_arrival(self, device: int, generation: int, future: Any) -> None:
        # Called on Ray's own thread: hand over, do nothing here.
        self._arrived.put((device, generation, future))

    def _read(self) -> None:
        """Report each reply as it arrives, or the loss of the actor it was for; kill the
        actors that have not stopped a task in time."""
        while True:
            try:
                arrived = self._arrived.get(timeout=self._kill_late())
            except queue.Empty:
                continue
            if arrived is None:
                return
            device, generation, future = arrived
            if future is None:
                continue
            try:
                messages = pickle.loads(future.result())
            except Exception as exc:
                self._actor_failed(device, generation, exc)
                continue
            with self._lock:
                actor = self._actors[device]
                if actor is not None and actor.generation == generation:
                    for task_id in stops_over(messages):
                        actor.stopping.pop(task_id, None)
            self._report(device, messages)

    def _kill_late(self) -> float | None:
        """Kill each actor that has not stopped a task in time (its loss follows, as the reply
        it owes fails); returns the seconds until the next stop falls due (``None``: none)."""
        with self._lock:
            actors = [actor for actor in self._actors if actor is not None]
            late, wait = overdue(actors, time.monotonic())
            for actor in late:
                actor.killed = True
        for actor in late:
            log.debug("killing the actor of pid %s: a stopped task still runs", actor.pid)
            with contextlib.suppress(Exception):
                self._ray.kill(actor.handle, no_restart=True)
        return wait

    def _report(self, device: int, messages: list[tuple[Any, ...]]) -> None:
        assert self._events is not None
        try:
            self._events.replies(device, messages)
        except Exception:  # the engine's bug must not kill the reader thread
            log.exception("error handling replies from %s", self._devices[device].id)

    def _actor_failed(self, device: int, generation: int, exc: BaseException) -> None:
        with self._lock:
            actor = self._actors[device]
            if actor is None or actor.generation != generation or self._closed:
                return  # already dealt with (or ended on purpose)
            self._actors[device] = None
        # "Unavailable" may be a blip of a live actor: end it, so that the device never has
        # two (its replacement starts with the next order).
        with contextlib.suppress(Exception):
            self._ray.kill(actor.handle, no_restart=True)
        if not self._node_of[device].alive:
            return
        node = self._node_of[device]
        if not self._alive(node.id):
            self._node_left(node, f"node {node.short} ({node.address}) left the cluster")
            return
        name = f"actor of {self._devices[device].id}"
        if actor.killed:
            reason = killed_for_overrun(name, STOP_GRACE_S)
        else:
            reason = f"{name} died ({first_line(exc)})"
        assert self._events is not None
        try:
            self._events.worker_lost(device, reason)
        except Exception:
            log.exception("error handling the loss of the actor of %s", self._devices[device].id)

    def _alive(self, node_id: str) -> bool:
        try:
            return any(n["NodeID"] == node_id and n.get("Alive") for n in self._ray.nodes())
        except Exception:
            return True  # cannot tell: treat it as a lost worker

    def _node_left(self, node: RayNode, reason: str) -> None:
        with self._lock:
            if not node.alive:
                return
            node.alive = False
            actors = [self._actors[i] for i in node.devices]
            for i in node.devices:
                self._actors[i] = None
        log.warning("%s: %d device(s) leave the fleet", reason, len(node.devices))
        for actor in actors:
            if actor is not None:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor.handle, no_restart=True)
        assert self._events is not None
        for i in node.devices:
            try:
                self._events.device_gone(i, reason)
            except Exception:
                log.exception("error handling the departure of %s", self._devices[i].id)

    def _watch(self) -> None:
        """Follow the cluster's nodes: joins and departures change the fleet."""
        while not self._stop.wait(self.poll_interval):
            try:
                infos = self._ray.nodes()
            except Exception:
                continue
            alive = {n["NodeID"]: n for n in infos if n.get("Alive")}
            for node in list(self._nodes.values()):
                if node.alive and node.id not in alive:
                    self._node_left(node, f"node {node.short} ({node.address}) left the cluster")
            new = [n for nid, n in alive.items() if nid not in self._nodes]
            if not new or self._stop.is_set():
                continue
            try:
                probes = probe_nodes(self._ray, new)
            except (Exception, SystemExit):  # Ray raises SystemExit in a call as it shuts down
                if self._stop.is_set():
                    return
                log.exception("probing the nodes that joined failed; trying again")
                continue
            for nid, probe in probes.items():
                if probe.problem:
                    log.error("node %s joined but is not used: %s", short_id(nid), probe.problem)
                    self._nodes[nid] = RayNode(nid, short_id(nid), "?", {}, alive=False)
                    continue
                added = self._adopt(alive[nid], probe)
                log.info("node %s joined with %d device(s)", short_id(nid), len(added))
                assert self._events is not None
                for i in added:
                    try:
                        self._events.device_added(self._devices[i])
                    except Exception:
                        log.exception("error adding %s", self._devices[i].id)


def ray_fleet(address: str | None = None) -> list[dict[str, Any]]:
    """Every node of the cluster at ``address`` with its devices (``hetero devices --ray``)."""
    backend = RayBackend(address)
    try:
        backend.discover()
        return backend.nodes()
    finally:
        backend.close()


def ray_node_topology(address: str | None = None) -> NodeTopology:
    """How the nodes of the cluster at ``address`` reach each other (``hetero topology
    --ray``): every live node is asked for its NICs."""
    backend = RayBackend(address)
    try:
        backend.discover()
        return backend.node_topology()
    finally:
        backend.close()
