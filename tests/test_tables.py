from __future__ import annotations

from hetero._tables import FitTable
from tests.rendering import assert_whole, flat, headers, render

CELLS = ["a100-80gb:0", "cpu:0", "Intel(R) Xeon(R) Processor", "23.54 GiB", "2.50", "healthy"]


REASON = (
    "bucket 10 (1,365–66,120 work units, mean 4,187 tokens) takes 1.64 s for its "
    "4,275-work-unit design request, above half the 1.5 s SLO"
)


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


def test_a_key_column_stays_whatever_its_priority() -> None:
    table = FitTable(key_columns=2)
    table.add_column("id", priority=-9)
    table.add_column("model", priority=-9)
    table.add_column("memory", priority=5)
    table.add_row("a100-80gb:0", "Intel(R) Xeon(R) Processor", "23.54 GiB")
    text = render(table, 44)
    assert headers(text) == [["id", "model"]]
    assert "not shown at 44 columns: memory" in flat(text)
