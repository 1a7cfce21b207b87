"""The command line reads tidily: help without typer's type noise, counts in agreement, tables
that do not leave one column alone below, suggestions for near-miss names, and docs whose
commands and claims match what the CLI does."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.testing import CliRunner

from hetero._cli_util import ParagraphHelpFormatter, rewrap_help
from hetero._format import plain_text
from hetero.cli import app
from hetero.devices.catalog import get_catalog
from hetero.errors import ConfigError, DeviceError
from hetero.sched.registry import make_policy, policy_names
from tests.rendering import flat, headers

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent


def _command_paths() -> list[list[str]]:
    """Every command and group of ``hetero``, as the words that name it."""
    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        paths.append(path)
        if isinstance(command, TyperGroup):
            for name, sub in command.commands.items():
                walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return paths


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "hetero")
def test_help_names_values_not_types(path: list[str]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    options = result.stdout.split("Options")[1].split("╰")[0]
    assert not re.search(r"<(bool|str|int|float|path)>", options), options


def test_help_of_a_value_option_names_its_value() -> None:
    text = flat(runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"}).stdout)
    assert "--workload -w WORKLOAD" in text and "--json Print JSON" in text
    top = flat(runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout)
    assert "--log-level LOG_LEVEL" in top and "--help Show this message" in top


def test_command_summaries_are_one_line_each() -> None:
    text = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    devices = next(line for line in text.splitlines() if "│ devices " in line)
    assert "those of every node of a Ray cluster" in devices


def _fleet_file(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text("devices:\n" + lines)
    return path


def test_one_device_is_singular(tmp_path: Path) -> None:
    one = _fleet_file(tmp_path, "  - {type: gpu, model: T4, emulate: true}\n")
    listed = runner.invoke(app, ["devices", "-c", str(one)], env={"COLUMNS": "200"})
    assert "1 device" in listed.stdout and "1 devices" not in listed.stdout
    checked = runner.invoke(app, ["config", "validate", str(one)])
    assert "1 device," in flat(checked.stdout), checked.output


def test_devices_at_80_columns_leave_no_column_alone_below(tmp_path: Path) -> None:
    fleet = _fleet_file(tmp_path, "  - {type: gpu, model: A100-80GB, emulate: true, count: 2}\n")
    text = runner.invoke(app, ["devices", "-c", str(fleet)], env={"COLUMNS": "80"}).stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    assert all(len(h) > 2 for h in headers(text)[1:]), headers(text)


def test_near_miss_strategy_names_get_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=r"did you mean 'tail_budget'\?"):
        make_policy("tail-budget")
    serve = runner.invoke(
        app, ["serve", "-r", "http://127.0.0.1:9=speed:1", "--strategy", "tail-budget"]
    )
    assert serve.exit_code == 1 and "did you mean 'tail_budget'?" in serve.stderr


def test_a_model_name_that_several_share_suggests_them_only() -> None:
    with pytest.raises(DeviceError) as caught:
        get_catalog().get("V100")
    message = str(caught.value)
    assert "V100-16GB" in message and "V100-32GB" in message
    assert "H100" not in message  # a spelling neighbour, not what V100 means


def test_docs_name_commands_that_exist() -> None:
    serve = (ROOT / "docs" / "serve.md").read_text("utf-8")
    assert "hetero policies list" not in serve and "`hetero policies`" in serve


def test_install_lines_work_from_a_checkout() -> None:
    texts = [p.read_text("utf-8") for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]]
    texts += [p.read_text("utf-8") for p in (ROOT / "src" / "hetero").rglob("*.py")]
    lines = [line for text in texts for line in text.splitlines() if "pip install" in line]
    assert lines and not [line for line in lines if "hetero-core[" in line]


def test_readme_counts_match_the_cli() -> None:
    readme = (ROOT / "README.md").read_text("utf-8")
    catalog = re.search(r"hetero catalog list\s+# (\d+) accelerators", readme)
    assert catalog and int(catalog.group(1)) == len(list(get_catalog()))
    policies = re.search(r"hetero policies\s+# the (\d+) scheduling policies", readme)
    assert policies and int(policies.group(1)) == len(policy_names())


# --- hetero policies: plain text, the list alias, columns by width ----------------------------


def test_policies_list_is_the_listing_that_serve_help_points_to() -> None:
    serve = flat(runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).stdout)
    assert "see `hetero policies list`" in serve
    listed = runner.invoke(app, ["policies", "list"], env={"COLUMNS": "120"})
    plain = runner.invoke(app, ["policies"], env={"COLUMNS": "120"})
    assert listed.exit_code == 0 and plain.exit_code == 0, listed.output + plain.output
    assert listed.stdout == plain.stdout
    assert all(name in listed.stdout for name in policy_names())


def test_policies_show_plain_text_not_markup() -> None:
    text = runner.invoke(app, ["policies"], env={"COLUMNS": "200"}).stdout
    assert "``" not in text and ":class:" not in text and "`" not in text
    # ``overtake_weight`` in the adaptive policy's docstring reads as the bare name.
    assert "Shortest expected delay (overtake_weight as there)" in flat(text)


def test_policies_at_80_columns_leave_out_the_options_and_say_so() -> None:
    narrow = runner.invoke(app, ["policies"], env={"COLUMNS": "80"}).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 80 and "…" not in narrow
    assert headers(narrow) == [["name", "when to use it"]]
    assert "not shown at 80 columns: options" in flat(narrow)
    assert all(name in narrow for name in policy_names())  # names whole, never cut
    wide = runner.invoke(app, ["policies"], env={"COLUMNS": "160"}).stdout
    assert headers(wide) == [["name", "when to use it", "options"]]
    assert "not shown" not in wide and "budget_factor" in flat(wide)


@pytest.mark.parametrize(
    ("rst", "plain"),
    [
        ("the ``cost`` of an item", "the cost of an item"),
        (
            ":class:`hetero.sched.Policy` and :meth:`~hetero.sched.Policy.pick`",
            "hetero.sched.Policy and pick",
        ),
        ("see `the dispatcher <hetero.sched.Dispatcher>`_", "see the dispatcher"),
        ("a *very*\n    **plain** text, 2 * 3 * 4", "a very plain text, 2 * 3 * 4"),
    ],
)
def test_plain_text_drops_rst_markup(rst: str, plain: str) -> None:
    assert plain_text(rst) == plain


# --- help texts: rewrapped by paragraph ------------------------------------------------------


def test_help_sentences_are_not_broken_where_the_source_breaks_them() -> None:
    top = runner.invoke(app, ["top", "--help"], env={"COLUMNS": "200"}).stdout
    line = next(line for line in top.splitlines() if "Examples:" in line)
    assert "`hetero top -c fleet.yaml`, `hetero top --serve http://127.0.0.1:8080`." in line
    policies = runner.invoke(app, ["policies", "--help"], env={"COLUMNS": "200"}).stdout
    assert any(
        "scheduler.options), `Context(strategy=...)`" in line for line in policies.splitlines()
    )


DOC = """First paragraph
runs on here.

- an item
  that wraps
- another item

    hetero top --once
    hetero top --pid 42

Last words.
"""


def test_rewrap_keeps_blank_lines_lists_and_indented_blocks() -> None:
    assert rewrap_help(DOC) == (
        "First paragraph runs on here.\n\n"
        "- an item that wraps\n- another item\n\n"
        "    hetero top --once\n    hetero top --pid 42\n\n"
        "Last words."
    )


def test_the_argparse_formatter_wraps_paragraphs_to_the_width() -> None:
    parser = argparse.ArgumentParser(
        prog="demo", description=DOC, formatter_class=ParagraphHelpFormatter
    )
    text = parser.format_help()
    assert "First paragraph runs on here.\n\n- an item that wraps\n- another item\n\n" in text
    assert "    hetero top --once\n    hetero top --pid 42\n\nLast words." in text
    narrow = argparse.ArgumentParser(
        prog="demo",
        description="one two three four five six seven eight nine ten " * 3,
        formatter_class=lambda prog: ParagraphHelpFormatter(prog, width=30),
    ).format_help()
    body = narrow.split("\n\n")[1].splitlines()
    assert len(body) > 2 and max(map(len, body)) <= 30
