"""SGLang: ``/v1/loads`` (per data-parallel rank: running and waiting requests, its cap, token
use and cache hits), or on releases without it ``/get_load`` and the cap from
``/get_server_info``. Counts are summed over ranks; fractions are their mean."""

from __future__ import annotations

from typing import Any

import aiohttp

from hetero.serve.engines.base import (
    EngineAdapter,
    LoadError,
    LoadSample,
    count,
    fraction,
    get_body,
    parse_json,
)

__all__ = ["SGLang"]


def _server_caps(info: dict[str, Any]) -> tuple[object, object]:
    """``max_running_requests`` and ``max_total_num_tokens`` in force, from ``/get_server_info``.
    The top-level ``max_running_requests`` is the launch argument (null unless given); the
    scheduler's figures are in ``internal_states``, one per data-parallel rank."""
    cap, tokens = info.get("max_running_requests"), info.get("max_total_num_tokens")
    states = info.get("internal_states")
    if isinstance(states, list) and states and all(isinstance(x, dict) for x in states):
        per_rank = [x.get("effective_max_running_requests_per_dp") for x in states]
        if all(c is not None for c in per_rank):
            cap = sum(count(c, "effective_max_running_requests_per_dp") for c in per_rank)
    return cap, tokens


class SGLang(EngineAdapter):
    name = "sglang"

    def __init__(self) -> None:
        self.cap: int | None = None
        self.kv_tokens: int | None = None
        self.loads = True  # /v1/loads answers (False: only /get_load)

    async def detect(self, session: aiohttp.ClientSession, url: str, timeout: float) -> bool:
        body = await get_body(session, url + "/get_server_info", timeout, missing_ok=True)
        if body is None:
            return False
        try:
            info = parse_json(body, "/get_server_info")
        except LoadError:
            return False
        if not isinstance(info, dict) or not (
            "max_running_requests" in info or "max_total_num_tokens" in info
        ):
            return False  # another server's page of that name
        cap, tokens = _server_caps(info)
        self.cap = (count(cap, "max_running_requests") or None) if cap is not None else None
        self.kv_tokens = count(tokens, "max_total_num_tokens") if tokens is not None else None
        self.loads = True
        return True

    async def read(self, session: aiohttp.ClientSession, url: str, timeout: float) -> LoadSample:
        if self.loads:
            body = await get_body(session, url + "/v1/loads", timeout, missing_ok=True)
            if body is not None:
                return self._loads(body)
            self.loads = False  # an older release: ask /get_load from now on
        body = await get_body(session, url + "/get_load", timeout)
        assert body is not None
        return self._get_load(body)

    def _loads(self, body: bytes) -> LoadSample:
        data = parse_json(body, "/v1/loads")
        ranks = data.get("loads") if isinstance(data, dict) else None
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
            raise LoadError(f"/v1/loads has no list of loads: {body[:60]!r}")
        running = sum(count(r.get("num_running_reqs"), "num_running_reqs") for r in ranks)
        waiting = sum(count(r.get("num_waiting_reqs"), "num_waiting_reqs") for r in ranks)
        caps = [r.get("max_running_requests") for r in ranks]
        cap = (
            sum(count(c, "max_running_requests") for c in caps)
            if all(c is not None for c in caps)
            else self.cap
        )
        tokens = [r.get("max_total_num_tokens") for r in ranks]
        kv_tokens = (
            sum(count(t, "max_total_num_tokens") for t in tokens)
            if all(t is not None for t in tokens)
            else self.kv_tokens
        )
        return LoadSample(
            running=running,
            waiting=waiting,
            cap=cap or None,
            kv_usage=_mean(ranks, "token_usage"),
            kv_tokens=kv_tokens,
            prefix_hit_rate=_mean(ranks, "cache_hit_rate"),
        )

    def _get_load(self, body: bytes) -> LoadSample:
        data = parse_json(body, "/get_load")
        ranks = data if isinstance(data, list) else [data]
        if not ranks or not all(isinstance(r, dict) for r in ranks):
            raise LoadError(f"/get_load is not a list of loads: {body[:60]!r}")
        total = sum(count(r.get("num_reqs"), "num_reqs") for r in ranks)
        waiting = sum(count(r.get("num_waiting_reqs", 0), "num_waiting_reqs") for r in ranks)
        if waiting > total:
            raise LoadError(f"/get_load: num_waiting_reqs ({waiting}) > num_reqs ({total})")
        return LoadSample(
            running=total - waiting, waiting=waiting, cap=self.cap, kv_tokens=self.kv_tokens
        )


def _mean(ranks: list[dict[str, Any]], key: str) -> float | None:
    values = [r.get(key) for r in ranks]
    if any(v is None for v in values):
        return None
    return sum(fraction(v, key) for v in values) / len(values)
