"""MIG slices as devices: catalog profiles, discovery through the fake NVML, CUDA_VISIBLE_DEVICES,
fleets, the collective rule and the environment a slice's worker gets."""

from __future__ import annotations

import logging
import os
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import hetero
from hetero import ConfigError, DeviceError, build_fleet, get_catalog, parse_config
from hetero.commands.fit import register as register_fit
from hetero.devices import shared_parents
from hetero.devices.discovery import get_device_list, visible_gpu_indices
from hetero.devices.fake_nvml import (
    MIG_PROFILES,
    FakeGPU,
    FakeNVML,
    mig_box,
    mig_slices,
    mixed_box,
)
from hetero.devices.mig import MigLayout, measured_share
from hetero.devices.spec import Device, DeviceKind

GIB = 1024**3
MIB = 1024**2
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
PROFILES = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]


def gpus(nvml: FakeNVML | None = None, **environ: str) -> list[Device]:
    found = get_device_list(nvml=nvml or mig_box(), environ=environ)
    assert found[0].kind is DeviceKind.CPU
    return found[1:]


# --- the catalog: a profile is a device model ---------------------------------------------------


def test_a_profile_is_its_gpu_scaled_by_its_share() -> None:
    catalog = get_catalog()
    a100 = catalog.get("A100-80GB")
    half = catalog.get("A100-80GB/3g.40gb")
    assert half.model == "A100-80GB/3g.40gb" and half.kind is DeviceKind.GPU
    # 42 of the A100's 108 SMs; 4 of its 8 memory slices; half the GPU kept from other slices.
    assert half.peak_tflops("bf16") == pytest.approx(312 * 42 / 108, abs=0.01)
    assert half.peak_tflops("fp64") == pytest.approx(9.7 * 42 / 108, abs=0.01)
    assert half.memory_bytes == round(39.25 * GIB)
    assert half.memory_bandwidth_gbs == pytest.approx(a100.memory_bandwidth_gbs / 2, abs=0.1)
    assert half.price_per_hour == pytest.approx(1.79 / 2, abs=0.001)
    assert half.tdp_w == pytest.approx(200)
    # A slice has no NVLink to anything and cannot be split again.
    assert half.interconnect == "none" and half.interconnect_gbs == 0
    assert not {"nvlink", "nvswitch", "mig"} & half.capabilities
    assert "bf16" in half.capabilities
    small = catalog.get("H100-SXM-80GB/1g.10gb")
    assert small.peak_tflops("fp8") == pytest.approx(1978.9 * 16 / 132, abs=0.01)
    assert small.price_per_hour == pytest.approx(2.99 / 7, abs=0.001)  # 1 of 7 compute slices
    whole = catalog.get("H100-SXM-80GB/7g.80gb")  # all 132 SMs
    assert whole.peak_tflops("bf16") == pytest.approx(989.4)


@pytest.mark.parametrize("gpu", ["A100-80GB", "H100-SXM-80GB"])
@pytest.mark.parametrize("profile", PROFILES)
def test_every_listed_profile_resolves_and_shrinks_with_its_size(gpu: str, profile: str) -> None:
    catalog = get_catalog()
    name = f"{gpu}/{profile}"
    spec = catalog.get(name)
    assert name in catalog and spec.model == name
    parent = catalog.get(gpu)
    assert 0 < spec.peak_tflops("bf16") <= parent.peak_tflops("bf16")
    assert spec.memory_bytes < parent.memory_bytes
    assert spec.memory_bytes == pytest.approx(int(profile.split(".")[1][:-2]) * GIB, rel=0.06)


@pytest.mark.parametrize(
    "name",
    [
        "a100-80gb/3G.40GB",
        "NVIDIA A100-SXM4-80GB/3g.40gb",
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",  # NVML's and torch's name of the slice
        "A100-80GB/MIG 3g.40gb",
        "A100 80GB/3g.40gb+me",  # media engines change neither compute nor memory
    ],
)
def test_profile_names_people_and_drivers_write(name: str) -> None:
    assert get_catalog().get(name).model == "A100-80GB/3g.40gb"
    assert name in get_catalog()


def test_bad_profile_names_say_what_is_allowed() -> None:
    catalog = get_catalog()
    with pytest.raises(DeviceError) as err:
        catalog.get("A100-80GB/5g.50gb")
    assert str(err.value) == (
        "A100-80GB has no MIG profile '5g.50gb'; allowed: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, "
        "4g.40gb, 7g.80gb (e.g. A100-80GB/7g.80gb)"
    )
    with pytest.raises(DeviceError, match="no MIG profiles for V100-32GB; models with MIG "):
        catalog.get("V100-32GB/1g.5gb")
    with pytest.raises(DeviceError, match=r"unknown device model 'A100'; closest: A100-40GB"):
        catalog.get("A100/3g.40gb")
    assert "A100-80GB/5g.50gb" not in catalog
    assert catalog.why_unknown("A100-80GB/3g.40gb") == ""
    # A name with a slash that the catalog lists as a whole is that model, not a slice.
    assert catalog.get("AMD Instinct MI250X/MI250").model == "MI250X"


def test_resolve_takes_a_driver_slice_name_and_falls_back_for_an_unknown_profile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    catalog = get_catalog()
    assert catalog.resolve(f"{H100} MIG 2g.20gb").model == "H100-SXM-80GB/2g.20gb"
    with caplog.at_level(logging.WARNING, logger="hetero"):
        spec = catalog.resolve(f"{A100} MIG 6g.60gb")
    assert spec.model == f"{A100} MIG 6g.60gb" and "not in the catalog" in caplog.text


def test_slices_stay_out_of_the_catalog_listing() -> None:
    catalog = get_catalog()
    assert all("/" not in spec.model for spec in catalog)
    layout = catalog.mig_layout("A100-80GB")
    assert layout is not None and layout.sms == 108 and layout.names[0] == "1g.10gb"
    assert catalog.mig_layout("T4") is None


def test_a_mig_block_that_does_not_add_up_is_refused() -> None:
    with pytest.raises(DeviceError, match=r"X\.mig must give sms"):
        MigLayout.from_row("X", {"sms": 10, "profiles": {}})
    row = {"sms": 10, "compute_slices": 7, "memory_slices": 8, "profiles": {"9g.9gb": [9, 1, 9]}}
    with pytest.raises(DeviceError, match=r"profile 9g\.9gb exceeds its GPU"):
        MigLayout.from_row("X", row)


# --- discovery through the fake NVML -------------------------------------------------------------


def test_discovery_lists_every_slice_and_no_gpu_in_mig_mode() -> None:
    found = gpus()
    assert [d.id for d in found] == [f"gpu:{i}" for i in range(8)]
    assert [d.model for d in found] == [
        "A100-80GB/3g.40gb",
        "A100-80GB/2g.20gb",
        "A100-80GB/1g.10gb",
        "A100-80GB/1g.10gb",
        "A100-80GB",  # GPU 1 is not in MIG mode: the whole GPU
        "H100-SXM-80GB/4g.40gb",
        "H100-SXM-80GB/3g.40gb",
        "H100-SXM-80GB/7g.80gb",
    ]
    box = mig_box()
    first, slices = found[0], box.gpus[0].mig or []
    assert first.uuid == slices[0].uuid and first.uuid.startswith("MIG-")
    assert first.parent == box.gpus[0].uuid and first.pci_bus_id == box.gpus[0].pci_bus_id
    assert first.memory_bytes == first.state.memory_total == 40192 * MIB  # what NVML reports
    assert first.state.temperature_c == 40  # its GPU's
    assert found[4].parent is None and found[4].uuid == box.gpus[1].uuid
    # A slice's figures are the catalog profile's, with the memory the driver reports.
    catalog = get_catalog()
    for device in found:
        profile = catalog.get(device.model)
        assert device.spec.tflops == profile.tflops
        assert device.spec.memory_bandwidth_gbs == profile.memory_bandwidth_gbs
        assert device.speed == pytest.approx(profile.peak_tflops("fp16") / 125)


def test_cuda_visible_devices_selects_slices() -> None:
    box = mig_box()
    a, b, c, d = (m.uuid for m in box.gpus[0].mig or [])
    h100 = [m.uuid for m in box.gpus[2].mig or []]

    def chosen(visible: str) -> list[str | None]:
        return [dev.uuid for dev in gpus(box, CUDA_VISIBLE_DEVICES=visible)]

    assert chosen(f"{c},{a}") == [c, a]
    assert chosen(c[:12]) == [c]  # a unique prefix, as for GPU UUIDs
    assert chosen("2") == h100  # a GPU in MIG mode stands for all its slices
    assert chosen(f"{h100[1]},2,{h100[1]}") == [h100[1], h100[0]]  # each slice once
    assert chosen(f"1,{b}") == [box.gpus[1].uuid, b]
    assert chosen(f"{d},0") == [d, a, b, c]
    assert [dev.id for dev in gpus(box, CUDA_VISIBLE_DEVICES=f"{d},{a}")] == ["gpu:0", "gpu:1"]


def test_a_mig_uuid_that_vanished_is_named_and_ends_the_list(
    caplog: pytest.LogCaptureFixture,
) -> None:
    box = mig_box()
    kept = (box.gpus[0].mig or [])[1].uuid
    gone = "MIG-99999999-dead-5eef-8000-000000000000"
    with caplog.at_level(logging.WARNING, logger="hetero"):
        found = gpus(box, CUDA_VISIBLE_DEVICES=f"{kept},{gone},1")
    assert [d.uuid for d in found] == [kept]  # like CUDA: stop at the first invalid entry
    assert f"MIG slice {gone!r} is on no GPU of this machine" in caplog.text
    assert "re-created under a new UUID" in caplog.text and kept in caplog.text


def test_a_reader_of_whole_gpus_says_it_skips_a_mig_entry(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listed = [(0, "GPU-a", ""), (1, "GPU-b", "")]
    with caplog.at_level(logging.WARNING, logger="hetero"):
        assert visible_gpu_indices("1,MIG-abc,0", listed) == [1]
    assert "'MIG-abc' is a MIG slice, and only whole GPUs are listed here" in caplog.text


def test_a_gpu_in_mig_mode_without_slices_runs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    box = mixed_box()
    box.gpus[0].mig = []
    with caplog.at_level(logging.WARNING, logger="hetero"):
        found = gpus(box)
    assert [d.model for d in found] == ["A100-80GB", "V100-32GB", "V100-32GB"]
    assert "GPU 0 is in MIG mode without MIG slices" in caplog.text


def test_a_slice_of_a_gpu_without_a_layout_gets_its_share_from_nvml() -> None:
    # The catalog has the H100 PCIe card but not its MIG layout: NVML's figures decide.
    gpu = FakeGPU(
        name="NVIDIA H100 PCIe",
        memory_total=80 * GIB,
        uuid="GPU-pcie",
        mig=mig_slices(H100, ["3g.40gb"], 0),
    )
    (device,) = gpus(FakeNVML([gpu]))
    parent = get_catalog().get("H100-PCIe-80GB")
    assert device.model == "H100-PCIe-80GB/3g.40gb" and device.parent == "GPU-pcie"
    # 3 of the 7 GPU slices NVML says the GPU divides into; 40448 MiB of its 80 GiB.
    assert device.spec.peak_tflops("bf16") == pytest.approx(756 * 3 / 7, abs=0.01)
    share = 40448 * MIB / (80 * GIB)
    assert device.spec.memory_bandwidth_gbs == pytest.approx(2000 * share, abs=0.1)
    # It keeps more of the GPU's memory (0.49) than of its compute slices (3/7) from the others.
    assert device.spec.price_per_hour == pytest.approx(
        (parent.price_per_hour or 0) * share, abs=0.001
    )


def test_a_driver_that_names_no_profile_gets_one_from_the_slice_figures() -> None:
    box = FakeNVML([FakeGPU(name=A100, memory_total=80 * GIB, uuid="GPU-x", mig=[])])
    (slice_,) = mig_slices(A100, ["2g.20gb"], 0)
    box.gpus[0].mig = [slice_]
    box.unsupported = {"nvmlDeviceGetName"}  # neither the GPU's name nor the slice's
    (device,) = gpus(box)
    assert device.model == "GPU/2g.20gb"  # the generic GPU, 2 slices, 19968 MiB
    assert device.memory_bytes == 19968 * MIB


def test_measured_share_prefers_sms_then_slices() -> None:
    layout = get_catalog().mig_layout("A100-80GB")
    share = measured_share(
        layout, "3g.40gb", sms=42, gpu_slices=3, max_slices=7, memory_bytes=1, parent_memory=2
    )
    assert (share.compute, share.memory, share.occupied) == pytest.approx((42 / 108, 0.5, 0.5))
    # A compute instance (1c) of a 3-slice GPU instance: its own SMs, the instance's memory.
    ci = measured_share(
        layout, "1c.3g.40gb", sms=14, gpu_slices=3, max_slices=7, memory_bytes=1, parent_memory=2
    )
    assert (ci.compute, ci.memory) == pytest.approx((14 / 108, 0.5))
    bare = measured_share(
        None, "2g.20gb", sms=0, gpu_slices=2, max_slices=7, memory_bytes=1, parent_memory=4
    )
    assert (bare.compute, bare.memory, bare.occupied) == pytest.approx((2 / 7, 0.25, 2 / 7))


def test_the_fake_answers_the_mig_calls_pynvml_has() -> None:
    box = mig_box()
    box.nvmlInit()
    gpu = box.nvmlDeviceGetHandleByIndex(0)
    assert box.nvmlDeviceGetMigMode(gpu) == [1, 1]
    assert box.nvmlDeviceGetMigMode(box.nvmlDeviceGetHandleByIndex(1)) == [0, 0]
    assert box.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    mig = box.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert box.nvmlDeviceIsMigDeviceHandle(mig) and not box.nvmlDeviceIsMigDeviceHandle(gpu)
    assert box.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig) is gpu
    assert box.nvmlDeviceGetName(mig) == f"{A100} MIG 3g.40gb"
    attrs = box.nvmlDeviceGetAttributes(mig)
    slices, sms, memory_mb = MIG_PROFILES[A100]["3g.40gb"]
    assert (attrs.gpuInstanceSliceCount, attrs.multiprocessorCount) == (slices, sms)
    assert attrs.memorySizeMB == memory_mb == box.nvmlDeviceGetMemoryInfo(mig).total // MIB
    with pytest.raises(box.NVMLError, match="Not Found"):
        box.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 4)
    with pytest.raises(box.NVMLError, match="Not Supported"):
        box.nvmlDeviceGetAttributes(gpu)  # for MIG devices only
    with pytest.raises(box.NVMLError, match="Not Supported"):
        box.nvmlDeviceGetUtilizationRates(mig)  # for whole GPUs only


# --- fleets: real slices by UUID, emulated slices by profile -------------------------------------


def real_fleet(entries: list[dict[str, Any]]) -> list[Device]:
    discovered = get_device_list(nvml=mig_box(), environ={})
    return build_fleet(parse_config({"devices": entries}), discovered=discovered)


def test_a_fleet_names_a_real_slice_by_its_uuid() -> None:
    box = mig_box()
    wanted = (box.gpus[2].mig or [])[1].uuid
    (device,) = real_fleet([{"type": "gpu", "id": wanted, "name": "h100-half"}])
    assert (device.id, device.model, device.uuid) == ("h100-half", "H100-SXM-80GB/3g.40gb", wanted)


def test_a_fleet_naming_a_vanished_slice_or_a_mig_gpu_says_why() -> None:
    gone = "MIG-99999999-dead-5eef-8000-000000000000"
    with pytest.raises(DeviceError) as err:
        real_fleet([{"type": "gpu", "id": gone}])
    text = str(err.value)
    assert f"devices[0].id: no MIG slice {gone} on this machine" in text
    assert "re-created under a new UUID" in text and "A100-80GB/3g.40gb, MIG-" in text
    parent = mig_box().gpus[0].uuid
    with pytest.raises(DeviceError, match=f"GPU {parent} is in MIG mode, so its slices are"):
        real_fleet([{"type": "gpu", "id": parent}])


def test_a_fleet_config_takes_a_profile_as_its_model() -> None:
    config = parse_config(
        {"devices": [{"type": "gpu", "emulate": True, "model": "a100-80gb/3g.40gb", "count": 2}]}
    )
    fleet = build_fleet(config)
    assert [d.model for d in fleet] == ["A100-80GB/3g.40gb"] * 2
    assert fleet[0].speed == pytest.approx(312 * 42 / 108 / 125, abs=0.001)
    with pytest.raises(ConfigError, match=r"devices\[0\]\.model: A100-80GB has no MIG profile"):
        parse_config({"devices": [{"type": "gpu", "emulate": True, "model": "A100-80GB/9g"}]})


def test_hetero_fit_takes_a_profile_as_its_device() -> None:
    app = typer.Typer()
    register_fit(app)

    @app.callback()
    def _root() -> None:
        """A group, so the command is invoked by name as under `hetero`."""

    runner = CliRunner()
    result = runner.invoke(
        app,
        ["fit", "llama-3-8b", "--device", "A100-80GB/3g.40gb", "--seq", "2048", "--batch", "1"],
        env={"COLUMNS": "160"},
    )
    assert result.exit_code == 0, result.output
    assert "on A100-80GB/3g.40gb" in result.stdout and "39.25 GiB" in result.stdout
    bad = runner.invoke(app, ["fit", "llama-3-8b", "--device", "A100-80GB/3g.41gb"])
    assert bad.exit_code != 0 and "allowed: 1g.10gb, 1g.20gb" in bad.stderr


# --- the collective rule and the worker's environment -------------------------------------------


def test_shared_parents_names_each_gpu_that_several_devices_live_on() -> None:
    found = gpus()
    box = mig_box()
    assert shared_parents(found) == {
        box.gpus[0].uuid: ["gpu:0", "gpu:1", "gpu:2", "gpu:3"],
        box.gpus[2].uuid: ["gpu:5", "gpu:6"],
    }
    # One slice of each GPU, and the whole GPU: a group a collective may span.
    assert shared_parents([found[i] for i in (0, 4, 5, 7)]) == {}
    # A whole GPU listed with a slice of itself shares it too.
    whole = Device(id="whole", spec=found[4].spec, uuid=box.gpus[0].uuid)
    assert shared_parents([whole, found[2]]) == {box.gpus[0].uuid: ["whole", "gpu:2"]}
    emulated = [Device(id=f"e{i}", spec=found[0].spec, emulated=True) for i in range(2)]
    assert shared_parents(emulated) == {}


def visible() -> tuple[str | None, str | None]:
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("HIP_VISIBLE_DEVICES")


def test_a_slice_worker_sees_only_its_slice() -> None:
    slice_ = gpus()[6]
    assert slice_.uuid is not None and slice_.uuid.startswith("MIG-")
    with hetero.Context(devices=[slice_]) as ctx:
        seen = ctx.run(hetero.task(devices=[slice_.id])(visible))
    assert seen[0] == slice_.uuid


def test_the_monitor_finds_a_slice_by_its_uuid() -> None:
    from hetero.runtime.device_probe import sample_device

    box = mig_box()
    slice_ = gpus(box)[1]
    (box.gpus[0].mig or [])[1].memory_used = 3 * GIB
    sample = sample_device(slice_, nvml=box)
    assert sample.healthy  # found, though NVML lists it under its GPU
    assert (sample.memory_used, sample.memory_total) == (3 * GIB, 19968 * MIB)
    assert sample.utilization is None  # a slice reports no utilization of its own
