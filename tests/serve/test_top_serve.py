"""``hetero top --serve URL`` against a real router on 127.0.0.1."""

from __future__ import annotations

from typer.testing import CliRunner

from hetero.cli import app
from hetero.commands.top_serve import fetch_status
from hetero.serve.router import DEFAULT_STRATEGY
from tests.serve.harness import KEY

runner = CliRunner()


#: A replica as /status shows it, for the views rendered from a status made here.
REPLICA = {
    "name": "a",
    "state": "up",
    "models": ["m"],
    "learned_speed": 1.0,
    "speed": None,
    "in_flight": 2,
    "queued": 0,
    "slots": 12,
    "completed": 9,
    "failed": 0,
    "mean_latency_s": 0.5,
}


def test_top_serve_shows_each_replica(router_url: str) -> None:
    result = runner.invoke(app, ["top", "--serve", router_url, "--once"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert f"strategy {DEFAULT_STRATEGY}" in result.output
    row = next(line for line in result.output.splitlines() if "fast" in line)
    assert "up" in row and " m " in row and "/ 2.00" in row
    assert row.split("│")[-5].strip() == "1"  # done


def test_top_serve_shows_what_only_the_admin_key_sees_with_it(router_url: str) -> None:
    assert "url" not in fetch_status(router_url)["replicas"][0]
    assert fetch_status(router_url, KEY)["replicas"][0]["url"].startswith("http://127.0.0.1:")
    args = ["top", "--serve", router_url, "--once"]
    for extra, shown in (([], False), (["--admin-key", KEY], True)):
        result = runner.invoke(app, [*args, *extra], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if "fast" in line)
        assert (row.split("│")[3].strip() != "—") is shown, row  # the engine column


def test_top_serve_unreachable_is_a_clear_error() -> None:
    result = runner.invoke(app, ["top", "--serve", "http://127.0.0.1:9", "--once"])
    assert result.exit_code == 1
    assert "cannot read http://127.0.0.1:9/status" in result.output
    assert "Traceback" not in result.output


def test_top_serve_shows_each_replica_s_engine_and_load() -> None:
    from hetero.commands.top_serve import serve_view
    from tests.rendering import render

    base = {"strategy": "power_of_two", "uptime_s": 3, "active": 0, "waiting": 0}
    replica = REPLICA | {"learned_speed": 1.5}
    known = replica | {
        "engine": "vllm",
        "load": {"known": True, "running": 2, "waiting": 1, "kv_usage": 0.25},
    }
    unknown = replica | {
        "name": "b",
        "engine": "openai",
        "load": {"known": False, "why": "the server publishes no load"},
    }
    status = base | {"queue_size": 100, "replicas": [known, unknown]}
    text = render(serve_view(status, "http://x"), 220)
    row_a = next(line for line in text.splitlines() if "│ a " in line)
    row_b = next(line for line in text.splitlines() if "│ b " in line)
    assert "vllm" in row_a and "2 + 1 · kv 25%" in row_a and "1.50 / —" in row_a
    assert "openai" in row_b and "unknown: the server publishes no load" in row_b


#: A replica's engine model in /status (the slo strategy's explain), idle and trusted.
ENGINE_MODEL = {
    "prefill_tokens_per_s": 12000.0,
    "step_base_s": 0.003,
    "step_per_request_s": 0.0005,
    "predicted_ttft_s": 0.08,
    "predicted_tpot_s": 0.04,
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05},
    "error_ttft": {"p50": 0.1, "p90": 0.3},
    "error_tpot": {"p50": 0.1, "p90": 0.3},
    "distrusted": False,
}


def test_top_serve_shows_a_replica_full_at_its_learned_limit() -> None:
    from hetero.commands.top_serve import serve_view
    from tests.rendering import render

    model = ENGINE_MODEL | {"widened": False, "slow_start_full": True, "most_running": 72.5}
    replica = REPLICA | {"name": "fast", "in_flight": 73, "slots": 4096, "engine_model": model}
    status = {"strategy": "slo", "uptime_s": 3, "active": 73, "waiting": 5, "queue_size": 100}
    text = render(serve_view(status | {"replicas": [replica]}, "http://x"), 220)
    assert "fast (full at 72.5)" in text
    assert "derived" not in text  # the SLO was given


def test_top_serve_says_where_a_derived_slo_comes_from() -> None:
    from hetero.commands.top_serve import serve_view
    from tests.rendering import render

    replicas = [
        REPLICA | {"name": name, "engine_model": ENGINE_MODEL | {"slo_from": source}}
        for name, source in (("a", "probe"), ("b", "probe"), ("c", "catalog"))
    ]
    status = {"strategy": "slo", "uptime_s": 3, "active": 0, "waiting": 0, "queue_size": 100}
    text = " ".join(render(serve_view(status | {"replicas": replicas}, "http://x"), 300).split())
    assert (
        "the SLO derived from each replica's lone times, held (from catalog ×1, probe ×2)" in text
    )
