"""The seed documents' own config (reference seeds 000 and 001) means what it says: batch sizes by
GPU family, and the seeds' switches as aliases of hetero's strategies and settings, each mapped
explicitly or refused with the hetero equivalent named."""

from __future__ import annotations

from typing import Any

import pytest

from hetero.config import HeteroConfig, parse_config
from hetero.devices.fleet import build_fleet
from hetero.errors import ConfigError
from hetero.sched import Dispatcher, PerfModel
from hetero.sched.perf import BatchTable, batch_key_kind

SEED_FLEET: list[dict[str, Any]] = [
    {"type": "gpu", "model": model, "emulate": True}
    for model in ("A100-80GB", "A100-40GB", "V100-32GB", "T4")
]
#: Seed 000's batch table, as the seed writes it.
SEED_BATCHES = {"A100": 32, "V100": 16, "T4": 8}
#: Seed 000's ``heterogeneous_config``, as the seed writes it.
SEED_000: dict[str, Any] = {
    "enable_weighted_routing": True,
    "weight_calculation": "dynamic",
    "monitoring_interval": 10,
    "capacity_aware": True,
    "request_tiering": True,
    "auto_adjust_batch_size": True,
}
TIERS = {"thresholds": [1024], "tiers": [["V100-32GB"], ["A100-80GB"]]}


def config(**sections: Any) -> HeteroConfig:
    return parse_config({"devices": SEED_FLEET, **sections})


def problems(**sections: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        config(**sections)
    return caught.value.problems


# --- 1. batch sizes by family --------------------------------------------------------------


def test_the_seed_batch_table_resolves_by_family_on_a_mixed_fleet() -> None:
    cfg = config(scheduler={"batch_sizes": SEED_BATCHES})
    fleet = build_fleet(cfg)
    perf = Dispatcher.from_config(cfg, devices=fleet).perf
    table = BatchTable.resolve(cfg.scheduler.batch_sizes, fleet)
    assert {d.model: table.cap(d) for d in fleet} == {
        "A100-80GB": 32,
        "A100-40GB": 32,
        "V100-32GB": 16,
        "T4": 8,
    }
    # A batch larger than the table allows is refused rather than overfilling a device.
    assert perf.batch_sizes(88) == [32, 32, 16, 8]
    with pytest.raises(ValueError, match="does not fit"):
        perf.batch_sizes(89)


def test_a_device_id_or_exact_model_wins_over_a_family() -> None:
    fleet = build_fleet(config())
    table = {"A100": 32, "A100-40GB": 24, "a100-80gb:0": 48, "tesla t4": 4}
    caps = {d.id: BatchTable.resolve(table, fleet).cap(d) for d in fleet}
    assert caps == {"a100-80gb:0": 48, "a100-40gb:0": 24, "v100-32gb:0": None, "t4:0": 4}


def test_family_and_model_names_are_told_apart() -> None:
    assert batch_key_kind("A100") == ("family", "A100")
    assert batch_key_kind("a100-80gb") == ("model", "A100-80GB")
    assert batch_key_kind("A10") == ("model", "A10")  # a model, not the A100 family
    assert batch_key_kind("H100") == ("family", "H100")  # every H100, not only the SXM part
    assert batch_key_kind("NVIDIA A100-SXM4-40GB") == ("model", "A100-40GB")
    assert batch_key_kind("A100-80GB/1g.10gb") == ("model", "A100-80GB/1g.10gb")
    assert batch_key_kind("A10O") is None


def test_a_key_that_matches_nothing_is_refused_naming_the_candidates() -> None:
    ((path, message),) = problems(scheduler={"batch_sizes": {"A100": 32, "A10O": 8}})
    assert path == "scheduler.batch_sizes.A10O"
    assert "'A10O' matches no device and no catalog model or family" in message
    assert "a device id (a100-80gb:0, a100-40gb:0, v100-32gb:0, t4:0)" in message
    assert "a model (A100-80GB, A100-40GB, V100-32GB, T4)" in message
    assert "a family (A100, V100)" in message


def test_the_fleet_refuses_a_key_the_file_could_not_check() -> None:
    """A config of real devices gives no ids until the fleet is built: the PerfModel checks."""
    fleet = build_fleet(config())
    with pytest.raises(ConfigError, match=r"scheduler\.batch_sizes\.gpu:7: 'gpu:7' matches no"):
        PerfModel(fleet, batch_table={"gpu:7": 8})


def test_two_keys_for_one_model_are_refused() -> None:
    found = problems(scheduler={"batch_sizes": {"A100-80GB": 32, "NVIDIA A100-SXM4-80GB": 16}})
    assert found == [
        (
            "scheduler.batch_sizes.NVIDIA A100-SXM4-80GB",
            "names the same model A100-80GB as key 'A100-80GB'; keep one",
        )
    ]


# --- 2. the seeds' switches ----------------------------------------------------------------


def test_seed_000s_block_maps_to_the_tiered_strategy() -> None:
    cfg = config(heterogeneous_config=SEED_000, scheduler={"options": TIERS})
    assert cfg.scheduler.strategy == "tiered"
    assert cfg.scheduler.monitoring_interval == 10


def test_tiering_without_tiers_says_what_tiered_needs() -> None:
    ((path, message),) = problems(heterogeneous_config=SEED_000)
    assert path == "heterogeneous_config.request_tiering"
    assert "scheduler.options.thresholds" in message and "scheduler.options.tiers" in message


@pytest.mark.parametrize(
    ("block", "strategy"),
    [
        ({"enable_weighted_routing": True}, "weighted"),
        ({"enable_weighted_routing": True, "weight_calculation": "static"}, "weighted"),
        ({"enable_weighted_routing": True, "weight_calculation": "dynamic"}, "adaptive"),
        ({"weight_calculation": "dynamic"}, "adaptive"),
        ({"enable_weighted_routing": False}, "round_robin"),
        ({"capacity_aware": True, "auto_adjust_batch_size": True}, "tail_budget"),  # always on
        ({"request_tiering": False}, "tail_budget"),
    ],
)
def test_weighted_routing_maps_to_a_speed_weighted_strategy(
    block: dict[str, Any], strategy: str
) -> None:
    assert config(heterogeneous_config=block).scheduler.strategy == strategy


def test_an_alias_that_agrees_with_the_hetero_key_is_accepted() -> None:
    cfg = config(
        heterogeneous_config={"enable_weighted_routing": True, "monitoring_interval": 5},
        scheduler={"strategy": "weighted", "monitoring_interval": 5.0},
    )
    assert (cfg.scheduler.strategy, cfg.scheduler.monitoring_interval) == ("weighted", 5.0)


def test_an_alias_that_contradicts_the_hetero_key_is_refused_naming_both() -> None:
    found = problems(
        heterogeneous_config={"request_tiering": True, "monitoring_interval": 10},
        scheduler={"strategy": "weighted", "monitoring_interval": 2, "options": {}},
    )
    assert found == [
        (
            "heterogeneous_config.request_tiering",
            "true means scheduler.strategy: tiered, but scheduler.strategy is 'weighted'; "
            "remove one or make them agree",
        ),
        (
            "heterogeneous_config.monitoring_interval",
            "10 means scheduler.monitoring_interval: 10.0, but scheduler.monitoring_interval "
            "is 2; remove one or make them agree",
        ),
    ]


@pytest.mark.parametrize(
    ("block", "path", "says"),
    [
        (
            {"request_tiering": True, "weight_calculation": "static"},
            "heterogeneous_config.weight_calculation",
            "static conflicts with request_tiering: true",
        ),
        (
            {"request_tiering": True, "enable_weighted_routing": False},
            "heterogeneous_config.enable_weighted_routing",
            "false (a uniform split) conflicts with request_tiering: true",
        ),
        (
            {"enable_weighted_routing": False, "weight_calculation": "dynamic"},
            "heterogeneous_config.weight_calculation",
            "enable_weighted_routing: false turns off",
        ),
        (
            {"capacity_aware": False},
            "heterogeneous_config.capacity_aware",
            "scheduler.strategy: capacity_aware with options {on_no_fit: reject}",
        ),
        (
            {"auto_adjust_batch_size": False},
            "heterogeneous_config.auto_adjust_batch_size",
            "set scheduler.batch_sizes",
        ),
        (
            {"weight_calculation": "learned"},
            "heterogeneous_config.weight_calculation",
            "'static' or 'dynamic'",
        ),
        (
            {"request_tierng": True},
            "heterogeneous_config.request_tierng",
            "did you mean 'request_tiering'?",
        ),
    ],
)
def test_seed_000_values_hetero_has_no_meaning_for_are_refused(
    block: dict[str, Any], path: str, says: str
) -> None:
    ((where, message),) = problems(heterogeneous_config=block)
    assert where == path
    assert says in message


def test_seed_001s_scheduler_config_is_valid_as_it_stands() -> None:
    seed_001 = {
        "strategy": "weighted_least_connections",
        "enable_monitoring": True,
        "monitoring_interval": 1.0,
        "enable_preemption": False,
        "max_queue_size": 100,
        "timeout": 30.0,
    }
    sched = config(scheduler=seed_001).scheduler
    assert (sched.strategy, sched.preemption, sched.max_queue_size) == (
        "weighted_least_connections",
        False,
        100,
    )
    assert config(scheduler={"enable_preemption": True}).scheduler.preemption is True


def test_seed_001s_switches_refused_where_they_mean_nothing_here() -> None:
    found = problems(
        scheduler={"enable_monitoring": False, "enable_preemption": True, "preemption": False}
    )
    assert found == [
        (
            "scheduler.enable_monitoring",
            "false cannot be honoured: hetero always reads its devices (memory in use, "
            "utilization, hetero top); set scheduler.monitoring_interval (seconds, up to 86400) "
            "to read them less often (got False)",
        ),
        (
            "scheduler.enable_preemption",
            "true means scheduler.preemption: true, but scheduler.preemption is false; remove "
            "one or make them agree",
        ),
    ]


def test_the_model_itself_never_ignores_an_alias() -> None:
    """Only ``parse_config`` maps the aliases; the model refuses them rather than drop them."""
    with pytest.raises(ValueError, match="heterogeneous_config"):
        HeteroConfig.model_validate({"devices": SEED_FLEET, "heterogeneous_config": SEED_000})
