"""A task's traceback names the user's file and line, not cloudpickle's ``<dynamic-code>``, and
is printed only when nothing catches the error: a caught ``TaskFailed`` says its reason in one
line and carries the traceback as a note (Python prints notes with an uncaught error)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from hetero.runtime.tracebacks import readable_traceback

SCRIPT = """\
import sys

import hetero


def helper(x):
    raise ValueError(f"bad value {x}")


@hetero.task(cost=0.01)
def boom(x):
    return helper(x)


if __name__ == "__main__":
    devices = [{"type": "gpu", "model": "T4", "emulate": True}]
    config = hetero.HeteroConfig(devices=devices)
    with hetero.Context(config, time_scale=0.01) as ctx:
        if sys.argv[1] == "caught":
            try:
                ctx.run(boom, 3)
            except hetero.TaskFailed as exc:
                print(f"caught: {exc}")
                print(f"note: {exc.__notes__[0].splitlines()[1]}")
        else:
            ctx.run(boom, 3)
"""
HELPER_LINE = 7  # raise ValueError(...)
BOOM_LINE = 12  # return helper(x)


def _run(script: Path, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "user_job.py"
    path.write_text(SCRIPT)
    return path


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11's")
def test_a_caught_failure_prints_nothing_and_says_its_reason_in_one_line(script: Path) -> None:
    done = _run(script, "caught")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "dynamic-code" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "caught: task 1 (boom) failed: ValueError: bad value 3"
    # The note's first frame is the user's function, in the user's file.
    assert lines[1] == f'note:   File "{script}", line {BOOM_LINE}, in boom'


def test_an_uncaught_failure_shows_the_users_file_lines_and_source(script: Path) -> None:
    done = _run(script, "uncaught")
    assert done.returncode == 1
    err = done.stderr
    assert "<dynamic-code>" not in err
    assert f'File "{script}", line {BOOM_LINE}, in boom\n    return helper(x)' in err
    assert f'File "{script}", line {HELPER_LINE}, in helper\n    raise ValueError' in err
    assert "run_order" not in err  # the worker's own frames are left out
    assert err.count('in helper\n    raise ValueError(f"bad value {x}")') == 1  # printed once


def _module(tmp_path: Path, name: str, source: str) -> ModuleType:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_frames_map_to_functions_methods_lambdas_and_wrapped_tasks(tmp_path: Path) -> None:
    module = _module(
        tmp_path,
        "shipped",
        """\
        import hetero

        class Model:
            def step(self, x):
                return x / 0

        square = lambda x: (
            x * x
        )

        @hetero.task(cost=1.0)
        def job(x):
            def inner(y):
                return y + 1
            return inner(x)
        """,
    )
    path = str(tmp_path / "shipped.py")
    remote = (
        "Traceback (most recent call last):\n"
        '  File "/site/hetero/runtime/worker.py", line 303, in run_order\n'
        "    result = fn(*args, **kwargs)\n"
        '  File "<dynamic-code>", line 15, in job\n'
        '  File "<dynamic-code>", line 14, in inner\n'
        '  File "<dynamic-code>", line 8, in <lambda>\n'
        '  File "<dynamic-code>", line 5, in step\n'
        '  File "<dynamic-code>", line 99, in nowhere\n'
        "ZeroDivisionError: division by zero\n"
    )
    shown = readable_traceback(remote, [module])
    assert shown == (
        "Traceback (most recent call last):\n"
        f'  File "{path}", line 15, in job\n'
        "    return inner(x)\n"
        f'  File "{path}", line 14, in inner\n'
        "    return y + 1\n"
        f'  File "{path}", line 8, in <lambda>\n'
        "    x * x\n"
        f'  File "{path}", line 5, in step\n'
        "    return x / 0\n"
        '  File "<dynamic-code>", line 99, in nowhere\n'  # no such code: left as it was
        "ZeroDivisionError: division by zero\n"
    )


def test_hetero_frames_stay_when_the_users_code_never_ran() -> None:
    remote = (
        "Traceback (most recent call last):\n"
        '  File "/site/hetero/runtime/worker.py", line 280, in run_order\n'
        "    fn = _function(state, order.fn, str(device.type))\n"
        "ModuleNotFoundError: No module named 'mine'\n"
    )
    assert readable_traceback(remote, []) == remote
