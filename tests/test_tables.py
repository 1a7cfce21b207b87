from __future__ import annotations

from hetero._tables import FitTable, SplitTable
from tests.rendering import assert_whole, flat, headers, render


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
    # health alone does not fit beside id to speed; speed moves down with it, so that the
    # second table does not hold a single column.
    assert headers(text) == [["id", "model", "memory"], ["id", "speed", "health"]]
    lines = text.splitlines()
    assert lines[0].strip() == "fleet"
    assert sum("fleet (continued)" in line for line in lines) == 1
    assert lines[-1].strip() == "speed: relative to a V100"  # once, under the last table
    assert text.count("speed: relative") == 1


def test_key_columns_repeat_in_every_table() -> None:
    text = render(_fleet(key_columns=2), 64)
    assert headers(text) == [["id", "model", "memory"], ["id", "model", "speed", "health"]]


def test_a_console_too_narrow_for_one_column_beside_the_keys_squeezes_it() -> None:
    text = render(_fleet(), 24)
    assert [h[0] for h in headers(text)] == ["id"] * 4
    assert max(len(line) for line in text.splitlines()) <= 24


REASON = (
    "bucket 10 (1,365–66,120 work units, mean 4,187 tokens) takes 1.64 s for its "
    "4,275-work-unit design request, above half the 1.5 s SLO"
)


def _reasons(width: int) -> SplitTable:
    table = SplitTable(title="why not")
    table.add_column("model")
    table.add_column("count", justify="right")
    table.add_wrapping_column("reason", width=width)
    table.add_row("Intel(R) Xeon(R) Processor", "-", REASON)
    table.add_row("A100-80GB", "16", "")
    return table


def test_a_wrapping_column_wraps_beside_the_others_which_stay_whole() -> None:
    # Once the reason is down to the width of the model, rich alone would wrap both alike.
    text = render(_reasons(width=20), 64)
    assert headers(text) == [["model", "count", "reason"]]
    assert_whole(text, 64, ["Intel(R) Xeon(R) Processor", "A100-80GB", "16"])
    assert REASON in flat(text)
    assert len(text.splitlines()) > 6  # the reason over several lines


def test_a_wrapping_column_that_does_not_fit_at_its_width_moves_below() -> None:
    text = render(_reasons(width=30), 64)
    assert headers(text) == [["model", "count"], ["model", "reason"]]
    assert_whole(text, 64, ["Intel(R) Xeon(R) Processor", "A100-80GB", "16"])
    assert REASON in flat(text)


def test_a_wide_console_shows_a_wrapping_column_on_one_line() -> None:
    text = render(_reasons(width=20), 200)
    assert headers(text) == [["model", "count", "reason"]]
    assert REASON in text


# --- FitTable: leave columns out, in one table, and say which --------------------------------


def _fit(hint: str = "--json shows every field") -> FitTable:
    table = FitTable(title="fleet", caption="speed: relative to a V100", hint=hint)
    for name, priority in (("id", 9), ("model", 8), ("memory", 5), ("speed", 7), ("health", 6)):
        table.add_column(name, priority=priority)
    table.add_row("a100-80gb:0", "A100-80GB", "80 GiB", "2.50", "healthy")
    table.add_row("cpu:0", "Intel(R) Xeon(R) Processor", "23.54 GiB", "0.01", "healthy")
    return table


def test_a_table_that_fits_shows_every_column_and_no_note() -> None:
    text = render(_fit(), 200)
    assert headers(text) == [["id", "model", "memory", "speed", "health"]]
    assert "not shown" not in text and "continued" not in text


def test_a_narrow_console_leaves_out_the_lowest_priority_columns_and_names_them() -> None:
    text = render(_fit(), 64)  # id to speed take 64 columns: one column must go
    assert headers(text) == [["id", "model", "speed", "health"]]  # memory, the lowest, went
    assert_whole(text, 64, [*CELLS[:3], "2.50", "healthy"])
    assert "continued" not in text and len(headers(text)) == 1
    assert "not shown at 64 columns: memory (--json shows every field)" in flat(text)
    assert "speed: relative to a V100" in text  # the caption stays, above the note


def test_without_priorities_the_columns_added_last_go_first() -> None:
    table = FitTable()
    for name in ("id", "model", "memory", "speed", "health"):
        table.add_column(name)
    table.add_row("a100-80gb:0", "Intel(R) Xeon(R) Processor", "23.54 GiB", "0.01", "healthy")
    text = render(table, 56)
    assert headers(text) == [["id", "model", "memory"]]
    assert "not shown at 56 columns: speed, health" in flat(text)


def test_a_column_dropped_early_comes_back_when_a_wider_one_went() -> None:
    # health goes first (lowest), then the model; without the model, health fits again.
    table = FitTable()
    table.add_column("id")
    table.add_column("model", priority=2)
    table.add_column("health", priority=1)
    table.add_row("a100-80gb:0", "Intel(R) Xeon(R) Processor Gold", "healthy")
    text = render(table, 40)
    assert headers(text) == [["id", "health"]]
    assert "not shown at 40 columns: model" in flat(text)


def test_a_long_text_column_wraps_beside_the_others_which_stay_whole() -> None:
    table = FitTable(title="why not")
    table.add_column("model")
    table.add_column("count", justify="right")
    table.add_wrapping_column("reason", width=20)
    table.add_row("Intel(R) Xeon(R) Processor", "-", REASON)
    text = render(table, 64)
    assert headers(text) == [["model", "count", "reason"]]
    assert_whole(text, 64, ["Intel(R) Xeon(R) Processor"])
    assert REASON in flat(text) and "not shown" not in text


def test_only_the_key_columns_left_are_squeezed_to_the_console() -> None:
    text = render(_fit(), 12)
    assert [h[0] for h in headers(text)] == ["id"]
    assert max(len(line) for line in text.splitlines()) <= 12
