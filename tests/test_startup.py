"""Start-up stays light: torch (seconds and some 180 MiB to import) is imported in the driver
only when a device needs it, not for a CPU fleet, a ``Context`` on a machine without GPUs or
``hetero devices``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hetero.devices.discovery import torch_may_see_gpus

CPU_FLEET = """
    config = hetero.HeteroConfig.model_validate({"devices": [{"type": "cpu"}]})
    hetero.Context(config).close()
"""
THIS_MACHINE = """
    hetero.Context().close()
"""
DEVICES_COMMAND = """
    from typer.testing import CliRunner
    from hetero.cli import app
    result = CliRunner().invoke(app, ["devices"])
    assert result.exit_code == 0, result.output
"""


def _imports_torch(code: str) -> bool:
    script = "import sys, hetero\n" + textwrap.dedent(code) + "print('torch' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] == "True"


def test_a_cpu_fleet_does_not_import_torch() -> None:
    assert not _imports_torch(CPU_FLEET)


@pytest.mark.parametrize("code", [THIS_MACHINE, DEVICES_COMMAND], ids=["context", "devices"])
def test_discovery_imports_torch_only_where_it_may_find_a_gpu(code: str) -> None:
    if torch_may_see_gpus():
        pytest.skip("this machine shows a GPU that torch may reach: discovery asks torch")
    assert not _imports_torch(code)
