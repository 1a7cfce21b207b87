from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import hetero
from hetero.cli import app
from hetero.plan import load_plan, plan_fleet
from hetero.plan.match import CRITERIA
from tests.rendering import assert_whole, body_cells, flat, headers

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mixed_fleet.yaml"
PLAN = ROOT / "examples" / "plan.yaml"
runner = CliRunner()


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert hetero.__version__ in result.output


def test_devices_from_example_config_json() -> None:
    # A real process, as a user runs it.
    proc = subprocess.run(
        [sys.executable, "-m", "hetero", "devices", "--config", str(EXAMPLE), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    devices = json.loads(proc.stdout)
    assert len(devices) == 5
    models = [d["model"] for d in devices]
    assert models.count("A100-80GB") == 2 and models.count("V100-32GB") == 2
    assert sum(d["kind"] == "cpu" for d in devices) == 1
    a100 = devices[0]
    assert a100["emulated"] is True
    assert a100["tflops"]["fp16"] == pytest.approx(312)
    assert a100["speed"] == pytest.approx(2.5 * devices[2]["speed"], rel=0.01)
    assert all(d["state"]["healthy"] for d in devices)


def _hetero_json(*args: str) -> Any:
    """Run ``hetero ARGS --json`` in a real process, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "hetero", *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(proc.stdout)


def test_planner_commands_in_real_processes() -> None:
    fit = _hetero_json("fit", "llama-3-8b", "--device", "A100-80GB", "--seq", "8192")
    assert fit["fits"] is True and fit["breakdown"]["kv_cache"] == 8192 * 128 * 1024
    ranked = _hetero_json("match", "--fleet", "L4,H100-SXM-80GB", "--memory", "40GB")
    assert [(m["model"], m["eligible"]) for m in ranked["matches"]] == [
        ("H100-SXM-80GB", True),
        ("L4", False),
    ]
    topology = _hetero_json("topology", "--fake", "mixed", "--group", "2")
    assert topology["group"]["ids"] == ["gpu:0", "gpu:1"]  # the NVLinked A100 pair
    plan = _hetero_json("plan", "examples/plan.yaml", "--verify", "--requests", "2000")
    assert sum(plan["mix"].values()) == plan["devices"] > 0
    assert plan["verification"][-1]["meets_slo"] is True


def test_devices_table() -> None:
    result = runner.invoke(app, ["devices", "--config", str(EXAMPLE)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "a100-80gb:1" in result.output and "5 devices" in result.output


def _hetero_at(columns: int, *args: str) -> str:
    """What ``hetero ARGS`` prints in a terminal ``columns`` wide (a real process, so that the
    width is read as it is for a user)."""
    proc = subprocess.run(
        [sys.executable, "-m", "hetero", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    return proc.stdout


def test_devices_table_at_80_and_200_columns() -> None:
    fleet = hetero.build_fleet(hetero.load_config(EXAMPLE))
    cells = [d.id for d in fleet] + [d.model for d in fleet]
    columns = ["id", "model", "memory", "speed", "fp16", "fp32", "kind", "emulated", "health"]
    narrow = _hetero_at(80, "devices", "--config", str(EXAMPLE))
    assert_whole(narrow, 80, [d.id for d in fleet])
    # A long CPU model name wraps, whatever cells stand beside it
    assert [c for c in cells if c not in body_cells(narrow)] == []
    # One table: how many columns fit depends on this machine's CPU model name; the columns
    # left out are named under it.
    (shown,) = headers(narrow)
    assert shown[:4] == ["id", "model", "memory", "speed"]
    left_out = [c for c in columns if c not in shown]
    assert left_out and f"not shown at 80 columns: {', '.join(left_out)}" in flat(narrow)
    assert headers(_hetero_at(200, "devices", "--config", str(EXAMPLE))) == [columns]


def test_catalog_tables_at_80_columns() -> None:
    models = [spec.model for spec in hetero.get_catalog()]
    listed = _hetero_at(80, "catalog", "list")
    assert_whole(listed, 80, models)
    assert headers(listed)[0][:2] == ["model", "memory"]
    compared = _hetero_at(80, "catalog", "compare")
    assert_whole(compared, 80, [*models, "TFLOPS/$", "GB/TFLOPS"])
    assert headers(compared)[0][:3] == ["#", "model", "TFLOPS"]
    shown = _hetero_at(80, "catalog", "show", "A100-80GB")
    url = hetero.get_catalog().get("A100-80GB").source
    assert "…" not in shown and url in "".join(shown.replace("│", "").split())  # folded whole


def test_plan_tables_at_80_and_200_columns() -> None:
    result = plan_fleet(load_plan(PLAN))
    types = [t.model for t in result.types]
    reasons = [s.reason for s in result.single_type if s.reason]
    args = ("plan", str(PLAN), "--verify", "--requests", "2000")
    buckets = ["bucket", "requests", "work units", "mean tokens", "design request"]
    mix = ["type", "count", "$/h each", "units/s", "util", "cap", "buckets"]
    single = ["type", "count", "$/hour", "$/M tokens", "vs mix", "why not"]
    check = ["round", "in SLO", "target", "meets SLO", "at target", "p50", "p99", "util"]
    narrow = _hetero_at(80, *args)
    assert_whole(narrow, 80, [*types, "1–9, 10 (41%)"])
    assert [r for r in reasons if r not in flat(narrow)] == []  # wrapped, not cut
    # One table each, no "(continued)": why a type cannot do it alone and whether the plan
    # met its SLO stay; the figures that follow from others are left out, and named.
    assert "continued" not in narrow
    assert headers(narrow) == [
        buckets,
        mix,
        ["type", "count", "$/hour", "vs mix", "why not"],
        ["round", "in SLO", "target", "meets SLO", "at target", "util"],
    ]
    note = "not shown at 80 columns: {} (--json shows every field)"
    assert note.format("$/M tokens") in flat(narrow)
    assert note.format("p50, p99, requests") in flat(narrow)
    wide = _hetero_at(200, *args)
    assert_whole(wide, 200, types)
    assert [r for r in reasons if r not in flat(wide)] == []
    assert headers(wide) == [buckets, mix, single, [*check, "requests"]]
    assert "not shown" not in wide


def test_match_table_at_80_and_200_columns() -> None:
    models = ["H100-SXM-80GB", "A100-80GB", "L4", "T4"]
    ids = [f"{m.lower()}:0" for m in models]
    args = (
        "match",
        "--fleet",
        ",".join(models),
        "--model",
        "llama-3-8b",
        "--seq",
        "8192",
        "--batch",
        "4",
    )
    first = ["#", "device", "model", "eligible", "total"]
    narrow = _hetero_at(80, *args)
    assert_whole(narrow, 80, [*models, *ids])
    # One table: the scores of the criteria that weigh least (features 0.10, cost 0.20) go.
    assert headers(narrow) == [[*first, "compute", "bandwidth"]]
    assert "continued" not in narrow
    assert "not shown at 80 columns: features, cost (--json shows every score)" in flat(narrow)
    wide = _hetero_at(200, *args)
    assert_whole(wide, 200, [*models, *ids])
    assert headers(wide) == [[*first, *CRITERIA]] and "not shown" not in wide
    # Weighed by cost alone, the cost score stays and compute goes.
    by_cost = _hetero_at(80, *args, "--weights", "cost=1,features=0.5")
    (shown,) = headers(by_cost)
    assert shown[:5] == first and "cost" in shown and "compute" not in shown
    catalog = [spec.model for spec in hetero.get_catalog()]
    assert_whole(_hetero_at(80, "match", "--catalog"), 80, catalog)


def test_devices_without_config_lists_this_machine() -> None:
    result = runner.invoke(app, ["devices", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["kind"] == "cpu"


def test_catalog_commands() -> None:
    listed = runner.invoke(app, ["catalog", "list", "--json"])
    assert listed.exit_code == 0
    assert len(json.loads(listed.stdout)) >= 30
    shown = runner.invoke(app, ["catalog", "show", "NVIDIA A100-SXM4-80GB", "--json"])
    assert json.loads(shown.stdout)["model"] == "A100-80GB"
    compared = runner.invoke(app, ["catalog", "compare", "--kind", "gpu", "--json"])
    rows = json.loads(compared.stdout)
    assert rows[0]["tflops_per_dollar"] >= rows[1]["tflops_per_dollar"]
    table = runner.invoke(app, ["catalog", "compare", "--by", "tflops_per_watt"])
    assert "TFLOPS/W" in table.output


def test_catalog_bad_input_is_a_clear_error() -> None:
    result = runner.invoke(app, ["catalog", "show", "A100-80G"])
    assert result.exit_code == 1
    assert "unknown device model 'A100-80G'" in result.stderr and "A100-80GB" in result.stderr
    bad_kind = runner.invoke(app, ["catalog", "list", "--kind", "qpu"])
    assert bad_kind.exit_code == 2 and "'qpu'" in bad_kind.stderr
    bad_dtype = runner.invoke(app, ["catalog", "compare", "--dtype", "fp12"])
    assert bad_dtype.exit_code == 2 and "'fp12'" in bad_dtype.stderr
    bad_by = runner.invoke(app, ["catalog", "compare", "--by", "tflops"])
    assert bad_by.exit_code == 2 and "--by" in bad_by.stderr and "tflops_per_watt" in bad_by.stderr


def test_config_validate(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["config", "validate", str(EXAMPLE)])
    assert ok.exit_code == 0 and "5 devices" in ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "devices:\n"
        "  - {type: gpu, model: A100-80G, emulate: true}\n"
        "  - {type: gpu, model: V100-16GB, emulate: true, memory_limit: 64GB}\n"
        "  - {type: gpu, id: 0}\n  - {type: gpu, id: 0}\n"
        "communication: {buffer_size: 0}\n"
    )
    result = runner.invoke(app, ["config", "validate", str(bad)])
    assert result.exit_code == 1
    err = result.stderr
    assert "4 problems" in err
    assert "devices[0].model: unknown model 'A100-80G'" in err
    assert "devices[1].memory_limit" in err
    assert "devices[3].id: duplicate id '0'" in err
    assert "communication.buffer_size" in err


def test_log_level_option() -> None:
    assert runner.invoke(app, ["--log-level", "debug", "catalog", "list"]).exit_code == 0
    bad = runner.invoke(app, ["--log-level", "loud", "catalog", "list"])
    assert bad.exit_code == 2 and "'loud'" in bad.stderr


def test_set_log_level() -> None:
    import logging

    hetero.set_log_level("DEBUG")
    assert logging.getLogger("hetero").level == logging.DEBUG
    hetero.set_log_level(logging.WARNING)
    with pytest.raises(ValueError, match="invalid log level 'LOUD'"):
        hetero.set_log_level("LOUD")


def test_an_explicit_level_wins_over_a_configs_in_either_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging

    from hetero.config import load_config, parse_config

    logger = logging.getLogger("hetero")
    monkeypatch.setattr(logger, "level", logger.level)  # restored after the test
    monkeypatch.setattr("hetero.log._explicit", False)
    path = tmp_path / "fleet.yaml"
    path.write_text("devices: [{type: cpu}]\nlogging: {level: ERROR}\n")
    load_config(path)
    assert logger.level == logging.ERROR  # no explicit level: the file's
    result = runner.invoke(app, ["--log-level", "info", "devices", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert logger.level == logging.INFO  # the flag, though the file is read after it
    monkeypatch.setattr("hetero.log._explicit", False)
    built = parse_config({"devices": [{"type": "cpu"}], "logging": {"level": "DEBUG"}})
    with hetero.Context(built):
        assert logger.level == logging.DEBUG  # a config built in code sets it too
    hetero.set_log_level("WARNING")
    load_config(path)
    assert logger.level == logging.WARNING  # set_log_level wins over a file read later


def test_public_api_is_complete_and_sorted() -> None:
    names = hetero.__all__
    assert names == sorted(names)
    for name in names:
        assert hasattr(hetero, name), name
    public = {n for n in vars(hetero) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(names), public - set(names)


def test_simulate_compares_policies_and_writes_a_report(tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "requests: 2000\narrivals: {process: poisson, load: 0.8}\n"
        "size: {dist: lognormal, mean: 1.0, sigma: 0.5}\nslo: {latency: 5}\nseed: 3\n"
    )
    report = tmp_path / "r.html"
    result = runner.invoke(
        app,
        [
            "simulate",
            "--fleet",
            "T4:2,A100-80GB:2",
            "--workload",
            str(workload),
            "--policies",
            "round_robin,shortest_expected_delay",
            "--json",
            "--report",
            str(report),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {r["policy"]: r for r in json.loads(result.stdout)}
    assert set(rows) == {"round_robin", "shortest_expected_delay"}
    assert all(r["completed"] == 2000 for r in rows.values())
    assert rows["shortest_expected_delay"]["p99"] <= rows["round_robin"]["p99"]
    assert all(0 < r["mean"] < r["p99"] for r in rows.values())
    assert "<img" in report.read_text()


def test_simulate_bad_input() -> None:
    missing = runner.invoke(app, ["simulate", "--workload", "nope.yaml", "--fleet", "T4"])
    assert missing.exit_code == 1 and "nope.yaml" in missing.stderr
    both = runner.invoke(app, ["simulate", "--workload", str(EXAMPLE)])
    assert both.exit_code == 2 and "exactly one of --config or --fleet" in both.stderr
    bad_policy = runner.invoke(
        app,
        [
            "simulate",
            "--workload",
            str(ROOT / "examples/workloads/batch.yaml"),
            "--fleet",
            "T4",
            "--policies",
            "fastest",
        ],
    )
    assert bad_policy.exit_code == 1 and "unknown strategy 'fastest'" in bad_policy.stderr
    bad_fleet = runner.invoke(
        app,
        [
            "simulate",
            "--workload",
            str(ROOT / "examples/workloads/batch.yaml"),
            "--fleet",
            "A100-80G:2",
        ],
    )
    assert bad_fleet.exit_code == 1 and "A100-80GB" in bad_fleet.stderr
