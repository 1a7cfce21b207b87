"""Learned and prior speeds in one unit, work units per second of the device's own time, what
``hetero top`` and ``Context.status()`` show: at ``time_scale`` 0.1 an emulated device that runs
at its prior speed shows about its prior as its learned speed, on a fleet of emulated devices
and on one beside a real device (whose priors the engine does not scale)."""

from __future__ import annotations

import pytest

import hetero
from hetero.config import parse_config
from hetero.devices.fleet import build_fleet
from hetero.devices.spec import Device
from hetero.runtime.status import own_time_speeds
from hetero.testing import emulated_fleet

TIME_SCALE = 0.1


@hetero.task(cost=0.5, devices=["d0"])
def unit_of_work() -> None:
    """Half a work unit, on the speed-1 device d0: 0.05 s there at time_scale 0.1."""


def _with_real_cpu() -> list[Device]:
    return [*emulated_fleet([1.0]), *build_fleet(parse_config({"devices": [{"type": "cpu"}]}))]


def _run(ctx: hetero.Context) -> None:
    for future in [ctx.submit(unit_of_work) for _ in range(20)]:
        future.result(timeout=60)


def test_the_conversion() -> None:
    # An emulated device measured by the wall clock, a prior in the engine's unit rate.
    assert own_time_speeds(10.0, 10.0, emulated=True, time_scale=0.1, unit_rate=10.0) == (
        pytest.approx(1.0),
        pytest.approx(1.0),
    )
    assert own_time_speeds(10.0, 1.0, emulated=True, time_scale=0.1, unit_rate=1.0) == (
        pytest.approx(1.0),
        1.0,
    )
    # A real device runs in its own time; nothing learned yet stays None.
    assert own_time_speeds(0.5, 0.4, emulated=False, time_scale=0.1, unit_rate=1.0) == (0.5, 0.4)
    assert own_time_speeds(None, 2.5, emulated=True, time_scale=0.1, unit_rate=10.0) == (
        None,
        pytest.approx(0.25),
    )
    with pytest.raises(ValueError, match="must be > 0"):
        own_time_speeds(1.0, 1.0, emulated=True, time_scale=0.0, unit_rate=1.0)


@pytest.mark.parametrize("fleet", [lambda: emulated_fleet([1.0, 2.5]), _with_real_cpu])
def test_learned_and_prior_agree_for_a_device_at_its_prior_speed(fleet: object) -> None:
    with hetero.Context(devices=fleet(), time_scale=TIME_SCALE) as ctx:  # type: ignore[operator]
        _run(ctx)
        perf = ctx.dispatcher.perf
        device = ctx.devices[0]
        learned, prior = own_time_speeds(
            float(perf.speed()[0]),
            perf.prior(device, "default"),
            emulated=device.emulated,
            time_scale=ctx.time_scale,
            unit_rate=perf.unit_rate,
        )
    assert prior == pytest.approx(1.0)  # a V100's work unit per second
    assert learned is not None and prior / 1.5 < learned < prior * 1.5


def test_context_status_shows_both_in_the_devices_own_time() -> None:
    with hetero.Context(devices=_with_real_cpu(), time_scale=TIME_SCALE) as ctx:
        _run(ctx)
        (shown, _) = ctx.status()["devices"]
    assert shown["done"] == 20 and shown["speed"] is not None
    assert shown["prior_speed"] == pytest.approx(1.0)
    assert shown["prior_speed"] / 1.5 < shown["speed"] < shown["prior_speed"] * 1.5
