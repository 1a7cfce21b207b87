"""The execution engine: the local backend (one worker process per device)."""

from __future__ import annotations
