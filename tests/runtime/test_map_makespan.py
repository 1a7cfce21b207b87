"""``ctx.map`` places a closed batch for its makespan: every device, the slowest included,
takes its share to the end, as the simulator does with the same fleet and items."""

from __future__ import annotations

import collections

import pytest

import hetero
from hetero.config import load_config
from hetero.devices.fleet import build_fleet
from hetero.sim import simulate
from hetero.sim.workload import WorkloadSpec

FLEET = "examples/emulated_fleet.yaml"
ITEMS = 600


@hetero.task(cost=1.0)
def where(_: int) -> str:
    return hetero.get_current_device().id


def speed_shares() -> dict[str, float]:
    devices = build_fleet(load_config(FLEET))
    total = sum(d.speed for d in devices)
    return {d.id: d.speed / total for d in devices}


@pytest.mark.parametrize("batch_size", ["auto", 1])
def test_map_keeps_every_device_busy_as_the_simulator_does(batch_size: int | str) -> None:
    shares = speed_shares()
    config = load_config(FLEET)
    (sim,) = simulate(
        build_fleet(config),
        WorkloadSpec(requests=ITEMS),
        [config.scheduler.strategy],
        scheduler=config.scheduler,
    )
    simulated = {d.id: d.completed / ITEMS for d in sim.metrics.devices}
    with hetero.Context(FLEET, time_scale=0.02) as ctx:
        ran = collections.Counter(ctx.map(where, range(ITEMS), batch_size=batch_size))
    engine = {d: ran[d] / ITEMS for d in shares}
    for device, share in shares.items():
        assert simulated[device] >= share / 2, (device, simulated)
        assert engine[device] >= share / 2, (device, engine)
        assert engine[device] == pytest.approx(simulated[device], abs=0.05), (engine, simulated)
