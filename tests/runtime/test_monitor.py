from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from hetero.devices.catalog import get_catalog
from hetero.devices.discovery import discover_cpu, get_device_list
from hetero.devices.fake_nvml import FakeNVML, mixed_box
from hetero.devices.spec import Device
from hetero.runtime.device_probe import (
    DeviceSample,
    MemoryPressure,
    Monitor,
    memory_usage,
    sample_device,
    sample_devices,
)

GIB = 1024**3


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A live process to stand for an emulated device's worker."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    yield proc
    proc.kill()
    proc.wait()


def emulated(model: str = "A100-80GB", **kw: Any) -> Device:
    return Device(id=f"{model.lower()}:0", spec=get_catalog().get(model), emulated=True, **kw)


def fake_gpus(nvml: FakeNVML) -> list[Device]:
    return get_device_list(nvml=nvml, environ={})[1:]


# --- sample_device ----------------------------------------------------------------------------


def test_cpu_sample_is_in_range() -> None:
    cpu = discover_cpu()
    sample = sample_device(cpu)
    assert sample.device_id == "cpu:0" and sample.healthy
    assert sample.utilization is not None and 0 <= sample.utilization <= 100
    assert sample.memory_total and 0 < (sample.memory_used or 0) <= sample.memory_total
    assert sample.temperature is None or 0 < sample.temperature < 150
    assert sample.rss is None and sample.errors is None


def test_cpu_memory_total_respects_the_limit() -> None:
    cpu = dataclasses.replace(discover_cpu(), memory_limit=GIB)
    assert sample_device(cpu).memory_total == GIB


def test_emulated_device_reads_its_worker(child: subprocess.Popen[bytes]) -> None:
    device = emulated(memory_limit=8 * GIB)
    first = sample_device(device, child.pid)
    assert first.healthy and first.rss and first.memory_used == first.rss
    assert first.memory_total == 8 * GIB  # the limit, not the A100's 80 GiB
    assert first.utilization is None  # psutil needs a first look to measure from
    second = sample_device(device, child.pid)
    assert second.utilization is not None and 0 <= second.utilization <= 100
    assert second.temperature is None and second.errors is None


def test_emulated_device_without_worker_reports_its_memory_only() -> None:
    sample = sample_device(emulated())
    assert sample.healthy and sample.memory_total == 80 * GIB
    assert (sample.utilization, sample.memory_used, sample.rss) == (None, None, None)


def test_dead_worker_is_unhealthy(child: subprocess.Popen[bytes]) -> None:
    device = emulated()
    assert sample_device(device, child.pid).healthy
    child.kill()
    # Wait for it to exit but leave it unreaped: a zombie is a dead worker too.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    zombie = sample_device(device, child.pid)
    assert not zombie.healthy and zombie.rss is None and zombie.utilization is None
    child.wait()
    assert not sample_device(device, child.pid).healthy


def test_gpu_sample_from_nvml() -> None:
    box = mixed_box()
    v100 = fake_gpus(box)[3]
    sample = sample_device(v100, nvml=box)
    assert sample.device_id == "gpu:3" and sample.healthy
    assert sample.utilization == 30 and sample.temperature == 43
    assert (sample.memory_used, sample.memory_total) == (4 * GIB, 32 * GIB)
    assert sample.errors is None  # the fake has no ECC counters: unsupported, not an error
    limited = dataclasses.replace(v100, memory_limit=16 * GIB)
    assert sample_device(limited, nvml=box).memory_total == 16 * GIB


def test_gpu_matched_by_uuid_whatever_the_order() -> None:
    box = mixed_box()
    gpus = fake_gpus(box)
    samples = sample_devices([(g, None) for g in reversed(gpus)], nvml=box)
    assert [s.device_id for s in samples] == ["gpu:3", "gpu:2", "gpu:1", "gpu:0"]
    assert [s.memory_used for s in samples] == [4 * GIB, 3 * GIB, 2 * GIB, GIB]


def test_gpu_without_uuid_matched_by_cuda_index(monkeypatch: pytest.MonkeyPatch) -> None:
    box = mixed_box()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    bare = dataclasses.replace(fake_gpus(box)[0], uuid=None, pci_bus_id=None, local_index=1)
    assert sample_device(bare, nvml=box).memory_used == GIB  # CUDA 1 is NVML 0


def test_failing_nvml_queries_leave_fields_empty() -> None:
    box = mixed_box()
    gpu = fake_gpus(box)[0]
    box.unsupported = {
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetTemperature",
    }
    sample = sample_device(gpu, nvml=box)
    assert sample.healthy
    assert (sample.utilization, sample.memory_used, sample.memory_total) == (None, None, None)
    assert sample.temperature is None
    box.fail_init = True
    assert sample_device(gpu, nvml=box).utilization is None


def test_gpu_gone_from_nvml_is_unhealthy() -> None:
    box = mixed_box()
    gpu = fake_gpus(box)[3]
    box.gpus.pop()
    assert not sample_device(gpu, nvml=box).healthy


class EccNVML(FakeNVML):
    """The fake with the ECC counter query and the constants pynvml defines for it."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0

    def __init__(self, errors: int) -> None:
        super().__init__(mixed_box().gpus)
        self.errors = errors

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors")
        assert (error_type, counter) == (1, 0)
        return self.errors


def test_uncorrected_ecc_errors_make_a_gpu_unhealthy() -> None:
    clean, broken = EccNVML(0), EccNVML(2)
    gpu = fake_gpus(clean)[0]
    assert sample_device(gpu, nvml=clean).errors == 0
    assert sample_device(gpu, nvml=clean).healthy
    sample = sample_device(gpu, nvml=broken)
    assert sample.errors == 2 and not sample.healthy


def test_memory_usage(child: subprocess.Popen[bytes]) -> None:
    box = mixed_box()
    gpu = fake_gpus(box)[0]
    worker, idle = emulated(memory_limit=8 * GIB), emulated("V100-32GB")
    usage = memory_usage([gpu, worker, idle], {worker.id: child.pid}, nvml=box)
    assert usage["gpu:0"] == {"used": GIB, "free": 79 * GIB, "total": 80 * GIB}
    assert usage[worker.id]["total"] == 8 * GIB and 0 < usage[worker.id]["used"] < 8 * GIB
    assert usage[worker.id]["used"] + usage[worker.id]["free"] == 8 * GIB
    assert usage[idle.id] == {"used": 0, "free": 32 * GIB, "total": 32 * GIB}


# --- Monitor ----------------------------------------------------------------------------------


class Rounds:
    """An ``on_sample`` callback that records rounds and signals when ``want`` have come."""

    def __init__(self, want: int, fail_first: bool = False) -> None:
        self.rounds: list[list[DeviceSample]] = []
        self.want = want
        self.fail_first = fail_first
        self.enough = threading.Event()

    def __call__(self, samples: list[DeviceSample]) -> None:
        self.rounds.append(samples)
        if len(self.rounds) >= self.want:
            self.enough.set()
        if self.fail_first and len(self.rounds) == 1:
            raise RuntimeError("callback broke")


def test_monitor_calls_back_every_interval() -> None:
    box = mixed_box()
    gpus = fake_gpus(box)
    rounds = Rounds(want=2)
    monitor = Monitor(lambda: [(g, None) for g in gpus], rounds, interval=0.01, nvml=box)
    monitor.start()
    try:
        assert rounds.enough.wait(10)
    finally:
        monitor.stop(timeout=10)
    assert not monitor.running
    assert all([s.device_id for s in r] == [g.id for g in gpus] for r in rounds.rounds)
    assert rounds.rounds[0][1].memory_used == 2 * GIB


def test_monitor_stops_without_waiting_out_its_interval() -> None:
    rounds = Rounds(want=1)
    monitor = Monitor(lambda: [(emulated(), None)], rounds, interval=3600)
    monitor.start()
    assert rounds.enough.wait(10)
    monitor.stop(timeout=10)  # a sleeping thread would still be alive after this
    assert not monitor.running and len(rounds.rounds) == 1


def test_monitor_survives_a_failing_callback(caplog: pytest.LogCaptureFixture) -> None:
    rounds = Rounds(want=2, fail_first=True)
    monitor = Monitor(lambda: [(emulated(), None)], rounds, interval=0.01)
    with caplog.at_level(logging.ERROR, logger="hetero.monitor"):
        monitor.start()
        try:
            assert rounds.enough.wait(10)
        finally:
            monitor.stop(timeout=10)
    failed = [r for r in caplog.records if r.name == "hetero.monitor"]
    assert failed and failed[0].exc_info and "callback broke" in str(failed[0].exc_info[1])


def test_monitor_refuses_a_bad_interval_and_a_second_start() -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="interval must be a positive number"):
            Monitor(list, print, interval=bad)
    monitor = Monitor(list, Rounds(want=1), interval=3600)
    monitor.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            monitor.start()
    finally:
        monitor.stop(timeout=10)


# --- rules ------------------------------------------------------------------------------------


def test_rule_parameters_are_checked() -> None:
    for threshold in (0, 1.01):
        with pytest.raises(ValueError, match="threshold"):
            MemoryPressure(threshold)


def test_memory_pressure_above_the_threshold() -> None:
    rule = MemoryPressure()
    assert rule.is_high(96, 100) and not rule.is_high(95, 100)
    assert not rule.is_high(None, 100) and not rule.is_high(10, None) and not rule.is_high(1, 0)
    assert MemoryPressure(0.5).is_high(51, 100)

    def sample(device_id: str, used: int | None, total: int | None) -> DeviceSample:
        return DeviceSample(device_id, 0.0, None, used, total, None, None, None, True)

    samples = [sample("a", 99, 100), sample("b", 50, 100), sample("c", None, 100)]
    assert rule.pressured_devices(samples) == ["a"]
