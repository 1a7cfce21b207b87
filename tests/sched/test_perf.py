from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetero import get_catalog
from hetero.devices.spec import Device
from hetero.sched import PerfModel
from tests.fleets import make_devices


def catalog_devices(*models: str) -> list[Device]:
    return [
        Device(id=f"{m}:{i}", spec=get_catalog().get(m), emulated=True)
        for i, m in enumerate(models)
    ]


def test_prior_from_catalog_tflops_and_bandwidth() -> None:
    devices = catalog_devices("A100-80GB", "V100-32GB", "T4")
    perf = PerfModel(devices, dtype="fp16", memory_bound_kinds={"decode"})
    np.testing.assert_allclose(perf.speed("prefill"), [312 / 125, 1.0, 65 / 125])
    spec = [d.spec.memory_bandwidth_gbs / 900 for d in devices]
    np.testing.assert_allclose(perf.speed("decode"), spec)
    np.testing.assert_allclose(perf.speed("decode:generate"), spec)  # one task's own row
    fp32 = PerfModel(devices, dtype="fp32").speed()
    assert fp32[0] == pytest.approx(19.5 / 125)


def test_explicit_speed_wins_and_unit_rate_scales() -> None:
    perf = PerfModel(make_devices([2.5, 1.0]), unit_rate=100.0)
    np.testing.assert_allclose(perf.speed(), [250.0, 100.0])
    assert perf.expected_seconds(0, 500.0) == pytest.approx(2.0)


def test_ewma_correction_and_inverse_speed() -> None:
    perf = PerfModel(make_devices([2.0, 1.0]), alpha=0.5)
    perf.observe(0, "default", work=1.0, seconds=1.0)  # observed 1.0 against a prior of 2.0
    assert perf.speed()[0] == pytest.approx(1.0)  # the first measurement, as it is
    assert perf.inv_speed()[0] == pytest.approx(1.0)
    perf.observe(0, "default", work=1.0, seconds=0.5)  # then an EWMA: halfway to 2.0
    assert perf.speed()[0] == pytest.approx(1.5)
    assert perf.inv_speed()[0] == pytest.approx(1 / 1.5)
    perf.observe(1, "default", work=1.0, seconds=0.25, concurrency=2)  # 8 units/s
    assert perf.speed()[1] == pytest.approx(8.0)
    perf.observe(1, "default", work=1.0, seconds=0.0)  # ignored
    assert perf.speed()[1] == pytest.approx(8.0)
    perf.observe(1, "default", work=1.0, seconds=5e-324)  # a speed that overflows: ignored too
    assert perf.speed()[1] == pytest.approx(8.0)
    perf.observe(1, "default", work=5e-324, seconds=1.0)  # one whose inverse overflows, too
    assert perf.speed()[1] == pytest.approx(8.0)


def test_devices_not_yet_measured_keep_their_catalog_ratio_to_those_measured() -> None:
    """The catalog knows ratios, not what a work unit costs: a measured device sets the unit
    for every device that has not finished anything yet."""
    perf = PerfModel(make_devices([8.0, 2.0, 1.0]))
    perf.observe(0, "default", work=1.0, seconds=0.01)  # 100 units/s, against a prior of 8
    np.testing.assert_allclose(perf.speed(), [100.0, 25.0, 12.5])
    np.testing.assert_allclose(perf.inv_speed(), [0.01, 0.04, 0.08])
    assert perf.fastest_inv() == pytest.approx(0.01)
    perf.observe(1, "default", work=1.0, seconds=1 / 50)  # 2x its share: the unit is the mean
    np.testing.assert_allclose(perf.speed(), [100.0, 50.0, 1.0 * (12.5 * 25.0) ** 0.5])
    other = perf.speed("other")  # another kind learns its own unit
    np.testing.assert_allclose(other, [8.0, 2.0, 1.0])
    perf.add(make_devices([4.0])[0])  # a device that joins later starts in the learned unit
    assert perf.speed()[3] == pytest.approx(4.0 * (12.5 * 25.0) ** 0.5)
    assert perf.speed("other")[3] == pytest.approx(4.0)


def test_a_device_measured_first_after_others_starts_from_its_measurement() -> None:
    perf = PerfModel(make_devices([8.0, 1.0]))
    for _ in range(20):
        perf.observe(0, "default", work=1.0, seconds=0.01)
    assert perf.speed()[1] == pytest.approx(12.5)  # 100 / 8: the unit the fast one measured
    perf.observe(1, "default", work=1.0, seconds=0.05)  # the slow one turns out 20 units/s
    assert perf.speed()[1] == pytest.approx(20.0)
    assert perf.speed()[0] == pytest.approx(100.0)  # a measured device keeps its own


def test_fastest_inverse_speed_follows_learning_and_health() -> None:
    perf = PerfModel(make_devices([2.0, 1.0]), alpha=1.0)
    assert perf.fastest_inv() == pytest.approx(0.5)
    perf.observe(0, "default", work=2.0, seconds=1.0)  # d0 runs at its catalog speed
    perf.observe(1, "default", work=4.0, seconds=1.0)  # d1 turns out to do 4 units/s
    assert perf.fastest_inv() == pytest.approx(0.25)
    perf.set_usable(1, False)
    assert perf.fastest_inv() == pytest.approx(0.5)
    perf.set_usable(0, False)
    assert perf.fastest_inv() == np.inf
    perf.add(make_devices([8.0])[0])  # in the unit measured so far: 2x the catalog
    assert perf.fastest_inv() == pytest.approx(1 / 16)


def test_unusable_devices_have_infinite_inverse_speed() -> None:
    perf = PerfModel(make_devices([2.0, 1.0]))
    perf.set_usable(0, False)
    assert perf.inv_speed()[0] == np.inf
    assert perf.inv_speed("other")[0] == np.inf  # kinds created later respect it too
    perf.set_usable(0, True)
    assert perf.inv_speed()[0] == pytest.approx(0.5)


def test_bad_parameters() -> None:
    with pytest.raises(ValueError, match="alpha must be in"):
        PerfModel(make_devices([1.0]), alpha=0.0)
    with pytest.raises(ValueError, match="unit_rate must be > 0"):
        PerfModel(make_devices([1.0]), unit_rate=-1)


def test_batch_sizes_follow_speed_and_memory() -> None:
    perf = PerfModel(make_devices([2.5, 2.5, 1.0, 1.0]))
    assert perf.batch_sizes(70) == [25, 25, 10, 10]
    # Device 0 holds only 5 samples: the rest goes to the others in proportion.
    free = [5 * 100, 10**9, 10**9, 10**9]
    sizes = perf.batch_sizes(70, sample_bytes=100, free_memory=free)
    assert sizes[0] == 5 and sum(sizes) == 70 and sizes[1] > sizes[2]
    with pytest.raises(ValueError, match="does not fit"):
        perf.batch_sizes(10, sample_bytes=100, free_memory=[100, 100, 100, 100])


def test_batch_table_caps() -> None:
    devices = make_devices([2.5, 1.0])
    perf = PerfModel(devices, batch_table={"d0": 8})
    assert perf.batch_sizes(20) == [8, 12]


@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=12), st.integers(0, 5000))
def test_batch_sizes_always_sum_to_the_global_batch(speeds: list[float], batch: int) -> None:
    sizes = PerfModel(make_devices(speeds)).batch_sizes(batch)
    assert sum(sizes) == batch and min(sizes) >= 0
