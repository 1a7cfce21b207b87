"""``TrainerOptions``: how a ``Trainer`` splits, runs and reports the work, and its validation:
each option's own checks when the options are built, then that the ranks agree on the model,
the shared options and the dataset when a ``Trainer`` starts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch import nn

from hetero._checks import is_integer, is_positive
from hetero.config import MAX_SPEED, MIN_SPEED
from hetero.errors import ConfigError
from hetero.train.layer_buckets import ANY_LAYER, LAYER_CODECS, lossy_layers

__all__ = [
    "PRECISIONS",
    "SHARDINGS",
    "SPLITS",
    "Compression",
    "MixedPrecision",
    "Sharding",
    "Split",
    "TrainerOptions",
    "local_sgd",
    "rank_setup",
    "setup_problems",
]

Compression = Literal["none", "fp16", "powersgd", "int8", "topk"]
MixedPrecision = Literal["no", "bf16", "fp16"]
Sharding = Literal["ddp", "fsdp"]
Split = Literal["speed", "equal"]

_COMPRESSIONS = ("none", "fp16", "powersgd", "int8", "topk")
PRECISIONS = {"no": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SHARDINGS = ("ddp", "fsdp")
SPLITS = ("speed", "equal")
# The longest emulated time per sample: longer ones are no device's, and overflow a sleep.
_MAX_SAMPLE_SECONDS = 3600
# Options every rank must share (the others, like speed or micro_batch, are per rank).
_SHARED_OPTIONS = (
    "global_batch",
    "rebalance_every",
    "profile_steps",
    "seed",
    "shuffle",
    "drop_last",
    "shares",
    "bucket_cap_mb",
    "compression",
    "mixed_precision",
    "sharding",
    "split",
    "max_grad_norm",
    # Every rank takes part in a checkpoint: FSDP gathers the state, local SGD averages it.
    "checkpoint_every",
    "local_sgd_every",
    "topk_ratio",
    "compression_by_layer",
    "exact",
)


@dataclass(frozen=True)
class TrainerOptions:
    """How a ``Trainer`` splits, runs and reports the work. Built on every rank: ``micro_batch``,
    ``memory_limit``, ``memory_cache``, ``num_workers``, ``prefetch_factor``, ``speed``,
    ``emulate_sample_time``, ``activation_checkpointing``, ``report_path`` and ``report_every``
    may differ per rank (``checkpoint_async``, ``checkpoint_keep`` and ``checkpoint_mirrors``
    count on rank 0, which writes), the others must be equal on all of them.

    - ``global_batch``: samples per optimizer step over all ranks (``B``).
    - ``micro_batch``: most samples one forward/backward on this rank holds (its memory); a
      larger share is accumulated over several. ``None``: no cap, or the one ``memory_limit``
      sets.
    - ``memory_limit``: bytes this rank's device holds for the model, its gradients and one
      micro-batch (the optimizer's state aside). The largest micro-batch that fits is measured
      at start (``hetero.train.memory``) and caps the micro-batches; with ``micro_batch`` too,
      that one is checked against it. Enforced: no micro-batch measured to need more runs.
    - ``memory_cache``: a JSON file keeping those measurements, keyed by the model, a sample's
      shapes and the device; ``None``: ``memory_probe.json`` in ``checkpoint_dir`` when there is
      one, else measured every time.
    - ``num_workers``, ``prefetch_factor``: the ``DataLoader``'s worker processes that load and
      collate this rank's next micro-batches while it computes (0: loaded in this process when
      needed), and how many micro-batches each loads ahead.
    - ``rebalance_every``: steps between rebalancing from measured speeds (0: never).
    - ``profile_steps``: timed micro-batches per rank at start that set the first shares.
    - ``shares``: fixed shares per rank (summing to ``global_batch``): no rebalancing.
    - ``split``: ``"speed"`` splits each global batch by the ranks' measured speeds;
      ``"equal"`` gives every rank the same share, as plain DDP does (the baseline to compare
      with), with the same exact update.
    - ``max_grad_norm``: clip the gradient of the global batch to this L2 norm before the
      optimizer steps (the norm of the averaged gradient, as one process would compute it);
      ``None``: no clipping.
    - ``speed``, ``emulate_sample_time``: emulate a device of relative ``speed`` on this rank
      (see ``docs/training.md``): each micro-batch takes ``samples × emulate_sample_time /
      speed`` seconds, or without a sample time its real compute time over ``speed``.
    - ``sharding``: ``"ddp"`` replicates the model on every rank (``DistributedDataParallel``);
      ``"fsdp"`` shards its parameters, gradients and optimizer state over the ranks
      (``torch.distributed.fsdp.fully_shard``), see ``hetero.train.parallel``.
    - ``bucket_cap_mb``, ``compression``, ``mixed_precision``: DDP's bucket size, a DDP
      communication hook (``fp16_compress_hook``, PowerSGD with torch's defaults, or int8
      quantisation and Top-K sparsification with error feedback, ``hetero.train.compression``)
      and ``torch.autocast`` (with a ``GradScaler`` for fp16); under FSDP, bf16 is its
      ``MixedPrecisionPolicy`` (bf16 compute, fp32 reduction). Compression makes the gradients
      inexact.
    - ``topk_ratio``: the share of each bucket's gradient values ``compression="topk"`` sends.
    - ``compression_by_layer``: a codec (``"none"``, ``"int8"``, ``"topk"``) per layer type, the
      class name of the module holding a parameter (``{"Embedding": "none", "Linear": "int8"}``;
      ``"*"``: every type not named; unnamed types are exact without it), instead of
      ``compression`` (``hetero.train.layer_buckets``).
    - ``local_sgd_every``: local SGD: each rank steps on its own share and the ranks average
      their parameters (weighted by their samples) every this many steps and at every
      checkpoint (``hetero.train.local_sgd``); ``None`` or 1: the gradients are all-reduced
      every step (DDP's exact update).
    - ``exact``: refuse every option that makes the update other than the global batch's on one
      device (compression, local SGD, mixed precision).
    - ``activation_checkpointing``: recompute the activations of the model's blocks in the
      backward instead of keeping them (``hetero.train.recompute``); exact, per rank.
    - ``report_path``: JSON lines, one step report each, written by rank 0.
    - ``checkpoint_dir``, ``checkpoint_every``: rank 0 saves the model, the optimizer, the
      sampler's position and the step count there every ``checkpoint_every`` steps (a directory
      every rank can read); a ``Trainer`` built where a checkpoint exists resumes from it,
      profiling the ranks afresh (``hetero launch`` restarts them after a failure).
    - ``checkpoint_async``: rank 0 copies the state to CPU memory at the step and writes it in a
      background thread while training goes on (``hetero.train.async_checkpoint``).
    - ``checkpoint_keep``: how many of the latest checkpoints to keep (``checkpoint.pt`` is the
      newest; with more than 1, each is also kept as ``checkpoint-<step>.pt``).
    - ``checkpoint_mirrors``: further directories (another disk, a network filesystem) each
      checkpoint is also written to, atomically likewise; a run resumes from the newest copy
      whose checksum verifies, wherever it is (``hetero.train.checkpoint``).
    """

    global_batch: int
    micro_batch: int | None = None
    rebalance_every: int = 50
    profile_steps: int = 3
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    shares: tuple[int, ...] | None = None
    speed: float | None = None
    emulate_sample_time: float | None = None
    bucket_cap_mb: float = 25.0
    compression: Compression = "none"
    mixed_precision: MixedPrecision = "no"
    sharding: Sharding = "ddp"
    split: Split = "speed"
    max_grad_norm: float | None = None
    topk_ratio: float = 0.01
    compression_by_layer: dict[str, str] | None = None
    local_sgd_every: int | None = None
    exact: bool = False
    activation_checkpointing: bool = False
    report_path: str | None = None
    report_every: int = 10
    checkpoint_dir: str | None = None
    checkpoint_every: int = 50
    checkpoint_async: bool = False
    checkpoint_keep: int = 1
    checkpoint_mirrors: Sequence[str] = ()
    memory_limit: int | None = None
    memory_cache: str | None = None
    num_workers: int = 0
    prefetch_factor: int = 2

    def __post_init__(self) -> None:
        if self.shares is not None and not isinstance(self.shares, (str, bytes)):
            with contextlib.suppress(TypeError):
                object.__setattr__(self, "shares", tuple(self.shares))
        if isinstance(self.checkpoint_mirrors, list):
            object.__setattr__(self, "checkpoint_mirrors", tuple(self.checkpoint_mirrors))
        problems = _check_options(self)
        if problems:
            raise ConfigError(problems)


def _check_options(o: TrainerOptions) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []

    def at_least(name: str, minimum: int, why: str = "") -> None:
        value = getattr(o, name)
        if not is_integer(value) or value < minimum:
            problems.append((name, f"must be an integer >= {minimum}{why}, got {value!r}"))

    at_least("global_batch", 1)
    if o.micro_batch is not None:
        at_least(
            "micro_batch",
            1,
            " (the most samples one forward/backward on this rank holds; None for no cap): a"
            " rank that cannot hold one sample cannot train",
        )
    if o.memory_limit is not None:
        at_least(
            "memory_limit",
            1,
            " (bytes this rank's device holds for the model, its gradients and one micro-batch; "
            "None for no limit)",
        )
    if o.memory_cache is not None and (not isinstance(o.memory_cache, str) or not o.memory_cache):
        problems.append(
            (
                "memory_cache",
                f"must be a file path (a non-empty string) or None, got {o.memory_cache!r}",
            )
        )
    at_least("num_workers", 0, " (0: load micro-batches in the training process)")
    at_least("prefetch_factor", 1, " (micro-batches each worker loads ahead)")
    at_least("rebalance_every", 0, " (0: never)")
    at_least("profile_steps", 1)
    at_least("seed", 0)
    at_least("report_every", 1)
    at_least("checkpoint_every", 1)
    at_least("checkpoint_keep", 1, " (the latest checkpoints kept)")
    if o.local_sgd_every is not None:
        at_least(
            "local_sgd_every",
            1,
            " (steps between parameter averages; None or 1: the gradients are all-reduced "
            "every step)",
        )
    if not (is_positive(o.topk_ratio) and o.topk_ratio <= 1):
        problems.append(
            (
                "topk_ratio",
                "must be a number > 0 and <= 1 (the share of each bucket's gradient values "
                f"compression='topk' sends), got {o.topk_ratio!r}",
            )
        )
    if o.speed is not None and not (is_positive(o.speed) and MIN_SPEED <= o.speed <= MAX_SPEED):
        problems.append(
            (
                "speed",
                f"must be a number from {MIN_SPEED:g} to {MAX_SPEED:g} or None, got {o.speed!r}",
            )
        )
    sample_time = o.emulate_sample_time
    if sample_time is not None and not (
        is_positive(sample_time) and sample_time <= _MAX_SAMPLE_SECONDS
    ):
        problems.append(
            (
                "emulate_sample_time",
                f"must be a number of seconds > 0 and at most {_MAX_SAMPLE_SECONDS} or None, "
                f"got {sample_time!r}",
            )
        )
    if not is_positive(o.bucket_cap_mb):
        problems.append(("bucket_cap_mb", f"must be a finite number > 0, got {o.bucket_cap_mb!r}"))
    if o.compression not in _COMPRESSIONS:
        allowed = ", ".join(_COMPRESSIONS)
        problems.append(("compression", f"must be one of {allowed}, got {o.compression!r}"))
    if o.mixed_precision not in PRECISIONS:
        allowed = ", ".join(PRECISIONS)
        problems.append(("mixed_precision", f"must be one of {allowed}, got {o.mixed_precision!r}"))
    if o.sharding not in SHARDINGS:
        allowed = ", ".join(SHARDINGS)
        problems.append(
            (
                "sharding",
                f"must be one of {allowed} (ddp: the model replicated on every rank; fsdp: "
                f"sharded over them), got {o.sharding!r}",
            )
        )
    elif o.sharding == "fsdp":
        if o.compression != "none":
            problems.append(
                (
                    "compression",
                    f"{o.compression!r} is a DDP communication hook: with sharding='fsdp' "
                    "gradients are reduce-scattered uncompressed; use compression='none'",
                )
            )
        if o.mixed_precision == "fp16":
            problems.append(
                (
                    "mixed_precision",
                    "'fp16' needs a gradient scaler that checks every rank's shard for "
                    "overflow, which sharding='fsdp' does not have here: use 'bf16' or 'no'",
                )
            )
    if o.compression in ("int8", "topk") and o.mixed_precision == "fp16":
        problems.append(
            (
                "compression",
                f"{o.compression!r} keeps what it did not send of each gradient for the next "
                "step, in units of the loss scale of mixed_precision='fp16', which its gradient "
                "scaler changes between steps (and a step it skips would leak into the next): "
                "use mixed_precision='bf16' or 'no'",
            )
        )
    if o.split not in SPLITS:
        allowed = ", ".join(SPLITS)
        problems.append(
            (
                "split",
                f"must be one of {allowed} (speed: shares in proportion to the ranks' measured "
                f"speeds; equal: the same share each, as plain DDP), got {o.split!r}",
            )
        )
    elif o.split == "equal" and o.shares is not None:
        problems.append(
            (
                "shares",
                "must be None with split='equal' (which gives every rank the same share), "
                f"got {o.shares!r}",
            )
        )
    if o.max_grad_norm is not None and not is_positive(o.max_grad_norm):
        problems.append(
            (
                "max_grad_norm",
                "must be a finite number > 0 (the largest L2 norm of the global batch's "
                f"gradient) or None for no clipping, got {o.max_grad_norm!r}",
            )
        )
    if o.shares is not None:
        shares = o.shares
        if not isinstance(shares, tuple) or not all(is_integer(s) and s >= 0 for s in shares):
            problems.append(("shares", f"must be a list of integers >= 0, got {shares!r}"))
        elif is_integer(o.global_batch) and sum(shares) != o.global_batch:
            problems.append(
                (
                    "shares",
                    f"must sum to global_batch={o.global_batch}, got {list(shares)} "
                    f"(sum {sum(shares)})",
                )
            )
    problems += _local_sgd_problems(o) + _exactness_problems(o)
    problems += _by_layer_problems(o)
    problems += _mirror_problems(o)
    return problems


def _mirror_problems(o: TrainerOptions) -> list[tuple[str, str]]:
    """``checkpoint_mirrors`` that are no directory, or one that another copy is in already."""
    mirrors = o.checkpoint_mirrors
    if not isinstance(mirrors, tuple):
        return [
            (
                "checkpoint_mirrors",
                "must be a list of directories each checkpoint is also written to (strings), "
                f"got {mirrors!r}",
            )
        ]
    folder = o.checkpoint_dir
    seen = {os.path.realpath(folder): "checkpoint_dir"} if isinstance(folder, str) else {}
    problems: list[tuple[str, str]] = []
    for i, mirror in enumerate(mirrors):
        name = f"checkpoint_mirrors[{i}]"
        if not isinstance(mirror, str) or not mirror:
            problems.append((name, f"must be a directory (a non-empty string), got {mirror!r}"))
        elif folder is None:
            problems.append(
                (
                    name,
                    f"{mirror!r} mirrors the checkpoints written to checkpoint_dir, which is "
                    "None: set checkpoint_dir too (the first copy), or no mirrors",
                )
            )
        elif (where := os.path.realpath(mirror)) in seen:
            problems.append(
                (
                    name,
                    f"{mirror!r} is the same directory as {seen[where]}: each copy needs a "
                    "directory of its own (best on another disk)",
                )
            )
        else:
            seen[where] = name
    return problems


def local_sgd(o: TrainerOptions) -> bool:
    """Whether ``o`` asks for local SGD: ranks stepping on their own between averages."""
    every = o.local_sgd_every
    return every is not None and is_integer(every) and every > 1


def _local_sgd_problems(o: TrainerOptions) -> list[tuple[str, str]]:
    """Options local SGD cannot honour: it reduces no gradient, it averages parameters."""
    if not local_sgd(o):
        return []
    k = o.local_sgd_every
    problems: list[tuple[str, str]] = []
    if o.sharding != "ddp":
        problems.append(
            (
                "local_sgd_every",
                f"{k} averages whole replicas of the model, which sharding={o.sharding!r} does "
                "not hold: use sharding='ddp'",
            )
        )
    if o.compression != "none":
        problems.append(
            (
                "compression",
                f"{o.compression!r} compresses DDP's gradient all-reduce, which "
                f"local_sgd_every={k} replaces by averaging the parameters every {k} steps: "
                "use compression='none'",
            )
        )
    if o.max_grad_norm is not None:
        problems.append(
            (
                "max_grad_norm",
                "clips the global batch's gradient, which no rank forms with "
                f"local_sgd_every={k} (each rank steps on its own share): use None",
            )
        )
    return problems


def _exactness_problems(o: TrainerOptions) -> list[tuple[str, str]]:
    """With ``exact=True``: every option that makes the update other than the global batch's."""
    if not o.exact:
        return []
    why = "and exact=True asks for the global batch's exact update"
    problems: list[tuple[str, str]] = []
    if o.compression != "none":
        problems.append(
            (
                "compression",
                f"{o.compression!r} sends an approximation of the gradient, {why}: use "
                "compression='none' or exact=False",
            )
        )
    if local_sgd(o):
        problems.append(
            (
                "local_sgd_every",
                f"{o.local_sgd_every} lets each rank step on its own share between averages, "
                f"{why}: use None (or 1) or exact=False",
            )
        )
    if o.mixed_precision != "no":
        problems.append(
            (
                "mixed_precision",
                f"{o.mixed_precision!r} computes in lower precision, {why}: use 'no' or "
                "exact=False",
            )
        )
    return problems


def _by_layer_problems(o: TrainerOptions) -> list[tuple[str, str]]:
    """``compression_by_layer``'s entries, and the options it cannot go with."""
    by_layer, name = o.compression_by_layer, "compression_by_layer"
    if by_layer is None:
        return []
    allowed = ", ".join(LAYER_CODECS)
    if not isinstance(by_layer, dict):
        return [
            (
                name,
                f"must be a dict from layer types (a module's class name, such as 'Linear', or "
                f"{ANY_LAYER!r} for every type not named) to codecs ({allowed}) or None, "
                f"got {by_layer!r}",
            )
        ]
    problems: list[tuple[str, str]] = []
    for layer, codec in by_layer.items():
        if not isinstance(layer, str) or not layer:
            problems.append(
                (
                    name,
                    f"keys must be layer types (a module's class name, such as 'Linear', or "
                    f"{ANY_LAYER!r} for every type not named), got {layer!r}",
                )
            )
        if codec not in LAYER_CODECS:
            problems.append((name, f"{layer!r}: must be one of {allowed}, got {codec!r}"))
    if o.compression != "none":
        problems.append(
            (
                name,
                f"is given with compression={o.compression!r}: give one of them (a "
                f"{ANY_LAYER!r} entry sets the codec of every layer type not named)",
            )
        )
    lossy = [(layer, codec) for layer, codec in lossy_layers(by_layer) if codec in LAYER_CODECS]
    if not lossy:  # every gradient exact: DDP's own all-reduce, allowed with anything
        return problems
    if o.exact:
        problems += [
            (
                name,
                f"{layer!r}: {codec!r} sends an approximation of the gradient, and exact=True "
                f"asks for the global batch's exact update: use 'none' or exact=False",
            )
            for layer, codec in lossy
        ]
    if o.sharding == "fsdp":
        problems.append(
            (
                name,
                f"{dict(lossy)!r} compresses in a DDP communication hook: with sharding='fsdp' "
                "gradients are reduce-scattered uncompressed; use None",
            )
        )
    if local_sgd(o):
        problems.append(
            (
                name,
                f"{dict(lossy)!r} compresses DDP's gradient all-reduce, which local_sgd_every="
                f"{o.local_sgd_every} replaces by averaging the parameters: use None",
            )
        )
    if o.mixed_precision == "fp16":
        problems.append(
            (
                name,
                f"{dict(lossy)!r} keeps what it did not send of each gradient for the next step, "
                "in units of the loss scale of mixed_precision='fp16', which its gradient scaler "
                "changes between steps: use mixed_precision='bf16' or 'no'",
            )
        )
    return problems


def rank_setup(
    o: TrainerOptions,
    model: nn.Module,
    dataset_size: int,
    *,
    micro_batch: int | None = None,
    memory: str | None = None,
) -> dict[str, Any]:
    """What this rank tells the others at start, for ``setup_problems`` to compare:
    ``micro_batch`` is its cap in effect (``o.micro_batch`` or the one its memory limit sets),
    ``memory`` why its memory limit cannot be met, if it cannot."""
    return {
        "model": [(n, tuple(t.shape), str(t.dtype)) for n, t in _tensors(model)],
        "options": {name: getattr(o, name) for name in _SHARED_OPTIONS},
        "dataset_size": dataset_size,
        "micro_batch": o.micro_batch if micro_batch is None else micro_batch,
        "memory": memory,
    }


def setup_problems(
    o: TrainerOptions, ranks: list[dict[str, Any]], world_size: int, dataset_size: int
) -> list[tuple[str, str]]:
    """What keeps the ranks from training together: options that do not fit ``world_size`` ranks
    or a dataset of ``dataset_size`` samples, and any rank whose ``rank_setup`` (``ranks``, in
    rank order) differs from rank 0's in its model, its shared options or its dataset's size."""
    problems: list[tuple[str, str]] = []
    if o.global_batch < world_size:
        problems.append(
            (
                "global_batch",
                f"a global batch smaller than the number of ranks: global_batch="
                f"{o.global_batch} with {world_size} ranks; use at least "
                f"{world_size} (or fewer ranks)",
            )
        )
    if o.shares is not None and len(o.shares) != world_size:
        problems.append(
            (
                "shares",
                f"has {len(o.shares)} entries for {world_size} ranks: give one each",
            )
        )
    if dataset_size < o.global_batch and o.drop_last:
        problems.append(
            (
                "dataset",
                f"has {dataset_size} samples, fewer than one global batch of "
                f"{o.global_batch}, and drop_last is set: no step would run",
            )
        )
    for rank, theirs in enumerate(ranks):
        if theirs.get("memory"):
            problems.append((f"rank {rank}", theirs["memory"]))
    first = ranks[0]
    for rank, theirs in enumerate(ranks[1:], start=1):
        if theirs["model"] != first["model"]:
            diff = _model_difference(first["model"], theirs["model"], rank)
            problems.append((f"rank {rank}", f"rank {rank}'s model differs from rank 0's: {diff}"))
        for name, value in theirs["options"].items():
            if value != first["options"][name]:
                problems.append(
                    (
                        f"rank {rank}",
                        f"option {name}={value!r} differs from rank 0's "
                        f"{first['options'][name]!r}: it must be the same on every rank",
                    )
                )
        if theirs["dataset_size"] != dataset_size:
            problems.append(
                (
                    f"rank {rank}",
                    f"its dataset has {theirs['dataset_size']} samples, rank 0's "
                    f"{dataset_size}: every rank indexes the same dataset",
                )
            )
    return problems


def _tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    yield from model.named_buffers()


def _model_difference(
    first: list[tuple[str, tuple[int, ...], str]],
    theirs: list[tuple[str, tuple[int, ...], str]],
    rank: int,
) -> str:
    """The first parameter or buffer where rank ``rank``'s model and rank 0's part ways."""
    for a, b in zip(first, theirs, strict=False):
        if a[0] != b[0]:
            return f"it has {b[0]!r} where rank 0 has {a[0]!r}"
        if a[1:] != b[1:]:
            return f"{a[0]!r} is {list(b[1])} {b[2]} on rank {rank}, {list(a[1])} {a[2]} on rank 0"
    return f"it has {len(theirs)} parameters and buffers, rank 0 has {len(first)}"
