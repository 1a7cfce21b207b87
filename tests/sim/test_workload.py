from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sim.workload import (
    BurstyArrivals,
    ClosedArrivals,
    LognormalSize,
    PoissonArrivals,
    TraceSize,
    WorkloadSpec,
    arrival_rate,
    generate,
    load_workload,
    mean_size,
    parse_workload,
)


def spec(**fields: Any) -> WorkloadSpec:
    return parse_workload(fields)


def arrays(s: WorkloadSpec, capacity: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    pairs = list(generate(s, capacity))
    return np.array([t for t, _ in pairs]), np.array([item.cost for _, item in pairs])


def problems(data: Any, **kwargs: Any) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        parse_workload(data, **kwargs)
    return info.value.problems


# --- generation -------------------------------------------------------------------------------


def test_same_seed_same_items_and_other_seed_differs() -> None:
    fields = {
        "requests": 2000,
        "arrivals": {"process": "bursty", "rate": 50},
        "size": {"dist": "lognormal", "mean": 10},
        "priorities": {0: 0.5, 1: 0.5},
    }
    a = [(t, i.cost, i.priority, i.id) for t, i in generate(spec(**fields, seed=3), 1.0)]
    b = [(t, i.cost, i.priority, i.id) for t, i in generate(spec(**fields, seed=3), 1.0)]
    c = [(t, i.cost, i.priority, i.id) for t, i in generate(spec(**fields, seed=4), 1.0)]
    assert a == b
    assert a != c


def test_items_have_ids_in_arrival_order_and_times_never_decrease() -> None:
    s = spec(requests=70_000, arrivals={"process": "poisson", "rate": 10})  # spans two chunks
    pairs = list(generate(s, 1.0))
    assert [item.id for _, item in pairs] == list(range(70_000))
    times = np.array([t for t, _ in pairs])
    assert (np.diff(times) >= 0).all()
    assert all(isinstance(item, WorkItem) for _, item in pairs[:10])


def test_generation_is_lazy() -> None:
    s = spec(requests=50_000_000, arrivals={"process": "poisson", "rate": 10})
    started = time.perf_counter()
    first = list(itertools.islice(generate(s, 1.0), 10))
    assert len(first) == 10
    assert time.perf_counter() - started < 2.0


def test_poisson_mean_rate() -> None:
    times, _ = arrays(spec(requests=50_000, arrivals={"process": "poisson", "rate": 200}))
    assert 50_000 / times[-1] == pytest.approx(200, rel=0.03)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps


def test_load_becomes_rate_through_capacity_and_mean_size() -> None:
    s = spec(
        requests=40_000,
        arrivals={"process": "poisson", "load": 0.5},
        size={"dist": "fixed", "value": 4},
    )
    assert arrival_rate(s, 200.0) == pytest.approx(25.0)  # 0.5 * 200 / 4
    times, _ = arrays(s, capacity=200.0)
    assert 40_000 / times[-1] == pytest.approx(25.0, rel=0.03)


def test_load_needs_a_positive_capacity() -> None:
    s = spec(arrivals={"process": "poisson", "load": 0.5})
    with pytest.raises(ValueError, match="capacity"):
        generate(s, 0.0)


def _counts(times: np.ndarray, window: float) -> np.ndarray:
    return np.bincount((times // window).astype(np.int64))[:-1]  # drop the partial last window


def test_bursty_keeps_the_mean_rate_and_is_burstier_than_poisson() -> None:
    rate = 100.0
    bursty = spec(requests=300_000, arrivals={"process": "bursty", "rate": rate}, seed=1)
    poisson = spec(requests=300_000, arrivals={"process": "poisson", "rate": rate}, seed=1)
    bt, _ = arrays(bursty)
    pt, _ = arrays(poisson)
    assert 300_000 / bt[-1] == pytest.approx(rate, rel=0.06)
    b_counts, p_counts = _counts(bt, 1.0), _counts(pt, 1.0)
    # Index of dispersion: ~1 for Poisson, much more for a modulated process.
    assert p_counts.var() / p_counts.mean() == pytest.approx(1.0, abs=0.15)
    assert b_counts.var() / b_counts.mean() > 5 * p_counts.var() / p_counts.mean()


def test_bursty_rates_average_to_the_mean() -> None:
    arrivals = BurstyArrivals(
        process="bursty", rate=10, burst_factor=5, burst_seconds=2, calm_seconds=3
    )
    calm, burst = arrivals.rates(10.0)
    assert burst == pytest.approx(5 * calm)
    assert (burst * 2 + calm * 3) / 5 == pytest.approx(10.0)


def test_closed_arrivals_all_at_time_zero() -> None:
    times, _ = arrays(spec(requests=1000, arrivals="closed"))
    assert (times == 0).all()
    assert arrival_rate(spec(arrivals={"process": "closed"}), 10.0) is None


def test_arrivals_default_to_a_batch_of_unit_items() -> None:
    s = spec(requests=3)
    assert isinstance(s.arrivals, ClosedArrivals)
    assert [(t, i.cost) for t, i in generate(s, 1.0)] == [(0.0, 1.0)] * 3


@pytest.mark.parametrize(
    ("size", "mean"),
    [
        ({"dist": "fixed", "value": 7.5}, 7.5),
        (7.5, 7.5),
        ({"dist": "uniform", "low": 2, "high": 10}, 6.0),
        ({"dist": "lognormal", "mean": 300, "sigma": 1.0}, 300.0),
        ({"dist": "lognormal", "mean": 5, "sigma": 0.5}, 5.0),
    ],
)
def test_size_distributions_have_their_mean(size: Any, mean: float) -> None:
    s = spec(requests=200_000, size=size)
    assert mean_size(s) == pytest.approx(mean)
    _, costs = arrays(s)
    assert costs.mean() == pytest.approx(mean, rel=0.02)
    assert (costs >= 0).all()


def test_uniform_sizes_stay_in_range_and_lognormal_has_its_sigma() -> None:
    _, costs = arrays(spec(requests=50_000, size={"dist": "uniform", "low": 2, "high": 10}))
    assert costs.min() >= 2 and costs.max() <= 10
    s = spec(requests=100_000, size={"dist": "lognormal", "mean": 100, "sigma": 0.8})
    assert isinstance(s.size, LognormalSize)
    assert s.size.mu == pytest.approx(np.log(100) - 0.32)
    _, costs = arrays(s)
    assert np.log(costs).std() == pytest.approx(0.8, rel=0.02)


def test_priorities_follow_their_mix() -> None:
    s = spec(requests=100_000, priorities={0: 0.7, 5: 0.2, 9: 0.1})
    prios = np.array([item.priority for _, item in generate(s, 1.0)])
    assert set(np.unique(prios)) == {0, 5, 9}
    assert (prios == 0).mean() == pytest.approx(0.7, abs=0.01)
    assert (prios == 5).mean() == pytest.approx(0.2, abs=0.01)
    assert (prios == 9).mean() == pytest.approx(0.1, abs=0.01)


def test_memory_kind_and_string_priority_keys_are_parsed() -> None:
    s = parse_workload(
        json.loads('{"requests": 2, "memory": "2GB", "kind": "llm", "priorities": {"3": 1.0}}')
    )
    assert s.memory == 2_000_000_000
    items = [item for _, item in generate(s, 1.0)]
    assert [(i.memory, i.kind, i.priority) for i in items] == [(2_000_000_000, "llm", 3)] * 2


def test_slo_and_failures_are_kept() -> None:
    s = spec(
        slo={"latency": 1.5},
        failures=[{"device": "a100-80gb:0", "at": 3, "recover": 9}, {"device": 2, "at": 1}],
    )
    assert s.slo is not None and s.slo.latency == 1.5
    assert [(f.device, f.at, f.recover) for f in s.failures] == [
        ("a100-80gb:0", 3.0, 9.0),
        ("2", 1.0, None),
    ]


def test_spec_is_frozen() -> None:
    s = spec()
    with pytest.raises(ValueError):
        s.requests = 5


# --- traces -----------------------------------------------------------------------------------


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", "utf-8")
    return path


def test_jsonl_trace_with_arrivals_overrides_the_arrival_process(tmp_path: Path) -> None:
    trace = _jsonl(
        tmp_path / "t.jsonl",
        [
            {"cost": 5, "arrival": 0.5, "priority": 2, "kind": "chat", "tags": ["eu"]},
            {"prompt_tokens": 100, "max_new_tokens": 20, "arrival": 0.1, "memory": "1kB"},
            {"cost": 1.5, "arrival": 2.0, "request_id": "ignored"},
        ],
    )
    s = spec(
        arrivals={"process": "poisson", "rate": 1000},
        size={"dist": "trace", "path": str(trace)},
        kind="batch",
        memory=7,
    )
    assert s.requests == 3  # defaults to the trace's length
    assert mean_size(s) == pytest.approx((5 + 70 + 1.5) / 3)
    got = [(t, i.cost, i.priority, i.kind, i.tags, i.memory, i.id) for t, i in generate(s, 1.0)]
    assert got == [
        (0.1, 70.0, 0, "batch", frozenset(), 1000, 0),  # sorted by arrival
        (0.5, 5.0, 2, "chat", frozenset({"eu"}), 7, 1),
        (2.0, 1.5, 0, "batch", frozenset(), 7, 2),
    ]


def test_trace_repeats_with_shifted_arrivals_when_more_requests(tmp_path: Path) -> None:
    trace = _jsonl(tmp_path / "t.jsonl", [{"cost": 1, "arrival": 0}, {"cost": 2, "arrival": 1}])
    s = spec(requests=5, size={"dist": "trace", "path": str(trace)})
    got = [(t, i.cost) for t, i in generate(s, 1.0)]
    assert got == [(0.0, 1.0), (1.0, 2.0), (2.0, 1.0), (3.0, 2.0), (4.0, 1.0)]


def test_csv_trace(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text(
        "arrival,cost,prompt_tokens,max_new_tokens,priority,kind,tags,memory\n"
        "0.0,3,,,1,a,x;y,2MB\n"
        "1.5,,10,4,,,,\n",
        "utf-8",
    )
    s = spec(size={"dist": "trace", "path": str(trace)})
    got = [(t, i.cost, i.priority, i.kind, i.tags, i.memory) for t, i in generate(s, 1.0)]
    assert got == [
        (0.0, 3.0, 1, "a", frozenset({"x", "y"}), 2_000_000),
        (1.5, 9.0, 0, "default", frozenset(), 0),
    ]


def test_trace_without_arrivals_uses_the_arrival_process(tmp_path: Path) -> None:
    trace = _jsonl(tmp_path / "t.jsonl", [{"cost": 1}, {"cost": 3}])
    s = spec(
        requests=6,
        arrivals={"process": "poisson", "rate": 5},
        size={"dist": "trace", "path": str(trace)},
    )
    pairs = list(generate(s, 1.0))
    assert [i.cost for _, i in pairs] == [1, 3, 1, 3, 1, 3]
    assert all(t > 0 for t, _ in pairs)
    assert arrival_rate(s, 1.0) == 5


def test_trace_constructed_directly_is_read_on_use(tmp_path: Path) -> None:
    trace = _jsonl(tmp_path / "t.jsonl", [{"cost": 4}])
    s = WorkloadSpec(requests=2, size=TraceSize(dist="trace", path=trace))
    assert [i.cost for _, i in generate(s, 1.0)] == [4.0, 4.0]
    bad = WorkloadSpec(size=TraceSize(dist="trace", path=tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match=r"missing\.jsonl"):
        mean_size(bad)


def test_load_workload_yaml_with_a_relative_trace(tmp_path: Path) -> None:
    _jsonl(tmp_path / "t.jsonl", [{"cost": 2, "arrival": 0}])
    (tmp_path / "w.yaml").write_text(
        "size: {dist: trace, path: t.jsonl}\nslo: {latency: 2}\nseed: 4\n", "utf-8"
    )
    s = load_workload(tmp_path / "w.yaml")
    assert s.requests == 1 and s.seed == 4
    assert [(t, i.cost) for t, i in generate(s, 1.0)] == [(0.0, 2.0)]


def test_load_workload_json(tmp_path: Path) -> None:
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"requests": 5, "arrivals": {"process": "poisson", "rate": 3}}))
    s = load_workload(path)
    assert isinstance(s.arrivals, PoissonArrivals) and s.arrivals.rate == 3


def test_load_workload_reports_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read workload"):
        load_workload(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("requests: [1,\n", "utf-8")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_workload(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{", "utf-8")
    with pytest.raises(ConfigError, match="invalid JSON"):
        load_workload(bad_json)


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "path", "fragments"),
    [
        (
            {"arrivals": {"process": "poisson", "rate": -1}},
            "arrivals.rate",
            ["greater than 0", "-1"],
        ),
        ({"arrivals": {"process": "poisson"}}, "arrivals", ["exactly one of 'rate'", "neither"]),
        (
            {"arrivals": {"process": "bursty", "rate": 1, "load": 0.5}},
            "arrivals",
            ["not both", "rate=1.0", "load=0.5"],
        ),
        (
            {"arrivals": {"process": "weibull"}},
            "arrivals.process",
            ["'weibull'", "poisson", "bursty", "closed"],
        ),
        ({"arrivals": {"rate": 3}}, "arrivals.process", ["missing", "poisson"]),
        (
            {"arrivals": {"process": "bursty", "rate": 1, "burst_factor": 0.5}},
            "arrivals.burst_factor",
            ["greater than 1", "0.5"],
        ),
        (
            {"size": {"dist": "gauss"}},
            "size.dist",
            ["'gauss'", "fixed", "uniform", "lognormal", "trace"],
        ),
        ({"size": {"dist": "uniform", "low": 5, "high": 2}}, "size.high", ["low=5", "2"]),
        ({"size": {"dist": "lognormal"}}, "size.mean", ["missing"]),
        (
            {"size": {"dist": "fixed", "value": 1, "sigma": 2}},
            "size.sigma",
            ["unknown key", "dist, value"],
        ),
        (
            {"size": {"dist": "trace", "path": "/no/such/trace.jsonl"}},
            "size.path",
            ["cannot read trace", "/no/such/trace.jsonl"],
        ),
        ({"requests": 0}, "requests", ["greater than or equal to 1", "0"]),
        ({"memory": "2 parsecs"}, "memory", ["'2 parsecs'", "GB"]),
        ({"priorities": {0: 0.5, 1: 0.4}}, "priorities", ["sum to 1", "0.9"]),
        ({"priorities": {0: 1.5, 1: -0.5}}, "priorities", ["between 0 and 1", "1.5"]),
        ({"priorities": {"high": 1.0}}, "priorities.high", ["integers", "'high'"]),
        ({"slo": {"latency": 0}}, "slo.latency", ["greater than 0"]),
        (
            {"failures": [{"device": "d0", "at": 5, "recover": 2}]},
            "failures[0].recover",
            ["later than at=5", "2"],
        ),
        ({"failures": [{"device": "d0", "at": -1}]}, "failures[0].at", ["-1"]),
        ({"failures": [{"at": 1}]}, "failures[0].device", ["missing"]),
        ({"bogus": 1}, "bogus", ["unknown key", "requests", "arrivals"]),
        ({"prompts": {"kind": "tree"}}, "prompts.kind", ["'tree'", "chat", "single", "hot"]),
        ({"prompts": {"systems": 2}}, "prompts.kind", ["missing", "chat, single, hot"]),
        ({"prompts": {"kind": "chat", "systems": 0}}, "prompts.systems", ["greater than", "0"]),
        ({"prompts": {"kind": "chat", "block_work": -2}}, "prompts.block_work", ["-2"]),
        (
            {"prompts": {"kind": "single", "turns": 3}},
            "prompts.turns",
            ["unknown key", "block_work, blocks, kind"],
        ),
        ({"prompts": {"kind": "hot", "share": 1.5}}, "prompts.share", ["less than", "1.5"]),
        ({"prompts": {"kind": "chat", "turns": 5000}}, "prompts", ["20016 blocks", "4096"]),
        (
            {"prompts": "single", "size": {"dist": "trace", "path": "t.jsonl"}},
            "prompts",
            ["size: trace", "'single'"],
        ),
    ],
)
def test_bad_input_names_field_and_value(data: Any, path: str, fragments: list[str]) -> None:
    found = problems(data)
    assert [p for p, _ in found] == [path], found
    for fragment in fragments:
        assert fragment in found[0][1], found


def test_every_problem_is_reported_at_once() -> None:
    found = problems({"requests": -1, "size": {"dist": "fixed", "value": 0}, "seed": "x"})
    assert sorted(p for p, _ in found) == ["requests", "seed", "size.value"]


def test_not_a_mapping() -> None:
    assert problems([1, 2])[0][1].endswith("got [1, 2]")


@pytest.mark.parametrize(
    ("lines", "fragments"),
    [
        (['{"cost": 1}', '{"cost": "abc"}'], ["line 2", "'cost'", "'abc'"]),
        (['{"cost": 1}', "", '{"cost": -3}'], ["line 3", "'cost'", "-3"]),
        (['{"cost": 1}', "not json"], ["line 2", "invalid JSON"]),
        (['{"prompt_tokens": 5}'], ["line 1", "'max_new_tokens'", "missing"]),
        (['{"prompt_tokens": 5.5, "max_new_tokens": 1}'], ["line 1", "'prompt_tokens'", "5.5"]),
        (['{"cost": 1, "arrival": "soon"}'], ["line 1", "'arrival'", "'soon'"]),
        (['{"cost": 1, "memory": "lots"}'], ["line 1", "'memory'", "'lots'"]),
        (['{"cost": 1, "priority": "high"}'], ["line 1", "'priority'", "'high'"]),
        (['{"cost": 1, "tags": 5}'], ["line 1", "'tags'", "5"]),
        (['{"tokens": 1}'], ["line 1", "needs 'cost'", "tokens"]),
        (["[1, 2]"], ["line 1", "JSON object"]),
        (['{"cost": 1, "arrival": 0}', '{"cost": 1}'], ["line 2", "'arrival'", "every line"]),
        ([], ["no items"]),
    ],
)
def test_malformed_trace_lines(tmp_path: Path, lines: list[str], fragments: list[str]) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines), "utf-8")
    found = problems({"size": {"dist": "trace", "path": "trace.jsonl"}}, base_dir=tmp_path)
    assert found[0][0] == "size.path"
    for fragment in ["trace.jsonl", *fragments]:
        assert fragment in found[0][1], found


def test_malformed_csv_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("cost,arrival\n1,0\n2,later\n", "utf-8")
    found = problems({"size": {"dist": "trace", "path": str(trace)}})
    assert found == [
        (
            "size.path",
            "trace.csv line 3: field 'arrival' must be a finite number of "
            "seconds >= 0 (got 'later')",
        )
    ]
    trace.write_text("size,arrival\n1,0\n", "utf-8")
    ((path, message),) = problems({"size": {"dist": "trace", "path": str(trace)}})
    assert path == "size.path" and "'cost' column" in message and "'size'" in message


def test_many_bad_trace_lines_are_each_reported(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"cost": "x"}\n{"cost": 1}\n{"cost": "y"}\n', "utf-8")
    found = problems({"size": {"dist": "trace", "path": str(trace)}})
    assert [m.split(":")[0] for _, m in found] == ["t.jsonl line 1", "t.jsonl line 3"]
