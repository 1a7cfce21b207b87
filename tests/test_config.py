from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hetero import ConfigError, HeteroConfig, load_config, parse_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mixed_fleet.yaml"


def problems(data: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    return info.value.problems


def only(data: Any) -> tuple[str, str]:
    found = problems(data)
    assert len(found) == 1, found
    return found[0]


def test_issue_example_parses() -> None:
    config = parse_config(
        {
            "devices": [
                {"type": "gpu", "id": 0, "memory_limit": "8GB"},
                {"type": "cpu", "cores": 8},
                {"type": "gpu", "model": "V100-32GB", "emulate": True, "count": 2},
                {"type": "gpu", "model": "A100-80GB", "emulate": True, "speed": 2.5},
            ],
            "scheduler": {
                "strategy": "weighted_least_connections",
                "max_queue_size": 100,
                "timeout": 30,
            },
            "communication": {"protocol": "gloo", "buffer_size": "64MB"},
            "logging": {"level": "info"},
        }
    )
    assert isinstance(config, HeteroConfig)
    assert config.devices[0].memory_limit == 8 * 10**9
    assert config.devices[2].count == 2
    assert config.devices[3].speed == 2.5
    assert config.communication.buffer_size == 64 * 10**6
    assert config.logging.level == "INFO"
    assert config.scheduler.max_queue_size == 100


def test_example_file_loads() -> None:
    config = load_config(EXAMPLE)
    assert sum(d.count for d in config.devices) == 5


def test_model_aliases_resolve_to_canonical_name() -> None:
    config = parse_config({"devices": [{"type": "gpu", "model": "a100 80gb", "emulate": True}]})
    assert config.devices[0].model == "A100-80GB"


def test_unknown_key_names_key_and_allowed() -> None:
    path, msg = only(
        {"devices": [{"type": "gpu", "model": "T4", "emulate": True, "colour": "red"}]}
    )
    assert path == "devices[0].colour"
    assert "unknown key 'colour'" in msg and "memory_limit" in msg


def test_unknown_top_level_key() -> None:
    path, msg = only({"devices": [{"type": "cpu"}], "schedular": {}})
    assert path == "schedular"
    # heterogeneous_config: seed 000's block, accepted as aliases (tests/test_seed_keys.py).
    allowed = (
        "backend, communication, devices, heterogeneous_config, logging, nodes, replicas, scheduler"
    )
    assert f"allowed keys: {allowed}" in msg


def test_wrong_type_names_field_and_value() -> None:
    path, msg = only({"devices": [{"type": "gpu", "model": "T4", "emulate": True, "count": "two"}]})
    assert path == "devices[0].count"
    assert "'two'" in msg


def test_unknown_device_type_lists_allowed() -> None:
    path, msg = only({"devices": [{"type": "qpu"}]})
    assert path == "devices[0].type"
    assert "'qpu'" in msg and "'gpu'" in msg and "'asic'" in msg


@pytest.mark.parametrize("size", ["0GB", 0, "-1GB", -5])
def test_zero_or_negative_sizes(size: object) -> None:
    path, msg = only(
        {"devices": [{"type": "gpu", "model": "T4", "emulate": True, "memory_limit": size}]}
    )
    assert path == "devices[0].memory_limit"
    assert repr(size) in msg


def test_bad_size_unit() -> None:
    path, msg = only({"devices": [{"type": "cpu"}], "communication": {"buffer_size": "64 XB"}})
    assert path == "communication.buffer_size"
    assert "'64 XB'" in msg and "GiB" in msg


def test_unknown_model_suggests_closest() -> None:
    path, msg = only({"devices": [{"type": "gpu", "model": "A100-80G", "emulate": True}]})
    assert path == "devices[0].model"
    assert "'A100-80G'" in msg and "A100-80GB" in msg


def test_duplicate_ids() -> None:
    path, msg = only({"devices": [{"type": "gpu", "id": 1}, {"type": "gpu", "id": 1}]})
    assert path == "devices[1].id"
    assert "duplicate id '1'" in msg and "devices[0]" in msg


def test_duplicate_names() -> None:
    path, msg = only(
        {
            "devices": [
                {"type": "gpu", "model": "T4", "emulate": True, "name": "x"},
                {"type": "gpu", "model": "L4", "emulate": True, "name": "x"},
            ]
        }
    )
    assert path == "devices[1].name" and "'x'" in msg


def test_memory_limit_above_device_memory() -> None:
    path, msg = only(
        {
            "devices": [
                {"type": "gpu", "model": "V100-16GB", "emulate": True, "memory_limit": "32GB"}
            ]
        }
    )
    assert path == "devices[0].memory_limit"
    assert "29.8 GiB" in msg and "V100-16GB" in msg and "16 GiB" in msg


def test_empty_device_list() -> None:
    path, msg = only({"devices": []})
    assert path == "devices"
    assert "at least 1" in msg and "[]" in msg


def test_missing_device_list() -> None:
    path, msg = only({"scheduler": {}})
    assert (path, msg) == ("devices", "required field is missing")


def test_emulated_needs_model_and_count_needs_emulation() -> None:
    found = problems({"devices": [{"type": "gpu", "emulate": True}, {"type": "gpu", "count": 3}]})
    assert ("devices[0].model", "an emulated device needs a catalog model") in found
    assert any(p == "devices[1].count" and "emulated" in m for p, m in found)


def test_real_tpu_cannot_be_discovered() -> None:
    path, msg = only({"devices": [{"type": "tpu"}]})
    assert path == "devices[0].type" and "emulate: true" in msg


def test_model_kind_mismatch() -> None:
    path, msg = only({"devices": [{"type": "cpu", "model": "A100-80GB", "emulate": True}]})
    assert path == "devices[0].model" and "is a gpu" in msg


def test_every_problem_is_reported_at_once() -> None:
    found = problems(
        {
            "devices": [
                {"type": "gpu", "model": "nope", "emulate": True},
                {"type": "gpu", "model": "T4", "emulate": True, "speed": -1},
            ],
            "scheduler": {"max_queue_size": 0},
            "logging": {"level": "LOUD"},
        }
    )
    paths = {p for p, _ in found}
    assert {
        "devices[0].model",
        "devices[1].speed",
        "scheduler.max_queue_size",
        "logging.level",
    } <= paths


def test_not_a_mapping() -> None:
    _, msg = only(["devices"])
    assert "expected a mapping" in msg


def test_load_config_yaml_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices:\n  - {type: gpu\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+, column \d+"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")


def test_unknown_strategy_lists_valid_names() -> None:
    path, msg = only({"devices": [{"type": "cpu"}], "scheduler": {"strategy": "fastest"}})
    assert path == "scheduler.strategy"
    assert "unknown strategy 'fastest'" in msg and "shortest_expected_delay" in msg


def test_strategy_options_are_checked() -> None:
    path, msg = only(
        {
            "devices": [{"type": "cpu"}],
            "scheduler": {"strategy": "weighted", "options": {"variant": "fast"}},
        }
    )
    assert path == "scheduler"
    assert "variant='fast'; allowed: smooth, random" in msg


def test_custom_strategy_by_import_path() -> None:
    config = parse_config(
        {
            "devices": [{"type": "cpu"}],
            "scheduler": {
                "strategy": "tests.sched.custom_policy:AlwaysLast",
                "options": {"offset": 1},
            },
        }
    )
    assert config.scheduler.options == {"offset": 1}


def test_scheduler_defaults_are_the_measured_best() -> None:
    scheduler = parse_config({"devices": [{"type": "cpu"}]}).scheduler
    assert scheduler.strategy == "tail_budget"
    assert (scheduler.queue_order, scheduler.aging, scheduler.max_bypass) == ("size", 10.0, None)


def test_queue_order_fields_are_checked() -> None:
    found = problems(
        {
            "devices": [{"type": "cpu"}],
            "scheduler": {"queue_order": "lifo", "aging": -1, "max_bypass": float("inf")},
        }
    )
    assert [path for path, _ in found] == [
        "scheduler.queue_order",
        "scheduler.aging",
        "scheduler.max_bypass",
    ]
    assert "'size' or 'fifo'" in found[0][1]


def test_a_file_of_replicas_needs_no_devices() -> None:
    config = parse_config(
        {
            "replicas": [
                {"url": "http://10.0.0.5:8000/", "device": "NVIDIA A100-SXM4-80GB"},
                {"url": "https://box7:443", "speed": 2.5, "slots": 16, "models": ["m"]},
            ]
        }
    )
    assert config.devices == []
    first, second = config.replicas
    assert (first.url, first.device) == ("http://10.0.0.5:8000", "A100-80GB")
    assert (second.speed, second.slots, second.models) == (2.5, 16, ["m"])


def test_bad_replicas_name_the_field() -> None:
    found = problems(
        {
            "replicas": [
                {"url": "ftp://x", "speed": 1},
                {"url": "http://h:1"},
                {"url": "http://h:2", "device": "A100"},
                {"url": "http://h:3", "speed": 0, "slots": 0},
            ]
        }
    )
    assert (
        "replicas[0].url",
        "expected http://HOST[:PORT] or https://HOST[:PORT], got 'ftp://x'",
    ) in found
    assert not any(p.startswith("replicas[1]") for p, _ in found)  # a URL alone is a replica
    assert any(
        p == "replicas[2].device" and "closest catalog names: A100-40GB" in m for p, m in found
    )
    assert any(p == "replicas[3].speed" for p, _ in found)
    assert any(p == "replicas[3].slots" for p, _ in found)


def test_a_ray_backend_needs_no_devices_and_keeps_its_address() -> None:
    config = parse_config({"backend": {"kind": "ray", "address": "10.0.0.5:6379"}})
    assert config.backend.kind == "ray" and config.backend.address == "10.0.0.5:6379"
    assert config.devices == []


def test_an_address_for_the_local_backend_is_refused() -> None:
    path, msg = only({"devices": [{"type": "cpu"}], "backend": {"address": "10.0.0.5:6379"}})
    assert path == "backend" and "address applies to kind: ray only" in msg


def test_an_unknown_backend_kind_names_those_allowed() -> None:
    path, msg = only({"devices": [{"type": "cpu"}], "backend": {"kind": "dask"}})
    assert path == "backend.kind" and "'local'" in msg and "'ray'" in msg
