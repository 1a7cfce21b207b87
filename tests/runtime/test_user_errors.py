"""Errors name the user's code: the function and input of a failing map, futures nested in
arguments, and a failed task graph's traceback printed once."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

import hetero
from hetero.errors import HeteroError, TaskFailed


def fails_on_five(x: int) -> int:
    if x == 5:
        raise ValueError(f"bad value {x}")
    return x


def add(a: int, b: int) -> int:
    return a + b


def total(values: Any) -> int:
    if isinstance(values, dict):
        values = values.values()
    return sum(total(v) if isinstance(v, (list, tuple, set, dict)) else v for v in values)


class Holder(NamedTuple):
    value: Any


@pytest.fixture
def ctx() -> Iterator[hetero.Context]:
    with hetero.Context() as context:
        yield context


def test_a_failing_function_in_a_map_names_the_function_and_the_input(
    ctx: hetero.Context,
) -> None:
    with pytest.raises(TaskFailed) as info:
        list(ctx.map(fails_on_five, range(10), batch_size=3))
    err = info.value
    first_line = str(err).splitlines()[0]
    assert "fails_on_five" in first_line and "input 5" in first_line, first_line
    assert "ValueError: bad value 5" in first_line
    assert isinstance(err.__cause__, ValueError)  # the user's own exception
    assert err.remote_traceback is not None and "in fails_on_five" in err.remote_traceback


def test_an_unpicklable_function_in_a_map_is_named(ctx: hetero.Context) -> None:
    lock = threading.Lock()

    def locked(x: int) -> int:
        with lock:
            return x

    with pytest.raises(HeteroError, match="does not pickle") as info:
        ctx.map(locked, range(3))
    assert "locked" in str(info.value) and "_Batch" not in str(info.value)


def test_futures_nested_in_lists_tuples_and_dicts_are_resolved(ctx: hetero.Context) -> None:
    f = ctx.submit(add, 1, 2)
    g = ctx.submit(add, f, 10)
    assert ctx.submit(total, [f, 1]).result(timeout=30) == 4
    assert ctx.submit(total, {"a": f, "b": [g, (f, 1)]}).result(timeout=30) == 3 + 13 + 3 + 1
    assert ctx.submit(total, values=[[[f]]]).result(timeout=30) == 3


def test_a_failed_future_nested_in_a_list_fails_its_child(ctx: hetero.Context) -> None:
    parent = ctx.submit(fails_on_five, 5)
    with pytest.raises(TaskFailed, match=r"parent task \d+ failed"):
        ctx.submit(total, [parent, 1]).result(timeout=30)


def test_a_future_inside_another_object_is_refused_saying_so(ctx: hetero.Context) -> None:
    f = ctx.submit(add, 1, 2)
    with pytest.raises(HeteroError, match="future") as info:
        ctx.submit(total, Holder(f)).result(timeout=30)
    assert "RLock" not in str(info.value)


def test_a_failure_in_a_task_graph_prints_its_traceback_once(ctx: hetero.Context) -> None:
    parent = ctx.submit(fails_on_five, 5)
    child = ctx.submit(add, parent, 1)
    grandchild = ctx.submit(add, child, 1)
    with pytest.raises(TaskFailed) as info:
        grandchild.result(timeout=30)
    printed = "".join(traceback.format_exception(info.value))
    assert printed.count("in fails_on_five") == 1, printed
    assert "task" in str(info.value) and "ValueError: bad value 5" in str(info.value)
