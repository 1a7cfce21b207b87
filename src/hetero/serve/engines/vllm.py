"""vLLM: its Prometheus ``/metrics`` page (the v1 engine's names, and the older ones).

Each data-parallel engine writes its own line (label ``engine``): counts are summed over
them, the KV cache's use is their mean.
"""

from __future__ import annotations

import aiohttp

from hetero.serve.engines.base import (
    MAX_COUNT,
    EngineAdapter,
    LoadError,
    LoadSample,
    count,
    fraction,
    get_body,
)
from hetero.serve.engines.prometheus import labels, samples

__all__ = ["VLLM"]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # new name, before 0.10
PREFIX = (
    ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"),
    ("vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"),
)
CACHE_CONFIG = "vllm:cache_config_info"  # its labels: block_size, num_gpu_blocks
# Each read looks for the current names; the older ones only when those are absent (every
# name searched for and absent costs a pass over the whole page).
_NAMES = (RUNNING, WAITING, KV_USAGE[0], *PREFIX[0])


class VLLM(EngineAdapter):
    name = "vllm"

    def __init__(self) -> None:
        self.seen = ""  # why detect said no

    async def detect(self, session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
        body = await get_body(session, url + "/metrics", timeout, missing_ok=True)
        if body is None:
            return False  # no /metrics at all: a plain OpenAI server
        if RUNNING.encode() not in body:
            self.seen = f"/metrics is not vLLM's page (no {RUNNING})"
            return False
        return True

    async def read(self, session: aiohttp.ClientSession, url: str, timeout: float) -> LoadSample:
        body = await get_body(session, url + "/metrics", timeout)
        assert body is not None
        return parse(body)


def parse(body: bytes) -> LoadSample:
    """The load on a vLLM ``/metrics`` page."""
    found = samples(body, _NAMES)
    if not found[KV_USAGE[0]]:
        found |= samples(body, KV_USAGE[1:])
    if not found[PREFIX[0][0]]:
        found |= samples(body, PREFIX[1])
    if not found[RUNNING] or not found[WAITING]:
        raise LoadError(f"/metrics is not vLLM's page now (no {RUNNING} and {WAITING} lines)")
    running = sum(count(v, RUNNING) for v in found[RUNNING])
    waiting = sum(count(v, WAITING) for v in found[WAITING])
    kv_usage = None
    for name in KV_USAGE:
        if found[name]:
            values = [fraction(v, name) for v in found[name]]
            kv_usage = sum(values) / len(values)
            break
    hit_rate = queries = hits = None
    for queries_name, hits_name in PREFIX:
        if found[queries_name] and found[hits_name]:
            queries = sum(count(v, queries_name) for v in found[queries_name])
            hits = sum(count(v, hits_name) for v in found[hits_name])
            if hits > queries:
                raise LoadError(f"{hits_name} ({hits}) is more than {queries_name} ({queries})")
            hit_rate = hits / queries if queries else None
            break
    return LoadSample(
        running=running,
        waiting=waiting,
        kv_usage=kv_usage,
        kv_tokens=_kv_tokens(body),
        prefix_hit_rate=hit_rate,
        prefix_queries=queries,
        prefix_hits=hits,
    )


def _kv_tokens(body: bytes) -> int | None:
    """Tokens the KV caches hold, from the cache config's labels (summed over data-parallel
    engines); None where the page does not say, or says more than ``MAX_COUNT`` (a label of
    400 digits would overflow the router's arithmetic, and one of 4,000 the JSON of
    ``/status``)."""
    total = 0
    for config in labels(body, CACHE_CONFIG):
        blocks, size = _digits(config.get("num_gpu_blocks")), _digits(config.get("block_size"))
        if blocks is None or size is None:
            return None
        total += blocks * size
    return total if 0 < total <= MAX_COUNT else None


def _digits(label: str | None) -> int | None:
    """A label's whole number of at most 16 ASCII digits (2**53 has 16), else None."""
    if label is None or not (label.isascii() and label.isdigit() and len(label) <= 16):
        return None
    return int(label)
