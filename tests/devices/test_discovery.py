from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest

from hetero.devices.discovery import get_device_list, visible_gpu_indices
from hetero.devices.fake_nvml import FakeGPU, FakeNVML, mixed_box
from hetero.devices.spec import DeviceKind

GIB = 1024**3


def gpus(environ: dict[str, str] | None = None, nvml: Any = None, **kw: Any) -> list[Any]:
    found = get_device_list(nvml=nvml or mixed_box(), environ=environ or {}, **kw)
    assert found[0].kind is DeviceKind.CPU
    return found[1:]


def test_mixed_box() -> None:
    found = get_device_list(nvml=mixed_box(), environ={})
    cpu, *rest = found
    assert cpu.id == "cpu:0" and (cpu.cores or 0) > 0 and cpu.memory_bytes > 0
    assert [g.id for g in rest] == ["gpu:0", "gpu:1", "gpu:2", "gpu:3"]
    assert [g.model for g in rest] == ["A100-80GB"] * 2 + ["V100-32GB"] * 2
    v100 = rest[3]
    assert v100.state.memory_total == 32 * GIB and v100.state.memory_used == 4 * GIB
    assert v100.state.memory_free == 28 * GIB
    assert v100.state.utilization == pytest.approx(0.3)
    assert v100.state.temperature_c == 43 and v100.state.power_w == pytest.approx(130)
    assert v100.uuid and v100.uuid.startswith("GPU-3v100")
    assert v100.pci_bus_id == "00000000:0A:00.0"
    assert v100.spec.peak_tflops("fp16") == pytest.approx(125)


@pytest.mark.parametrize(
    ("visible", "models"),
    [
        ("2,0", ["V100-32GB", "A100-80GB"]),
        ("GPU-3v100-0000-1111-2222-333344445555", ["V100-32GB"]),
        ("GPU-1a100", ["A100-80GB"]),
        ("2v100", ["V100-32GB"]),
        ("0000:07:00.0,0A:00.0", ["A100-80GB", "V100-32GB"]),
        ("00000000:09:00.0", ["V100-32GB"]),
        ("", []),
        ("-1", []),
        ("1,7,0", ["A100-80GB"]),  # CUDA stops at the first invalid entry
        ("1,1", ["A100-80GB"]),
    ],
)
def test_cuda_visible_devices(visible: str, models: list[str]) -> None:
    found = gpus({"CUDA_VISIBLE_DEVICES": visible})
    assert [g.model for g in found] == models
    assert [g.id for g in found] == [f"gpu:{i}" for i in range(len(models))]


def test_invalid_entry_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert visible_gpu_indices("0,banana", [(0, "GPU-a", ""), (1, "GPU-b", "")]) == [0]
    assert "'banana'" in caplog.text


def test_ambiguous_uuid_prefix_matches_nothing() -> None:
    assert visible_gpu_indices("GPU-a", [(0, "GPU-ab", ""), (1, "GPU-ac", "")]) == []


def test_missing_driver_gives_only_the_cpu() -> None:
    box = mixed_box()
    box.fail_init = True
    assert (
        gpus(
            nvml=box,
            torch_module=SimpleNamespace(
                cuda=SimpleNamespace(is_available=lambda: False), backends=None
            ),
        )
        == []
    )


def test_missing_pynvml_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    # None in sys.modules makes `import pynvml` raise ImportError, as on a machine without it.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "torch", None)
    found = get_device_list(environ={})
    assert [d.kind for d in found] == [DeviceKind.CPU]


def test_unsupported_queries_leave_fields_empty() -> None:
    box = mixed_box()
    box.unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"}
    (first, *_) = gpus(nvml=box)
    assert first.state.power_w is None and first.state.temperature_c is None
    assert first.model == "A100-80GB"


def test_unknown_gpu_gets_generic_spec_with_warning(caplog: pytest.LogCaptureFixture) -> None:
    box = FakeNVML([FakeGPU(name="NVIDIA Future X1", memory_total=200 * GIB, uuid="GPU-x")])
    with caplog.at_level(logging.WARNING, logger="hetero"):
        (gpu,) = gpus(nvml=box)
    assert gpu.model == "NVIDIA Future X1"
    assert gpu.state.memory_total == 200 * GIB
    assert gpu.spec.peak_tflops("fp32") > 0
    assert "NVIDIA Future X1" in caplog.text


def fake_torch(names: list[str], hip: str | None = None) -> Any:
    return SimpleNamespace(
        cuda=SimpleNamespace(
            is_available=lambda: bool(names),
            device_count=lambda: len(names),
            get_device_name=lambda i: names[i],
        ),
        version=SimpleNamespace(hip=hip),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: False)),
    )


def test_torch_fallback_when_nvml_has_no_gpus() -> None:
    empty = FakeNVML([])
    (gpu,) = gpus(nvml=empty, torch_module=fake_torch(["NVIDIA L4"]))
    assert gpu.model == "L4" and gpu.id == "gpu:0"


def test_torch_rocm_fallback() -> None:
    empty = FakeNVML([])
    (gpu,) = gpus(nvml=empty, torch_module=fake_torch(["AMD Instinct MI300X"], hip="6.2"))
    assert gpu.model == "MI300X" and gpu.spec.vendor == "AMD"


def test_torch_mps_fallback() -> None:
    torch = fake_torch([])
    torch.backends.mps.is_available = lambda: True
    (gpu,) = gpus(nvml=FakeNVML([]), torch_module=torch)
    assert gpu.spec.vendor == "Apple"


def test_gpus_hidden_by_cuda_visible_devices_are_not_found_again_through_torch() -> None:
    # torch honours the same variable, so asking it would only disagree with NVML.
    torch = fake_torch(["NVIDIA A100-SXM4-80GB"])
    assert gpus({"CUDA_VISIBLE_DEVICES": ""}, torch_module=torch) == []
    assert gpus({"CUDA_VISIBLE_DEVICES": "-1"}, torch_module=torch) == []
