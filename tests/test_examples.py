"""The runnable examples, run as a user runs them: a fresh process each, small sizes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.example_runs import run_example


@pytest.mark.timeout(150)
def test_matmul_runs_submits_a_graph_and_maps_with_results_matching_numpy() -> None:
    out = run_example("matmul.py", "--quick")
    assert re.search(r"^fleet: h100-sxm-80gb:0, a100-80gb:0, a100-80gb:1, v100-32gb:0, t4:0", out)
    assert "run:    128x128 @ 128x128 -> (128, 128), matches numpy: True" in out
    assert re.search(
        r"^graph:  matmul on \S+, then post on \S+: .* matches numpy: True$", out, re.M
    )
    assert "map:    64 batches scored, match numpy: True" in out
    done = re.search(r"^tasks done per device .*: (.*)$", out, re.M)
    assert done is not None
    # 1 run + 2 graph tasks + the map's batches, each counted once on the device that ran it.
    assert sum(int(x) for x in re.findall(r" (\d+)(?:,|$)", done.group(1))) >= 4


@pytest.mark.timeout(150)
def test_matmul_on_this_machine() -> None:
    out = run_example("matmul.py", "--this-machine", "--quick", "--batches", "8")
    assert out.startswith("fleet: cpu:0")
    assert out.count(": True") == 3


@pytest.mark.timeout(150)
def test_checkpoint_retry_resumes_half_way_after_the_worker_is_killed() -> None:
    out = run_example("checkpoint.py", "--quick", "--steps", "12")
    first = re.search(r"first attempt \(worker pid (\d+)\) killed its worker at step 6", out)
    retry = re.search(r"retry ran on cpu:0 \(a new worker, pid (\d+)\)", out)
    assert first and retry and first.group(1) != retry.group(1), out
    assert "retries after a lost worker: 1" in out
    assert "it ran steps 6..11 (6 of 12)" in out
    assert "total over all steps: 66 (expected 66): every step ran exactly once" in out


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_engine_demo_prints_its_table_and_writes_both_reports(tmp_path: Path) -> None:
    out = run_example(
        "engine_demo.py", "--items", "12", "--time-scale", "0.05", "--out", str(tmp_path)
    )
    for row in ("makespan", "ideal makespan", "efficiency", "load balance factor"):
        assert re.search(rf"│ {row} +│ +[\d.]+( s|%)? │ +[\d.]+( s|%)? │", out), row
    assert out.count("results checked against numpy: ok") == 2
    for strategy in ("round_robin", "tail_budget"):
        assert (tmp_path / f"{strategy}.html").is_file()
        assert (tmp_path / f"{strategy}.trace.json").is_file()


@pytest.mark.timeout(150)
def test_serve_demo_routes_every_request_and_reports_both_ways() -> None:
    out = run_example("serve_demo.py", "--requests", "60")
    assert "router on http://127.0.0.1:" in out
    assert re.search(r"│ h100 +│ up +│ sglang +│ demo-llm", out)  # its engine, detected
    lines = out.splitlines()
    at = next(k for k, line in enumerate(lines) if "replica" in line and "done" in line)
    column = [c.strip() for c in lines[at].split("┃")].index("done")
    # the rows of the table whose header has "done" (a narrow console splits the view in two)
    rows = [line.split("│") for line in lines[at:] if re.match(r"│ (t4|l40s|h100) ", line)][:3]
    done = [int(row[column]) for row in rows if len(row) > column and row[column].strip()]
    assert sum(done) == 60  # every routed request counted once
    assert re.search(r"hetero serve +│ +[\d.]+ │", out)
    assert re.search(r"round robin, no router +│ +[\d.]+ │", out)
