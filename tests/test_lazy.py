"""``import hetero`` and a worker's imports stay light: public names load on first use."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hetero


def loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_import_hetero_loads_no_subsystem_until_a_name_is_used() -> None:
    loaded = loaded_after("import hetero")
    assert not {"hetero.config", "pydantic", "hetero.sched", "hetero.runtime.context"} & loaded
    assert "hetero.sched.dispatcher" in loaded_after("import hetero; hetero.Dispatcher")


def test_a_worker_process_imports_neither_the_config_nor_the_scheduler() -> None:
    loaded = loaded_after("from hetero.runtime.worker import main")
    assert not {"pydantic", "hetero.config", "hetero.sched", "scipy"} & loaded


def test_names_and_subpackages_resolve_and_unknown_names_fail() -> None:
    assert hetero.task.__module__ == "hetero.runtime.tasks"
    assert hetero.sched.Dispatcher is hetero.Dispatcher
    assert set(hetero.__all__) <= set(dir(hetero))
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        hetero.nothing_here  # noqa: B018
