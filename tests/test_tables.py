from __future__ import annotations

from hetero._tables import SplitTable
from tests.rendering import assert_whole, headers, render


def _fleet(key_columns: int = 1) -> SplitTable:
    table = SplitTable(title="fleet", caption="speed: relative to a V100", key_columns=key_columns)
    for name in ("id", "model", "memory", "speed", "health"):
        table.add_column(name)
    table.add_row("a100-80gb:0", "A100-80GB", "80 GiB", "2.50", "healthy")
    table.add_row("cpu:0", "Intel(R) Xeon(R) Processor", "23.54 GiB", "0.01", "healthy")
    return table


CELLS = ["a100-80gb:0", "cpu:0", "Intel(R) Xeon(R) Processor", "23.54 GiB", "2.50", "healthy"]


def test_a_wide_console_shows_one_table() -> None:
    text = render(_fleet(), 200)
    assert headers(text) == [["id", "model", "memory", "speed", "health"]]
    assert "continued" not in text


def test_columns_past_the_width_move_whole_into_tables_below() -> None:
    text = render(_fleet(), 64)  # id to speed take 64 columns
    assert_whole(text, 64, CELLS)
    assert headers(text) == [["id", "model", "memory", "speed"], ["id", "health"]]
    lines = text.splitlines()
    assert lines[0].strip() == "fleet"
    assert sum("fleet (continued)" in line for line in lines) == 1
    assert lines[-1].strip() == "speed: relative to a V100"  # once, under the last table
    assert text.count("speed: relative") == 1


def test_key_columns_repeat_in_every_table() -> None:
    text = render(_fleet(key_columns=2), 64)
    assert headers(text) == [["id", "model", "memory", "speed"], ["id", "model", "health"]]


def test_a_console_too_narrow_for_one_column_beside_the_keys_squeezes_it() -> None:
    text = render(_fleet(), 24)
    assert [h[0] for h in headers(text)] == ["id"] * 4
    assert max(len(line) for line in text.splitlines()) <= 24
