from __future__ import annotations

import pytest

from hetero import DeviceError, build_fleet, get_catalog, parse_config
from hetero.devices.spec import Device, DeviceKind


def discovered() -> list[Device]:
    catalog = get_catalog()
    cpu = Device(id="cpu:0", spec=catalog.get("CPU"), cores=16)
    gpus = [
        Device(
            id=f"gpu:{i}",
            spec=catalog.get(model),
            local_index=i,
            uuid=f"GPU-{i}abc-0000",
            pci_bus_id=f"00000000:0{i}:00.0",
        )
        for i, model in enumerate(["A100-80GB", "V100-16GB"])
    ]
    return [cpu, *gpus]


def test_emulated_devices_get_catalog_specs_and_ids() -> None:
    config = parse_config(
        {
            "devices": [
                {"type": "gpu", "model": "A100-80GB", "emulate": True, "count": 2},
                {
                    "type": "gpu",
                    "model": "V100-32GB",
                    "emulate": True,
                    "count": 2,
                    "tags": ["small"],
                },
                {
                    "type": "gpu",
                    "model": "A100-80GB",
                    "emulate": True,
                    "speed": 3.0,
                    "name": "fast",
                },
            ]
        }
    )
    fleet = build_fleet(config, discovered=[])
    assert [d.id for d in fleet] == [
        "a100-80gb:0",
        "a100-80gb:1",
        "v100-32gb:0",
        "v100-32gb:1",
        "fast",
    ]
    assert all(d.emulated for d in fleet)
    assert fleet[0].speed == pytest.approx(2.5, rel=0.01) and fleet[2].speed == pytest.approx(1.0)
    assert fleet[4].speed == 3.0
    assert fleet[2].tags == {"small"}


def test_real_devices_matched_by_index_uuid_and_bus_id() -> None:
    for wanted in (1, "GPU-1abc-0000", "1abc-0000", "0000:01:00.0", "01:00.0"):
        config = parse_config({"devices": [{"type": "gpu", "id": wanted, "memory_limit": "8GB"}]})
        (gpu,) = build_fleet(config, discovered=discovered())
        assert gpu.model == "V100-16GB", wanted
        assert gpu.memory_bytes == 8 * 10**9
        assert gpu.state.memory_total == 8 * 10**9


def test_cpu_cores_and_missing_devices() -> None:
    config = parse_config({"devices": [{"type": "cpu", "cores": 8}]})
    (cpu,) = build_fleet(config, discovered=discovered())
    assert cpu.kind is DeviceKind.CPU and cpu.cores == 8
    too_many = parse_config({"devices": [{"type": "cpu", "cores": 64}]})
    with pytest.raises(DeviceError, match=r"devices\[0\].cores: 64 cores requested .* has 16"):
        build_fleet(too_many, discovered=discovered())
    missing = parse_config({"devices": [{"type": "gpu", "id": 5}]})
    with pytest.raises(DeviceError, match=r"devices\[0\].id: no gpu 5 on this machine; found: 0 "):
        build_fleet(missing, discovered=discovered())


def test_memory_limit_above_a_real_device() -> None:
    config = parse_config({"devices": [{"type": "gpu", "id": 1, "memory_limit": "20GB"}]})
    with pytest.raises(DeviceError, match=r"devices\[0\].memory_limit"):
        build_fleet(config, discovered=discovered())
