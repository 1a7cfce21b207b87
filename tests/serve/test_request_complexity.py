"""A request's prompt tokens are its complexity, so the ``tiered`` strategy tiers requests by
prompt length (seed 000: long sequences to the A100s, short ones to the V100s)."""

from __future__ import annotations

import asyncio

from hetero.sched.item import Tokens
from hetero.serve.replicas import Replica
from hetero.serve.router import Router, RouterOptions, Ticket, request_item
from tests.serve.harness import assert_settled

URL = "http://127.0.0.1:9"  # never contacted


async def test_a_requests_item_carries_its_prompt_tokens_as_complexity() -> None:
    waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    ticket = Ticket(7, "m", 2048, waiter, 0.0)  # type: ignore[arg-type]
    item = request_item(ticket, cost=297.0, priority=2, tokens=Tokens(2048, 256.0))
    assert (item.id, item.cost, item.priority, item.complexity) == (7, 297.0, 2, 2048)
    assert item.tier_key == 2048  # tiered reads the prompt, not the cost


async def test_tiered_routing_sends_long_prompts_to_the_big_replica() -> None:
    replicas = [
        Replica("v100", URL, 1.0, 4, {"m"}, True),
        Replica("a100", URL, 2.5, 4, {"m"}, True),
    ]
    options = RouterOptions(
        strategy="tiered",
        strategy_options={"thresholds": [1024], "tiers": [["v100"], ["a100"]]},
    )
    router = Router(replicas, options)
    # The same expected output: by cost alone the two would share a tier.
    long = router.admit("m", 4000, 256)
    short = router.admit("m", 100, 256)
    assert long.waiter.result() == 1
    assert short.waiter.result() == 0
    for ticket in (long, short):
        router.cancel(ticket, "test over")
    assert_settled(router)
