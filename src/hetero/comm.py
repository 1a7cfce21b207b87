"""Collectives over torch.distributed, for the trainer and for users' own code.

A thin facade: ``init`` picks the backend from the config's ``communication`` section, every call
checks its arguments and that the process group exists before torch sees them, and failures inside
torch come out as :class:`~hetero.errors.BackendError`. Beyond torch, ``all_reduce`` takes a
per-rank ``weight`` (the weighted sum or mean that uneven batch shares need), and
``reduce_scatter`` also works on gloo.

Every rank must make the same calls in the same order with tensors of the same shape and dtype,
as with torch.distributed itself; a rank that skips a call leaves the others waiting until the
``timeout`` given to ``init``.
"""

from __future__ import annotations

import datetime
import gc
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
import torch.distributed as dist

from hetero.errors import BackendError, ConfigError, HeteroError
from hetero.units import format_size

if TYPE_CHECKING:
    from hetero.config import HeteroConfig

__all__ = [
    "all_gather",
    "all_gather_object",
    "all_reduce",
    "barrier",
    "broadcast",
    "destroy",
    "init",
    "is_initialized",
    "rank",
    "recv",
    "reduce_scatter",
    "send",
    "world_size",
]

# hetero's protocol names → torch backends; "tcp" is gloo, whose transport is TCP, and "rdma" is
# NCCL held to its InfiniBand/RoCE transport.
_BACKENDS = {"gloo": "gloo", "tcp": "gloo", "nccl": "nccl", "rdma": "nccl", "mpi": "mpi"}
#: Where Linux lists RDMA devices (InfiniBand HCAs and RoCE NICs).
_RDMA_DEVICES = Path("/sys/class/infiniband")
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "mean": dist.ReduceOp.SUM,  # then divided here: gloo has no AVG
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "product": dist.ReduceOp.PRODUCT,
}
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


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    _require()
    return dist.get_rank()


def world_size() -> int:
    _require()
    return dist.get_world_size()


def barrier() -> None:
    _require()
    with _boundary("barrier"):
        dist.barrier()


def destroy() -> None:
    """Leave the process group; does nothing when there is none, so it is safe in teardown."""
    if is_initialized():
        # DDP leaves reference cycles; freed after the group is gone, gloo may abort the
        # process at exit. Free them while it is still up.
        gc.collect()
        dist.destroy_process_group()


def send(tensor: torch.Tensor, dst: int) -> None:
    """Send ``tensor`` to rank ``dst``, which must ``recv`` a tensor of the same shape and dtype."""
    _peer("dst", dst)
    with _boundary(f"send to rank {dst}"):
        dist.send(tensor, dst)


def recv(tensor: torch.Tensor, src: int) -> None:
    """Receive into ``tensor`` what rank ``src`` sends."""
    _peer("src", src)
    with _boundary(f"recv from rank {src}"):
        dist.recv(tensor, src)


def broadcast(tensor: torch.Tensor, src: int = 0) -> None:
    """Overwrite ``tensor`` on every rank with rank ``src``'s."""
    _rank_arg("src", src)
    with _boundary("broadcast"):
        dist.broadcast(tensor, src)


def all_reduce(tensor: torch.Tensor, op: str = "sum", weight: float | None = None) -> None:
    """Reduce ``tensor`` over all ranks in place: ``op`` is sum, mean, max, min or product.

    With ``weight`` (this rank's; every rank passes one or none does) the result is
    Σ_i weight_i · tensor_i, and with ``op="mean"`` that divided by Σ_i weight_i: the mean of
    per-rank means over uneven batches, weighted by batch size, is the mean over all samples.
    """
    reduce_op = _op(op)
    _require()
    if weight is not None:
        if op not in ("sum", "mean"):
            raise ConfigError([("weight", f"applies to op 'sum' or 'mean', not {op!r}")])
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ConfigError([("weight", f"must be a number, got {weight!r}")])
        if not math.isfinite(weight):
            raise ConfigError([("weight", f"must be finite, got {weight!r}")])
    if op == "mean" or weight is not None:
        _floating(tensor, "tensor", f"op={op!r}" if weight is None else "weight")
    if weight is not None:
        tensor.mul_(weight)
    with _boundary(f"all_reduce({op})"):
        dist.all_reduce(tensor, op=reduce_op)
        if op == "mean" and weight is not None:
            total = torch.tensor([float(weight)], dtype=torch.float64, device=tensor.device)
            dist.all_reduce(total)
    if op != "mean":
        return
    divisor = float(total.item()) if weight is not None else dist.get_world_size()
    if divisor == 0.0:
        raise HeteroError("all_reduce(op='mean'): the ranks' weights sum to 0; nothing to divide")
    tensor.div_(divisor)


def all_gather(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape and dtype on all), in rank order."""
    _require()
    out = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    with _boundary("all_gather"):
        dist.all_gather(out, tensor)
    return out


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, in rank order."""
    _require()
    out: list[Any] = [None] * dist.get_world_size()
    with _boundary("all_gather_object"):
        dist.all_gather_object(out, obj)
    return out


def reduce_scatter(output: torch.Tensor, inputs: Sequence[torch.Tensor], op: str = "sum") -> None:
    """Reduce ``inputs[i]`` over all ranks into rank i's ``output``: one input per rank, each of
    ``output``'s shape and dtype.

    On gloo this is one all_reduce of the stacked inputs of which each rank keeps its slice:
    torch before 2.8 has no gloo reduce_scatter (and since then runs one all_reduce per rank), so
    this works on every torch, at world_size times the traffic of a true reduce-scatter.
    """
    reduce_op = _op(op)
    n = world_size()
    if len(inputs) != n:
        raise ConfigError([("inputs", f"needs one tensor per rank ({n}), got {len(inputs)}")])
    for i, piece in enumerate(inputs):
        if piece.shape != output.shape or piece.dtype != output.dtype:
            raise ConfigError(
                [
                    (
                        f"inputs[{i}]",
                        f"must match output ({tuple(output.shape)}, {output.dtype}), got "
                        f"({tuple(piece.shape)}, {piece.dtype})",
                    )
                ]
            )
    if op == "mean":
        _floating(output, "output", "op='mean'")
    with _boundary(f"reduce_scatter({op})"):
        if dist.get_backend() == "gloo":
            stacked = torch.stack(list(inputs))
            dist.all_reduce(stacked, op=reduce_op)
            output.copy_(stacked[dist.get_rank()])
        else:
            dist.reduce_scatter(output, list(inputs), op=reduce_op)
    if op == "mean":
        output.div_(n)


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


def _require() -> None:
    if not is_initialized():
        raise HeteroError("the process group is not initialised; call hetero.comm.init() first")


def _rank_arg(name: str, value: int) -> None:
    _require()
    n = dist.get_world_size()
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n:
        raise ConfigError([(name, f"must be a rank in [0, {n}), got {value!r}")])


def _peer(name: str, value: int) -> None:
    _rank_arg(name, value)
    if value == dist.get_rank():
        raise ConfigError([(name, f"must be another rank than this one ({value})")])


def _op(op: str) -> dist.ReduceOp.RedOpType:
    if op not in _OPS:
        raise ConfigError([("op", f"unknown op {op!r}; expected one of {', '.join(sorted(_OPS))}")])
    return _OPS[op]


def _floating(tensor: torch.Tensor, name: str, why: str) -> None:
    if not (tensor.is_floating_point() or tensor.is_complex()):
        raise ConfigError(
            [(name, f"{why} needs a floating-point tensor, got dtype {tensor.dtype}")]
        )


@contextmanager
def _boundary(what: str) -> Iterator[None]:
    """torch's failures (a peer gone, a timeout, mismatched shapes) as BackendError."""
    try:
        yield
    except RuntimeError as exc:
        raise BackendError(f"{what} failed: {exc}") from exc
