"""Which ranks split a layer between them: tensor-parallel groups on the best-connected devices
(``tensor_parallel_groups``, pure), and the ``DeviceMesh`` of this rank's group
(``tensor_parallel_mesh``).

Tensor parallelism all-reduces activations twice a block each way, every step, on the critical
path: its group must sit on the fastest links there are (NVLink before PCIe, one node before
the network), and data or pipeline parallelism take the slower links between groups. The links
are the ranks' bandwidth matrix, as ``hetero.devices.rings.device_bandwidth`` gives it for the
ranks' devices (or ``Topology.bandwidth`` for the GPUs of one machine), and the group of the
fastest slowest link is ``hetero.devices.topology.best_group_indices``'s, which ``DevicePool``
allocates by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hetero._checks import is_integer
from hetero.devices.topology import best_group_indices
from hetero.errors import ConfigError

__all__ = ["tensor_parallel_groups", "tensor_parallel_mesh"]

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh


def tensor_parallel_groups(bandwidth: npt.ArrayLike, degree: int) -> tuple[tuple[int, ...], ...]:
    """The ranks in groups of ``degree``, each group on well-connected devices.

    ``bandwidth[i][j]`` is the GB/s between ranks ``i`` and ``j`` (symmetric; the diagonal is
    ignored). The first group is the ``degree`` ranks whose slowest link among them is the
    fastest (ties: the larger total, then the lower ranks), the next the same among the ranks
    left, and so on; each group's ranks ascending. Greedy: the best group first, so a later
    group may be worse than some other partition would make it (finding the partition whose
    worst group is best is a harder search; on machines of pairs or quads behind one switch
    and on several nodes the greedy one is it). ``ConfigError`` when ``degree`` does not divide
    the number of ranks.
    """
    matrix = np.asarray(bandwidth, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ConfigError([("bandwidth", f"must be a square matrix, got shape {matrix.shape}")])
    n = matrix.shape[0]
    if not is_integer(degree) or degree < 1 or n % degree:
        allowed = ", ".join(str(d) for d in range(1, n + 1) if n % d == 0) or "none (no ranks)"
        raise ConfigError(
            [
                (
                    "degree",
                    f"{degree!r} does not split the {n} ranks into tensor-parallel groups of "
                    f"equal size; allowed: {allowed}",
                )
            ]
        )
    left = list(range(n))
    groups: list[tuple[int, ...]] = []
    while left:
        chosen, _ = best_group_indices(matrix[np.ix_(left, left)], degree)
        groups.append(tuple(left[i] for i in chosen))
        left = [r for r in left if r not in groups[-1]]
    return tuple(groups)


def tensor_parallel_mesh(groups: Sequence[Sequence[int]]) -> DeviceMesh:
    """The one-dimensional ``DeviceMesh`` of this rank's group among ``groups``.

    ``groups`` split the world's ranks into groups of one size (``tensor_parallel_groups``).
    Every rank must call it with the same groups: each is made with ``hetero.comm.new_group``
    (so its collectives time out as ``comm.init`` said), on the CPU under gloo and on the
    GPUs under NCCL.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from hetero import comm

    world = comm.world_size()
    listed = [list(g) for g in groups]
    ranks = sorted(r for g in listed for r in g)
    if ranks != list(range(world)) or len({len(g) for g in listed}) != 1:
        raise ConfigError(
            [
                (
                    "groups",
                    f"must split the {world} ranks 0..{world - 1} into groups of one size, "
                    f"each rank in one; got {listed}",
                )
            ]
        )
    made = [comm.new_group(g) for g in listed]
    mine = next(g for g in made if g.member)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    # The mesh runs on the group comm made (its timeout), in the group's rank order.
    return DeviceMesh.from_group(
        mine.torch_group, device, mesh=list(mine.ranks), mesh_dim_names=("tp",)
    )
