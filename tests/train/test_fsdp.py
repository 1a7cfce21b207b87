"""The Trainer with ``sharding="fsdp"`` on 3 gloo ranks over 127.0.0.1: the same uneven shares
and the same exact update as DDP (against one process training on the same global batches),
gradient accumulation, a rank with share 0, bf16, checkpoints gathered and resumed, and the
errors; the memory estimate's optimizer state and shards in one process.

The three processes start once per module and run every scenario in order; the tests then
check what each rank recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero.errors import ConfigError
from hetero.train import Trainer, TrainerOptions
from hetero.train.memory import MemoryProbe, optimizer_state_bytes
from hetero.train.parallel import fsdp_units
from tests.train._models import (
    LOSS,
    adam,
    data,
    relative_difference,
    sgd,
    trained_in_one_process,
)
from tests.train._ranks import Outcome, each, errors, matching_one_process, run_ranks

WORLD = 3
STEPS = 5


class _Blocks(nn.Module):
    """An input layer, a ModuleList of residual blocks (FSDP's units) and a head."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(3)
        )
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


def _model(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return _Blocks(width)


def _exact(
    make_optimizer: Callable[[Any], torch.optim.Optimizer], sharding: str = "fsdp", **kw: Any
) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        options = TrainerOptions(global_batch=24, seed=3, sharding=sharding, **kw)  # type: ignore[arg-type]
        trainer = Trainer(_model(), make_optimizer, LOSS, data(), options)
        reports = trainer.train(STEPS, progress=False)
        reference = trained_in_one_process(_model(), make_optimizer, options, STEPS)
        return {
            "diff": relative_difference(trainer.model_state_dict(), reference),
            "reports": [r.to_dict() for r in reports],
        }

    return scenario


def _resume(rank: int) -> Any:
    """5 steps with a checkpoint at step 3, then a new trainer in the same folder: it resumes
    from step 3 and, after 2 more steps, ends where the first one did."""
    folder = Path(_OUT, "fsdp-checkpoints")
    options = TrainerOptions(
        global_batch=24,
        shares=(12, 8, 4),
        micro_batch=5,
        sharding="fsdp",
        checkpoint_dir=str(folder),
        checkpoint_every=3,
    )
    first = Trainer(_model(), adam, LOSS, data(), options)
    first.train(STEPS, progress=False)
    whole = first.model_state_dict()
    second = Trainer(_model(), adam, LOSS, data(), options)
    resumed = second.resumed_from
    second.train(STEPS - second.steps, progress=False)
    diff = max(
        ((t - whole[name]).abs().max() / whole[name].abs().max()).item()
        for name, t in second.model_state_dict().items()
    )
    return {"resumed_from": resumed, "steps": second.steps, "diff": diff}


def _other_sharding(rank: int) -> Any:
    """A DDP run pointed at the FSDP run's checkpoints."""
    options = TrainerOptions(
        global_batch=24, checkpoint_dir=str(Path(_OUT, "fsdp-checkpoints")), profile_steps=1
    )
    Trainer(_model(), adam, LOSS, data(), options)


def _bf16(rank: int) -> Any:
    options = TrainerOptions(
        global_batch=24, micro_batch=5, sharding="fsdp", mixed_precision="bf16", profile_steps=1
    )
    trainer = Trainer(_model(), sgd, LOSS, data(), options)
    reports = trainer.train(2, progress=False)
    return {
        "global_batches": [r.global_batch for r in reports],
        "dtypes": sorted({str(t.dtype) for t in trainer.model_state_dict().values()}),
    }


def _memory(rank: int) -> Any:
    """A memory limit under FSDP: the probe counts this rank's shards, and the cap holds."""
    options = TrainerOptions(
        global_batch=24, shares=(12, 8, 4), sharding="fsdp", memory_limit=10**9, profile_steps=1
    )
    trainer = Trainer(_model(), adam, LOSS, data(), options)
    reports = trainer.train(2, progress=False)
    assert trainer.memory is not None
    return {
        "parts": dict(trainer.memory.resident_parts),
        "cap": trainer.micro_batch,
        "steps": len(reports),
    }


def _mixed_shardings(rank: int) -> Any:
    options = TrainerOptions(global_batch=24, sharding="fsdp" if rank == 1 else "ddp")
    Trainer(_model(), sgd, LOSS, data(), options)


SCENARIOS: dict[str, Callable[[int], Any]] = {
    # Unequal shares; micro_batch 4 makes ranks 0 and 1 accumulate (14 = 4+4+3+3, 7 = 4+3).
    # 60 samples: the third step is an epoch's partial last batch of 12, the fourth a new epoch.
    "sgd": _exact(sgd, shares=(14, 7, 3), micro_batch=4),
    "adam": _exact(adam, shares=(5, 16, 3), micro_batch=5),
    "share0": _exact(sgd, shares=(16, 8, 0), micro_batch=6),
    "ddp_share0": _exact(sgd, sharding="ddp", shares=(16, 8, 0), micro_batch=6),
    "profiled": _exact(adam, micro_batch=3),
    "resume": _resume,
    "other_sharding": _other_sharding,
    "bf16": _bf16,
    "memory": _memory,
    "mixed_shardings": _mixed_shardings,
}
_OUT = ""  # set in each rank by run_ranks: where scenarios write files


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("fsdp"))


@pytest.mark.parametrize("name", ["sgd", "adam", "share0", "ddp_share0", "profiled"])
def test_fsdp_matches_one_process_training_on_the_global_batches(
    ranks: list[dict[str, Outcome]], name: str
) -> None:
    reports = matching_one_process(ranks, name, 1e-6)[0]["reports"]
    assert [r["global_batch"] for r in reports] == [24, 24, 12, 24, 24]


def test_fsdp_ranks_accumulate_over_their_micro_batches(ranks: list[dict[str, Outcome]]) -> None:
    first = each(ranks, "sgd")[0]["reports"][0]
    assert [(r["samples"], r["micro_batches"]) for r in first["ranks"]] == [(14, 4), (7, 2), (3, 1)]
    zero = each(ranks, "share0")[0]["reports"][0]
    assert [(r["samples"], r["micro_batches"]) for r in zero["ranks"]] == [(16, 3), (8, 2), (0, 0)]


def test_an_fsdp_run_resumes_from_its_gathered_checkpoint(
    ranks: list[dict[str, Outcome]],
) -> None:
    results = each(ranks, "resume")
    assert all(r["resumed_from"] == 3 and r["steps"] == STEPS for r in results)
    assert max(r["diff"] for r in results) <= 1e-6


def test_a_checkpoint_of_another_sharding_is_refused(ranks: list[dict[str, Outcome]]) -> None:
    message = errors(ranks, "other_sharding")
    assert message.startswith("ConfigError: checkpoint_dir: cannot resume from ")
    assert message.endswith(
        "it was written with sharding='fsdp' and this run uses sharding='ddp': resume with "
        "sharding='fsdp'"
    )


def test_fsdp_trains_in_bf16_and_keeps_fp32_parameters(ranks: list[dict[str, Outcome]]) -> None:
    result = each(ranks, "bf16")[0]
    assert result == {"global_batches": [24, 24], "dtypes": ["torch.float32"]}


def test_a_memory_limit_under_fsdp_counts_this_ranks_shards(
    ranks: list[dict[str, Outcome]],
) -> None:
    result = each(ranks, "memory")[0]
    model = _model()
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert result["parts"] == {
        "the model's tensors": weights,
        "its parameters' shard": -(-weights // WORLD),
        "the optimizer's state shard": -(-optimizer_state_bytes(adam, model) // WORLD),
    }
    assert result["cap"] == 24 and result["steps"] == 2


def test_ranks_with_different_shardings_are_refused(ranks: list[dict[str, Outcome]]) -> None:
    assert errors(ranks, "mixed_shardings") == (
        "ConfigError: rank 1: option sharding='fsdp' differs from rank 0's 'ddp': it must be "
        "the same on every rank"
    )


# ------------------------------------------------------------------------------ one process


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"sharding": "zero3"},
            "sharding: must be one of ddp, fsdp (ddp: the model replicated on every rank; "
            "fsdp: sharded over them), got 'zero3'",
        ),
        (
            {"sharding": "fsdp", "compression": "powersgd"},
            "compression: 'powersgd' is a DDP communication hook: with sharding='fsdp' "
            "gradients are reduce-scattered uncompressed; use compression='none'",
        ),
        (
            {"sharding": "fsdp", "mixed_precision": "fp16"},
            "mixed_precision: 'fp16' needs a gradient scaler that checks every rank's shard "
            "for overflow, which sharding='fsdp' does not have here: use 'bf16' or 'no'",
        ),
    ],
)
def test_bad_sharding_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=8, **options)
    assert str(info.value) == message


def test_fsdp_needs_an_optimizer_factory(group: None) -> None:
    model = _model()
    with pytest.raises(ConfigError, match=r"^optimizer: with sharding='fsdp' give a function"):
        Trainer(model, sgd(model.parameters()), LOSS, data(), TrainerOptions(8, sharding="fsdp"))


def test_the_units_are_the_module_lists_members() -> None:
    model = _model()
    assert fsdp_units(model) == list(reversed(model.blocks))


def test_the_optimizer_state_is_measured_on_a_stand_in() -> None:
    model = _model()
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    # Adam: two fp32 moments per element and a step count per parameter (an fp32 scalar).
    assert optimizer_state_bytes(adam, model) == 8 * params + 4 * tensors
    assert optimizer_state_bytes(sgd(model.parameters()), model) == 4 * params
    assert optimizer_state_bytes(torch.optim.SGD(model.parameters(), lr=0.1), model) == 0


def test_fsdp_shards_the_resident_state_over_the_ranks() -> None:
    model = _model(64)
    weights = sum(p.numel() * 4 for p in model.parameters())
    adam_state = optimizer_state_bytes(adam, model)
    ddp = MemoryProbe(model, LOSS, data(), optimizer=adam).resident_parts()
    fsdp = MemoryProbe(
        model, LOSS, data(), optimizer=adam, sharding="fsdp", world_size=4
    ).resident_parts()
    assert ddp == {
        "the model's tensors": weights,
        "DDP's gradient buckets": weights,
        "the optimizer's state": adam_state,
    }
    assert fsdp == {
        "the model's tensors": weights,
        "its parameters' shard": weights // 4,
        "the optimizer's state shard": adam_state // 4,
    }
