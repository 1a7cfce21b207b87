"""The framework's original example config (reference seed 004) validates, means what it says,
and on a machine without its GPU fails when the fleet is built, naming every device at once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetero import DeviceError, build_fleet, get_catalog, parse_config
from hetero.config import load_config
from hetero.devices.spec import Device, DeviceKind
from hetero.errors import BackendError, ConfigError

SEED: dict[str, Any] = {
    "devices": [
        {"type": "GPU", "id": 0, "memory_limit": "8GB"},
        {"type": "CPU", "cores": 8},
    ],
    "communication": {"protocol": "RDMA", "buffer_size": "64MB"},
}


def test_the_seed_config_validates_with_kinds_and_protocol_in_any_case() -> None:
    config = parse_config(SEED)
    assert [d.type for d in config.devices] == [DeviceKind.GPU, DeviceKind.CPU]
    assert config.communication.protocol == "rdma"
    assert config.communication.buffer_size == 64 * 10**6


def test_on_a_machine_without_its_gpu_one_error_names_every_device() -> None:
    two_core_cpu = Device(id="cpu:0", spec=get_catalog().get("CPU"), cores=2)
    with pytest.raises(DeviceError) as caught:
        build_fleet(parse_config(SEED), discovered=[two_core_cpu])
    message = str(caught.value)
    assert message.startswith("2 devices cannot be built on this machine:")
    assert "devices[0].id: no gpu 0 on this machine; found: none" in message
    assert "devices[1].cores: 8 cores requested but this machine has 2" in message


@pytest.mark.parametrize(
    ("section", "key", "meant"),
    [("devices", "emulated", "emulate"), ("communication", "buffersize", "buffer_size")],
)
def test_a_near_miss_of_a_key_says_did_you_mean(section: str, key: str, meant: str) -> None:
    data: dict[str, Any] = {"devices": [{"type": "cpu"}]}
    if section == "devices":
        data["devices"][0][key] = True
    else:
        data[section] = {key: "64MB"}
    with pytest.raises(ConfigError) as caught:
        parse_config(data)
    ((_, message),) = caught.value.problems
    assert f"unknown key {key!r}; did you mean {meant!r}? allowed keys:" in message


@pytest.fixture
def hetero_level(monkeypatch: pytest.MonkeyPatch) -> Iterator[logging.Logger]:
    logger = logging.getLogger("hetero")
    before = logger.level
    monkeypatch.setattr("hetero.log._explicit", False)  # no level chosen by the application
    yield logger
    logger.setLevel(before)


def test_logging_level_of_a_loaded_file_takes_effect(
    tmp_path: Path, hetero_level: logging.Logger
) -> None:
    path = tmp_path / "hetero_config.yaml"
    path.write_text("devices: [{type: cpu}]\nlogging: {level: error}\n")
    hetero_level.setLevel(logging.INFO)
    load_config(path)
    assert hetero_level.level == logging.ERROR
    # A file that does not set a level leaves the one the application chose.
    path.write_text("devices: [{type: cpu}]\n")
    hetero_level.setLevel(logging.DEBUG)
    load_config(path)
    assert hetero_level.level == logging.DEBUG


def test_buffer_size_sets_nccls_buffer_and_is_refused_where_no_transport_has_one() -> None:
    comm = pytest.importorskip("hetero.comm")
    assert comm._transport_env("nccl", 64 * 10**6) == {"NCCL_BUFFSIZE": "64000000"}
    assert comm._transport_env("rdma", 8 * 2**20) == {
        "NCCL_BUFFSIZE": str(8 * 2**20),
        "NCCL_NET": "IB",
    }
    assert comm._transport_env("gloo", None) == {}
    gloo = parse_config({**SEED, "communication": {"protocol": "gloo", "buffer_size": "64MB"}})
    with pytest.raises(ConfigError, match=r"communication.buffer_size: .*gloo has none"):
        comm.init(0, 1, config=gloo)


def test_rdma_where_no_such_transport_exists_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    comm = pytest.importorskip("hetero.comm")
    monkeypatch.setattr(comm, "_RDMA_DEVICES", Path("/nonexistent/infiniband"))
    with pytest.raises(BackendError, match=r"protocol 'rdma' .*InfiniBand.*RoCE.* no RDMA device"):
        comm.init(0, 1, config=parse_config(SEED))
