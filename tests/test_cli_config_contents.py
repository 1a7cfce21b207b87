"""``hetero config validate`` says what a valid file has: its devices, its replicas, and the
strategy each command that reads it routes by."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from tests.rendering import flat

runner = CliRunner()

REPLICAS = '  - {url: "http://10.0.0.4:8000"}\n  - {url: "http://10.0.0.5:8000", device: T4}\n'


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "replicas:\n" + REPLICAS,
            "2 replicas, no devices, strategy slo (hetero serve's default)",
        ),
        (
            "replicas:\n" + REPLICAS + "scheduler: {strategy: slo}\n",
            "2 replicas, no devices, strategy slo",
        ),
        (
            "devices:\n  - {type: gpu, model: T4, emulate: true, count: 3}\nreplicas:\n" + REPLICAS,
            "3 devices, 2 replicas, strategy tail_budget (hetero serve: slo)",
        ),
        ("devices:\n  - {type: gpu, model: T4, emulate: true}\n", "1 device, strategy tail_budget"),
        (
            "backend: {kind: ray}\n",
            "no devices (the Ray cluster's nodes declare theirs), strategy tail_budget",
        ),
    ],
)
def test_validate_says_what_the_file_has(tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["config", "validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert flat(result.stdout) == f"ok: {path}: {said}"
    assert "0 devices" not in result.stdout
