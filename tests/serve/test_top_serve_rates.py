"""``hetero top --serve``'s tok/s: a single view (``--once``, a pipe, a watch's first frame)
shows each replica's output tokens over the router's uptime, not a dash; a dash only where
nothing is known."""

from __future__ import annotations

import time
from typing import Any

from typer.testing import CliRunner

from hetero.cli import app
from hetero.commands.top_serve import fetch_status, serve_view
from tests.rendering import render

runner = CliRunner()


def _status(uptime: float | None, **replica: Any) -> dict[str, Any]:
    row = {
        "name": "a",
        "state": "up",
        "models": ["m"],
        "learned_speed": 1.0,
        "speed": None,
        "in_flight": 0,
        "queued": 0,
        "slots": 4,
        "completed": 3,
        "failed": 0,
        "mean_latency_s": 0.5,
        **replica,
    }
    return {
        "strategy": "shortest_expected_delay",
        "uptime_s": uptime,
        "active": 0,
        "waiting": 0,
        "queue_size": 100,
        "replicas": [row],
    }


def _rate_cell(text: str) -> str:
    row = next(line for line in text.splitlines() if "│ a " in line)
    return row.split("│")[-3].strip()


def test_one_view_shows_tokens_over_the_uptime() -> None:
    text = render(serve_view(_status(10.0, output_tokens=1234), "http://x"), 220)
    assert _rate_cell(text) == "123"
    assert "tok/s: output tokens per second since the router started" in " ".join(text.split())
    assert _rate_cell(render(serve_view(_status(10.0, output_tokens=25), "http://x"), 220)) == "2.5"
    idle = render(serve_view(_status(10.0, output_tokens=0), "http://x"), 220)
    assert _rate_cell(idle) == "0.0"  # known: nothing generated


def test_a_dash_only_where_nothing_is_known() -> None:
    assert _rate_cell(render(serve_view(_status(10.0), "http://x"), 220)) == "—"  # no tokens
    assert _rate_cell(render(serve_view(_status(0.0, output_tokens=5), "http://x"), 220)) == "—"
    watched = serve_view(_status(10.0, output_tokens=99), "http://x", rates={})
    assert _rate_cell(render(watched, 220)) == "—"  # a replica the previous view did not have


def test_a_watch_shows_the_rate_since_the_last_refresh() -> None:
    text = render(serve_view(_status(10.0, output_tokens=99), "http://x", {"a": 42.0}), 220)
    assert _rate_cell(text) == "42"
    assert "since the last refresh" in " ".join(text.split())


def test_top_serve_once_shows_a_real_token_rate(router_url: str) -> None:
    # The fixture's request generated 3 tokens; the router reports its uptime to 0.1 s.
    deadline = time.monotonic() + 10
    while not fetch_status(router_url)["uptime_s"]:
        assert time.monotonic() < deadline, "the router's uptime stayed 0"
        time.sleep(0.01)
    status = fetch_status(router_url)
    assert status["replicas"][0]["output_tokens"] == 3
    result = runner.invoke(app, ["top", "--serve", router_url, "--once"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "fast" in line)
    rate = row.split("│")[-3].strip()
    assert rate != "—" and float(rate.replace(",", "")) > 0, row
