"""A replica's engine measured before it is sent requests (strategy ``slo``): one short streamed
chat completion, alone, gives its time to first token for a prompt of known length and its time
per output token alone, and the router's fit of it starts from them instead of a guess.

Without it a replica known by its URL alone is learned from the users' requests: the first ones
sent to a replica five times slower than the guess miss their SLO, and the router tries an
idle replica it knows nothing of with a request that would otherwise wait (on real vLLM at
half the fleet's capacity, 6 of 125 requests went to two throttled replicas, TTFT p99 3.9 s,
where the fast replica alone met every request's SLO). The probe costs each replica one
request of ``PROMPT_WORDS`` words and ``OUTPUT_TOKENS`` tokens when the router starts (which
waits for it at most ``TIMEOUT_S`` seconds: a replica that does not answer in time keeps its
guess) or as the replica joins (beside its first requests, which its slow start bounds).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from hetero.serve.proxy import event_problem
from hetero.serve.upstream import Upstream, UpstreamError

__all__ = [
    "OUTPUT_TOKENS",
    "PROMPT_TOKENS",
    "PROMPT_WORDS",
    "TIMEOUT_S",
    "EngineSample",
    "measure_engine",
]

PROMPT_WORDS = 200
OUTPUT_TOKENS = 16
TIMEOUT_S = 20.0
# The probe's prompt in tokens where the replica reports no usage: 1.3 tokens a word.
PROMPT_TOKENS = round(PROMPT_WORDS * 1.3)


@dataclass(frozen=True, slots=True)
class EngineSample:
    """A lone request's times on one replica."""

    prompt_tokens: int  # as the replica counted them (its usage), else estimated
    ttft: float  # seconds from the request to its first event
    tpot: float | None  # seconds per chunk after it; None where fewer than 3 came


def probe_body(model: str) -> bytes:
    """The probe: ``PROMPT_WORDS`` plain words, ``OUTPUT_TOKENS`` tokens out, streamed."""
    words = " ".join(f"measure{i % 10} the engine" for i in range(PROMPT_WORDS // 3 + 1))
    text = " ".join(words.split()[:PROMPT_WORDS])
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": OUTPUT_TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()


async def measure_engine(
    upstream: Upstream, url: str, model: str, timeout: float = TIMEOUT_S
) -> EngineSample | None:
    """One probe of the replica at ``url`` serving ``model``; None when it did not answer a
    well-formed stream within ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    counts = [0, -1, -1]  # content chunks, completion and prompt tokens (event_problem's)
    first = last = 0.0
    try:
        async with asyncio.timeout(timeout):
            started = loop.time()
            reply = await upstream.post(url, "/v1/chat/completions", probe_body(model))
            try:
                if reply.status != 200:
                    return None
                while line := await reply.readline():
                    before = counts[0]
                    if event_problem(line, counts) is not None:
                        return None
                    if counts[0] > before:
                        last = loop.time()
                        first = first or last
            finally:
                reply.release()
    except (UpstreamError, OSError, TimeoutError, ValueError):
        return None
    if not counts[0]:
        return None
    prompt = counts[2] if counts[2] > 0 else PROMPT_TOKENS
    tpot = (last - first) / (counts[0] - 1) if counts[0] >= 3 else None
    return EngineSample(prompt, first - started, tpot)
