"""The anchors' routing as ``hetero.sched`` policies, for the simulator: what sglang-router
(0.3, its ``src/policies/*.rs``) and vllm-router (0.1.17, a fork of it) decide, so that
``bench_sim_to_real.py`` can set them beside hetero's own in virtual time. Models of other
products, kept to what the benchmark's workloads exercise, in front of vLLM workers as in the
benchmark: ``cache_aware``'s loads are the requests each worker has in flight through the
router, ``power_of_two`` compares none (see ``PowerOfTwo``), and nothing is held in the router
(the simulator's ``capacity="none"``).
"""

from __future__ import annotations

import numpy as np

from hetero.errors import ConfigError
from hetero.sched.item import WorkItem
from hetero.sched.policy import BoolArray, Policy, masked_argmin
from hetero.sched.view import FleetView
from hetero.serve.records import RouterOptions

#: No router: a replica alone, each request forwarded to its engine as it comes (with the
#: simulator's ``capacity="none"``, or held only at the engine's cap with ``"engine"``). Any
#: strategy that holds nothing back does; the router's default, ``slo``, would hold some.
NO_ROUTER = RouterOptions(strategy="shortest_expected_delay")


class CacheAware(Policy):
    """``cache_aware``. While the fleet is imbalanced (the most loaded worker holds more than
    ``balance_abs_threshold`` requests beyond the least loaded, and more than
    ``balance_rel_threshold`` times as many) the least loaded worker takes the request; else
    the worker whose prefix tree matches the most of the prompt's text, where that is more
    than ``cache_threshold`` of it, else the least loaded. The prompt joins the tree of the
    worker it goes to, either way.

    The tree is kept at the simulator's block granularity: a prompt matches as many of its
    leading blocks (``item.prefix``) as some worker was sent before, the worker last sent the
    deepest of them being the match (the tree's most recent tenant of its node). A prompt
    without blocks matches nothing. Nothing is evicted: the routers evict past 2^25 or 2^26
    characters a tree, far more than a run sends."""

    name = "anchor_cache_aware"

    def __init__(
        self,
        *,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        if not 0 <= cache_threshold <= 1:
            raise ConfigError([("cache_threshold", f"must be in [0, 1], got {cache_threshold!r}")])
        if balance_abs_threshold < 0 or not balance_rel_threshold >= 1:
            problem = (
                f"got {balance_abs_threshold!r}, {balance_rel_threshold!r}; allowed: >= 0, >= 1"
            )
            raise ConfigError([("balance thresholds", problem)])
        self._threshold = cache_threshold
        self._abs = balance_abs_threshold
        self._rel = balance_rel_threshold
        self._last: dict[int, int] = {}  # block -> the worker last sent a prompt holding it

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        if not mask.any():
            return None
        load = view.in_flight[: view.n].astype(np.float64)
        most, least = load[mask].max(), load[mask].min()
        prefix = item.prefix
        blocks = prefix.blocks if prefix is not None else ()
        i: int | None = None
        if (
            prefix is not None
            and blocks
            and not (most - least > self._abs and most > least * self._rel)
        ):
            depth = 0
            for block in blocks:
                if block not in self._last:
                    break
                depth += 1
            if depth and depth / (prefix.span or len(blocks)) > self._threshold:
                tenant = self._last[blocks[depth - 1]]
                i = tenant if tenant < view.n and mask[tenant] else None
        if i is None:
            i = masked_argmin(load, mask)
            if i is None:
                return None
        for block in blocks:
            self._last[block] = i
        return i


class VllmRouterCacheAware(CacheAware):
    """vllm-router 0.1.17's ``cache_aware`` (its default), on engines served as the benchmark
    serves them. Its prefix tree holds token ids, not text: for each chat request the router
    first asks every worker to render it (``POST /v1/chat/completions/render``, all at once,
    routing only once all have answered) and matches the rendered tokens. vLLM answers that
    endpoint only when started with ``--enable-scale-out`` (else 403, "Scale-out endpoints are
    disabled"); the benchmark's engines were started without it before 44a8b78, and there
    every request took the router's ``missing_tokens`` branch: the least loaded worker
    (requests in flight through the router), the first in its worker list on a tie; the tree
    learns nothing, so no later request has a prefix to follow either. ``tokens=True`` models
    engines that do render (the runs since, whose fleet says ``scale_out``): then it decides
    as ``CacheAware``.

    Measured with ``bench/probe_vllm_router_render.py``
    (``bench/results/probe_vllm_router_render.json``): the real router (default flags, as
    ``bench/_serve_procs.py`` starts it) in front of three fake vLLM workers, one 5x slower than
    the others; 30 conversations of 5 turns (system prompts of 3,000 characters, one to each 8
    conversations), 4 at once; three runs of each variant. With vLLM's 403 for the render: in
    each run all 150 requests counted ``outcome="missing_tokens"`` in
    ``vllm_router_prefix_routing_decisions_total`` (each worker asked for 150 renders) and went
    to a worker with the fewest in flight, all but 0-3 of the run's 45-80 ties to the first of
    the router's list (its "Router ready" line: a hash map's order, different at each start);
    93-99 of the 120 continuing turns stayed on the previous turn's worker, by that chance
    alone (the count moves with the speeds, the timings and that order). sglang-router
    0.3.2's ``cache_aware`` in the same runs: 120 of 120. The render answered with token ids:
    146 ``prefix_hit`` and 4 ``prefix_miss`` (one per system prompt) in each run, 120 of 120
    continuing turns on the same worker, as sglang-router. Not modelled: the render round
    trip, which adds the slowest worker's answer to it to each request's time (a request
    served by a fast worker 0.20-0.21 s, 0.69-0.71 s with the slow worker's 403 held
    0.5 s)."""

    name = "anchor_vllm_router_cache_aware"

    def __init__(
        self,
        *,
        tokens: bool = False,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        super().__init__(
            cache_threshold=cache_threshold,
            balance_abs_threshold=balance_abs_threshold,
            balance_rel_threshold=balance_rel_threshold,
        )
        self._tokens = tokens

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        if self._tokens:
            return super().pick(item, view, allowed)
        mask = view.usable if allowed is None else allowed
        if not mask.any():
            return None
        return masked_argmin(view.in_flight[: view.n].astype(np.float64), mask)


class PowerOfTwo(Policy):
    """``power_of_two`` as sglang-router 0.3 runs it in front of vLLM: a worker drawn uniformly
    at random.

    The policy draws two different workers and takes the less loaded, the first drawn on a tie, but
    the loads it compares are not its own in-flight counts (its source falls back to those only for
    a worker it holds no polled load for): the load monitor it starts for ``power_of_two`` polls
    each worker's SGLang ``/get_load`` (every ``--worker-startup-check-interval``, 1 s in the
    benchmark), which vLLM does not serve, and keeps -1 for each worker whose poll fails. So every
    comparison is -1 against -1 and the first drawn worker always wins; vLLM's own ``/load`` is
    never asked. Measured with ``bench/probe_sglang_p2c.py``
    (``bench/results/probe_sglang_p2c.json``: sglang-router 0.3.2, three fake workers answering as
    vLLM does, 5:2:1 in speed, 400 requests from 16 clients a variant): every logged selection
    compared -1 with -1 and took the first drawn, with ``/load`` answering ``{"server_load": 0}`` as
    vLLM's does (shares 38/35/27%, fastest first), absent (34/33/33%) or reporting the worker's
    requests in flight (30/32/38%); each worker was polled at ``/get_load`` only. Only a worker
    answering ``/get_load`` moves the picks (49/30/21%). The real runs' shares, 34/35/31% (as
    client-side round robin's), are this uniform draw."""

    name = "anchor_power_of_two"

    def __init__(self, *, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        mask = view.usable if allowed is None else allowed
        candidates = np.flatnonzero(mask)
        if candidates.size == 0:
            return None
        return int(candidates[self._rng.integers(candidates.size)])
