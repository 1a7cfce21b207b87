"""Expert parallelism: experts placed by speed within memory (``place_experts``, pure), and the
expert-parallel MoE layer on 2 and 3 gloo ranks over 127.0.0.1: its output, and after 5 SGD
steps every parameter (the experts', the gate's and the dense layers' around it), match one
process running the whole layer on the same global batches, under top-1 and top-2 gating, with
3 experts on a fast rank beside 1 on a slow one and uneven batch shares; emulated ranks pace
their experts' forward and backward; placements for other ranks or layers are refused.

The ranks start once per world size and run every scenario in order; the tests then check
what each rank recorded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn

from hetero import comm
from hetero.errors import ConfigError
from hetero.train.expert_parallel import (
    ExpertParallelMoE,
    MixtureOfExperts,
    reduce_dense_gradients,
)
from hetero.train.expert_placement import (
    ExpertPlacement,
    ExpertRank,
    place_experts,
    place_experts_evenly,
)
from tests.train._models import LOSS, data, sgd
from tests.train._ranks import Outcome, each, errors, run_ranks

STEPS = 5
BATCH = 12  # 60 samples: 5 steps are one epoch
TOLERANCE = 1e-5
# Per world size: each rank's speed (placement) and its share of every global batch.
SPEEDS = {2: (3.0, 1.0), 3: (4.0, 1.0, 1.0)}
SHARES = {2: (8, 4), 3: (6, 4, 2)}
EXPERTS = {2: 4, 3: 6}
PACED_TOKEN_SECONDS = 2e-3


# ------------------------------------------------------------------------------- placement


def _ranks(speeds: Sequence[float], memory: Sequence[int] | int = 1000) -> list[ExpertRank]:
    limits = [memory] * len(speeds) if isinstance(memory, int) else list(memory)
    return [ExpertRank(r, s, m) for r, (s, m) in enumerate(zip(speeds, limits, strict=True))]


def _best_load(experts: int, speeds: Sequence[float], caps: Sequence[int]) -> float:
    """The least slowest ``count / speed`` over every split of ``experts`` experts of one size,
    at least one and at most ``caps[r]`` on rank r (brute force)."""
    best = float("inf")
    for counts in itertools.product(*(range(1, cap + 1) for cap in caps)):
        if sum(counts) == experts:
            best = min(best, max(c / s for c, s in zip(counts, speeds, strict=True)))
    return best


def test_experts_go_to_ranks_in_proportion_to_speed() -> None:
    assert place_experts([10] * 4, _ranks([3.0, 1.0])).counts == (3, 1)
    placement = place_experts([10] * 8, _ranks([4.0, 2.0, 1.0, 1.0]))
    assert placement.counts == (4, 2, 1, 1)
    assert sorted(e for r in range(4) for e in placement.experts_of(r)) == list(range(8))
    assert [placement.load(r) for r in range(4)] == [1.0, 1.0, 1.0, 1.0]


def test_a_rank_holds_no_more_experts_than_its_memory() -> None:
    # The fast rank would take 3 of 4, but has room for 2.
    placement = place_experts([10] * 4, _ranks([3.0, 1.0], [25, 100]))
    assert placement.counts == (2, 2)
    assert placement.memory(0) == 20 and placement.memory(1) == 20


@pytest.mark.parametrize(
    ("speeds", "experts", "memory"),
    [
        ((3.0, 1.0), 4, (100, 100)),
        ((1.0, 1.0, 1.0), 7, (100, 100, 100)),
        ((5.0, 2.0, 1.0), 9, (100, 100, 100)),
        ((5.0, 2.0, 1.0), 9, (30, 100, 100)),
        ((1.0, 2.5, 0.5, 1.5), 11, (100, 40, 100, 100)),
        ((0.3, 0.7, 1.0), 3, (10, 10, 10)),
    ],
)
def test_experts_of_one_size_get_the_least_slowest_rank_there_is(
    speeds: tuple[float, ...], experts: int, memory: tuple[int, ...]
) -> None:
    placement = place_experts([10] * experts, _ranks(speeds, list(memory)))
    assert min(placement.counts) >= 1
    assert all(placement.memory(r.rank) <= r.memory for r in placement.ranks)
    caps = [m // 10 for m in memory]
    assert placement.load(placement.slowest.rank) == pytest.approx(
        _best_load(experts, speeds, caps)
    )


def test_experts_of_different_sizes_fit_the_ranks_memory() -> None:
    placement = place_experts([50, 10, 10, 30, 10], _ranks([1.0, 1.0, 4.0], [60, 60, 45]))
    assert min(placement.counts) >= 1
    assert all(placement.memory(r.rank) <= r.memory for r in placement.ranks)
    assert placement.owners[0] in (0, 1)  # the 50-byte expert fits only there


def test_an_even_placement_ignores_speed() -> None:
    placement = place_experts_evenly([10] * 7, _ranks([4.0, 1.0, 1.0]))
    assert placement.owners == (0, 0, 0, 1, 1, 2, 2)
    with pytest.raises(ConfigError, match=r"rank 0's even share, experts 0-2, needs 30 bytes"):
        place_experts_evenly([10] * 7, _ranks([4.0, 1.0, 1.0], [25, 100, 100]))


def test_more_ranks_than_experts_are_refused() -> None:
    with pytest.raises(ConfigError, match="3 ranks for 2 experts: every rank holds at least one"):
        place_experts([10, 10], _ranks([1.0, 1.0, 1.0]))


def test_an_expert_larger_than_every_rank_is_refused_naming_it_and_the_largest_rank() -> None:
    with pytest.raises(ConfigError) as caught:
        place_experts([10, 10, 500, 10], _ranks([1.0, 2.0, 1.0], [100, 300, 200]))
    message = str(caught.value)
    assert "expert 2 needs 500 bytes" in message
    assert "the largest rank, rank 1 with 300 bytes" in message


def test_experts_that_fit_no_layout_are_refused() -> None:
    with pytest.raises(ConfigError, match="found no layout of the 4 experts"):
        place_experts([30, 30, 30, 30], _ranks([1.0, 1.0], [60, 50]))


def test_bad_ranks_are_refused_with_every_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        place_experts([10, 10], [ExpertRank(0, 0.0, 100), ExpertRank(0, 1.0, -5)])
    message = str(caught.value)
    assert "ranks[0].speed: must be > 0, got 0.0" in message
    assert "ranks[1].memory: must be bytes > 0, got -5" in message
    assert "ranks: must be ranks 0 .. 1, each once, got [0, 0]" in message


def test_a_bad_layer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"top_k: must be in \[1, 4\] \(the experts\), got 5"):
        MixtureOfExperts(8, 16, 4, top_k=5)


# --------------------------------------------------------------------------- on the ranks


def _model(top_k: int) -> nn.Sequential:
    """8 → 16, the MoE layer of width 16 (experts of 32 hidden units), tanh, 16 → 4: the same
    start on every rank."""
    torch.manual_seed(0)
    experts = EXPERTS[comm.world_size()] if comm.is_initialized() else 4
    return nn.Sequential(
        nn.Linear(8, 16),
        MixtureOfExperts(16, 32, experts, top_k=top_k),
        nn.Tanh(),
        nn.Linear(16, 4),
    )


def _placement(model: nn.Sequential) -> ExpertPlacement:
    moe = model[1]
    assert isinstance(moe, MixtureOfExperts)
    return place_experts(moe.expert_state_bytes(), _ranks(SPEEDS[comm.world_size()], 1 << 20))


def _distributed(model: nn.Sequential, placement: ExpertPlacement, **kw: Any) -> nn.Sequential:
    moe = model[1]
    assert isinstance(moe, MixtureOfExperts)
    return nn.Sequential(model[0], ExpertParallelMoE(moe, placement, **kw), model[2], model[3])


def _batch(step: int, rank: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Global batch ``step`` (in order), or ``rank``'s share of it."""
    x, y = data().tensors
    x, y = x[step * BATCH : (step + 1) * BATCH], y[step * BATCH : (step + 1) * BATCH]
    if rank is None:
        return x, y
    shares = SHARES[comm.world_size()]
    start = sum(shares[:rank])
    return x[start : start + shares[rank]], y[start : start + shares[rank]]


def _train(model: nn.Sequential, rank: int | None) -> None:
    """``STEPS`` SGD steps, each on the global batch's mean loss (every rank's share of it
    summed over the global batch size): the layer's own gradients, the others' reduced."""
    optimizer = sgd(model.parameters())
    for step in range(STEPS):
        x, y = _batch(step, rank)
        loss = LOSS(model(x), y) / BATCH
        optimizer.zero_grad()
        loss.backward()
        if rank is not None:
            reduce_dense_gradients(model)
        optimizer.step()


def _difference(mine: nn.Module, reference: nn.Module) -> float:
    """The largest difference of any of ``mine``'s parameters from ``reference``'s of that
    name, relative to the largest value of that parameter."""
    theirs = dict(reference.named_parameters())
    return max(
        ((p - theirs[name]).abs().max() / theirs[name].abs().max()).item()
        for name, p in mine.named_parameters()
    )


def _exact(top_k: int) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        model = _model(top_k)
        placement = _placement(model)
        distributed = _distributed(model, placement)
        reference = _model(top_k)
        # The layer's output on this rank's tokens against the whole layer on the global batch.
        hidden = reference[0](_batch(0, None)[0]).detach()
        start = sum(SHARES[comm.world_size()][:rank])
        expected = reference[1](hidden)[start : start + SHARES[comm.world_size()][rank]]
        output = distributed[1](hidden[start : start + len(expected)])
        output_diff = ((output - expected).abs().max() / expected.abs().max()).item()
        layer = distributed[1]
        assert isinstance(layer, ExpertParallelMoE)
        sent = sum(layer.sent)
        _train(distributed, rank)
        _train(reference, None)
        return {
            "output_diff": output_diff,
            "diff": _difference(distributed, reference),
            "experts": list(layer.local),
            "sent_rows": sent,
            "rows": len(expected) * top_k,
            "parameters": [name for name, _ in distributed.named_parameters()],
        }

    return scenario


def _paced(rank: int) -> Any:
    """Two emulated steps: the experts' time against the rows they ran."""
    model = _model(1)
    distributed = _distributed(model, _placement(model), emulate_token_seconds=PACED_TOKEN_SECONDS)
    layer = distributed[1]
    assert isinstance(layer, ExpertParallelMoE)
    optimizer = sgd(distributed.parameters())
    rows, seconds = [], []
    for step in range(2):
        before = layer.compute_seconds
        x, y = _batch(step, rank)
        loss = LOSS(distributed(x), y) / BATCH
        optimizer.zero_grad()
        loss.backward()
        reduce_dense_gradients(distributed)
        optimizer.step()
        rows.append(sum(layer.received))
        seconds.append(layer.compute_seconds - before)
    return {"rows": rows, "seconds": seconds, "speed": SPEEDS[comm.world_size()][rank]}


def _other_ranks(rank: int) -> Any:
    model = _model(1)
    placement = place_experts([10] * 4, _ranks([1.0] * (comm.world_size() + 1)))
    return _distributed(model, placement)


def _other_layer(rank: int) -> Any:
    model = _model(1)
    placement = place_experts([10] * 7, _ranks(SPEEDS[comm.world_size()]))
    return _distributed(model, placement)


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "top1": _exact(1),
    "top2": _exact(2),
    "paced": _paced,
    "other_ranks": _other_ranks,
    "other_layer": _other_layer,
}


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def world(request: pytest.FixtureRequest) -> int:
    return int(request.param)


_RUNS: dict[int, list[dict[str, Outcome]]] = {}


@pytest.fixture(scope="module")
def recorded_ranks(world: int, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What each rank recorded, by scenario (the ranks run once per world size)."""
    if world not in _RUNS:
        _RUNS[world] = run_ranks(__name__, world, tmp_path_factory.mktemp(f"experts{world}"))
    return _RUNS[world]


@pytest.mark.slow
@pytest.mark.parametrize("gating", ["top1", "top2"])
def test_output_and_parameters_after_5_steps_match_one_process(
    recorded_ranks: list[dict[str, Outcome]], world: int, gating: str
) -> None:
    results = each(recorded_ranks, gating)
    print(
        f"{gating} on {world} ranks: output difference {[r['output_diff'] for r in results]}, "
        f"parameters {[r['diff'] for r in results]}, experts {[r['experts'] for r in results]}"
    )
    assert max(r["output_diff"] for r in results) <= TOLERANCE
    assert max(r["diff"] for r in results) <= TOLERANCE
    # Every expert is on one rank, the fast rank holding the most, and each rank sent each of
    # its tokens to its top_k experts.
    held = sorted(e for r in results for e in r["experts"])
    assert held == list(range(EXPERTS[world]))
    counts = [len(r["experts"]) for r in results]
    assert counts == ([3, 1] if world == 2 else [4, 1, 1])
    assert all(r["sent_rows"] == r["rows"] for r in results)


@pytest.mark.slow
def test_an_emulated_rank_paces_its_experts(
    recorded_ranks: list[dict[str, Outcome]], world: int
) -> None:
    """Lower bounds only, which pacing guarantees (how close it comes is for bench/)."""
    for r in each(recorded_ranks, "paced"):
        for rows, seconds in zip(r["rows"], r["seconds"], strict=True):
            assert seconds >= rows * PACED_TOKEN_SECONDS / r["speed"] * (1 - 1e-6)


@pytest.mark.slow
def test_a_placement_for_other_ranks_or_another_layer_is_refused_on_every_rank(
    recorded_ranks: list[dict[str, Outcome]], world: int
) -> None:
    message = errors(recorded_ranks, "other_ranks")
    assert f"places experts on ranks {list(range(world + 1))}" in message
    assert f"the process group has {world} ranks" in message
    message = errors(recorded_ranks, "other_layer")
    assert f"places 7 experts, the layer has {EXPERTS[world]}" in message
