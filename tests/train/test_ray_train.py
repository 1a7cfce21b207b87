"""hetero's ``Trainer`` inside Ray Train's ``TorchTrainer`` workers, on a local Ray cluster of two
emulated nodes of different devices (a V100 of speed 1 and a T4 of speed 0.5): the parameters
after 5 steps are those of one process training on the same global batches, the shares follow
the nodes' speeds; a worker's error comes back to the driver as it was raised.

The cluster starts once per module, for the tests marked ``ray`` (starting Ray and Ray Train
costs most of the time); the others need Ray installed only. Which node gets rank 0 is Ray's
choice, so the checks go by each rank's recorded device.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray.train")

from hetero.devices.catalog import get_catalog
from hetero.devices.spec import Device
from hetero.errors import BackendError, ConfigError, HeteroError
from hetero.runtime.ray_cluster import import_ray, local_cluster
from hetero.train import TrainerOptions
from hetero.train.ray_train import (
    RayTrainRun,
    TrainerParts,
    _worker_error,
    assign_devices,
    ray_trainer,
    run_on_ray,
)
from tests.ray.fleets import write_fleet
from tests.train._models import LOSS, data, mlp, relative_difference, sgd, trained_in_one_process

# Each node's one emulated device.
NODES = {
    "v100": {"type": "gpu", "model": "V100-32GB", "emulate": True, "speed": 1.0},
    "t4": {"type": "gpu", "model": "T4", "emulate": True, "speed": 0.5},
}
STEPS = 5
# micro_batch 4: the V100's share of 8 accumulates over two micro-batches.
OPTIONS = TrainerOptions(
    global_batch=12,
    micro_batch=4,
    seed=3,
    profile_steps=2,
    rebalance_every=0,
    emulate_sample_time=0.01,
)


def build() -> TrainerParts:
    """What every worker trains (``run_on_ray`` calls it there)."""
    return TrainerParts(mlp(), sgd, LOSS, data())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The two-node cluster, this process connected to it; yields where runs keep their
    storage."""
    folder = tmp_path_factory.mktemp("ray_train")
    configs = [write_fleet(folder, name, [device]) for name, device in NODES.items()]
    with local_cluster(configs) as c:
        import_ray().init(address=c.address, logging_level="WARNING")
        yield folder / "runs"


@pytest.fixture(scope="module")
def run(cluster: Path) -> RayTrainRun:
    return run_on_ray(build, OPTIONS, STEPS, num_workers=2, storage_path=str(cluster))


@pytest.mark.ray
@pytest.mark.slow
def test_each_worker_trains_on_its_own_nodes_device(run: RayTrainRun) -> None:
    assert [w.rank for w in run.workers] == [0, 1]
    assert len({w.node for w in run.workers}) == 2  # one worker per node
    assert {w.device.model: w.speed for w in run.workers} == {"V100-32GB": 1.0, "T4": 0.5}


@pytest.mark.ray
@pytest.mark.slow
def test_parameters_match_one_process_on_the_same_global_batches(run: RayTrainRun) -> None:
    assert [r.step for r in run.reports] == list(range(1, STEPS + 1))
    reference = trained_in_one_process(mlp(), sgd, OPTIONS, STEPS)
    assert relative_difference(run.model_state, reference) <= 1e-5


@pytest.mark.ray
@pytest.mark.slow
def test_shares_follow_the_nodes_speeds(run: RayTrainRun) -> None:
    shares = run.reports[-1].shares
    assert sum(shares) == 12
    # 12 × 1 : 0.5 over 1.5 = 8 : 4, by each rank's node.
    ideal = [8 if w.speed == 1.0 else 4 for w in run.workers]
    assert list(shares) == ideal


def test_a_workers_error_is_raised_on_the_driver_as_it_was_raised() -> None:
    from ray.train import ControllerError, WorkerGroupError

    refused = ConfigError([("global_batch", "too small")])
    broken = BackendError("all_gather failed: peer gone")
    # As fit() raises it: each failed worker's own exception, by rank.
    failed = WorkerGroupError("rank 0 ... rank 1 ...", {0: broken, 1: refused})
    assert _worker_error(failed) is refused  # the cause before the peers' broken collectives
    assert _worker_error(WorkerGroupError("...", {0: broken})) is broken
    other = _worker_error(WorkerGroupError("worker 1 died", {1: RuntimeError("killed")}))
    assert isinstance(other, BackendError)
    assert "the Ray Train run failed: Training failed due to worker errors" in str(other)
    crashed = _worker_error(ControllerError(RuntimeError("no placement")))
    assert isinstance(crashed, BackendError) and "no placement" in str(crashed)


def test_a_given_speed_is_refused_before_any_worker_starts() -> None:
    with pytest.raises(ConfigError, match=r"options\.speed: is 0\.5; on Ray Train"):
        run_on_ray(build, TrainerOptions(global_batch=4, speed=0.5), 1, num_workers=2)


def test_run_arguments_are_checked_by_name() -> None:
    with pytest.raises(ConfigError, match="steps: must be an integer >= 1, got 0"):
        run_on_ray(build, OPTIONS, 0, num_workers=2)
    with pytest.raises(ConfigError, match="num_workers: must be an integer >= 1, got 0"):
        run_on_ray(build, OPTIONS, 1, num_workers=0)


def test_ray_trainer_needs_ray_trains_process_group() -> None:
    with pytest.raises(HeteroError, match="inside the training function of a Ray Train"):
        ray_trainer(mlp(), sgd, LOSS, data(), OPTIONS)


def _device(model: str, speed: float, emulated: bool = True) -> Device:
    return Device(id=model, spec=get_catalog().get(model), emulated=emulated, speed_override=speed)


def test_the_kth_worker_on_a_node_takes_its_kth_device() -> None:
    a100, v100, t4 = _device("A100-80GB", 2.5), _device("V100-32GB", 1.0), _device("T4", 0.5)
    workers = assign_devices(["nodeA1", "nodeB1", "nodeA1"], [[a100, t4], [v100], [a100, t4]])
    assert [(w.rank, w.node, w.device.id) for w in workers] == [
        (0, "nodeA1", "A100-80GB"),
        (1, "nodeB1", "V100-32GB"),
        (2, "nodeA1", "T4"),
    ]
    # Relative to the fastest emulated device of the workers.
    assert [w.speed for w in workers] == [1.0, 0.4, 0.2]


def test_a_real_device_is_measured_not_paced() -> None:
    real = _device("V100-32GB", 1.0, emulated=False)
    workers = assign_devices(["a", "b"], [[real], [_device("T4", 0.5)]])
    assert [w.speed for w in workers] == [None, 1.0]


def test_nodes_with_too_few_devices_or_none_known_are_named() -> None:
    t4 = _device("T4", 0.5)
    with pytest.raises(ConfigError) as caught:
        assign_devices(
            ["nodeA1xx", "nodeA1xx", "nodeB1xx"], [[t4], [t4], "HETERO_NODE_CONFIG=x: no file"]
        )
    message = str(caught.value)
    assert (
        "node nodeA1: Ray Train placed 2 workers there (ranks [0, 1]) and it has 1 device(s) "
        "(T4); a worker takes one device" in message
    )
    assert "node nodeB1: rank 2 found no devices there: HETERO_NODE_CONFIG=x: no file" in message
