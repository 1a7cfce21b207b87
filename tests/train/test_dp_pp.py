"""Data × pipeline parallelism: the layout planner as pure code (2 × 2 chosen over 1 × 4 while
the gradient all-reduce costs less than the bubble it saves, and not once it costs more; the
all-reduce of replicas whose stage boundaries differ; its explanation; a layout given by hand
predicted alike; refusals of bad input),
and the runner on 4 gloo ranks over 127.0.0.1: a 2 × 2 layout with batch shares of 9 and 3
and different stage boundaries in its two replicas, whose parameters after 5 steps match one
process training on the same global batches.

The four processes start once per module and run every scenario in order; the tests then check
what each rank recorded.
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
from hetero.train import TrainerOptions
from hetero.train.fleet_layout import (
    FleetLayout,
    GradientRange,
    PipelineReplica,
    choose_layout,
    given_layout,
)
from hetero.train.pipeline_parallel import DataPipelineRunner
from hetero.train.stages import LayerCost, PipelineRank, pipeline_seconds, split_layers
from tests.train._models import LOSS, adam, data, sgd
from tests.train._ranks import Outcome, each, errors, one_process, recorded, run_ranks
from tests.train.test_pipeline_parallel import BATCH, SPEEDS, STEPS, TOLERANCE, WORLD, layers

MB = 1 << 20


def uniform(n: int, memory_state: int = 4 * MB) -> list[LayerCost]:
    """``n`` layers of 10 ms a sample, ``memory_state`` bytes of state, 1 MiB of parameters."""
    return [LayerCost(f"block{i}", 0.01, memory_state, 0, MB) for i in range(n)]


def fleet(*speeds: float, memory: int = 20 * MB) -> list[PipelineRank]:
    return [PipelineRank(r, s, memory) for r, s in enumerate(speeds)]


# ------------------------------------------------------------------------------ the planner


def test_two_replicas_of_two_stages_beat_one_pipeline_of_four_while_the_all_reduce_is_cheap() -> (
    None
):
    # 8 layers of 4 MiB: no rank of 20 MiB holds them all, two stages of 16 MiB fit.
    layout = choose_layout(
        uniform(8), fleet(1, 1, 1, 1), global_batch=16, micro_batch_size=1, bandwidth=1e9
    )
    assert layout.chosen.name == "2 × 2 (dealt)"
    assert [r.samples for r in layout.replicas] == [8, 8]
    options = {o.name: o for o in layout.considered}
    # One pipeline: 16 micro-batches through 4 stages of 20 ms; no gradients to all-reduce.
    assert options["1 × 4 (blocks)"].step_seconds == pytest.approx(pipeline_seconds([0.02] * 4, 16))
    assert options["1 × 4 (blocks)"].allreduce_seconds == 0
    # Two: 8 micro-batches through 2 stages of 40 ms (360 ms), then each stage's 4 MiB of
    # gradients all-reduced between the two ranks that hold it: 2 × 1/2 × 4 MiB at 1 GB/s.
    two = layout.chosen
    assert two.pipeline_seconds == pytest.approx(pipeline_seconds([0.04] * 2, 8))
    assert two.allreduce_seconds == pytest.approx(4 * MB / 1e9)
    assert layout.step_seconds < options["1 × 4 (blocks)"].step_seconds
    assert layout.gradient_ranges == (
        GradientRange(0, 4, (0, 1), 4 * MB),
        GradientRange(4, 8, (2, 3), 4 * MB),
    )
    text = layout.explain()
    print(text)
    assert "chose 2 × 2 (dealt): the least predicted step of 4 layout(s)" in text
    assert "at 1 GB/s a rank" in text
    assert (
        "4 × 1 (dealt): does not fit: the replica of ranks 0: memory: no split of the 8 layers "
        "over the 1 rank fits"
    ) in text
    assert "1 × 4 (blocks): slower: predicted 380.0 ms, 1.04× the chosen" in text
    assert "2 × 2 (blocks): as fast, predicted 364.2 ms" in text
    assert (
        "2 × 2 (dealt): chosen, predicted 364.2 ms (pipelines 360.0 ms + gradient all-reduce"
        in (text)
    )


def test_one_pipeline_wins_once_the_all_reduce_costs_more_than_its_bubble() -> None:
    # At 100 MB/s each stage's all-reduce takes 41.9 ms: 401.9 ms against one pipeline's 380.
    layout = choose_layout(
        uniform(8), fleet(1, 1, 1, 1), global_batch=16, micro_batch_size=1, bandwidth=1e8
    )
    assert layout.chosen.name == "1 × 4 (blocks)"
    assert layout.gradient_ranges == ()
    assert (
        "2 × 2 (dealt): slower: predicted 401.9 ms (pipelines 360.0 ms + gradient all-reduce "
        "41.9 ms), 1.06× the chosen"
    ) in layout.explain()
    # Without a bandwidth the all-reduce is left out, and two replicas win.
    assert choose_layout(
        uniform(8), fleet(1, 1, 1, 1), global_batch=16, micro_batch_size=1
    ).chosen.name == ("2 × 2 (dealt)")


def runner_layout(schedule: str = "1f1b") -> FleetLayout:
    """The runner's layout: the pipeline tests' MLP on ranks of speeds 1, 0.25, 1, 0.5 and 16 kB
    each (the model's state is 20.8 kB), a global batch of 12 in micro-batches of 1."""
    ranks = [PipelineRank(r, s, 16_000) for r, s in enumerate(SPEEDS)]
    costs = [
        LayerCost(f"layer{i}", s * 1e-4, 16 * size, 64, 4 * size)
        for i, (s, size) in enumerate(zip((1, 2, 2, 2, 2, 1), _parameters(), strict=True))
    ]
    return choose_layout(
        costs, ranks, global_batch=BATCH, micro_batch_size=1, schedule=schedule, bandwidth=1e8
    )


def _parameters() -> list[int]:
    return [sum(p.numel() for p in layer.parameters()) for layer in layers()]


def test_replicas_with_different_boundaries_all_reduce_each_run_of_layers_the_same_ranks_hold() -> (
    None
):
    layout = runner_layout()
    fast, slow = layout.replicas
    assert layout.chosen.name == "2 × 2 (blocks)"
    # The replicas take 9 and 3 of the 12 samples; the slow one's faster rank goes first with
    # four layers, so its boundary differs from the fast replica's.
    assert (fast.samples, slow.samples) == (9, 3)
    assert [(s.rank, s.first, s.end) for s in fast.plan.stages] == [(0, 0, 3), (2, 3, 6)]
    assert [(s.rank, s.first, s.end) for s in slow.plan.stages] == [(3, 0, 4), (1, 4, 6)]
    sizes = [4 * n for n in _parameters()]
    assert layout.gradient_ranges == (
        GradientRange(0, 3, (0, 3), sum(sizes[:3])),
        GradientRange(3, 4, (2, 3), sizes[3]),
        GradientRange(4, 6, (2, 1), sum(sizes[4:])),
    )
    # Rank 3 all-reduces layers 0-2 with rank 0 and then layer 3 with rank 2; rank 2 waits for
    # it, then reduces layers 4-5 with rank 1: the three ranges one after another.
    took = sum(g.seconds(1e8) for g in layout.gradient_ranges)
    assert layout.chosen.allreduce_seconds == pytest.approx(took)


def test_a_given_layout_is_predicted_as_the_chosen_and_an_even_split_is_slower() -> None:
    layout = runner_layout()
    even = given_layout(
        [
            PipelineReplica(
                split_layers(
                    r.plan.layers,
                    [PipelineRank(s.rank, s.speed, s.limit) for s in r.plan.stages],
                    [s.end - s.first for s in r.plan.stages],
                    micro_batches=6,
                    micro_batch_size=1,
                ),
                6,
            )
            for r in layout.replicas
        ],
        bandwidth=1e8,
    )
    # The same stages and ranges; the slow replica's 6 micro-batches set the step.
    assert even.gradient_ranges == layout.gradient_ranges
    assert even.chosen.allreduce_seconds == pytest.approx(layout.chosen.allreduce_seconds)
    slow = [s.seconds for s in even.replicas[1].plan.stages]
    assert even.chosen.pipeline_seconds == pytest.approx(pipeline_seconds(slow, 6))
    assert even.step_seconds > layout.step_seconds
    assert even.chosen.name == "2 × 2 (given)"
    fast = layout.replicas[0]
    with pytest.raises(ConfigError) as caught:
        given_layout([fast, PipelineReplica(fast.plan, 5)], bandwidth=-1.0)
    message = str(caught.value)
    assert "replicas: must run on distinct ranks, got ranks [0, 2, 0, 2]" in message
    assert "replicas[1].samples: must be its plan's 9 micro-batches of 1, got 5" in message
    assert "bandwidth: must be bytes a second > 0" in message


def test_a_layer_no_rank_holds_is_refused_naming_the_layer_and_the_largest_rank() -> None:
    costs = uniform(4)
    costs[2] = LayerCost("lm_head", 0.01, 30 * MB, 0, 8 * MB)
    ranks = [*fleet(1, 1, 0.5), PipelineRank(3, 0.25, 25 * MB)]
    with pytest.raises(ConfigError) as caught:
        choose_layout(costs, ranks, global_batch=8, micro_batch_size=1)
    message = str(caught.value)
    assert message.startswith("memory: layer 2 ('lm_head') needs 31,457,280 bytes (30 MiB)")
    assert "more than the largest rank, rank 3 with 26,214,400 bytes (25 MiB)" in message


def test_bad_input_is_refused_naming_each_argument() -> None:
    with pytest.raises(ConfigError, match=r"bandwidth: must be bytes a second > 0.*got 0"):
        choose_layout(uniform(4), fleet(1), global_batch=4, micro_batch_size=1, bandwidth=0)
    bad = [PipelineRank(0, 0.0, MB), PipelineRank(1, 1.0, -1)]
    with pytest.raises(ConfigError) as caught:
        choose_layout(uniform(4), bad, global_batch=4, micro_batch_size=1)
    assert "ranks[0].speed: must be > 0, got 0.0" in str(caught.value)
    assert "ranks[1].memory: must be bytes > 0, got -1" in str(caught.value)
    with pytest.raises(ConfigError, match=r"layers\[0\].parameter_bytes: must be bytes >= 0"):
        choose_layout(
            [LayerCost("x", 0.01, MB, 0, -4)], fleet(1), global_batch=4, micro_batch_size=1
        )


# ------------------------------------------------------------------------- on 4 gloo ranks


def _exact(schedule: str, make_optimizer: Callable[[Any], torch.optim.Optimizer]) -> Any:
    def scenario(rank: int) -> Any:
        layout = runner_layout(schedule)
        runner = DataPipelineRunner(layers(), layout, make_optimizer, LOSS)
        x, y = data().tensors
        reports = [
            runner.step(x[k * BATCH : (k + 1) * BATCH], y[k * BATCH : (k + 1) * BATCH])
            for k in range(STEPS)
        ]
        reference = nn.Sequential(*layers())
        options = TrainerOptions(global_batch=BATCH, shuffle=False)
        one_process(reference, data(), make_optimizer(reference.parameters()), LOSS, options, STEPS)
        stage = runner.pipeline.stage
        mine = list(runner.pipeline.module.parameters())
        theirs = [p for i in stage.layers for p in reference[i].parameters()]
        diff = max(
            ((a - b).abs().max() / b.abs().max()).item() for a, b in zip(mine, theirs, strict=True)
        )
        return {
            "diff": diff,
            "samples": runner.replica.samples,
            "layers": [stage.first, stage.end],
            "losses": [r.loss for r in reports],
        }

    return scenario


def _wrong_batch(rank: int) -> Any:
    runner = DataPipelineRunner(layers(), runner_layout(), sgd, LOSS)
    x, y = data().tensors
    return runner.step(x[:10], y[:10])


def _too_few_ranks(rank: int) -> Any:
    ranks = [PipelineRank(r, 1.0, MB) for r in range(2)]
    costs = [LayerCost(f"layer{i}", 1e-4, 64) for i in range(6)]
    layout = choose_layout(costs, ranks, global_batch=BATCH, micro_batch_size=1)
    return DataPipelineRunner(layers(), layout, sgd, LOSS)


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "1f1b_sgd": _exact("1f1b", sgd),
    "gpipe_adam": _exact("gpipe", adam),
    "wrong_batch": _wrong_batch,
    "too_few_ranks": _too_few_ranks,
}


@pytest.fixture(scope="module")
def recorded_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 4 ranks recorded, by scenario."""
    out: Path = tmp_path_factory.mktemp("dp_pp")
    run_ranks(__name__, WORLD, out)
    return recorded(out, WORLD)


@pytest.mark.parametrize(("name", "shares"), [("1f1b_sgd", (9, 3)), ("gpipe_adam", (10, 2))])
def test_two_uneven_replicas_after_5_steps_match_one_process(
    recorded_ranks: list[dict[str, Outcome]], name: str, shares: tuple[int, int]
) -> None:
    results = each(recorded_ranks, name)
    diffs = [r["diff"] for r in results]
    print(f"{name}: relative difference per rank {diffs}")
    assert max(diffs) <= TOLERANCE
    # Ranks 0 and 2 run the fast replica (9 samples of 12 under 1F1B, 10 under GPipe, whose
    # bubble is longer), 3 and 1 the slow one, with different boundaries: every parameter of
    # the model was checked on two ranks.
    fast, slow = shares
    assert [r["samples"] for r in results] == [fast, slow, fast, slow]
    assert [r["layers"] for r in results] == [[0, 3], [4, 6], [3, 6], [0, 4]]
    # Every rank reports the same loss each step: the global batch's mean.
    assert all(r["losses"] == results[0]["losses"] for r in results)


def test_a_batch_other_than_the_layouts_is_refused_on_every_rank(
    recorded_ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(recorded_ranks, "wrong_batch")
    assert "a batch of 10 samples: the layout splits a global batch of 12 (9 + 3 samples" in (
        message
    )


def test_a_layout_for_other_ranks_is_refused_on_every_rank(
    recorded_ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(recorded_ranks, "too_few_ranks")
    assert "layout: runs on ranks [0, 1], but the process group has 4 ranks" in message
