"""Which GPU each rank of ``hetero launch`` runs on: ring neighbours on the fastest links, and
never two ranks on MIG slices of one GPU.

A rank's slot is its ``LOCAL_RANK``, the GPU it takes (``hetero.comm``); its ``RANK`` is its
place in the ring that the collectives follow. So ordering the live slots by the machine's
topology (``hetero.devices.rings.ring_order``) puts ranks that exchange gradients on NVLink
rather than across the sockets. Pure: the launcher passes this machine's GPUs and topology.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetero.devices.mig import shared_parents
from hetero.devices.rings import ring_order
from hetero.devices.spec import Device
from hetero.devices.topology import Topology
from hetero.errors import ConfigError

__all__ = ["check_slices", "ring_slots"]


def ring_slots(slots: Sequence[int], topology: Topology) -> tuple[int, ...]:
    """``slots`` in the order their GPUs make the best ring: rank ``r`` runs on slot
    ``result[r]``. As given where the topology does not cover every slot (ranks on the CPU, or
    fewer GPUs than slots): there are no links to follow."""
    if len(slots) <= 2 or len(topology) <= max(slots):
        return tuple(slots)
    order = ring_order(topology.bandwidth[np.ix_(slots, slots)])
    return tuple(slots[i] for i in order)


def check_slices(slots: Sequence[int], gpus: Sequence[Device]) -> None:
    """Refuse ranks on two MIG slices of one GPU (``gpus[slot]`` is a slot's GPU): a collective
    never spans slices of one GPU (CUDA shows a process one slice, and NCCL cannot join them)."""
    held = [gpus[s] for s in slots if s < len(gpus)]
    shared = shared_parents(held)
    if shared:
        parent, ids = next(iter(shared.items()))
        raise ConfigError(
            [
                (
                    "--nproc",
                    f"{len(slots)} ranks would put {' and '.join(ids)} in one collective, "
                    f"MIG slices of one GPU ({parent}); a collective never spans slices of one "
                    "GPU: start fewer ranks, or one per whole GPU",
                )
            ]
        )
