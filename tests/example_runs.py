"""Run one of examples/ as a user runs it: a fresh process, from the repository's root."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def run_example(*args: str, cwd: Path = ROOT, timeout: float = 120) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout
