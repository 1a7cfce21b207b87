"""The pipeline runner on 4 gloo ranks over 127.0.0.1: after 5 steps under GPipe and 1F1B, in
the planner's rank order and in one given by hand, every stage's parameters match one process
training on the same batches; an emulated pipeline takes the time the plan predicts; bad
batches and plans are refused on every rank.

The four processes start once per module and run every scenario in order; the tests then check
what each rank recorded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero.train import (
    LayerCost,
    PipelineRank,
    PipelineRunner,
    StagePlan,
    TrainerOptions,
    plan_stages,
)
from tests.train._models import LOSS, adam, data, sgd
from tests.train._ranks import Outcome, each, errors, one_process, recorded, run_ranks

WORLD = 4
STEPS = 5
BATCH = 12  # 60 samples: 5 steps are one epoch
SPEEDS = (1.0, 0.25, 1.0, 0.5)  # rank 1 the slowest: a reordered pipeline puts it elsewhere
TOLERANCE = 1e-5


def layers() -> list[nn.Module]:
    """A 6-layer MLP, 8 → 16 → … → 4, the same start on every rank."""
    torch.manual_seed(0)
    widths = [8, 16, 16, 16, 16, 16]
    blocks: list[nn.Module] = [
        nn.Sequential(nn.Linear(a, b), nn.Tanh()) for a, b in itertools.pairwise(widths)
    ]
    return [*blocks, nn.Linear(16, 4)]


def costs(seconds: Sequence[float] = (1, 2, 2, 2, 2, 1)) -> list[LayerCost]:
    return [
        LayerCost(f"layer{i}", s * 1e-4, sum(p.numel() * 4 for p in layer.parameters()) * 4, 64)
        for i, (s, layer) in enumerate(zip(seconds, layers(), strict=True))
    ]


def ranks(memory: int = 1 << 20) -> list[PipelineRank]:
    return [PipelineRank(r, s, memory) for r, s in enumerate(SPEEDS)]


def _train(
    plan: StagePlan, make_optimizer: Callable[[Any], torch.optim.Optimizer], emulate: bool = False
) -> tuple[PipelineRunner, list[Any]]:
    runner = PipelineRunner(layers(), plan, make_optimizer, LOSS, emulate=emulate)
    x, y = data().tensors
    reports = [
        runner.step(x[k * BATCH : (k + 1) * BATCH], y[k * BATCH : (k + 1) * BATCH])
        for k in range(STEPS)
    ]
    return runner, reports


def _exact(
    schedule: str,
    make_optimizer: Callable[[Any], torch.optim.Optimizer],
    order: Sequence[int] | None = None,
) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        given = ranks() if order is None else [ranks()[r] for r in order]
        plan = plan_stages(
            costs(),
            given,
            micro_batches=4,
            micro_batch_size=BATCH // 4,
            schedule=schedule,
            reorder=order is None,
        )
        runner, reports = _train(plan, make_optimizer)
        reference = nn.Sequential(*layers())
        options = TrainerOptions(global_batch=BATCH, shuffle=False)
        one_process(reference, data(), make_optimizer(reference.parameters()), LOSS, options, STEPS)
        mine = list(runner.module.parameters())
        theirs = [p for i in runner.stage.layers for p in reference[i].parameters()]
        diff = max(
            ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(mine, theirs, strict=True)
        )
        return {
            "diff": diff,
            "order": [s.rank for s in plan.stages],
            "losses": [r.loss for r in reports],
        }

    return scenario


def _paced(rank: int) -> Any:
    """The emulated pipeline of 24 ms a sample at speed 1: each step against the plan's."""
    plan = plan_stages(
        costs([40, 40, 40, 40, 40, 40]), ranks(), micro_batches=4, micro_batch_size=BATCH // 4
    )
    runner, reports = _train(plan, sgd, emulate=True)
    return {
        "stage_seconds": runner.stage.seconds,
        "seconds": [r.seconds for r in reports],
        "compute": [r.compute_seconds for r in reports],
    }


def _uneven_batch(rank: int) -> Any:
    plan = plan_stages(costs(), ranks(), micro_batches=4, micro_batch_size=3)
    runner = PipelineRunner(layers(), plan, sgd, LOSS)
    x, y = data().tensors
    return runner.step(x[:10], y[:10])


def _too_few_ranks(rank: int) -> Any:
    plan = plan_stages(costs(), ranks()[:3], micro_batches=4, micro_batch_size=3)
    return PipelineRunner(layers(), plan, sgd, LOSS)


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "gpipe": _exact("gpipe", sgd),
    "1f1b": _exact("1f1b", adam),
    "1f1b_order": _exact("1f1b", sgd, order=(2, 0, 3, 1)),
    "gpipe_order": _exact("gpipe", adam, order=(3, 1, 0, 2)),
    "paced": _paced,
    "uneven_batch": _uneven_batch,
    "too_few_ranks": _too_few_ranks,
}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipeline")
    run_ranks(__name__, WORLD, path)
    return path


@pytest.fixture(scope="module")
def recorded_ranks(out: Path) -> list[dict[str, Outcome]]:
    """What each of the 4 ranks recorded, by scenario."""
    return recorded(out, WORLD)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "1f1b_order", "gpipe_order"])
def test_parameters_after_5_steps_match_one_process(
    recorded_ranks: list[dict[str, Outcome]], name: str
) -> None:
    results = each(recorded_ranks, name)
    diffs = [r["diff"] for r in results]
    print(f"{name}: relative difference per rank {diffs}, pipeline order {results[0]['order']}")
    assert max(diffs) <= TOLERANCE
    # Every rank reports the same loss each step: the last stage's, broadcast.
    assert all(r["losses"] == results[0]["losses"] for r in results)


def test_the_planner_reorders_the_ranks_and_a_given_order_is_kept(
    recorded_ranks: list[dict[str, Outcome]],
) -> None:
    assert each(recorded_ranks, "1f1b_order")[0]["order"] == [2, 0, 3, 1]
    assert each(recorded_ranks, "gpipe_order")[0]["order"] == [3, 1, 0, 2]


def test_an_emulated_pipeline_paces_each_stage_to_its_planned_time(
    recorded_ranks: list[dict[str, Outcome]],
) -> None:
    """Lower bounds only, which pacing guarantees: how close a step comes to the plan's
    prediction is a speed, measured in bench/bench_pipeline.py, not asserted here."""
    for r in each(recorded_ranks, "paced"):
        # Each stage computes at least its 4 micro-batches' planned time (it sleeps the rest).
        for compute, step in zip(r["compute"][1:], r["seconds"][1:], strict=True):
            assert 4 * r["stage_seconds"] <= compute * (1 + 1e-6), (compute, r["stage_seconds"])
            assert compute <= step * (1 + 1e-6)  # and the step holds its stage's compute


def test_a_batch_the_micro_batches_do_not_divide_is_refused_on_every_rank(
    recorded_ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(recorded_ranks, "uneven_batch")
    assert "a batch of 10 samples" in message and "multiple of the plan's 4" in message


def test_a_plan_for_other_ranks_is_refused_on_every_rank(
    recorded_ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(recorded_ranks, "too_few_ranks")
    assert "runs on ranks [0, 1, 2], but the process group has 4 ranks" in message
