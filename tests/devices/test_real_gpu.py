"""Discovery and topology on real NVIDIA GPUs through the real NVML (skipped without one)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from hetero.devices.catalog import get_catalog
from hetero.devices.discovery import get_device_list
from hetero.devices.spec import DeviceKind
from hetero.devices.topology import LinkKind
from hetero.devices.topology_nvml import read_topology


def _nvml_gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library or no driver: no GPU to test
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(_nvml_gpu_count() == 0, reason="needs an NVIDIA GPU and its driver"),
]


def _nvidia_smi(query: str) -> list[str]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def test_every_gpu_is_found_with_its_catalog_row_and_memory() -> None:
    gpus = [d for d in get_device_list() if d.kind is DeviceKind.GPU]
    rows = [line.split(", ") for line in _nvidia_smi("name,memory.total,uuid")]
    assert len(gpus) == len(rows)
    for gpu, (name, total_mib, uuid) in zip(gpus, rows, strict=True):
        # The driver's name resolves to a real catalog row, not the generic fallback.
        assert gpu.spec == get_catalog().resolve(name)
        assert gpu.spec.model in get_catalog().names
        assert gpu.state.memory_total == int(total_mib) * 1024**2
        assert gpu.uuid == uuid
        assert 0 < gpu.state.memory_used < gpu.state.memory_total


def test_cuda_visible_devices_hides_and_reorders_real_gpus() -> None:
    assert [
        d
        for d in get_device_list(environ={"CUDA_VISIBLE_DEVICES": ""})
        if d.kind is not DeviceKind.CPU
    ] == []
    uuid = _nvidia_smi("uuid")[-1]
    found = [
        d
        for d in get_device_list(environ={"CUDA_VISIBLE_DEVICES": uuid[:12]})
        if d.kind is DeviceKind.GPU
    ]
    assert [(d.id, d.uuid) for d in found] == [("gpu:0", uuid)]


def test_hetero_devices_json_in_a_real_process() -> None:
    import json

    proc = subprocess.run(
        [sys.executable, "-m", "hetero", "devices", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    listed: list[dict[str, Any]] = json.loads(proc.stdout)
    assert sum(d["kind"] == "gpu" for d in listed) == _nvml_gpu_count()


def test_real_topology_is_symmetric_and_complete() -> None:
    topo = read_topology(environ={})
    n = _nvml_gpu_count()
    assert len(topo) == n
    bw = topo.bandwidth
    assert (bw == bw.T).all() and (np.diag(bw) == 0).all()
    assert all(topo.links[i][i].kind is LinkKind.SELF for i in range(n))
    assert all(bw[i, j] > 0 for i in range(n) for j in range(n) if i != j)
    assert topo.best_group(n).ids == tuple(topo.ids)
