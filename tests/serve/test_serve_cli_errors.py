"""``hetero serve``'s bad flags: a port out of range, a ``--replica`` string off its grammar, one
engine given twice. Each is a clear message naming the flag and the bad part, never a
traceback; nothing is started."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hetero.cli import app
from hetero.errors import ConfigError
from hetero.serve.replicas import REPLICA_GRAMMAR, parse_replica_flag
from tests.rendering import flat

runner = CliRunner()
URL = "http://127.0.0.1:9"  # nothing listens: none of these gets as far as connecting


@pytest.mark.parametrize(
    ("args", "flag", "value"),
    [
        (["serve", "--port", "99999", "-r", URL], "--port", "99999"),
        (["serve", "--port", "-1", "-r", URL], "--port", "-1"),
        (["serve", "--admin-port", "65536", "-r", URL], "--admin-port", "65536"),
        (["mock-replica", "--port", "70000"], "--port", "70000"),
        (["mock-model", "/nonexistent/x", "--port", "65536"], "--port", "65536"),
    ],
)
def test_a_port_out_of_range_is_refused_naming_it(args: list[str], flag: str, value: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    text = flat(result.output)
    assert f"Invalid value for '{flag}': {value} is not a port" in text
    assert "allowed: 1 to 65535, or 0 to pick a free one" in text
    assert "Traceback" not in result.output and "OverflowError" not in result.output


def test_the_default_admin_port_past_65535_is_refused() -> None:
    result = runner.invoke(app, ["serve", "--port", "65535", "--admin-key", "k", "-r", URL])
    assert result.exit_code == 1
    assert "--admin-port: the default, --port + 1, is 65536: give --admin-port" in result.output


@pytest.mark.parametrize(
    ("flag", "part"),
    [
        (f"{URL},slots=abc", "slots: Input should be a valid integer"),
        (f"{URL},slots=abc", "(got 'abc')"),
        (f"{URL}=slots:8", "'slots:8' is neither a GPU nor speed:N"),
        (f"{URL}=slots:8", "as in URL,slots=8"),
        (f"{URL},slot=3", "bad option 'slot=3': unknown key 'slot' (did you mean slots=...?)"),
        (f"{URL},", "an empty option"),
        (f"{URL},slots=1,slots=2", "slots is given twice"),
        (f"{URL}=T4,name=", "name: String should have at least 1 character"),
        (f"{URL}=abc", "device: unknown model 'abc'"),
    ],
)
def test_a_bad_replica_string_names_the_grammar_and_the_bad_part(flag: str, part: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_replica_flag(flag)
    message = str(info.value)
    assert part in message
    assert f"{flag!r}" in message
    assert message.endswith(REPLICA_GRAMMAR)  # what -r takes, with an example
    assert "unknown model 'abc'" not in message or flag.endswith("=abc")


def test_replica_options_after_a_comma_need_no_gpu() -> None:
    config = parse_replica_flag(f"{URL},slots=8,models=a|b,name=x")
    assert (config.url, config.device, config.slots, config.models, config.name) == (
        URL,
        None,
        8,
        ["a", "b"],
        "x",
    )
    assert parse_replica_flag(f"{URL}/,name=y").url == URL
    assert parse_replica_flag(f"{URL}=slots=4").slots == 4  # the older spelling still works


def test_a_bad_replica_string_on_the_command_line_is_one_clear_line() -> None:
    result = runner.invoke(app, ["serve", "-r", f"{URL},slots=abc"], env={"COLUMNS": "300"})
    assert result.exit_code == 1
    assert result.output.startswith(f"error: --replica: '{URL},slots=abc': slots: ")
    assert "expected URL or URL=GPU or URL=speed:N" in result.output
    assert "e.g. http://10.0.0.5:8000=A100-80GB,slots=8" in result.output
    assert "Traceback" not in result.output


def test_one_engine_given_twice_is_refused() -> None:
    for args in (["-r", URL, "-r", f"{URL}/,name=b"], ["-r", URL, "-r", URL]):
        result = runner.invoke(app, ["serve", *args], env={"COLUMNS": "300"})
        assert result.exit_code == 1, result.output
        assert f"--replica: {URL} is given twice (replicas '127.0.0.1:9' and " in result.output
