"""Checkpoints of a training run: the state rank 0 writes (atomically) and every rank reads
back on resuming, loaded as tensors and plain values only and checked before use; and the
checkpoint as the place where the ranks of an elastic launch regroup.

The state is the run's, not a rank's: the full model and optimizer state, the step count and
the sampler's epoch and position in global batches. The shares it also holds are used only at
the same number of ranks, so a checkpoint resumes at any world size.

Each file carries the sha256 of its content, as the comment of its zip archive (the file is
``torch.save``'s, then its last bytes: what ``torch.load`` ignores), so that the checksum and
the data are renamed into place together. A checkpoint can be mirrored to further directories
(another disk, a network filesystem): serialised once, copied to each, each copy atomic; a run
resumes from the newest copy whose checksum verifies.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import re
import shutil
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc

from hetero import comm
from hetero._checks import is_integer
from hetero.train.elastic import REGROUP_FILE_ENV, Regroup, regroup_answer
from hetero.train.tensors import named_tensors

__all__ = [
    "CheckpointCopies",
    "leave_if_regrouping",
    "read_checkpoint",
    "read_newest_checkpoint",
    "write_checkpoint",
]

log = logging.getLogger("hetero.train")

# What a checkpoint holds beside the optional "scaler".
_CHECKPOINT_KEYS = ("steps", "model", "optimizer", "sampler")
# A zip archive ends with its end record: this signature, 16 bytes, the comment's length (2
# bytes) and the comment. torch.save writes none; hetero's is the checksum.
_END_RECORD = b"PK\x05\x06"
_END_RECORD_SIZE = 22
_ZIP_START = b"PK\x03\x04"
_STAMP = re.compile(
    rb"PK\x05\x06.{16}(..)(hetero-checkpoint sha256=([0-9a-f]{64}) steps=(\d+))\Z", re.DOTALL
)
_TAIL = 256  # bytes that hold the end record and the checksum
_CHUNK = 4 << 20
_MISSING = "there is no such file"


@dataclass(frozen=True)
class CheckpointCopies:
    """Where the checkpoint of step ``steps`` went: ``written``, the copies on disk (primary
    first), and ``failed``, each copy that could not be written and why."""

    steps: int
    written: tuple[Path, ...]
    failed: tuple[tuple[Path, str], ...] = ()


@dataclass(frozen=True)
class _Stamp:
    """The checksum a checkpoint file carries: the sha256 of ``torch.save``'s bytes, which are
    the file's first ``end`` bytes followed by an empty comment's length (two zero bytes)."""

    sha256: str
    steps: int
    end: int


def write_checkpoint(
    path: Path, state: dict[str, Any], keep: int = 1, mirrors: Sequence[str | Path] = ()
) -> CheckpointCopies:
    """Save ``state`` at ``path`` atomically: it is written to a temporary file, flushed to the
    disk, and renamed over ``path``, so a crash mid-write keeps the last checkpoint whole. With
    ``keep`` above 1 it is also kept beside ``path`` under its step (``checkpoint-000000042.pt``
    for ``checkpoint.pt``: a hard link, no second copy on disk where links work), and only the
    ``keep`` latest of those are left. The file carries the sha256 of its content.

    Each of ``mirrors`` (directories) gets a copy under the same name, written the same way:
    serialised once, then copied. A copy that cannot be written is logged and passed over when
    another one was written; when none was, the primary's error is raised (the mirrors' as its
    notes). Returns where the checkpoint was written."""
    steps = state["steps"]
    written: list[Path] = []
    errors: list[tuple[Path, BaseException]] = []
    for target in [path, *(Path(m) / path.name for m in mirrors)]:
        try:
            _write_copy(target, state, written[0] if written else None, keep)
        except (OSError, RuntimeError) as error:  # a full disk, a lost mount, no permission
            errors.append((target, error))
        else:
            written.append(target)
    if not written:
        primary = errors[0][1]
        for target, failure in errors[1:]:
            primary.add_note(f"the mirror {target} could not be written either: {_why(failure)}")
        raise primary
    copies = CheckpointCopies(steps, tuple(written), tuple((t, _why(e)) for t, e in errors))
    for target, why in copies.failed:
        log.warning(
            "the checkpoint of step %d was not written to %s (%s); it is in %s",
            steps,
            target,
            why,
            ", ".join(map(str, written)),
        )
    return copies


def _write_copy(path: Path, state: dict[str, Any], source: Path | None, keep: int) -> None:
    """One copy of the checkpoint at ``path``: ``state`` serialised, or the file at ``source``
    (a copy written already) copied; then kept and renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    try:
        if source is None:
            _serialise(state, partial)
        else:
            shutil.copyfile(source, partial)
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
    except BaseException:
        with contextlib.suppress(OSError):  # on a full disk, what it took is given back
            partial.unlink(missing_ok=True)
        raise
    _flush(path.parent)


class _Hashing:
    """A file ``torch.save`` writes to, hashing what it writes on the way."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def _serialise(state: dict[str, Any], path: Path) -> None:
    """``state`` saved at ``path`` by ``torch.save``, its sha256 then written in place of the
    archive's empty comment."""
    with open(path, "w+b") as file:
        hashing = _Hashing(file)
        torch.save(state, cast("IO[bytes]", hashing))  # it calls write and flush only
        file.seek(-_END_RECORD_SIZE, os.SEEK_END)
        end = file.read()
        if not (end.startswith(_END_RECORD) and end.endswith(b"\0\0")):
            raise RuntimeError("torch.save wrote no zip archive: there is no place for a checksum")
        stamp = f"hetero-checkpoint sha256={hashing.sha256.hexdigest()} steps={state['steps']}"
        file.seek(-2, os.SEEK_END)
        file.write(struct.pack("<H", len(stamp)) + stamp.encode())


def _stamp_of(file: IO[bytes]) -> _Stamp | None:
    """The checksum ``file`` carries; ``None`` for a file without one that ``torch.load`` may
    still read (one ``torch.save`` wrote, not hetero: a complete zip archive with no comment, or
    not a zip archive at all). ``ValueError`` for a zip archive with neither at its end: one cut
    short, or a checksum damaged."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - _TAIL))
    tail = file.read()
    found = _STAMP.search(tail)
    if found is not None and struct.unpack("<H", found.group(1))[0] == len(found.group(2)):
        return _Stamp(found.group(3).decode(), int(found.group(4)), size - len(found.group(2)) - 2)
    file.seek(0)
    if file.read(len(_ZIP_START)) != _ZIP_START:
        return None
    end = tail[-_END_RECORD_SIZE:]
    if end.startswith(_END_RECORD) and end.endswith(b"\0\0"):
        return None
    raise ValueError(
        f"the file is cut short or damaged: its {size} bytes end neither with a checksum nor "
        "with a zip archive's end"
    )


def _verify(file: IO[bytes], stamp: _Stamp) -> None:
    """``ValueError`` unless the sha256 of ``file``'s content is the one it carries."""
    sha256 = hashlib.sha256()
    file.seek(0)
    left = stamp.end
    while left > 0:
        chunk = file.read(min(_CHUNK, left))
        if not chunk:
            break
        sha256.update(chunk)
        left -= len(chunk)
    sha256.update(b"\0\0")
    if sha256.hexdigest() != stamp.sha256:
        raise ValueError(
            f"its content does not match the sha256 written with it (sha256 {sha256.hexdigest()}, "
            f"written {stamp.sha256}): the file is damaged"
        )


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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


def read_newest_checkpoint(
    path: Path, device: torch.device, parameters: set[str], mirrors: Sequence[str | Path] = ()
) -> tuple[Path, dict[str, Any]] | None:
    """The newest training state among the copies of the checkpoint at ``path`` and in each of
    ``mirrors`` (directories) whose checksum verifies and that ``read_checkpoint`` accepts, and
    where it was read; ``None`` when there is no copy. Copies go newest step first (a copy
    without a checksum, which ``torch.save`` wrote, after those with one), the primary first of
    equals. A copy passed over (missing, damaged, refused, or older) is logged, naming it and
    why. ``ValueError`` naming every copy and what is wrong with each when none can be read."""
    copies = [path, *(Path(m) / path.name for m in mirrors)]
    problems: dict[Path, str] = {}
    found: list[tuple[int, Path]] = []  # (steps, -1 without a checksum), primary first
    for copy in copies:
        try:
            with open(copy, "rb") as file:
                stamp = _stamp_of(file)
        except (FileNotFoundError, NotADirectoryError):  # as Path.exists has it
            problems[copy] = _MISSING
        except (OSError, ValueError) as exc:
            problems[copy] = str(exc)
        else:
            found.append((-1 if stamp is None else stamp.steps, copy))
    if not found and all(why == _MISSING for why in problems.values()):
        return None
    found.sort(key=lambda f: -f[0])  # a stable sort: the primary first of equals
    for tried, (_, copy) in enumerate(found):
        try:
            state = read_checkpoint(copy, device, parameters)
        except (OSError, RuntimeError, ValueError) as exc:
            problems[copy] = str(exc)
            continue
        for steps, older in found[tried + 1 :]:
            if 0 <= steps < state["steps"]:
                problems[older] = f"it holds step {steps}, older"
        for bad in sorted(problems, key=copies.index):
            log.warning(
                "checkpoint copy %s passed over: %s; resuming from %s (step %d)",
                bad,
                problems[bad],
                copy,
                state["steps"],
            )
        return copy, state
    listed = "; ".join(f"{copy}: {problems[copy]}" for copy in sorted(problems, key=copies.index))
    raise ValueError(listed if len(problems) == 1 else f"any copy: {listed}")


def read_checkpoint(path: Path, device: torch.device, parameters: set[str]) -> dict[str, Any]:
    """The training state saved at ``path``, loaded as tensors and plain values only (to
    unpickle anything else could run any code: the file may come from a shared filesystem),
    once the sha256 it carries matches its content (a file ``torch.save`` wrote carries none).
    ``ValueError`` saying what is wrong when it is damaged or cut short, no training state,
    lacks a key, or a parameter or the optimizer's state holds NaN or infinity. Buffers are not
    checked: they may hold infinities on purpose (attention masks)."""
    with open(path, "rb") as file:
        stamp = _stamp_of(file)
        if stamp is not None:
            _verify(file, stamp)
        file.seek(0)
        state = _load(file, device)
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


def _load(file: IO[bytes], device: torch.device) -> Any:
    """What ``file`` holds, if it is tensors and plain values torch can read."""
    try:
        return torch.load(file, map_location=device, weights_only=True)
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


def leave_if_regrouping(device: torch.device, written: Callable[[], object]) -> None:
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
