"""The router's pure parts: breakers, gray failures, rate limits, cost estimates, replica flags,
and the ``Router`` itself driven without HTTP (its waiters are futures on the test's loop)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero.config import ReplicaConfig
from hetero.errors import ConfigError, QueueFull
from hetero.plan.memory import FitRequest, fit_memory
from hetero.plan.models import get_model, model_names
from hetero.sched import Finish, ItemState
from hetero.sched.health import Breaker
from hetero.sched.item import CostModel
from hetero.serve.cost import OutputLengths, prompt_tokens, requested_max_tokens
from hetero.serve.health import gray_replicas
from hetero.serve.ratelimit import RateLimiter
from hetero.serve.replicas import Replica, parse_replica_flag, replica_from_config
from hetero.serve.router import NoReplica, Router, RouterOptions, Ticket, UnknownModel
from hetero.testing import ManualClock
from tests.serve.harness import PINNED, assert_settled

URL = "http://127.0.0.1:9"  # never contacted


# --- the circuit breaker -----------------------------------------------------------------------


def test_breaker_opens_after_threshold_failures_in_a_row() -> None:
    breaker = Breaker(threshold=3, cooldown=5.0)
    assert breaker.failure(10.0, "e1") is False
    assert breaker.failure(11.0, "e2") is False
    assert breaker.state == "closed"
    assert breaker.failure(12.0, "e3") is True
    assert breaker.state == "open" and breaker.last_error == "e3"
    # More failures while open neither reopen it nor push its cooldown back.
    assert breaker.failure(16.0, "e4") is False
    assert breaker.state == "open"
    assert breaker.probe_ok(16.9) is False
    assert breaker.probe_ok(17.0) is True  # 12 + 5


def test_breaker_kept_closed_counts_its_failures() -> None:
    breaker = Breaker(threshold=2, cooldown=5.0)
    for t in (1.0, 2.0, 3.0):
        assert breaker.failure(t, "e", may_open=False) is False
    assert breaker.state == "closed" and breaker.failures == 3
    assert breaker.failure(4.0, "e") is True  # once it may open


def test_breaker_success_resets_the_count_of_failures_in_a_row() -> None:
    breaker = Breaker(threshold=3, cooldown=5.0)
    for t in (1.0, 2.0):
        breaker.failure(t, "e")
    assert breaker.success() is False  # it was closed: nothing closed
    for t in (3.0, 4.0):
        assert breaker.failure(t, "e") is False
    assert breaker.state == "closed"


def test_a_probe_never_clears_a_closed_breakers_failures() -> None:
    """A hung replica still answers its health check: only a request's success counts."""
    breaker = Breaker(threshold=2, cooldown=5.0)
    breaker.failure(1.0, "timed out")
    assert breaker.probe_ok(2.0) is False
    assert breaker.failure(3.0, "timed out") is True


def test_breaker_cooldown_half_opens_and_a_request_success_closes() -> None:
    breaker = Breaker(threshold=1, cooldown=5.0)
    assert breaker.failure(100.0, "down") is True
    assert breaker.success() is False and breaker.state == "open"  # a request begun before
    assert breaker.probe_ok(104.999) is False and breaker.state == "open"
    assert breaker.probe_ok(105.0) is True and breaker.state == "half_open"
    assert breaker.probe_ok(106.0) is False  # stays half-open until a request decides
    assert breaker.success() is True
    assert breaker.state == "closed" and breaker.failures == 0


def test_breaker_failure_in_half_open_reopens_at_once() -> None:
    breaker = Breaker(threshold=3, cooldown=5.0)
    for t in (0.0, 1.0, 2.0):
        breaker.failure(t, "e")
    assert breaker.probe_ok(7.0) is True
    assert breaker.failure(8.0, "timed out") is True  # one failure, not three
    assert breaker.state == "open" and breaker.opened_at == 8.0
    assert breaker.probe_ok(12.0) is False
    assert breaker.probe_ok(13.0) is True


@pytest.mark.parametrize(
    ("threshold", "cooldown", "message"),
    [(0, 1.0, "breaker_threshold: must be >= 1"), (1, 0.0, "breaker_cooldown: must be > 0")],
)
def test_breaker_rejects_bad_settings(threshold: int, cooldown: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Breaker(threshold, cooldown)


# --- gray failures -----------------------------------------------------------------------------


def gray(speeds: list[float], classes: list[str | None], done: list[int]) -> list[int]:
    """Positions of the gray replicas at the router's defaults (0.35 of the median, 20 done)."""
    return [i for i, _ in gray_replicas(speeds, classes, done, 0.35, 20)]


def test_gray_replica_is_far_below_the_median_of_its_peers() -> None:
    assert gray_replicas([1.0, 1.1, 0.3], ["A"] * 3, [20] * 3, 0.35, 20) == [(2, 0.3)]
    assert gray([1.0, 1.1, 0.4], ["A"] * 3, [20] * 3) == []


def test_gray_compares_replicas_declared_alike_only() -> None:
    # A T4 at a tenth of an A100's speed is compared with T4s, not with A100s.
    classes: list[str | None] = ["A100", "A100", "T4"]
    assert gray([3.0, 3.0, 0.3], classes, [50] * 3) == []
    assert gray([3.0, 3.0, 0.3, 1.0, 1.0], [*classes, "T4", "T4"], [50] * 5) == [2]


def test_gray_needs_min_done_completions_and_two_comparable_replicas() -> None:
    speeds, classes = [1.0, 1.0, 0.1], ["A", "A", "A"]
    assert gray(speeds, classes, [20, 20, 19]) == []  # too few to judge
    assert gray([1.0, 0.1], ["A", "A"], [20, 19]) == []  # one comparable
    assert gray([1.0, 0.1], ["A", None], [20, 20]) == []  # no class
    assert gray([0.1], ["A"], [100]) == []
    assert gray([1.0, 0.1], ["A", "A"], [20, 20]) == [1]


def test_gray_uses_the_median_not_the_mean() -> None:
    # One very fast replica does not make the others look gray.
    assert gray([1.0, 1.0, 1.0, 50.0], ["A"] * 4, [30] * 4) == []


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0.01, 100.0), min_size=2, max_size=8),
    st.floats(0.01, 100.0),
    st.floats(0.05, 0.95),
)
def test_gray_ignores_the_unit_of_speed(speeds: list[float], scale: float, ratio: float) -> None:
    n = len(speeds)
    done, classes = [20] * n, ["A"] * n

    def positions(values: list[float]) -> list[int]:
        return [i for i, _ in gray_replicas(values, classes, done, ratio, 20)]

    plain = positions(speeds)
    assert positions([s * scale for s in speeds]) == plain
    assert positions([speeds[0]] * n) == []
    # Never more than half the fleet: the median itself is never gray.
    assert len(plain) <= n // 2


# --- rate limits -------------------------------------------------------------------------------


def test_rate_limiter_allows_a_burst_then_refills() -> None:
    clock = ManualClock(100.0)
    limiter = RateLimiter(rate=2.0, burst=3.0, clock=clock.now)
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.take("k") == 0.5  # one token at 2 a second
    clock.advance(0.25)
    assert limiter.take("k") == 0.25
    clock.advance(0.25)
    assert limiter.take("k") == 0.0
    assert limiter.take("k") == 0.5


def test_rate_limiter_keeps_no_more_than_a_burst() -> None:
    clock = ManualClock()
    limiter = RateLimiter(rate=4.0, burst=2.0, clock=clock.now)
    clock.advance(1000.0)
    assert [limiter.take("k") for _ in range(3)] == [0.0, 0.0, 0.25]


def test_rate_limiter_keys_are_charged_to_the_address_they_were_first_seen_from() -> None:
    limiter = RateLimiter(rate=1.0, clock=ManualClock().now)
    assert limiter.burst == 1.0
    assert limiter.take("alice") == 0.0
    assert limiter.take("alice") == 1.0
    assert limiter.take("bob", "10.0.0.2") == 0.0
    assert limiter.take("bob", "10.0.0.2") == 1.0
    assert limiter.take("bob", "10.0.0.3") == 1.0  # from elsewhere: still 10.0.0.2's bucket
    assert limiter.take("", "10.0.0.3") == 0.0  # that address has its own


def test_rate_limiter_charges_a_new_key_to_its_address() -> None:
    limiter = RateLimiter(rate=1.0, clock=ManualClock().now)
    assert limiter.take("alice", "10.0.0.1") == 0.0
    assert limiter.take("invented", "10.0.0.1") == 1.0  # the address's token is spent
    assert limiter.take("", "10.0.0.1") == 1.0  # as is a request without a key
    assert len(limiter) == 2  # alice and the address; the refused key is not kept


def test_rate_limiter_burst_defaults_to_one_second_of_rate_and_at_least_one() -> None:
    assert RateLimiter(rate=10.0).burst == 10.0
    assert RateLimiter(rate=0.5).burst == 1.0
    with pytest.raises(ValueError, match="rate limit must be > 0"):
        RateLimiter(rate=0.0)


# --- cost estimates ----------------------------------------------------------------------------


def test_prompt_tokens_of_chat_completion_and_embedding_bodies() -> None:
    chat = {
        "messages": [{"role": "system", "content": "ab" * 10}, {"role": "user", "content": "x"}]
    }
    assert prompt_tokens(chat) == 6  # 21 characters, 4 a token, rounded up
    parts = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "a" * 12},
                    {"type": "image_url", "image_url": {"url": "data:..." + "z" * 999}},
                    {"type": "text", "text": "b" * 4},
                ],
            }
        ]
    }
    assert prompt_tokens(parts) == 4  # only the text parts count
    assert prompt_tokens({"prompt": "a" * 40}) == 10
    assert prompt_tokens({"prompt": ["a" * 4, "b" * 8]}) == 3
    assert prompt_tokens({"input": "a" * 9}) == 3
    assert prompt_tokens({"input": ["a" * 8, "b" * 8]}) == 4
    assert prompt_tokens({}) == 1  # never free
    assert prompt_tokens({"messages": "not a list", "prompt": 12}) == 1


def test_requested_max_tokens() -> None:
    assert requested_max_tokens({}) is None
    assert requested_max_tokens({"max_tokens": None}) is None
    assert requested_max_tokens({"max_tokens": 64}) == 64
    assert requested_max_tokens({"max_tokens": 0}) == 0
    assert requested_max_tokens({"max_completion_tokens": 10, "max_tokens": 99}) == 10


@pytest.mark.parametrize(
    ("payload", "key"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "64"}, "max_tokens"),
        ({"max_tokens": 6.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_completion_tokens": [1]}, "max_completion_tokens"),
    ],
)
def test_bad_max_tokens_raise_naming_the_key(payload: dict[str, Any], key: str) -> None:
    with pytest.raises(ValueError, match=f"^{key} must be an integer from 0 to 2147483647, got "):
        requested_max_tokens(payload)


def test_output_lengths_learn_the_mean_reply_and_respect_the_cap() -> None:
    outputs = OutputLengths(CostModel(prefill=0.5, decode=1.0), default_max_tokens=256)
    assert outputs.expected("m", None) == 256.0  # nothing seen: the cap
    assert outputs.expected("m", 40) == 40.0
    outputs.observe("m", 100)
    assert outputs.expected("m", None) == 100.0  # the first reply sets the mean
    assert outputs.expected("m", 30) == 30.0  # never above the request's own cap
    outputs.observe("m", 300)
    assert outputs.expected("m", None) == pytest.approx(110.0)  # EWMA, alpha 0.05
    assert outputs.expected("other", None) == 256.0  # per model
    assert outputs.cost_model.cost(20, outputs.expected("m", 1000)) == pytest.approx(
        20 * 0.5 + 110.0
    )


# --- replica flags and config ------------------------------------------------------------------


def test_replica_flag_with_a_catalog_gpu() -> None:
    config = parse_replica_flag("http://10.0.0.5:8000=A100-80GB")
    assert (config.url, config.device, config.speed) == ("http://10.0.0.5:8000", "A100-80GB", None)
    replica = replica_from_config(config)
    assert replica.name == "10.0.0.5:8000"
    assert replica.slots is None and replica.models == set()  # learned, not guessed
    assert replica.declared_models is False and replica.device_model == "A100-80GB"
    v100 = replica_from_config(parse_replica_flag("http://h:1=V100-32GB"))
    assert v100.speed == pytest.approx(1.0)  # the unit of speed
    assert replica.speed > 2 * v100.speed  # memory bandwidth: 2 TB/s against 0.9


def test_replica_flag_with_a_speed_and_options() -> None:
    config = parse_replica_flag("http://h:8001=speed:2.5,slots=4,models=a|b,name=x")
    replica = replica_from_config(config)
    assert replica == Replica("x", "http://h:8001", 2.5, 4, {"a", "b"}, True, None)
    device = replica.device(4)
    assert device.id == "x" and device.node == "h"
    assert device.speed_override == 10.0  # a device runs all its slots: 2.5 x 4


@pytest.mark.parametrize(
    ("flag", "part"),
    [
        ("http://h:1=", "expected URL or URL=GPU or URL=speed:N"),
        ("http://h:1=speed:2,color=red", "bad option 'color=red'"),
        ("http://h:1=speed:2,slots", "bad option 'slots'"),
        ("http://h:1=speed:fast", "speed: Input should be a valid number"),
        ("http://h:1=speed:0", "speed: Input should be greater than or equal to 0.000001"),
        ("http://h:1=speed:1,slots=0", "slots: Input should be greater than or equal to 1"),
        ("http://h:1=A100-80", "closest catalog names: A100-80GB"),
        ("ftp://h:1=speed:1", "url: expected http://HOST[:PORT]"),
        ("http://:1=speed:1", "url: expected http://HOST[:PORT]"),
        ("127.0.0.1:8000=A100-80GB", "did you mean 'http://127.0.0.1:8000'?"),
    ],
)
def test_bad_replica_flag_names_replica_and_the_bad_part(flag: str, part: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_replica_flag(flag)
    assert [path for path, _ in info.value.problems] == ["--replica"] * len(info.value.problems)
    assert part in str(info.value)


def test_replica_slots_from_hetero_fit() -> None:
    assert "llama-3-8b" in model_names()
    config = ReplicaConfig(url=URL, device="A100-80GB", fit_model="llama-3-8b")
    fit = fit_memory(get_model("llama-3-8b"), "A100-80GB", FitRequest(seq=4096))
    replica = replica_from_config(config)
    assert replica.slots == fit.max_batch > 8
    long = replica_from_config(config.model_copy(update={"context": 32768}))
    assert 1 <= long.slots < replica.slots  # longer requests: fewer at once
    declared = replica_from_config(config.model_copy(update={"slots": 3}))
    assert declared.slots == 3  # declared slots win
    flag = replica_from_config(
        parse_replica_flag(f"{URL}=A100-80GB,fit_model=llama-3-8b,context=4096")
    )
    assert flag.slots == replica.slots


def test_replica_whose_model_does_not_fit_is_a_config_error() -> None:
    config = ReplicaConfig(url=URL, device="T4", fit_model="llama-3-70b")
    with pytest.raises(ConfigError, match="fit_model: llama-3-70b does not fit on a T4"):
        replica_from_config(config)


def test_replica_without_slots_or_fit_model_declares_none() -> None:
    assert replica_from_config(ReplicaConfig(url=URL, device="A100-80GB")).slots is None
    assert replica_from_config(ReplicaConfig(url=URL, speed=3.0)).slots is None


def test_a_replica_is_a_url() -> None:
    for text in ("http://10.0.0.5:8000", "http://10.0.0.5:8000/"):
        replica = replica_from_config(parse_replica_flag(text))
        assert replica.url == "http://10.0.0.5:8000" and replica.name == "10.0.0.5:8000"
        assert (replica.speed, replica.slots, replica.device_model) == (None, None, None)
    # options without a GPU or speed
    replica = replica_from_config(parse_replica_flag("http://h:1=slots=3,name=a"))
    assert (replica.name, replica.slots, replica.speed) == ("a", 3, None)
    assert replica_from_config(ReplicaConfig(url="http://h:2")).speed is None


# --- router options and construction ----------------------------------------------------------


def test_router_options_list_every_bad_field() -> None:
    with pytest.raises(ConfigError) as info:
        RouterOptions(
            strategy=PINNED,
            queue_size=0,
            timeout=0.0,
            default_max_tokens=0,
            prefill_weight=-1.0,
            unit_rate=0.0,
            gray_ratio=1.0,
        )
    assert [path for path, _ in info.value.problems] == [
        "queue_size",
        "timeout",
        "default_max_tokens",
        "prefill_weight",
        "unit_rate",
        "gray_ratio",
    ]
    assert RouterOptions(strategy=PINNED, timeout=None).timeout is None


def test_router_needs_replicas_with_distinct_names() -> None:
    with pytest.raises(ConfigError, match="at least one replica"):
        Router([])
    twins = [Replica("a", URL, 1.0, 1, {"m"}, True), Replica("a", URL + "0", 1.0, 1, {"m"}, True)]
    with pytest.raises(ConfigError, match="duplicate replica name 'a'"):
        Router(twins)


# --- the router without HTTP -------------------------------------------------------------------


def replica(name: str, speed: float = 1.0, slots: int = 1, models: str = "m") -> Replica:
    return Replica(name, f"{URL}/{name}", speed, slots, set(models.split("|")), True)


def ran_on(ticket: Ticket) -> int | None:
    """Where the ticket's current waiter says it runs (None: waiting or ended)."""
    if not ticket.waiter.done():
        return None
    placed = ticket.waiter.result()
    return placed if isinstance(placed, int) else None


async def test_admission_errors_say_what_is_wrong() -> None:
    router = Router(
        [replica("a", models="m|x"), replica("b")], RouterOptions(strategy=PINNED, queue_size=1)
    )
    with pytest.raises(UnknownModel, match="model 'y' is not served here; models: m, x"):
        router.admit("y", 1, None)
    router.drain("a")
    with pytest.raises(NoReplica, match=r"no healthy replica serves 'x' now \(a: a draining\)"):
        router.admit("x", 1, None)
    router.undrain("a")
    first = router.admit("m", 1, 10)
    second = router.admit("m", 1, 10)
    waiting = router.admit("m", 1, 10)
    with pytest.raises(QueueFull):
        router.admit("m", 1, 10)
    assert len(router.tickets) == 3  # the refused one left nothing behind
    router.closing = True
    with pytest.raises(NoReplica, match="shutting down"):
        router.admit("m", 1, None)
    for ticket in (first, second, waiting):
        router.cancel(ticket, "test over")
    assert_settled(router)


async def test_open_circuit_takes_no_work_and_a_probe_after_cooldown_half_opens_it() -> None:
    options = RouterOptions(strategy=PINNED, breaker_threshold=2, breaker_cooldown=1e-9)
    router = Router([replica("a", speed=10.0), replica("b")], options)
    state = router.by_name["a"]

    def circuit() -> tuple[str, str]:
        listed = router.status()["replicas"][0]
        return listed["circuit"], listed["state"]

    router.replica_failed(state, "health check: refused")
    assert circuit() == ("closed", "up")
    router.replica_failed(state, "health check: refused")
    assert circuit() == ("open", "down")
    elsewhere = router.admit("m", 1, None)
    assert ran_on(elsewhere) == 1  # not on a, ten times as fast
    await asyncio.sleep(0.001)  # past the (tiny) cooldown
    router.probe_ok(state)
    assert circuit() == ("half_open", "up")
    ticket = router.admit("m", 1, None)
    assert ran_on(ticket) == 0  # on trial
    router.complete(ticket, 5, 0.1)
    assert circuit() == ("closed", "up")
    router.complete(elsewhere, 5, 0.1)
    assert_settled(router)


async def test_the_last_replica_of_a_model_keeps_its_circuit_closed() -> None:
    options = RouterOptions(strategy=PINNED, breaker_threshold=1)
    router = Router([replica("a", models="m|x"), replica("b")], options)
    router.replica_failed(router.by_name["a"], "health check: refused")
    assert router.status()["replicas"][0]["state"] == "failing"  # the only one serving x
    ticket = router.admit("x", 1, None)
    assert ran_on(ticket) == 0
    router.complete(ticket, 5, 0.1)
    assert router.status()["replicas"][0]["state"] == "up"
    assert_settled(router)


async def test_failed_attempt_is_retried_on_another_replica_then_ends() -> None:
    router = Router([replica("a"), replica("b")], RouterOptions(strategy=PINNED, max_retries=1))
    ticket = router.admit("m", 1, None)
    first = ran_on(ticket)
    assert first is not None
    router.fail(ticket, "HTTP 500")
    second = ran_on(ticket)
    assert second is not None and second != first and ticket.attempts == 2
    router.fail(ticket, "HTTP 500")
    finish = ticket.waiter.result()
    assert isinstance(finish, Finish) and finish.state is ItemState.FAILED
    assert "after 2 attempts" in finish.reason
    assert ticket.ended and not router.tickets
    assert_settled(router)


async def test_busy_replica_is_held_and_its_request_placed_elsewhere() -> None:
    """A replica that answered 429 is held for Retry-After: the request goes elsewhere."""
    router = Router([replica("fast", speed=10.0), replica("slow")], RouterOptions(strategy=PINNED))
    ticket = router.admit("m", 1, None)
    assert ran_on(ticket) == 0
    router.busy(ticket, retry_after=0.01)
    assert ticket.attempts == 2 and router.dispatcher.records[ticket.id].attempts == 1
    assert ran_on(ticket) == 1, "placed again on the replica that just answered 429"
    assert router.status()["replicas"][0]["state"] == "busy"
    router.complete(ticket, 3, 0.1)
    # Held, not down: a request for it is admitted and waits out the hold.
    waiting = router.admit("m", 1, None)
    assert ran_on(waiting) == 1
    router.complete(waiting, 3, 0.1)
    deadline = asyncio.get_running_loop().time() + 5
    while router.status()["replicas"][0]["state"] != "up":
        assert asyncio.get_running_loop().time() < deadline, "the hold never ended"
        await asyncio.sleep(0.005)
    assert_settled(router)


async def test_a_sole_busy_replica_keeps_its_request_until_the_hold_ends() -> None:
    router = Router([replica("a")])
    ticket = router.admit("m", 1, None)
    router.busy(ticket, retry_after=0.02)
    assert ran_on(ticket) is None, "sent straight back to the replica that answered 429"
    assert await asyncio.wait_for(ticket.waiter, 5) == 0
    router.complete(ticket, 3, 0.1)
    assert_settled(router)


async def test_request_waits_for_a_replica_that_serves_its_model() -> None:
    """A request for a model every replica serves must not go to one that joins later and
    serves another model."""
    router = Router([replica("a")])
    running = router.admit("m", 1, None)
    waiting = router.admit("m", 1, None)
    assert ran_on(running) == 0 and ran_on(waiting) is None
    router.add(replica("b", speed=5.0, models="other"))
    assert ran_on(waiting) is None, "placed on a replica that does not serve its model"
    router.complete(running, 3, 0.1)
    assert ran_on(waiting) == 0
    router.complete(waiting, 3, 0.1)
    assert_settled(router)


async def test_request_queued_behind_a_replica_whose_circuit_opens_is_not_charged() -> None:
    options = RouterOptions(strategy=PINNED, max_retries=0, breaker_threshold=1)
    router = Router([replica("a", speed=10.0), replica("b")], options)
    first = router.admit("m", 1, None)
    queued = router.admit("m", 1, None)
    assert ran_on(first) == 0 and router.status()["replicas"][0]["queued"] == 1
    try:
        router.fail(first, "HTTP 500")
        assert isinstance(first.waiter.result(), Finish)
        assert ran_on(queued) == 1, queued.waiter.result()
    finally:
        for ticket in (first, queued):
            router.cancel(ticket, "test over")
        assert_settled(router)


async def test_removed_replica_stops_its_requests_and_can_rejoin() -> None:
    router = Router([replica("a", slots=2), replica("b", slots=2)], RouterOptions(strategy=PINNED))
    tickets = [router.admit("m", 1, None) for _ in range(4)]
    on_a = [t for t in tickets if ran_on(t) == 0]
    assert len(on_a) == 2
    router.remove("a")
    assert all(ran_on(t) is None for t in on_a)  # stopped, waiting for b
    assert all(t.stopped for t in on_a)
    assert [r["name"] for r in router.status()["replicas"]] == ["b"]
    with pytest.raises(ConfigError, match="unknown replica 'a'; replicas: b"):
        router.drain("a")
    router.add(replica("a", slots=2))  # joins again under its name
    assert [ran_on(t) for t in on_a] == [0, 0]  # its old position
    assert all(t.attempts == 2 for t in on_a)
    with pytest.raises(ConfigError, match="already in the fleet"):
        router.add(replica("a"))
    for t in tickets:
        router.complete(t, 2, 0.1)
    assert_settled(router)


# --- a property: random events never lose or duplicate a request ------------------------------

MODELS = ("m", "x")
Step = tuple[Any, ...]

admit = st.tuples(
    st.just("admit"), st.sampled_from(MODELS), st.integers(-1, 2), st.sampled_from([None, 1, 500])
)
outcome = st.one_of(
    st.tuples(st.just("complete"), st.integers(0, 99), st.sampled_from([None, 0, 7, 120])),
    st.tuples(st.just("fail"), st.integers(0, 99), st.booleans()),
    st.tuples(st.just("busy"), st.integers(0, 99)),
    st.tuples(st.just("cancel"), st.integers(0, 99)),
)
membership = st.one_of(
    st.tuples(
        st.sampled_from(["drain", "undrain", "remove", "probe_fail", "probe_ok"]),
        st.integers(0, 99),
    ),
    st.tuples(st.just("add"), st.integers(0, 99), st.sampled_from(["m", "x", "m|x"])),
    st.tuples(st.just("tick")),
)
# Requests arrive and end more often than the fleet changes.
steps = st.sampled_from(["admit"] * 4 + ["outcome"] * 4 + ["membership"] * 2).flatmap(
    {"admit": admit, "outcome": outcome, "membership": membership}.__getitem__
)


class RouterModel:
    """Drives a ``Router`` as its HTTP handlers would and checks it after every step."""

    def __init__(self) -> None:
        options = RouterOptions(
            strategy=PINNED,
            queue_size=12,
            max_retries=1,
            breaker_threshold=2,
            breaker_cooldown=1e-9,
        )
        self.router = Router(
            [replica("a", 2.0, 2, "m|x"), replica("b", 1.0, 1, "m"), replica("c", 1.0, 2, "m|x")],
            options,
        )
        self.tickets: list[Ticket] = []
        self.ends: dict[int, list[str]] = {}  # ticket id -> how it ended, as a client saw it
        self.final: dict[int, asyncio.Future[int | Finish]] = {}  # its waiter when it ended
        self.added = 0

    def live(self) -> list[Ticket]:
        return [t for t in self.tickets if t.id not in self.ends]

    def running(self) -> list[Ticket]:
        return [t for t in self.live() if ran_on(t) is not None]

    def present(self) -> list[str]:
        return [s.replica.name for s in self.router.replicas if not s.removed]

    def end(self, ticket: Ticket, how: str) -> None:
        self.ends.setdefault(ticket.id, []).append(how)
        self.final.setdefault(ticket.id, ticket.waiter)

    async def step(self, step: Step) -> None:
        router = self.router
        op = step[0]
        if op == "admit":
            _, model, priority, max_tokens = step
            try:
                ticket = router.admit(model, 10, max_tokens, priority)
            except (UnknownModel, NoReplica, QueueFull):
                return
            self.tickets.append(ticket)
        elif op in ("complete", "fail", "busy"):
            running = self.running()
            if not running:
                return
            ticket = running[step[1] % len(running)]
            if op == "complete":
                router.complete(ticket, step[2], 0.05)
                self.end(ticket, "complete")
            elif op == "fail":
                router.fail(ticket, "HTTP 500", retryable=step[2])
            else:
                router.busy(ticket, retry_after=0.0)
        elif op == "cancel":
            live = self.live()
            if live:
                ticket = live[step[1] % len(live)]
                router.cancel(ticket, "client disconnected")
                self.end(ticket, "cancel")
        elif op == "add":
            removed = [s.replica for s in router.replicas if s.removed]
            if removed and step[1] % 2:  # joins again, as it was
                again = removed[step[1] % len(removed)]
                router.add(replica(again.name, again.speed, again.slots, "|".join(again.models)))
            elif len(router.replicas) < 6:
                self.added += 1
                router.add(replica(f"n{self.added}", 1.0 + step[1] % 3, 1 + step[1] % 2, step[2]))
        elif op == "tick":
            await asyncio.sleep(0)  # holds of busy replicas end
        else:
            present = self.present()
            if not present:
                return
            name = present[step[1] % len(present)]
            if op == "drain":
                router.drain(name)
            elif op == "undrain":
                router.undrain(name)
            elif op == "remove":
                router.remove(name)
            elif op == "probe_fail":
                router.replica_failed(router.by_name[name], "health check failed")
            else:
                router.probe_ok(router.by_name[name])
        self.check()

    def check(self) -> None:
        router = self.router
        dispatcher = router.dispatcher
        # Finishes the router delivered end the request for its client, once.
        for ticket in self.live():
            if ticket.waiter.done() and isinstance(ticket.waiter.result(), Finish):
                self.end(ticket, "finish")
        assert all(len(ends) == 1 for ends in self.ends.values()), self.ends
        assert all(t.waiter is self.final[t.id] for t in self.tickets if t.id in self.final)
        live = {t.id for t in self.live()}
        assert set(router.tickets) == live
        assert set(dispatcher.records) == live  # keep_finished=False: only live items
        assert dispatcher.active == len(router.tickets)
        for ticket in self.tickets:
            assert ticket.ended == (ticket.id not in live)
        for ticket in self.live():
            rec = dispatcher.records[ticket.id]
            if rec.state is ItemState.RUNNING:
                assert ran_on(ticket) == rec.device == ticket.replica
                state = router.replicas[rec.device]
                assert not state.removed
                assert ticket.model in state.replica.models
            else:
                assert rec.state in (ItemState.PENDING, ItemState.QUEUED), rec.state
                assert not ticket.waiter.done()
        dispatcher.validate_state()

    async def finish(self) -> None:
        """Clients that are still waiting leave; then nothing may be left."""
        await asyncio.sleep(0)
        for ticket in self.live():
            self.router.cancel(ticket, "client disconnected")
            self.end(ticket, "cancel")
        self.check()
        assert_settled(self.router)
        assert all(t.ended for t in self.tickets)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(steps, min_size=20, max_size=100))
def test_random_events_never_lose_or_duplicate_a_request(script: list[Step]) -> None:
    async def run() -> None:
        model = RouterModel()
        for step in script:
            await model.step(step)
        await model.finish()

    asyncio.run(run())
