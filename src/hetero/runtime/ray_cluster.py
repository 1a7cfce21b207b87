"""Ray as hetero uses it: the import (an optional extra, with a version floor), how a node
declares its fleet, and a multi-node cluster on this machine.

A node's devices are its own business: the node that runs a device is the one that knows it.
A node started with ``HETERO_NODE_CONFIG=<fleet config>`` in its environment (``ray start``
inherits it; ``node_args`` sets it for ``ray.cluster_utils.Cluster``) has the devices of that
file, emulated ones included; any other node has the devices hetero detects on it. A node also
carries one custom resource per accelerator model it holds (``hetero:<model>``), which each
device's actor asks for, so an actor lands exactly on a node with its kind of device.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from hetero.errors import HeteroError

__all__ = [
    "MIN_RAY",
    "NODE_CONFIG_ENV",
    "import_ray",
    "local_cluster",
    "node_args",
    "resource_name",
]

#: The oldest Ray release hetero runs on (NodeAffinitySchedulingStrategy, concurrency groups
#: and ``ObjectRef.future`` as hetero uses them).
MIN_RAY = (2, 9)
#: The environment variable naming a node's own fleet config.
NODE_CONFIG_ENV = "HETERO_NODE_CONFIG"


# Ray's switch for machines that run no multi-node cluster: with it off, Ray keeps 127.0.0.1 as
# a node's address and in the addresses drivers connect to.
_MULTI_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# A node that dies is known for dead within about 2 s here (Ray's defaults take about 15 s, which
# suits real networks better than one machine).
_FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 1000,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 1000,
    "health_check_failure_threshold": 3,
}


def import_ray() -> Any:
    """The ``ray`` module, or a ``HeteroError`` saying how to install it (or upgrade it)."""
    try:
        import ray
    except ImportError:
        raise HeteroError(
            "the Ray backend needs Ray, an optional extra: pip install -e '.[ray]' "
            "(in the hetero checkout)"
        ) from None
    version = getattr(ray, "__version__", "0")
    parts = tuple(int(p) if p.isdigit() else 0 for p in version.split(".")[:2])
    if parts < MIN_RAY:
        floor = ".".join(map(str, MIN_RAY))
        raise HeteroError(
            f"the Ray backend needs ray>={floor}, found ray {version}: "
            "pip install -U -e '.[ray]' (in the hetero checkout)"
        )
    return ray


def resource_name(model: str) -> str:
    """The custom resource a node holds one of per device of ``model``."""
    return f"hetero:{model}"


def node_args(config: str | os.PathLike[str]) -> dict[str, Any]:
    """What a node declaring the fleet of ``config`` is started with: ``env_vars`` naming the
    file and one ``resources`` entry per accelerator model (for ``Cluster.add_node``; by hand:
    ``HETERO_NODE_CONFIG=<file> ray start --resources '<json>'``). ``ConfigError`` if the file
    is not a valid fleet."""
    from hetero.config import load_config
    from hetero.devices.fleet import build_fleet

    path = Path(config).resolve()
    devices = build_fleet(load_config(path))
    counts = Counter(resource_name(d.model) for d in devices)
    return {"env_vars": {NODE_CONFIG_ENV: str(path)}, "resources": dict(counts)}


@contextlib.contextmanager
def local_cluster(
    node_configs: Sequence[str | os.PathLike[str]],
    *,
    num_cpus: int = 1,
    client_port: int | None = None,
) -> Iterator[Any]:
    """A ``ray.cluster_utils.Cluster`` of one node per config (the first is the head), each
    declaring that fleet; shut down on exit (with this process's Ray connection, if any).
    Connect with ``address=cluster.address``, or, with ``client_port``, through Ray Client at
    ``ray://127.0.0.1:<client_port>``. Only this machine can reach it: until the block ends,
    every Ray process started here (nodes added by hand included) listens on 127.0.0.1 only,
    and the head starts no dashboard."""
    ray = import_ray()
    from ray.cluster_utils import Cluster

    if not node_configs:
        raise HeteroError("local_cluster needs at least one node config")
    args = [node_args(c) for c in node_configs]
    head = {
        "num_cpus": num_cpus,
        "_system_config": _FAST_HEALTH_CHECKS,
        "include_dashboard": False,
        **args[0],
    }
    with _loopback_only(ray):
        cluster = Cluster(initialize_head=True, head_node_args=head)
        client: subprocess.Popen[bytes] | None = None
        try:
            for extra in args[1:]:
                cluster.add_node(num_cpus=num_cpus, **extra)
            cluster.wait_for_nodes()
            if client_port is not None:
                assert cluster.head_node is not None
                logs = cluster.head_node.get_logs_dir_path()
                client = _client_server(ray, cluster.address, client_port, logs)
            yield cluster
        finally:
            if ray.is_initialized():  # a driver still connected would stop the head's removal
                ray.shutdown()
            if client is not None:
                client.terminate()
                client.wait(10)
            cluster.shutdown()  # type: ignore[no-untyped-call]


@contextlib.contextmanager
def _loopback_only(ray: Any) -> Iterator[None]:
    """Ray on this machine alone while the block runs: every node started then listens on
    127.0.0.1, and drivers (here, and in processes started from here) connect to it there
    instead of at the machine's outward address, where no node listens."""
    constants = ray._private.ray_constants
    saved_env, saved_constant = os.environ.get(_MULTI_NODE_ENV), constants.ENABLE_RAY_CLUSTER
    os.environ[_MULTI_NODE_ENV] = "0"  # read by the Ray processes started from here
    constants.ENABLE_RAY_CLUSTER = False  # this process read it when it imported ray
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved_constant
        if saved_env is None:
            del os.environ[_MULTI_NODE_ENV]
        else:
            os.environ[_MULTI_NODE_ENV] = saved_env


def _client_server(ray: Any, address: str, port: int, logs_dir: str) -> subprocess.Popen[bytes]:
    """A Ray Client server for the cluster at ``address`` on 127.0.0.1:``port``, started once
    the head's runtime-env agent is known (one started with the head may ask that agent
    before it listens, and then refuses every client)."""
    ray.init(address=address, logging_level="WARNING")
    try:
        (head,) = [n for n in ray.nodes() if "node:__internal_head__" in n["Resources"]]
    finally:
        ray.shutdown()
    agent = f"http://{head['NodeManagerAddress']}:{head['RuntimeEnvAgentPort']}"
    command = [sys.executable, "-m", "ray.util.client.server", "--mode", "proxy"]
    command += ["--address", address, "--host", "127.0.0.1", "--port", str(port)]
    command += ["--runtime-env-agent-address", agent, "--node-id", head["NodeID"]]
    log = Path(logs_dir) / "hetero_client_server.err"  # beside Ray's own logs of the cluster
    with open(log, "ab") as err:
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return server
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise HeteroError(f"the Ray Client server on port {port} did not start (see {log})")
        time.sleep(0.1)
