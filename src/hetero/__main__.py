from __future__ import annotations

from hetero.cli import run

run()
