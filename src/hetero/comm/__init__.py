"""Collectives over torch.distributed, for the trainer and for users' own code.

A thin facade: ``init`` picks the backend from the config's ``communication`` section, every call
checks its arguments and that the process group exists before torch sees them, and failures inside
torch come out as :class:`~hetero.errors.BackendError`. Beyond torch, ``all_reduce`` and
``reduce`` take a per-rank ``weight`` (the weighted sum or mean that uneven batch shares need),
``all_to_all`` sends uneven shares without the receivers knowing their sizes, ``reduce_scatter``
also works on gloo, and ``reduce`` leaves the other ranks' tensors as they were.

Every call takes ``group=`` (a :class:`Group` from :func:`new_group`; on a rank outside it the
call does nothing), and those torch can run in the background take ``async_op=True``, which
returns a :class:`Handle` to ``wait()`` on. Every call is timed: :func:`stats` gives this rank's
calls, seconds and bytes per op, which the profiler reports (``docs/profiling.md``).

Every rank must make the same calls in the same order with tensors of the same shape and dtype,
as with torch.distributed itself; a rank that skips a call leaves the others waiting until the
``timeout`` given to ``init``.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
import torch.distributed as dist

from hetero.comm import _stats
from hetero.comm._base import STATE, Handle, require
from hetero.comm._collectives import (
    all_gather,
    all_gather_object,
    all_reduce,
    all_to_all,
    barrier,
    broadcast,
    recv,
    reduce,
    reduce_scatter,
    send,
)
from hetero.comm._groups import Group, new_group
from hetero.comm._stats import gather_stats, reset_stats, stats
from hetero.errors import BackendError, ConfigError, HeteroError
from hetero.telemetry.collectives import RECORDER
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.config import HeteroConfig

__all__ = [
    "Group",
    "Handle",
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "barrier",
    "broadcast",
    "destroy",
    "gather_stats",
    "init",
    "is_initialized",
    "new_group",
    "rank",
    "recv",
    "reduce",
    "reduce_scatter",
    "reset_stats",
    "send",
    "stats",
    "world_size",
]

# hetero's protocol names → torch backends; "tcp" is gloo, whose transport is TCP, and "rdma" is
# NCCL held to its InfiniBand/RoCE transport.
_BACKENDS = {"gloo": "gloo", "tcp": "gloo", "nccl": "nccl", "rdma": "nccl", "mpi": "mpi"}
#: Where Linux lists RDMA devices (InfiniBand HCAs and RoCE NICs).
_RDMA_DEVICES = Path("/sys/class/infiniband")
_DEFAULT_PORT = 29500  # torch's own default


def init(
    rank: int | None = None,
    world_size: int | None = None,
    *,
    backend: str | None = None,
    config: HeteroConfig | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    timeout: float = 60.0,
) -> None:
    """Join the process group as ``rank`` of ``world_size``.

    ``rank`` and ``world_size`` default to the ``RANK`` and ``WORLD_SIZE`` that torchrun sets,
    ``master_addr`` and ``master_port`` to ``MASTER_ADDR`` and ``MASTER_PORT`` (else
    127.0.0.1:29500). The backend is ``backend`` if given, else the config's
    ``communication.protocol``, else nccl when CUDA is available and gloo otherwise; "tcp" means
    gloo and "rdma" NCCL over InfiniBand or RoCE only (``NCCL_NET=IB``: no fall-back to
    sockets), refused on a machine with no RDMA device. The config's
    ``communication.buffer_size`` sets ``NCCL_BUFFSIZE`` (nccl and rdma; the other protocols
    have no buffer to size and refuse it). With nccl each rank takes the GPU ``LOCAL_RANK``
    (else ``rank`` modulo the GPU count).
    ``timeout`` (seconds) bounds the rendezvous and every collective.

    Calling it again with the same rank, world size and backend does nothing; with different
    ones it is an error (``destroy()`` first).
    """
    if not dist.is_available():
        raise BackendError("this torch build has no torch.distributed; install one that has")
    protocol = _protocol(backend, config)
    name = _BACKENDS[protocol]
    env = _transport_env(protocol, config.communication.buffer_size if config else None)
    rank = _from_env("rank", rank, "RANK")
    world_size = _from_env("world_size", world_size, "WORLD_SIZE")
    if world_size < 1:
        raise ConfigError([("world_size", f"must be at least 1, got {world_size}")])
    if not 0 <= rank < world_size:
        raise ConfigError(
            [("rank", f"must be in [0, {world_size}) for world_size={world_size}, got {rank}")]
        )
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ConfigError([("timeout", f"must be a positive number of seconds, got {timeout!r}")])
    if dist.is_initialized():
        current = (dist.get_rank(), dist.get_world_size(), dist.get_backend())
        if current != (rank, world_size, name):
            raise HeteroError(
                f"the process group is already initialised as rank {current[0]} of {current[1]} "
                f"on {current[2]}, not rank {rank} of {world_size} on {name}; call "
                "hetero.comm.destroy() first"
            )
        return
    addr = master_addr if master_addr is not None else os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = _from_env("master_port", master_port, "MASTER_PORT", _DEFAULT_PORT)
    if not 1 <= port <= 65535:
        raise ConfigError([("master_port", f"must be in [1, 65535], got {port}")])
    if name == "nccl":
        _take_gpu(rank)
    os.environ.update(env)
    try:
        dist.init_process_group(
            name,
            init_method=f"tcp://{addr}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout),
        )
    except (RuntimeError, ValueError) as exc:
        raise BackendError(
            f"rank {rank} of {world_size} could not join the {name} process group at "
            f"{addr}:{port}: {exc}"
        ) from exc
    STATE.timeout = datetime.timedelta(seconds=timeout)
    RECORDER.join(rank, world_size)
    _stats.joined()


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    require()
    return dist.get_rank()


def world_size() -> int:
    require()
    return dist.get_world_size()


def destroy() -> None:
    """Leave the process group; does nothing when there is none, so it is safe in teardown."""
    if is_initialized():
        _stats.leaving()
        # DDP leaves reference cycles; freed after the group is gone, gloo may abort the
        # process at exit. Free them while it is still up.
        gc.collect()
        dist.destroy_process_group()
        STATE.generation += 1  # its groups go with it
        STATE.timeout = None


def _protocol(backend: str | None, config: HeteroConfig | None) -> str:
    """hetero's protocol name (a key of ``_BACKENDS``), checked to be usable here."""
    if backend is not None:
        if backend not in _BACKENDS:
            raise ConfigError(
                [
                    (
                        "backend",
                        f"unknown backend {backend!r}; expected one of "
                        f"{', '.join(sorted(_BACKENDS))}",
                    )
                ]
            )
        protocol = backend
    elif config is not None:
        protocol = config.communication.protocol
    else:
        protocol = "nccl" if torch.cuda.is_available() else "gloo"
    if protocol == "rdma" and not (_RDMA_DEVICES.is_dir() and any(_RDMA_DEVICES.iterdir())):
        raise BackendError(
            "protocol 'rdma' is NCCL over InfiniBand or RoCE, and this machine has no RDMA "
            f"device ({_RDMA_DEVICES} is empty or absent); use 'nccl' (NVLink, PCIe or TCP "
            "sockets between GPUs) or 'gloo'"
        )
    name = _BACKENDS[protocol]
    available = {
        "gloo": dist.is_gloo_available,
        "nccl": dist.is_nccl_available,
        "mpi": dist.is_mpi_available,
    }[name]
    if not available():
        raise BackendError(
            f"backend {name!r} is not available in this torch build; use "
            "'gloo' (CPU) or 'nccl' (NVIDIA GPUs) where the build has it"
        )
    return protocol


def _transport_env(protocol: str, buffer_size: int | None) -> dict[str, str]:
    """The NCCL settings that ``protocol`` and ``communication.buffer_size`` stand for."""
    env: dict[str, str] = {}
    if buffer_size is not None:
        if _BACKENDS[protocol] != "nccl":
            raise ConfigError(
                [
                    (
                        "communication.buffer_size",
                        f"{format_size(buffer_size)} sizes NCCL's buffer (NCCL_BUFFSIZE), for "
                        f"protocol nccl or rdma; {protocol} has none to set: remove it",
                    )
                ]
            )
        env["NCCL_BUFFSIZE"] = str(buffer_size)
    if protocol == "rdma":
        env["NCCL_NET"] = "IB"  # NCCL's InfiniBand/RoCE transport, never its socket fall-back
    return env


def _take_gpu(rank: int) -> None:
    """NCCL needs each rank on its own GPU before the group forms."""
    count = torch.cuda.device_count()
    if count == 0:
        raise BackendError("backend 'nccl' needs CUDA GPUs and none is visible; use 'gloo'")
    torch.cuda.set_device(_from_env("LOCAL_RANK", None, "LOCAL_RANK", rank % count))


def _from_env(name: str, value: int | None, env: str, default: int | None = None) -> int:
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError([(name, f"must be an integer, got {value!r}")])
        return value
    raw = os.environ.get(env)
    if raw is None:
        if default is None:
            raise ConfigError(
                [(name, f"not given and ${env} is not set; pass {name}= or run under torchrun")]
            )
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError([(name, f"${env} must be an integer, got {raw!r}")]) from None
