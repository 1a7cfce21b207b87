"""How many requests per second one replica serves within a TTFT/TPOT SLO: the engine model's
step time (:class:`hetero.serve.engine_model.StepCost`, the roofline the emulator runs and the
router's prior is made from) read in the steady state of a continuous batcher.

With ``B`` requests decoding and requests of ``p`` prompt and ``o`` output tokens arriving at
the rate that keeps ``B`` running, each step decodes one token of each running request and
prefills ``B·p/o`` prompt tokens of new ones (chunked prefill shares every step). The step then
reads the weights and ``B·(p + o/2)`` KV tokens and computes ``B·(1 + p/o)`` tokens:

- **TPOT** is that step's time ``τ(B)``;
- **TTFT** is half a step of waiting plus the step that holds the request's own prefill
  (``B`` decodes and its ``p`` tokens; a prompt longer than the step's token budget takes more
  steps);
- **throughput** is ``B / (o·τ + TTFT)`` requests per second (Little's law).

The largest ``B`` that keeps TPOT and TTFT within the SLO, ``B·(1 + p/o)`` within the token
budget, ``B`` within ``max_num_seqs`` and ``B·(p + o/2)`` within the KV cache (less a tenth:
growth above the mean must not preempt) sets the replica's capacity for requests of that size.
Every term grows with ``B``, so the largest is found by bisection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hetero.serve.engine_model import EngineSpec

__all__ = ["KV_HEADROOM", "ReplicaCapacity", "replica_capacity"]

#: The share of the KV cache the mean occupancy may take (the rest absorbs requests that run
#: longer than the mean before others finish).
KV_HEADROOM = 0.9


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """One replica's capacity for requests of one size, or why it has none (``reason``)."""

    rate: float  # requests/s at the largest batch within the SLO; 0 when none
    batch: int  # that batch
    tpot: float  # seconds per output token at that batch
    ttft: float  # seconds to the first token at that batch
    limit: str  # what stops the batch growing: tpot, ttft, kv, max_num_seqs, token_budget
    reason: str | None = None

    @property
    def eligible(self) -> bool:
        return self.reason is None


def _step(engine: EngineSpec, batch: int, prompt: float, output: float) -> float:
    """Seconds of a steady-state step with ``batch`` requests decoding."""
    prefill = batch * prompt / output
    held = batch * (prompt + output / 2)
    attended = held + prefill * prompt / 2
    return engine.cost.time(
        max(1, round(batch + prefill)), round(held), round(attended), requests=batch
    )


def _ttft(engine: EngineSpec, batch: int, prompt: float, step: float) -> float:
    """Half a step of waiting, then the steps that prefill ``prompt`` beside ``batch``
    decodes."""
    room = engine.max_num_batched_tokens - batch
    if room <= 0:
        return math.inf
    chunks = max(1, math.ceil(prompt / room))
    # Each chunk step: its share of the prompt and of its attention, beside the decodes.
    share = prompt / chunks
    held = round(batch * prompt + prompt)
    attended = round(prompt * prompt / 2 / chunks)
    chunk = engine.cost.time(round(batch + share), held, attended, requests=batch + 1)
    return step / 2 + chunks * chunk


def _at(
    engine: EngineSpec, batch: int, prompt: float, output: float, design_prompt: float
) -> tuple[float, float, float]:
    """``(tpot, ttft of the design prompt, requests/s)`` at ``batch``."""
    tpot = _step(engine, batch, prompt, output)
    ttft = _ttft(engine, batch, design_prompt, tpot)
    mean_ttft = _ttft(engine, batch, prompt, tpot)
    return tpot, ttft, batch / (output * tpot + mean_ttft)


def replica_capacity(
    engine: EngineSpec,
    prompt: float,
    output: float,
    *,
    ttft: float,
    tpot: float,
    design_prompt: float | None = None,
    design_total: float | None = None,
) -> ReplicaCapacity:
    """The capacity of a replica running ``engine`` for requests of ``prompt`` and ``output``
    tokens on average, within ``ttft`` and ``tpot`` seconds. ``design_prompt`` is the longest
    prompt whose TTFT is checked, ``design_total`` the longest request (prompt and output) the
    replica must hold; both default to the means."""
    prompt, output = max(0.0, prompt), max(1.0, output)
    design_prompt = max(prompt, design_prompt or 0.0)
    longest = max(prompt + output, design_total or 0.0)
    if longest > engine.max_context:
        reason = (
            f"a request of {longest:,.0f} tokens is longer than the {engine.max_context:,} a "
            "replica holds"
        )
        return ReplicaCapacity(0.0, 0, math.inf, math.inf, "kv", reason)

    def fits(batch: int) -> str | None:
        """What ``batch`` breaks, or None."""
        if batch > engine.max_num_seqs:
            return "max_num_seqs"
        if batch * (1 + prompt / output) > engine.max_num_batched_tokens and batch > 1:
            return "token_budget"
        if batch * (prompt + output / 2) > KV_HEADROOM * engine.kv_tokens and batch > 1:
            return "kv"
        step_s, first_s, _ = _at(engine, batch, prompt, output, design_prompt)
        if step_s > tpot:
            return "tpot"
        if first_s > ttft:
            return "ttft"
        return None

    alone = fits(1)
    if alone is not None:
        step_s, first_s, _ = _at(engine, 1, prompt, output, design_prompt)
        if alone == "tpot":
            why = f"TPOT alone is {step_s * 1e3:,.1f} ms, above the SLO's {tpot * 1e3:,.1f} ms"
        else:
            why = (
                f"TTFT of a {design_prompt:,.0f}-token prompt alone is {first_s:,.2f} s, above "
                f"the SLO's {ttft:g} s"
            )
        return ReplicaCapacity(0.0, 0, step_s, first_s, alone, why)
    low, high = 1, engine.max_num_seqs + 1  # fits(low); high breaks
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid) is None:
            low = mid
        else:
            high = mid
    step_s, first_s, rate = _at(engine, low, prompt, output, design_prompt)
    limit = fits(high) or "max_num_seqs"
    return ReplicaCapacity(rate, low, step_s, first_s, limit)
