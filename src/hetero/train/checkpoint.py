"""Checkpoints of a training run: the state rank 0 writes (atomically) and every rank reads
back on resuming, loaded as tensors and plain values only and checked before use; and the
checkpoint as the place where the ranks of an elastic launch regroup.

The state is the run's, not a rank's: the full model and optimizer state, the step count and
the sampler's epoch and position in global batches. The shares it also holds are used only at
the same number of ranks, so a checkpoint resumes at any world size.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc

from hetero import comm
from hetero._checks import is_integer
from hetero.train.elastic import REGROUP_FILE_ENV, Regroup, regroup_answer
from hetero.train.tensors import named_tensors

__all__ = ["leave_if_regrouping", "read_checkpoint", "write_checkpoint"]

# What a checkpoint holds beside the optional "scaler".
_CHECKPOINT_KEYS = ("steps", "model", "optimizer", "sampler")


def write_checkpoint(path: Path, state: dict[str, Any], keep: int = 1) -> None:
    """Save ``state`` at ``path`` atomically: it is written to a temporary file, flushed to the
    disk, and renamed over ``path``, so a crash mid-write keeps the last checkpoint whole. With
    ``keep`` above 1 it is also kept beside ``path`` under its step (``checkpoint-000000042.pt``
    for ``checkpoint.pt``: a hard link, no second copy on disk where links work), and only the
    ``keep`` latest of those are left."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    _flush(partial)
    if keep > 1:
        kept = _kept_path(path, state["steps"])
        kept.unlink(missing_ok=True)  # a resumed run saving the same step again
        try:
            os.link(partial, kept)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(partial, kept)
        for old in sorted(path.parent.glob(f"{path.stem}-*{path.suffix}"))[:-keep]:
            old.unlink()
    partial.replace(path)
    _flush(path.parent)


def _kept_path(path: Path, steps: int) -> Path:
    """Where the checkpoint of step ``steps`` is kept beside ``path`` (``checkpoint_keep``)."""
    return path.with_name(f"{path.stem}-{steps:09d}{path.suffix}")


def _flush(path: Path) -> None:
    """Wait until ``path`` (a file, or a directory's entries) is on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_checkpoint(path: Path, device: torch.device, parameters: set[str]) -> dict[str, Any]:
    """The training state saved at ``path``, loaded as tensors and plain values only (to
    unpickle anything else could run any code: the file may come from a shared filesystem).
    ``ValueError`` saying what is wrong when it is no training state, lacks a key, or a
    parameter or the optimizer's state holds NaN or infinity. Buffers are not checked: they may
    hold infinities on purpose (attention masks)."""
    try:
        state = torch.load(path, map_location=device, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        if found is None:
            raise ValueError("it is not a file of tensors and plain values torch can read") from exc
        raise ValueError(
            "it holds an object other than tensors and plain values, which hetero does not load "
            f"(loading it could run any code): {found.group(1)}"
        ) from exc
    except EOFError as exc:
        raise ValueError("the file is empty or cut short") from exc
    if not isinstance(state, dict):
        raise ValueError(
            f"it holds a {type(state).__name__}, not a training state (a mapping of "
            f"{', '.join(_CHECKPOINT_KEYS)})"
        )
    for key in _CHECKPOINT_KEYS:
        if key not in state:
            raise ValueError(f"it has no {key!r}; it holds: {', '.join(map(str, state))}")
    if not is_integer(state["steps"]) or state["steps"] < 0:
        raise ValueError(f"its 'steps' is {state['steps']!r}, not a step count (an integer >= 0)")
    weights = [(f"model {n}", t) for n, t in named_tensors(state["model"]) if n in parameters]
    weights += [(f"optimizer {n}", t) for n, t in named_tensors(state["optimizer"])]
    for where, tensor in weights:
        if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.isfinite().all():
            continue
        counts = ((int(tensor.isnan().sum()), "NaN"), (int(tensor.isinf().sum()), "infinite"))
        bad = " and ".join(f"{n} {what}" for n, what in counts if n)
        raise ValueError(
            f"{where} holds {bad} of {tensor.numel()} values; a run resumed from it would "
            "train on nothing but NaN"
        )
    return state


def leave_if_regrouping(device: torch.device, written: Callable[[], None]) -> None:
    """On every rank, after a checkpoint: raise ``Regroup`` (every rank leaves with
    ``REGROUP_EXIT``) when ``hetero launch --nproc MIN:MAX`` asks the ranks to regroup, so that
    it starts them again, a lost rank rejoining, from that checkpoint. Rank 0 reads the request
    and answers it once ``written()`` returns (the checkpoint is on disk: it may be written in
    the background), and one broadcast tells the others, so every rank leaves at the same step
    or none does. Outside such a launch it does nothing."""
    request = os.environ.get(REGROUP_FILE_ENV)
    if not request:
        return
    asked = comm.rank() == 0 and os.path.exists(request)
    if asked:  # before any rank leaves: the launcher goes by this answer, not by exit statuses
        written()
        regroup_answer(Path(request)).touch()
    flag = torch.tensor([int(asked)], dtype=torch.int32, device=device)
    comm.broadcast(flag, src=0)
    if flag.item():
        raise Regroup
