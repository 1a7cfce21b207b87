"""Micro-batches bounded by memory and the input pipeline, on 3 gloo ranks over 127.0.0.1 (and
one rank in this process): a fast rank with a quarter of the others' memory keeps its speed
share through more, smaller micro-batches and the update stays exact; a model that does not
fit, or a micro_batch above the limit, is refused on every rank; a dataset that sleeps shows its
time as data, not compute, and with workers it overlaps the compute.

The three processes start once per module and run every scenario in order; the tests then
check what each rank recorded.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch import nn
from torch.utils.data import Dataset

from hetero.errors import ConfigError
from hetero.train import Trainer, TrainerOptions
from hetero.train.memory import MemoryProbe, largest_fitting
from tests.train._models import LOSS, data, mlp, relative_difference, sgd, trained_in_one_process
from tests.train._ranks import Outcome, each, errors, matching_one_process, run_ranks

WORLD = 3
STEPS = 5
SPEEDS = (1.0, 0.5, 0.25)
# Seconds each sample of the slow dataset takes to load, and to compute on the emulated
# device: wide enough that a loaded machine's scheduling (tens of ms) does not blur which
# waits for which (at 5 ms a sample, a prefetched micro-batch once took 70 ms to hand over).
SLEEP = 0.02
SAMPLE_S = 0.04


class _SlowData(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``data()``, each sample taking ``SLEEP`` seconds to load (a disk, a decoder); with a
    ``log``, each load's process and start (``time.monotonic``, one clock for every process)
    is appended there."""

    def __init__(self, log: str | None = None) -> None:
        self.data = data()
        self.log = log

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.log is not None:
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                os.write(fd, f"{os.getpid()} {time.monotonic()!r}\n".encode())
            finally:
                os.close(fd)
        time.sleep(SLEEP)
        x, y = self.data[i]
        return x, y


def _model() -> nn.Module:
    return mlp(64)


def _need(samples: int) -> int:
    """What a micro-batch of ``samples`` needs on this rank, as the trainer's probe measures."""
    probe = MemoryProbe(_model(), LOSS, data(), optimizer=sgd)
    with probe.session():
        transient = probe.transient(samples)
        assert transient is not None
        return probe.resident() + transient


def _memory_capped(rank: int) -> Any:
    """Speeds 1 : 0.5 : 0.25; the fast rank 0 has room for 4 samples' micro-batch, the others
    four times its memory."""
    limit = _need(4) * (1 if rank == 0 else 4)
    options = TrainerOptions(
        global_batch=28,
        seed=3,
        profile_steps=2,
        rebalance_every=0,
        speed=SPEEDS[rank],
        emulate_sample_time=0.002,
        memory_limit=limit,
    )
    trainer = Trainer(_model(), sgd, LOSS, data(), options)
    reports = trainer.train(STEPS, progress=False)
    assert trainer.memory is not None
    return {
        "limit": limit,
        "cap": trainer.micro_batch,
        "memory": trainer.memory.to_dict(),
        "fits": [trainer.memory.need(n) <= limit for n in (trainer.micro_batch, 1)],
        "shares": trainer.shares,
        "reports": [r.to_dict() for r in reports],
        "diff": relative_difference(
            trainer.model_state_dict(), trained_in_one_process(_model(), sgd, options, STEPS)
        ),
    }


def _too_big(rank: int) -> Any:
    options = TrainerOptions(global_batch=24, memory_limit=1000 if rank == 2 else 10**9)
    Trainer(_model(), sgd, LOSS, data(), options)


def _override_too_big(rank: int) -> Any:
    limit = _need(4)
    options = TrainerOptions(
        global_batch=24, memory_limit=limit, micro_batch=12 if rank == 1 else None
    )
    Trainer(_model(), sgd, LOSS, data(), options)


def _slow_data(workers: int) -> Callable[[int], Any]:
    """Shares 12/8/4 of the slow dataset, one micro-batch per step, emulated compute of 20 ms
    per sample: loading a step's samples takes a quarter of computing them."""

    def scenario(rank: int) -> Any:
        options = TrainerOptions(
            global_batch=24,
            shares=(12, 8, 4),
            profile_steps=1,
            speed=1.0,
            emulate_sample_time=SAMPLE_S,
            num_workers=workers,
        )
        log = tempfile.mkstemp(prefix="loads-")[1]
        trainer = Trainer(_model(), sgd, LOSS, _SlowData(log), options)
        starts, reports = [], []
        try:
            for _ in range(4):
                starts.append(time.monotonic())
                reports.append(trainer.step().to_dict())
        finally:
            trainer.close()
        lines = [line.split() for line in Path(log).read_text().splitlines()]
        os.unlink(log)
        # The set-up's own loads (the rank's speed probe) are not the steps'.
        loads = [float(t) for pid, t in lines if workers == 0 or int(pid) != os.getpid()]
        loads = [t for t in loads if t >= starts[0]] if workers == 0 else loads
        return {"rank": rank, "reports": reports, "starts": starts, "loads": loads}

    return scenario


def _workers_exact(rank: int) -> Any:
    """Workers load ahead; the shares change after step 2 (as a rebalance would), so the
    loader starts again from there. The update stays the global batch's."""
    options = TrainerOptions(
        global_batch=24, seed=3, shares=(14, 7, 3), micro_batch=4, profile_steps=1, num_workers=2
    )
    trainer = Trainer(_model(), sgd, LOSS, data(), options)
    try:
        reports = trainer.train(2, progress=False)
        trainer.sampler.set_shares((5, 16, 3))
        reports += trainer.train(STEPS - 2, progress=False)
    finally:
        trainer.close()
    return {
        "diff": relative_difference(
            trainer.model_state_dict(), trained_in_one_process(_model(), sgd, options, STEPS)
        ),
        "reports": [r.to_dict() for r in reports],
    }


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "memory_capped": _memory_capped,
    "too_big": _too_big,
    "override_too_big": _override_too_big,
    "slow_data": _slow_data(0),
    "slow_data_workers": _slow_data(2),
    "workers_exact": _workers_exact,
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("memory_data"))


# ----------------------------------------------------------------------------------- memory


def test_a_fast_rank_with_a_quarter_of_the_memory_keeps_its_share_in_smaller_micro_batches(
    ranks: list[dict[str, Outcome]],
) -> None:
    # The update is still the global batch's, whatever carries it.
    results = matching_one_process(ranks, "memory_capped", 1e-6)
    fast, *others = results
    assert fast["limit"] * 4 == others[0]["limit"] == others[1]["limit"]
    # Its cap is the largest micro-batch measured to fit: 4 samples, by how the limit was set.
    assert fast["cap"] == 4
    assert all(r["fits"] == [True, True] for r in results)
    assert all(r["cap"] >= 16 for r in others)
    # Speed decides the shares (28 × 1 : 0.5 : 0.25 = 16 : 8 : 4; profiling noise may move one).
    shares = fast["shares"]
    assert all(r["shares"] == shares for r in results)
    for share, ideal in zip(shares, (16, 8, 4), strict=True):
        assert abs(share - ideal) <= 1, shares
    # Memory decides how many micro-batches carry them: the fast rank accumulates.
    for report in fast["reports"]:
        mine, *theirs = report["ranks"]
        assert mine["micro_batches"] == math.ceil(mine["samples"] / 4)
        assert all(r["micro_batches"] == (1 if r["samples"] else 0) for r in theirs)
    assert fast["reports"][0]["ranks"][0]["micro_batches"] >= 4


def test_the_probe_fits_a_line_and_measures_the_cap(ranks: list[dict[str, Outcome]]) -> None:
    memory = each(ranks, "memory_capped")[0]["memory"]
    assert memory["method"] == "torch's CPU allocator, through the profiler's memory events"
    assert memory["per_sample_bytes"] > 0 and memory["fixed_bytes"] >= 0
    points = {int(n): b for n, b in memory["points"].items()}
    assert (
        points[4] + memory["resident_bytes"]
        <= memory["limit"]
        < (points[5] + memory["resident_bytes"])
    )


def test_a_model_that_does_not_fit_one_sample_is_refused_on_every_rank(
    ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(ranks, "too_big")
    assert message.startswith(
        "ConfigError: rank 2: memory_limit=1000 bytes (1000 B) cannot hold a micro-batch of 1 "
        "sample: it needs an estimated "
    )
    assert re.search(
        r"resident \(the model's tensors \d+ bytes \(.*\), DDP's gradient buckets \d+ bytes "
        r"\(.*\), the optimizer's state \d+ bytes \(.*\)\) \+ ",
        message,
    ), message
    assert message.endswith("; raise memory_limit or train a smaller model")


def test_a_micro_batch_above_the_memory_limit_is_refused_on_every_rank(
    ranks: list[dict[str, Outcome]],
) -> None:
    message = errors(ranks, "override_too_big")
    assert message.startswith("ConfigError: rank 1: micro_batch=12 needs an estimated ")
    assert message.endswith(
        "; at most 4 samples fit: lower micro_batch, or leave it None for the limit to set it"
    )


# ------------------------------------------------------------------------------------- data


def test_a_slow_dataset_shows_its_time_as_data_not_compute(
    ranks: list[dict[str, Outcome]],
) -> None:
    for seen in each(ranks, "slow_data"):  # no workers: each step loads its own samples
        taken = [r["ranks"][seen["rank"]]["samples"] for r in seen["reports"]]
        for k in range(len(seen["starts"])):
            assert sum(t < seen["starts"][k] for t in seen["loads"]) == sum(taken[:k])
    for report in each(ranks, "slow_data")[0]["reports"]:
        for r in report["ranks"]:
            loading = r["samples"] * SLEEP
            emulated = r["samples"] * SAMPLE_S
            # Loaded in the step: the rank waits for every sample to load.
            assert r["data_seconds"] >= loading
            # Compute is the emulated device's: the loading is not in it.
            assert emulated <= r["compute_seconds"] < emulated + loading
            parts = r["compute_seconds"] + r["data_seconds"] + r["idle_seconds"]
            assert parts + r["comm_seconds"] <= r["step_seconds"] + 1e-6
            assert r["samples_per_second"] == pytest.approx(r["samples"] / r["compute_seconds"])


def test_workers_load_the_next_micro_batches_while_the_rank_computes(
    ranks: list[dict[str, Outcome]],
) -> None:
    # Each step's samples began loading during the steps before: before step k starts, the
    # workers have begun loading as many samples as steps 0 to k take. An order of events, not
    # a duration, so a loaded machine cannot blur it (waits measured in ms once did).
    for seen in each(ranks, "slow_data_workers"):
        taken = [r["ranks"][seen["rank"]]["samples"] for r in seen["reports"]]
        for k in range(1, len(seen["starts"])):
            begun = sum(t < seen["starts"][k] for t in seen["loads"])
            assert begun >= sum(taken[: k + 1]), (k, begun, taken)
        for report in seen["reports"]:
            for r in report["ranks"]:
                assert r["compute_seconds"] >= r["samples"] * SAMPLE_S  # the emulated device's


def test_workers_and_changed_shares_keep_the_update_exact(
    ranks: list[dict[str, Outcome]],
) -> None:
    reports = matching_one_process(ranks, "workers_exact", 1e-6)[0]["reports"]
    assert [r["shares"] for r in reports] == [[14, 7, 3]] * 2 + [[5, 16, 3]] * 3
    assert [r["global_batch"] for r in reports] == [24, 24, 12, 24, 24]


# ------------------------------------------------------------------------------ one process


def test_measurements_are_cached_and_reused(group: None, tmp_path: Path) -> None:
    cache = tmp_path / "probe.json"
    options = TrainerOptions(
        global_batch=24, profile_steps=1, memory_limit=_need(6), memory_cache=str(cache)
    )
    first = Trainer(_model(), sgd, LOSS, data(), options)
    second = Trainer(_model(), sgd, LOSS, data(), options)
    assert first.memory is not None and second.memory is not None
    assert first.micro_batch == second.micro_batch == 6
    assert first.memory.probed > 0 and second.memory.probed == 0
    assert second.memory.points == first.memory.points
    # Another model is another entry.
    wider = nn.Sequential(nn.Linear(8, 65), nn.Tanh(), nn.Linear(65, 4))
    third = Trainer(wider, sgd, LOSS, data(), options)
    assert third.memory is not None and third.memory.probed > 0


def test_the_cache_defaults_to_the_checkpoint_dir(group: None, tmp_path: Path) -> None:
    options = TrainerOptions(global_batch=24, memory_limit=10**9, checkpoint_dir=str(tmp_path))
    Trainer(_model(), sgd, LOSS, data(), options)
    assert (tmp_path / "memory_probe.json").exists()


def test_without_a_memory_limit_nothing_is_probed(group: None) -> None:
    trainer = Trainer(_model(), sgd, LOSS, data(), TrainerOptions(global_batch=24, micro_batch=5))
    assert trainer.memory is None and trainer.micro_batch == 5
    report = trainer.step()
    assert [(r.samples, r.micro_batches) for r in report.ranks] == [(24, 5)]
    assert "compute/data/comm/idle ms r0 " in report.summary()


def test_a_micro_batch_that_fits_the_limit_is_kept(group: None) -> None:
    # No step gives this rank more than the global batch: that size is what is measured.
    options = TrainerOptions(global_batch=8, micro_batch=100, memory_limit=10**9)
    trainer = Trainer(_model(), sgd, LOSS, data(), options)
    assert trainer.memory is not None and trainer.micro_batch == 100
    assert sorted(trainer.memory.points) == [1, 8]
    assert [(r.samples, r.micro_batches) for r in trainer.step().ranks] == [(8, 1)]


def test_the_search_finds_the_largest_size_that_fits_in_few_measurements() -> None:
    # A convex need, as measured: the gradients first, then the activations dominate.
    def transient(n: int) -> int:
        return max(3000 + 100 * n, 800 * n)

    for limit in (3000, 3100, 3500, 8000, 30_000, 123_456, 10**9):
        measured: dict[int, int | None] = {}  # every size the search measured
        cap = largest_fitting(limit, 0, transient, 1000, measured)
        expected = max((n for n in range(1, 1001) if transient(n) <= limit), default=0)
        assert cap == expected, (limit, measured)
        assert len(measured) <= 18, measured


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"memory_limit": 0},
            "memory_limit: must be an integer >= 1 (bytes this rank's device holds for the "
            "model, its gradients and one micro-batch; None for no limit), got 0",
        ),
        (
            {"memory_limit": "8GB"},
            "memory_limit: must be an integer >= 1 (bytes this rank's device holds for the "
            "model, its gradients and one micro-batch; None for no limit), got '8GB'",
        ),
        (
            {"memory_cache": ""},
            "memory_cache: must be a file path (a non-empty string) or None, got ''",
        ),
        (
            {"num_workers": -1},
            "num_workers: must be an integer >= 0 (0: load micro-batches in the training "
            "process), got -1",
        ),
        (
            {"prefetch_factor": 0},
            "prefetch_factor: must be an integer >= 1 (micro-batches each worker loads ahead), "
            "got 0",
        ),
    ],
)
def test_bad_memory_and_data_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerOptions(global_batch=8, **options)
    assert str(info.value) == message
