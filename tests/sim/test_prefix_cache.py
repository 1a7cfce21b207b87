"""The simulator's prefix cache: each device's true KV cache, which spares a prompt's prefill."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hetero.cli import app
from hetero.sched import Policy, WorkItem
from hetero.sched.prefix import Prefix
from hetero.sched.registry import make_policy
from hetero.sim.engine import Simulator
from hetero.sim.result import SimResult
from hetero.sim.run import devices_from_names, expected_duration, simulate
from hetero.sim.workload import generate, parse_workload
from tests.fleets import make_devices

Row = tuple[float, float, tuple[int, ...]]  # arrival time, cost, prompt blocks


def prompts(*rows: Row, block_work: float = 2.0) -> Iterator[tuple[float, WorkItem]]:
    for i, (t, cost, blocks) in enumerate(rows):
        yield t, WorkItem(cost=cost, id=i, prefix=Prefix(blocks, block_work))


def run(
    rows: Sequence[Row],
    cache_blocks: int | Sequence[int] | None = 100,
    policy: str = "shortest_expected_delay",
    speeds: Sequence[float] = (1.0,),
    **kwargs: Any,
) -> tuple[SimResult, list[tuple[float, str, int | str, str]]]:
    sim = Simulator(make_devices(speeds), make_policy(policy), cache_blocks=cache_blocks)
    log: list[tuple[float, str, int | str, str]] = []
    return sim.run(prompts(*rows), log=log, **kwargs), log


def finished(log: list[tuple[float, str, int | str, str]]) -> list[tuple[float, int | str]]:
    return [(t, item) for t, what, item, _ in log if what == "done"]


def test_a_cached_prefix_spares_exactly_its_prefill() -> None:
    result, log = run(
        [
            (0.0, 10.0, (1, 2, 3)),  # nothing cached: 10 s
            (20.0, 10.0, (1, 2, 3)),  # all 3 blocks cached: 10 - 3 × 2 = 4 s
            (30.0, 10.0, (1, 2, 7)),  # the first 2: 10 - 2 × 2 = 6 s
            (40.0, 3.0, (1, 2, 3)),  # 6 cached, but never more than its cost: 0 s
            (50.0, 10.0, (9, 1, 2)),  # a different first block: nothing matches
        ]
    )
    assert finished(log) == [(10.0, 0), (24.0, 1), (36.0, 2), (40.0, 3), (60.0, 4)]
    assert result.prefix_lookups is not None and result.prefix_hits is not None
    assert result.prefix_lookups.tolist() == [15]
    assert result.prefix_hits.tolist() == [0 + 3 + 2 + 3 + 0]
    assert result.prefix_hit_rate == pytest.approx(8 / 15)
    assert result.summary()["prefix_hit_rate"] == result.prefix_hit_rate


def test_each_device_has_its_own_cache() -> None:
    rows = [(0.0, 10.0, (1, 2)), (0.0, 10.0, (1, 2)), (20.0, 10.0, (1, 2))]
    result, log = run(rows, policy="round_robin", speeds=(1.0, 1.0), cache_blocks=[100, 0])
    runs = [(item, device) for _, what, item, device in log if what == "run"]
    assert runs == [(0, "d0"), (1, "d1"), (2, "d0")]
    assert finished(log) == [(10.0, 0), (10.0, 1), (26.0, 2)]  # d1 met the prompt too, d0 had it
    assert result.prefix_hits is not None and result.prefix_hits.tolist() == [2, 0]


def test_the_least_recently_used_blocks_go_at_capacity() -> None:
    a, b, c = (1, 2), (3, 4), (5, 6)
    result, log = run(
        [
            (0.0, 10.0, a),
            (10.0, 10.0, b),
            (20.0, 10.0, a),  # hit: a is now the most recently used
            (30.0, 10.0, c),  # 4 blocks fit: b goes, not a (it came in first)
            (40.0, 10.0, a),  # hit
            (50.0, 10.0, b),  # miss
        ],
        cache_blocks=4,
    )
    assert finished(log) == [(10.0, 0), (20.0, 1), (26.0, 2), (40.0, 3), (46.0, 4), (60.0, 5)]
    assert result.prefix_hit_rate == pytest.approx(4 / 12)


def test_a_device_that_fails_loses_its_cache() -> None:
    rows = [(0.0, 10.0, (1, 2)), (20.0, 10.0, (1, 2))]
    _, log = run(rows, failures=[("d0", 15.0, 16.0)])
    assert finished(log) == [(10.0, 0), (30.0, 1)]


def test_without_a_cache_every_item_runs_for_its_cost() -> None:
    result, log = run([(0.0, 10.0, (1, 2)), (20.0, 10.0, (1, 2))], cache_blocks=None)
    assert finished(log) == [(10.0, 0), (30.0, 1)]
    assert result.prefix_hit_rate is None and result.prefix_hits is None
    assert result.summary()["prefix_hit_rate"] is None
    # A cache with no prompt to look up has no hit rate either, but counts its devices.
    sim = Simulator(make_devices([1.0, 1.0]), make_policy("round_robin"), cache_blocks=8)
    plain = sim.run(iter([(0.0, WorkItem(cost=1.0, id=0))]))
    assert plain.prefix_hit_rate is None
    assert plain.prefix_lookups is not None and plain.prefix_lookups.tolist() == [0, 0]


@pytest.mark.parametrize(
    ("cache_blocks", "message"), [([4], "1 capacities for 2 devices"), (-1, "blocks >= 0")]
)
def test_bad_cache_capacities_are_refused(cache_blocks: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Simulator(make_devices([1.0, 1.0]), make_policy("round_robin"), cache_blocks=cache_blocks)


def chat_hit_rate(policy: Policy, seed: int) -> float:
    workload = parse_workload(
        {
            "requests": 2000,
            "arrivals": {"process": "poisson", "load": 0.8},
            "size": {"dist": "lognormal", "mean": 100},
            "prompts": {"kind": "chat", "systems": 20, "sessions": 50},
            "seed": seed,
        }
    )
    sim = Simulator(devices_from_names("A100-80GB:2,V100-32GB:2"), policy, cache_blocks=256)
    result = sim.run(
        generate(workload, sim.capacity),
        expected_duration=expected_duration(workload, sim.capacity),
    )
    assert result.completed == 2000
    assert result.prefix_hit_rate is not None
    return result.prefix_hit_rate


@pytest.mark.parametrize("seed", [1, 2])
def test_prefix_affinity_hits_the_cache_more_than_shortest_expected_delay(seed: int) -> None:
    affinity = chat_hit_rate(make_policy("prefix_affinity", {"capacity_blocks": 256}), seed)
    delay = chat_hit_rate(make_policy("shortest_expected_delay"), seed)
    assert affinity > delay + 0.05, (affinity, delay)


def test_simulate_models_a_cache_for_workloads_with_prompts() -> None:
    fleet = devices_from_names("A100-80GB,T4")
    fields = {"requests": 300, "arrivals": {"process": "poisson", "load": 0.5}, "seed": 1}
    chat = parse_workload({**fields, "prompts": {"kind": "hot", "systems": 1}})
    (cached,) = simulate(fleet, chat, ["prefix_affinity"])
    assert cached.prefix_hit_rate is not None and cached.prefix_hit_rate > 0.5
    (none,) = simulate(fleet, chat, ["prefix_affinity"], cache_blocks=0)
    assert none.prefix_hit_rate == 0.0
    assert none.metrics.elapsed > cached.metrics.elapsed
    (plain,) = simulate(fleet, parse_workload(fields), ["prefix_affinity"])
    assert plain.prefix_hit_rate is None


def test_hetero_simulate_reads_prompts_and_cache_blocks(tmp_path: Path) -> None:
    workload = tmp_path / "chat.yaml"
    workload.write_text(
        "requests: 300\narrivals: {process: poisson, load: 0.7}\n"
        "prompts: {kind: chat, systems: 4}\n"
    )
    args = ["simulate", "--fleet", "A100-80GB,T4", "-w", str(workload), "--no-progress"]
    args += ["--policies", "prefix_affinity,round_robin", "--cache-blocks", "512"]
    table = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "cache hits" in table.output
    rows = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert all(0 < row["prefix_hit_rate"] < 1 for row in rows)


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["chat", "single", "hot"]),
    policy=st.sampled_from(["prefix_affinity", "shortest_expected_delay", "round_robin"]),
    speeds=st.lists(st.sampled_from([0.5, 1.0, 2.5]), min_size=1, max_size=4),
    cache=st.integers(0, 64),
    slots=st.integers(1, 3),
    timeout=st.one_of(st.none(), st.floats(5.0, 200.0)),
    seed=st.integers(0, 2**16),
)
def test_nothing_is_lost_and_hits_never_exceed_lookups(
    kind: str,
    policy: str,
    speeds: list[float],
    cache: int,
    slots: int,
    timeout: float | None,
    seed: int,
) -> None:
    workload = parse_workload(
        {
            "requests": 150,
            "arrivals": {"process": "bursty", "load": 0.9},
            "size": {"dist": "lognormal", "mean": 2},
            "prompts": {"kind": kind, "block_work": 1},
            "seed": seed,
        }
    )
    options: dict[str, Any] = {"max_queue_size": 60, "timeout": timeout}
    sim = Simulator(
        make_devices(speeds),
        make_policy(policy),
        slots=[slots] * len(speeds),
        dispatcher_options=options,
        cache_blocks=cache,
    )
    failures = [("d0", 10.0, 30.0)] if len(speeds) > 1 else []
    result = sim.run(generate(workload, sim.capacity), failures=failures)
    assert result.completed + result.failed + result.rejected == result.submitted == 150
    assert result.prefix_hits is not None and result.prefix_lookups is not None
    assert (result.prefix_hits <= result.prefix_lookups).all()
    assert result.prefix_hit_rate is not None and 0.0 <= result.prefix_hit_rate <= 1.0
