"""The session's real vLLM fleet: two CPU engines of different speed, started once per run.

``vllm_fleet`` makes the two tiny models (``tests.vllm_engine.make_model``), starts a small one
on core 0 and a large one (about ten times slower per token) on core 1, both serving the same
model name, as a router's replicas would, and stops them at the end of the run. Where vLLM cannot
run, every test that asks for it is skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.vllm_engine import (
    Size,
    VllmReplica,
    make_model,
    models_dir,
    start_replicas,
    stop_replicas,
    vllm_available,
)

#: The model name both replicas serve.
MODEL = "tiny-llama"


@dataclass(frozen=True)
class VllmEndpoint:
    name: str  # the replica's: "small" or "large"
    url: str  # http://127.0.0.1:PORT
    model: str  # the served model name (MODEL for both)
    size: Size
    core: int
    # The server itself, for a test that kills it (and must start it again before it ends).
    process: VllmReplica = field(compare=False, repr=False)


@dataclass(frozen=True)
class VllmFleet:
    replicas: tuple[VllmEndpoint, ...]

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def __getitem__(self, name: str) -> VllmEndpoint:
        return next(r for r in self.replicas if r.name == name)


@pytest.fixture(scope="session")
def vllm_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmFleet]:
    reason = vllm_available()
    if reason is not None:
        pytest.skip(reason)
    cores = (0, 1) if (os.cpu_count() or 1) >= 2 else (0, 0)
    logs = tmp_path_factory.mktemp("vllm-logs")
    sizes: tuple[Size, Size] = ("small", "large")
    replicas = [
        VllmReplica(make_model(models_dir() / size, size=size), MODEL, core=core, log_dir=logs)
        for size, core in zip(sizes, cores, strict=True)
    ]
    start_replicas(replicas)
    try:
        yield VllmFleet(
            tuple(
                VllmEndpoint(size, r.url, MODEL, size, core, r)
                for size, core, r in zip(sizes, cores, replicas, strict=True)
            )
        )
    finally:
        stop_replicas(replicas)
