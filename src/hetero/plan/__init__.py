"""Planning before work runs: memory fit, device matching, allocation and fleet sizing."""

from __future__ import annotations
