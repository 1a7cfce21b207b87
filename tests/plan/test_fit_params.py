"""``hetero fit --params N``: a model known only by its parameter count."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hetero.commands.fit import register
from hetero.plan.memory import FitRequest, fit_memory
from hetero.plan.models import shape_for_params
from tests.cli_apps import command_app

app = command_app(register)
runner = CliRunner()
WIDE = {"COLUMNS": "160"}


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["fit", *args], env=WIDE)
    return result.exit_code, result.stdout, result.stderr


def test_a_bare_count_is_fitted_as_a_dense_shape_of_that_size() -> None:
    code, out, _ = invoke("--params", "70B", "--device", "H100", "--json")
    assert code == 0, out
    data = json.loads(out)
    expected = fit_memory(shape_for_params(70e9), "H100", FitRequest(seq=4096)).to_dict()
    assert data == expected
    assert data["model"] == "dense-70B" and data["params"] == pytest.approx(70e9, rel=0.03)
    assert data["fits"] is False  # 70B bf16 weights (~130 GiB) do not fit in 80 GiB


@pytest.mark.parametrize(("text", "count"), [("8b", 8e9), ("1.5T", 1.5e12), ("7e9", 7e9)])
def test_counts_are_read_as_parse_params_reads_them(text: str, count: float) -> None:
    code, out, _ = invoke("--params", text, "-d", "B200", "--json")
    assert code == 0, out
    assert json.loads(out)["params"] == pytest.approx(count, rel=0.03)


def test_the_table_says_what_the_shape_assumes() -> None:
    code, out, _ = invoke("--params", "8B", "-d", "A100-80GB", "--seq", "8192")
    assert code == 0, out
    assert "dense-8B on A100-80GB" in out and "fits:" in out
    assert "note: dense-8B is a dense Llama-style shape of 8B parameters" in " ".join(out.split())


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (
            ["--params", "70X"],
            "--params: expected a parameter count such as 70B, 1.5B or 7e9, got '70X'",
        ),
        (["--params", "500M"], "--params: a parameter count must be from 1B to 10T, got '500M'"),
        (["--params", "20T"], "--params: a parameter count must be from 1B to 10T, got '20T'"),
        (["llama-3-8b", "--params", "70B"], "not both (got MODEL and --params)"),
        (["--config", "x.json", "--params", "70B"], "not both (got --config and --params)"),
    ],
)
def test_bad_counts_and_two_models_are_refused(args: list[str], text: str) -> None:
    code, out, err = invoke(*args, "-d", "A100-80GB")
    assert code == 1 and out == ""
    assert text in err
