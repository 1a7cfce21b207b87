"""hetero serve: a heterogeneity-aware router for inference replicas, and an emulated replica."""

from __future__ import annotations
