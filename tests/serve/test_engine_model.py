"""The engine-faithful replica model (``hetero.serve.engine_model``) on a fake clock: step times
from the batch, continuous batching, preemption, the prefix cache and its LRU, bad config."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from hetero.errors import ConfigError
from hetero.sched.prefix import prefix_blocks
from hetero.serve.emulator.config import MockConfig
from hetero.serve.engine_model import (
    BLOCK_SIZE,
    Calibration,
    EngineModel,
    EngineRequest,
    EngineSpec,
    Step,
    engine_spec,
)
from hetero.testing import ManualClock


def engine(**options: object) -> tuple[EngineModel, ManualClock]:
    clock = ManualClock()
    spec = engine_spec("llama-3-8b", "H100-SXM-80GB", **options)  # type: ignore[arg-type]
    return EngineModel(spec, clock.now), clock


def run(model: EngineModel, clock: ManualClock) -> list[Step]:
    """Steps until idle, the clock following them."""
    steps = []
    while (step := model.step()) is not None:
        clock.set(step.end)
        steps.append(step)
    return steps


def blocks(text: str, tokens: int) -> tuple[int, ...]:
    """The mock's blocks of a prompt: 64 characters (16 tokens) each."""
    return prefix_blocks(text, 4 * BLOCK_SIZE, limit=tokens // BLOCK_SIZE)


def test_step_time_grows_with_the_prefill_tokens_of_the_batch() -> None:
    times = []
    for prompt in (1024, 2048, 4096, 8000):
        model, _ = engine()
        model.submit(EngineRequest(prompt, 1))
        step = model.step()
        assert step is not None and step.prefill_tokens == prompt
        times.append(step.duration)
    assert times == sorted(times) and len(set(times)) == 4
    cost = model.spec.cost
    # Long prefills are bound by compute: twice the tokens, about twice the time.
    assert cost.compute_s(2048) > cost.memory_s(2048, 2048)
    attended = {n: n * (n + 1) // 2 for n in (4096, 8000)}  # each token, the ones before it
    expected = cost.compute_s(8000, attended[8000]) - cost.compute_s(4096, attended[4096])
    assert times[3] - times[2] == pytest.approx(expected)


def test_decode_is_bound_by_memory_and_grows_with_the_requests_decoding() -> None:
    times = {}
    for n in (1, 8, 32):
        model, clock = engine()
        for _ in range(n):
            model.submit(EngineRequest(256, 4))
        prefill = model.step()
        assert prefill is not None and prefill.prefill_tokens == 256 * n
        clock.set(prefill.end)
        decode = model.step()
        assert decode is not None and (decode.decode_tokens, decode.prefill_tokens) == (n, 0)
        times[n] = decode.duration
    cost = model.spec.cost
    assert times[1] < times[8] < times[32]
    # Memory-bound: the weights are read once for the whole batch, so 32 requests cost well
    # under twice one; the growth is the KV cache each reads.
    assert cost.memory_s(1, 257) > cost.compute_s(1)
    assert times[1] == pytest.approx(cost.overhead + cost.memory_s(1, 257))
    assert times[32] < 2 * times[1]


def closed_loop(model: EngineModel, clock: ManualClock, concurrency: int, total: int) -> float:
    """Tokens (prompt and output) per second with ``concurrency`` clients, each sending its
    next request as the last one finishes, ``total`` requests in all."""
    sent = 0
    for _ in range(concurrency):
        model.submit(EngineRequest(64, 64))
        sent += 1
    while (step := model.step()) is not None:
        clock.set(step.end)
        for _ in step.finished:
            if sent < total:
                model.submit(EngineRequest(64, 64))
                sent += 1
    return total * 128 / clock.now()


def test_throughput_rises_with_concurrency_until_bound_by_compute() -> None:
    rates = {}
    for concurrency in (1, 4, 16, 64, 256, 512):
        model, clock = engine(max_num_seqs=1024)
        rates[concurrency] = closed_loop(model, clock, concurrency, total=2 * concurrency)
    ceiling = 1 / model.spec.cost.compute_s(1)  # tokens per second at the peak compute rate
    values = list(rates.values())
    assert values == sorted(values)
    assert rates[4] > 3 * rates[1] and rates[16] > 3 * rates[4]  # decode batches almost free
    assert rates[512] < 1.25 * rates[256]  # and then compute binds
    assert 0.6 * ceiling < rates[512] <= ceiling


def test_requests_join_the_batch_at_step_boundaries_and_long_prompts_prefill_in_chunks() -> None:
    model, clock = engine(max_num_batched_tokens=2048)
    short = model.submit(EngineRequest(100, 50))
    first = model.step()
    assert first is not None
    clock.set((first.start + first.end) / 2)  # mid-step: the newcomer waits for the next one
    long = model.submit(EngineRequest(5000, 1))
    assert model.waiting[0] is long and short in model.running
    steps = [first, *run(model, clock)]
    # Running requests first: each chunk of the long prompt rides with the short one's decode.
    budget = model.spec.max_num_batched_tokens
    chunks = [s.prefill_tokens for s in steps[1:4]]
    assert chunks == [budget - 1, budget - 1, 5000 - 2 * (budget - 1)]
    assert all(s.decode_tokens == 1 for s in steps[1:4])
    assert steps[1].start == first.end  # back to back
    assert long.first_token_at == steps[3].end and long.finished_at == steps[3].end
    assert short.generated == 50 and short.finished


def test_a_full_kv_cache_preempts_the_newest_request_which_still_finishes_once() -> None:
    model, clock = engine(kv_tokens=256)  # 16 blocks; four requests need 7 each at the end
    requests = [model.submit(EngineRequest(40, 60)) for _ in range(4)]
    finished: Counter[int] = Counter()
    preempted: list[EngineRequest] = []
    while (step := model.step()) is not None:
        clock.set(step.end)
        assert model.used_blocks <= model.spec.num_blocks
        finished.update(id(r) for r in step.finished)
        preempted += step.preempted
    assert model.preemptions == len(preempted) > 0
    assert preempted[0] is requests[-1]  # the newest goes first
    assert finished == Counter({id(r): 1 for r in requests})
    assert all(r.generated == 60 and r.finished for r in requests)
    assert requests[-1].preemptions >= 1
    assert model.used_blocks == 0 and model.kv_usage == 0


def test_a_cached_prefix_shortens_time_to_first_token_by_the_prefill_it_skips() -> None:
    model, clock = engine()
    system = "S" * 4096 * 4  # 4096 tokens shared, then 2048 of each request's own
    first = model.submit(EngineRequest(6144, 2, blocks(system + "a" * 2048 * 4, 6144)))
    run(model, clock)
    clock.advance(1.0)
    second = model.submit(EngineRequest(6144, 2, blocks(system + "b" * 2048 * 4, 6144)))
    run(model, clock)
    assert first.first_token_at is not None and second.first_token_at is not None
    ttft = first.first_token_at - first.arrival, second.first_token_at - second.arrival
    cost = model.spec.cost
    # Both compute-bound: the difference is the prefix's own prefill, attention included (the
    # second's tokens attend to the cached prefix as the first's did).
    assert ttft[0] - ttft[1] == pytest.approx(cost.compute_s(4096, 4096 * 4097 // 2))
    assert (first.cached_tokens, second.cached_tokens) == (0, 4096)
    assert (model.prefix_queries, model.prefix_hits) == (2 * 6144, 4096)


def test_running_requests_share_the_blocks_of_a_prefix() -> None:
    model, clock = engine()
    system = "S" * 1024 * 4
    a = model.submit(EngineRequest(1040, 100, blocks(system + "a" * 64, 1040)))
    step = model.step()
    assert step is not None
    clock.set(step.end)
    b = model.submit(EngineRequest(1040, 100, blocks(system + "b" * 64, 1040)))
    model.step()
    assert b.cached_tokens == 1024  # a still runs: its blocks are shared, not copied
    # The prefix once, each one's last prompt block, and the block a's output began.
    assert model.used_blocks == 64 + 2 + 1
    run(model, clock)
    assert a.finished and b.finished


def test_the_prefix_cache_evicts_the_least_recently_used_at_capacity() -> None:
    model, clock = engine(kv_tokens=1024)  # 64 blocks; each prompt fills 25
    prompts = {name: blocks(name * 400 * 4, 400) for name in "ABCD"}
    for name in "ABCD":
        model.submit(EngineRequest(400, 8, prompts[name]))
        run(model, clock)
    held = {name: model.cached_prefix(b) for name, b in prompts.items()}
    assert held["A"] == 0  # the oldest is gone
    assert held["C"] == held["D"] == 25  # the newest are whole
    assert 0 < held["B"] < 25  # a prompt goes tail first: its head still matches
    again = model.submit(EngineRequest(400, 8, prompts["D"]))
    run(model, clock)
    assert again.cached_tokens == 384  # all but the last block: its last token is recomputed


def test_aborting_frees_the_blocks() -> None:
    model, _ = engine()
    request = model.submit(EngineRequest(1000, 100))
    step = model.step()
    assert step is not None and model.used_blocks > 0
    model.abort(request)
    assert model.used_blocks == 0 and not model.busy and model.step() is None


def test_a_request_that_cannot_fit_is_refused() -> None:
    model, _ = engine(kv_tokens=256)
    with pytest.raises(ValueError, match="exceed the engine's 256"):
        model.submit(EngineRequest(200, 57))


def test_kv_capacity_comes_from_the_memory_fit() -> None:
    small, large = engine_spec("llama-3-8b", "L4"), engine_spec("llama-3-8b", "H100-SXM-80GB")
    assert 0 < small.kv_tokens < large.kv_tokens
    assert small.kv_tokens % BLOCK_SIZE == 0
    # 0.9 of 80 GiB, less about 16 GB of weights, at 128 KiB a token: about 450k tokens.
    assert 400_000 < large.kv_tokens < 500_000
    assert engine_spec("llama-3-8b", "L4", kv_tokens=1000).kv_tokens == 992  # whole blocks


def test_calibration_scales_the_step_time() -> None:
    slow = engine_spec("llama-3-8b", "L4", calibration=Calibration(0.25, 0.4, 0.01, 0.001))
    fast = engine_spec("llama-3-8b", "L4", calibration=Calibration(0.5, 0.8, 0.0, 0.0))
    assert slow.cost.compute_s(1000) == pytest.approx(2 * fast.cost.compute_s(1000))
    assert slow.cost.memory_s(1, 0) == pytest.approx(2 * fast.cost.memory_s(1, 0))
    assert slow.cost.time(1, 0) == pytest.approx(2 * fast.cost.time(1, 0) + 0.011)
    # The per-request overhead counts each request of the batch.
    assert slow.cost.time(8, 0, requests=8) - slow.cost.time(8, 0, requests=1) == (
        pytest.approx(7 * 0.001)
    )


def test_attention_runs_at_its_own_efficiency_and_only_attention_does() -> None:
    same = engine_spec("llama-3-8b", "L4", calibration=Calibration(0.5, 0.8))
    slow = engine_spec("llama-3-8b", "L4", calibration=Calibration(0.5, 0.8, 0.0, 0.0, 0.1))
    assert Calibration(0.5, 0.8).attention == 0.5  # None: as the rest of the pass
    # The tokens' matrix products and the memory side are as before ...
    assert slow.cost.compute_s(2048) == pytest.approx(same.cost.compute_s(2048))
    assert slow.cost.memory_s(8, 4096) == same.cost.memory_s(8, 4096)
    # ... the attention over the context five times slower: a long prompt's prefill grows
    # faster than its length (each token attends to all before it).
    pairs = 4096 * 4097 // 2
    extra = slow.cost.compute_s(4096, pairs) - slow.cost.compute_s(4096)
    assert extra == pytest.approx(
        5 * (same.cost.compute_s(4096, pairs) - same.cost.compute_s(4096))
    )
    assert slow.cost.compute_s(4096, pairs) / slow.cost.compute_s(1024, 1024 * 1025 // 2) > 4.5


@pytest.mark.parametrize(
    ("options", "field", "message"),
    [
        ({"model_shape": "llama-9"}, "model_shape", "unknown model shape 'llama-9'; built-in: "),
        ({"attention_efficiency": 1.5}, "attention_efficiency", "in (0, 1], got 1.5"),
        ({"device": "H900"}, "device", "unknown device 'H900'"),
        ({"compute_efficiency": 0}, "compute_efficiency", "in (0, 1], got 0"),
        ({"bandwidth_efficiency": -0.5}, "bandwidth_efficiency", "in (0, 1], got -0.5"),
        ({"step_overhead": -1}, "step_overhead", "seconds >= 0, got -1"),
        ({"request_overhead": float("nan")}, "request_overhead", "seconds >= 0, got nan"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", "integer >= 1, got 0"),
        ({"engine_model": "paged"}, "engine_model", "one of simple, continuous, got 'paged'"),
    ],
)
def test_bad_config_names_the_field_the_value_and_what_is_allowed(
    options: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        MockConfig(**{"engine_model": "continuous", **options})  # type: ignore[arg-type]
    assert [f for f, _ in caught.value.problems] == [field]
    assert message in caught.value.problems[0][1]


def test_a_model_that_does_not_fit_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"device: llama-3-70b does not fit on L4"):
        MockConfig(engine_model="continuous", model_shape="llama-3-70b", device="L4")
    MockConfig(model_shape="llama-3-70b", device="L4")  # the simple model never fits it


def test_the_mock_config_builds_the_engine_it_names() -> None:
    config = MockConfig(engine_model="continuous", device="L4", slots=64, step_overhead=0.0)
    spec = config.engine_spec
    assert isinstance(spec, EngineSpec)
    assert (spec.device.model, spec.shape.name, spec.max_num_seqs) == ("L4", "llama-3-8b", 64)
    assert config.kv_capacity == spec.kv_tokens
    assert replace(config, speed=2.0).engine_spec == spec
    assert MockConfig().engine_spec is None
