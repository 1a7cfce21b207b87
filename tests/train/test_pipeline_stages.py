"""The stage planner as pure code: balanced contiguous splits (against every split, on small
random pipelines), the rank order, memory (a layer no rank holds, a pipeline that fits
nowhere, 1F1B's activations in flight), its table, the refusals of bad input; the layer
profile; and the data × pipeline layout of a fleet."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from hetero.errors import ConfigError
from hetero.train import LayerCost, PipelineRank, choose_layout, plan_stages, split_layers
from hetero.train.stages import (
    SCHEDULES,
    _distinct,
    check_schedule,
    even_counts,
    pipeline_seconds,
)

MB = 1 << 20


def uniform(
    n: int, seconds: float = 0.01, state: int = MB, activations: int = 0
) -> list[LayerCost]:
    return [LayerCost(f"block{i}", seconds, state, activations) for i in range(n)]


def fleet(*speeds: float, memory: int = 100 * MB) -> list[PipelineRank]:
    return [PipelineRank(r, s, memory) for r, s in enumerate(speeds)]


def test_stages_take_layers_in_proportion_to_speed() -> None:
    plan = plan_stages(
        uniform(16), fleet(1, 1, 0.5, 0.25), micro_batches=8, micro_batch_size=2, reorder=False
    )
    assert [s.end - s.first for s in plan.stages] == [6, 6, 3, 1]
    assert [s.first for s in plan.stages] == [0, 6, 12, 15]
    # 6 layers × 2 samples × 10 ms at speed 1; the slowest rank's one layer takes 80 ms.
    assert [round(s.seconds, 6) for s in plan.stages] == [0.12, 0.12, 0.12, 0.08]
    assert plan.step_seconds == pytest.approx(0.44 + 7 * 0.12)
    even = split_layers(
        uniform(16), fleet(1, 1, 0.5, 0.25), even_counts(16, 4), micro_batches=8, micro_batch_size=2
    )
    assert even.slowest.rank == 3 and even.slowest.seconds == pytest.approx(0.32)
    assert even.step_seconds / plan.step_seconds > 2


def _brute_bottleneck(
    layers: list[LayerCost], ranks: list[PipelineRank], size: int, schedule: str, m: int
) -> float:
    """The least slowest stage over every contiguous split that fits, ranks in the given order."""
    best = float("inf")
    n, s = len(layers), len(ranks)
    for inner in itertools.combinations(range(1, n), s - 1):
        cuts = [0, *inner, n]
        worst = 0.0
        for i, r in enumerate(ranks):
            chunk = layers[cuts[i] : cuts[i + 1]]
            flight = m if schedule == "gpipe" else min(m, s - i)
            need = sum(x.state_bytes for x in chunk) + flight * size * sum(
                x.activation_bytes for x in chunk
            )
            if need > r.memory:
                worst = float("inf")
                break
            worst = max(worst, size * sum(x.seconds for x in chunk) / r.speed)
        best = min(best, worst)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_the_slowest_stage_is_the_least_any_split_gives(seed: int) -> None:
    rng = random.Random(seed)
    layers = [
        LayerCost(f"l{i}", rng.uniform(0.001, 0.02), rng.randint(1, 8) * MB, rng.randint(0, MB))
        for i in range(rng.randint(3, 9))
    ]
    ranks = [
        PipelineRank(r, rng.choice([1.0, 0.5, 0.25, 0.8]), rng.randint(8, 40) * MB)
        for r in range(rng.randint(1, min(4, len(layers))))
    ]
    schedule, m = rng.choice(SCHEDULES), rng.randint(len(ranks), 8)
    expected = _brute_bottleneck(layers, ranks, 2, schedule, m)
    kw = {"micro_batches": m, "micro_batch_size": 2, "schedule": schedule}
    if expected == float("inf"):
        with pytest.raises(ConfigError, match="memory"):
            plan_stages(layers, ranks, reorder=False, **kw)
        return
    plan = plan_stages(layers, ranks, reorder=False, **kw)
    assert plan.slowest.seconds == pytest.approx(expected, rel=1e-9)
    assert all(s.memory <= s.limit for s in plan.stages)
    assert [s.rank for s in plan.stages] == [r.rank for r in ranks]
    # Reordering never predicts a slower step than any order it could keep.
    reordered = plan_stages(layers, ranks, **kw)
    for order in itertools.permutations(ranks):
        try:
            kept = plan_stages(layers, list(order), reorder=False, **kw)
        except ConfigError:
            continue
        assert reordered.step_seconds <= kept.step_seconds * (1 + 1e-9)


def test_an_expensive_last_layer_goes_to_a_fast_rank() -> None:
    layers = [*uniform(5, seconds=0.01), LayerCost("head", 0.1, MB)]
    ranks = [PipelineRank(0, 1.0, 100 * MB), PipelineRank(1, 0.25, 100 * MB)]
    kept = plan_stages(layers, ranks, micro_batches=4, micro_batch_size=1, reorder=False)
    plan = plan_stages(layers, ranks, micro_batches=4, micro_batch_size=1)
    assert [s.rank for s in plan.stages] == [1, 0]
    # Three blocks at a quarter speed take as long as the head and two blocks at full speed.
    assert plan.stages[1].layers == range(3, 6)
    assert [s.seconds for s in plan.stages] == pytest.approx([0.12, 0.12])
    assert plan.step_seconds < kept.step_seconds


def test_memory_moves_layers_off_a_fast_rank_with_little_memory() -> None:
    # Rank 0 is fast but holds 3 layers' state only; the balanced split would give it 8.
    ranks = [PipelineRank(0, 1.0, 3 * MB), PipelineRank(1, 1.0, 100 * MB)]
    plan = plan_stages(uniform(16), ranks, micro_batches=4, micro_batch_size=1, reorder=False)
    assert [s.end - s.first for s in plan.stages] == [3, 13]
    assert all(s.memory <= s.limit for s in plan.stages)


def test_1f1b_puts_the_rank_of_least_memory_last_where_fewest_activations_wait() -> None:
    # 4 layers of 1 MB state and 1 MB of activations a sample; 4 micro-batches of 1 sample.
    layers = uniform(4, state=MB, activations=MB)
    ranks = [PipelineRank(0, 1.0, 4 * MB), PipelineRank(1, 1.0, 100 * MB)]
    plan = plan_stages(layers, ranks, micro_batches=4, micro_batch_size=1, schedule="1f1b")
    # First, rank 0 would hold 2 micro-batches' activations: 2 layers need 6 MB. Last, 4 MB.
    assert [s.rank for s in plan.stages] == [1, 0]
    assert [s.in_flight for s in plan.stages] == [2, 1]
    assert [s.end - s.first for s in plan.stages] == [2, 2]
    # GPipe holds all 4 micro-batches' activations everywhere: rank 0 cannot hold a layer.
    with pytest.raises(ConfigError, match="no split of the 4 layers over the 2 ranks"):
        plan_stages(layers, ranks, micro_batches=4, micro_batch_size=1, schedule="gpipe")


def test_a_layer_no_rank_can_hold_is_refused_naming_it_and_the_largest_rank() -> None:
    layers = [*uniform(3), LayerCost("lm_head", 0.01, 50 * MB)]
    ranks = [PipelineRank(0, 1.0, 20 * MB), PipelineRank(1, 1.0, 40 * MB), PipelineRank(2, 1, MB)]
    with pytest.raises(ConfigError) as info:
        plan_stages(layers, ranks, micro_batches=4, micro_batch_size=2)
    message = str(info.value)
    assert "layer 3 ('lm_head') needs 52,428,800 bytes (50 MiB)" in message
    assert "more than the largest rank, rank 1 with 41,943,040 bytes (40 MiB)" in message


def test_a_pipeline_that_fits_no_split_says_what_it_needs() -> None:
    with pytest.raises(ConfigError) as info:
        plan_stages(uniform(8), fleet(1, 1, memory=3 * MB), micro_batches=2, micro_batch_size=1)
    message = str(info.value)
    assert "no split of the 8 layers over the 2 ranks fits their memory" in message
    assert "8,388,608 bytes (8 MiB) of parameters" in message and "6,291,456 bytes" in message


def test_an_unknown_schedule_gets_the_allowed_list() -> None:
    with pytest.raises(ConfigError, match=r"schedule: must be one of 'gpipe', '1f1b', got 'zb'"):
        plan_stages(uniform(4), fleet(1, 1), micro_batches=4, micro_batch_size=1, schedule="zb")
    assert check_schedule("gpipe") == "gpipe"


def test_bad_input_names_every_bad_value() -> None:
    layers = [LayerCost("a", -1.0, 10), LayerCost("b", 0.1, -5, 1)]
    ranks = [PipelineRank(0, 0.0, 10), PipelineRank(0, 1.0, 0), PipelineRank(2, 1.0, 10)]
    with pytest.raises(ConfigError) as info:
        plan_stages(layers, ranks, micro_batches=0, micro_batch_size=1, schedule="x")
    paths = [path for path, _ in info.value.problems]
    assert paths == [
        "micro_batches",
        "layers[0].seconds",
        "layers[1].state_bytes",
        "ranks[0].speed",
        "ranks[1].rank",
        "ranks[1].memory",
        "layers",
        "schedule",
    ]
    with pytest.raises(ConfigError, match="1f1b needs at least as many micro-batches as stages"):
        plan_stages(uniform(4), fleet(1, 1, 1), micro_batches=2, micro_batch_size=1)


def test_a_given_split_is_checked_against_memory() -> None:
    with pytest.raises(ConfigError, match=r"stage 0 \(layers 0-2\) needs 3,145,728 bytes"):
        split_layers(
            uniform(4),
            [PipelineRank(0, 1, 2 * MB), PipelineRank(1, 1, 9 * MB)],
            [3, 1],
            micro_batches=2,
            micro_batch_size=1,
        )
    with pytest.raises(ConfigError, match="counts: must give each of the 2 ranks"):
        split_layers(uniform(4), fleet(1, 1), [4, 0], micro_batches=2, micro_batch_size=1)
    assert even_counts(14, 4) == [4, 4, 3, 3]


def test_the_table_names_each_stage_rank_layers_time_and_memory() -> None:
    plan = plan_stages(uniform(6), fleet(1, 0.5), micro_batches=4, micro_batch_size=1)
    lines = plan.table().splitlines()
    assert lines[0].split() == [
        "stage",
        "rank",
        "speed",
        "layers",
        "ms/micro-batch",
        "memory",
        "/",
        "limit",
    ]
    assert lines[1].split()[:5] == ["0", "0", "1", "0-3", "(block0"]
    assert "40.0" in lines[1] and "4 MiB / 100 MiB" in lines[1]
    assert lines[3].startswith("predicted step 200.0 ms: 4 micro-batches of 1 under 1f1b")
    assert plan.to_dict()["stages"][1]["layers"] == [4, 6]
    assert pipeline_seconds([0.04, 0.04], 4) == pytest.approx(0.2)


def test_profile_measures_each_layer() -> None:
    torch = pytest.importorskip("torch")
    from torch import nn

    from hetero.train import profile_layers

    torch.manual_seed(0)
    layers = [nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4)]
    costs = profile_layers(
        layers, torch.randn(16, 8), optimizer=lambda p: torch.optim.Adam(p), repeats=2
    )
    assert [c.name for c in costs] == ["0:Linear", "1:Tanh", "2:Linear"]
    # Parameters, their gradients and Adam's two moments: 4 copies of 8·64 + 64 floats.
    assert costs[0].state_bytes == 4 * 4 * (8 * 64 + 64) + 4 * 2  # and Adam's step counts
    assert costs[1].state_bytes == 0
    assert all(c.seconds > 0 for c in costs)
    # Tanh keeps its output for the backward: 64 floats a sample.
    assert costs[1].activation_bytes == 64 * 4
    assert all(p.grad is None for layer in layers for p in layer.parameters())


# ------------------------------------------------------------------ data × pipeline layouts


def test_a_model_every_rank_holds_runs_as_data_parallel_replicas_of_one_stage() -> None:
    layout = choose_layout(uniform(12), fleet(1, 1, 1, 1), global_batch=16, micro_batch_size=1)
    assert layout.depth == 1 and len(layout.replicas) == 4
    assert [r.samples for r in layout.replicas] == [4, 4, 4, 4]
    # Deeper pipelines add their fill and drain to the same work.
    tried = {(d, g): t for d, g, t in layout.tried}
    assert tried[(1, "dealt")] == pytest.approx(0.48)
    assert tried[(2, "dealt")] == pytest.approx(0.54)
    assert tried[(4, "blocks")] == pytest.approx((16 + 3) * 0.03)


def test_data_parallel_shares_follow_each_replica_pipeline_throughput() -> None:
    # 12 MiB of layers; each rank holds 7: two stages at least, two replicas of two.
    ranks = fleet(1, 1, 0.4, 0.4, memory=7 * MB)
    layout = choose_layout(uniform(12), ranks, global_batch=24, micro_batch_size=1)
    assert layout.depth == 2
    assert all(s.memory <= s.limit for r in layout.replicas for s in r.plan.stages)
    fast, slow = sorted(layout.replicas, key=lambda r: -r.samples)
    assert sorted(fast.ranks) == [0, 1] and sorted(slow.ranks) == [2, 3]
    # Stages of 60 and 150 ms a micro-batch: (18 + 1) × 60 and (6 + 1) × 150 ms; one more
    # micro-batch to the slow replica would end it at 1,200 ms.
    assert (fast.samples, slow.samples) == (18, 6)
    assert layout.step_seconds == pytest.approx(1.14)
    # Mixing a fast and a slow rank in each replica is slower: 7 MiB keep 7 layers at most on
    # the fast rank, 5 on the slow one take 125 ms.
    assert dict(((d, g), t) for d, g, t in layout.tried)[(2, "dealt")] == pytest.approx(1.57)
    assert "2 replica(s) × 2 stage(s)" in layout.table()
    assert any(
        "left out: memory: no split of the 12 layers over the 1 rank fits" in str(t)
        for t in layout.tried
    )


def test_no_layout_that_fits_is_refused_with_every_reason() -> None:
    with pytest.raises(ConfigError, match="no data × pipeline layout of the 2 ranks works"):
        choose_layout(uniform(12), fleet(1, 1, memory=2 * MB), global_batch=4, micro_batch_size=1)
    with pytest.raises(ConfigError, match="schedule: must be one of 'gpipe', '1f1b'"):
        choose_layout(uniform(4), fleet(1), global_batch=4, micro_batch_size=1, schedule="x")
    with pytest.raises(ConfigError, match="global_batch: 10 is not a whole number"):
        choose_layout(uniform(4), fleet(1), global_batch=10, micro_batch_size=4)


def test_the_orders_tried_are_the_distinct_ones_built_without_walking_every_permutation() -> None:
    small = tuple(PipelineRank(i, s, m) for i, (s, m) in enumerate([(1.0, 8), (0.5, 4)] * 3))
    seen: set[tuple[tuple[float, int], ...]] = set()
    expected = []
    for order in itertools.permutations(small):
        kinds = tuple((r.speed, r.memory) for r in order)
        if kinds not in seen:
            seen.add(kinds)
            expected.append(order)
    assert list(_distinct(small)) == expected  # the same orders, in the same order
    # 12 ranks of two kinds: 495 distinct orders (12! permutations took minutes to walk).
    fleet = tuple(PipelineRank(i, 1.0 if i < 4 else 0.5, 80 if i < 4 else 24) for i in range(12))
    orders = list(_distinct(fleet))
    assert len(orders) == math.comb(12, 4) and orders[0] == fleet
