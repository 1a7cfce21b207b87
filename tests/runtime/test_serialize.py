"""Shared-memory transport: large buffers out of band, kept results passed on without a copy."""

from __future__ import annotations

import gc
import os

import numpy as np

import hetero
from hetero.runtime.serialize import SHM_THRESHOLD, pack, remove_segments, segment_dir, unpack
from hetero.testing import emulated_fleet


def test_small_values_stay_in_band_and_large_buffers_go_through_shared_memory() -> None:
    small = pack((1, "x", np.zeros(8)), "hetero-test-small")
    assert small.segments == []
    big = np.arange(SHM_THRESHOLD, dtype=np.uint8)
    packed = pack({"a": big}, f"hetero-{os.getpid()}-test")
    ((name, size, owned),) = packed.segments
    assert size == big.nbytes and owned and (segment_dir() / name).exists()
    out, _ = unpack(packed)
    assert np.array_equal(out["a"], big)
    out["a"][0] = 255  # private mapping: the sender's segment is unchanged
    again, _ = unpack(packed)
    assert again["a"][0] == 0
    remove_segments(packed.segments)
    assert not (segment_dir() / name).exists()


def test_a_kept_result_is_referred_to_not_copied_and_removed_once_collected() -> None:
    result = pack(np.ones(1_000_000), f"hetero-{os.getpid()}-worker")
    ((name, _, _),) = result.segments
    array, _ = unpack(result, keep=True)
    onward = pack((array,), f"hetero-{os.getpid()}-driver")
    assert onward.segments == [(name, array.nbytes, False)]  # the same segment, not written
    remove_segments(onward.segments)  # a message does not remove what it only refers to
    assert (segment_dir() / name).exists()
    array[:] = 2.0  # the driver's writes are what the next task reads
    (seen,), _ = unpack(onward)
    assert seen.sum() == 2_000_000
    del array, seen
    gc.collect()
    assert not (segment_dir() / name).exists()


def total(a: np.ndarray) -> float:
    return float(a.sum())


def test_intermediate_results_flow_through_a_graph_without_copies() -> None:
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        parent = ctx.submit(np.ones, 2_000_000)
        child = ctx.submit(total, parent)
        assert child.result(timeout=30) == 2_000_000.0
        kept = parent.result()
        kept[:10] = 0.0
        assert ctx.run(total, kept) == 2_000_000.0 - 10


def test_a_pool_hands_a_file_back_for_the_same_size_class_only() -> None:
    from hetero.runtime.serialize import SegmentPool

    pool = SegmentPool(cap=4 * 2**20)
    first = pack(np.ones(300_000), f"hetero-{os.getpid()}-pool", pool)  # 2.4 MB: 4 MiB class
    ((name, size, _),) = first.segments
    pool.give(name, size)
    assert pool.take(10**6) is None  # a 1 MiB class: not that file
    again = pack(np.full(400_000, 3.0), f"hetero-{os.getpid()}-pool", pool)
    assert again.segments[0][0] == name  # rewritten, not created
    out, _ = unpack(again)
    assert out.shape == (400_000,) and (out == 3.0).all()
    pool.give(name, again.segments[0][1])
    pool.give("hetero-not-kept", 2**30)  # over the cap: removed, not kept
    pool.clear()
    assert not (segment_dir() / name).exists()


def identity(a: np.ndarray) -> np.ndarray:
    return a


def test_files_are_reused_across_calls_and_no_live_result_is_ever_overwritten() -> None:
    from hetero.runtime.serialize import _DIR

    seen: set[str] = set()
    results = []
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        for k in range(40):
            out = ctx.run(identity, np.full(200_000, float(k)))
            if k % 4 == 0:
                results.append((k, out))  # kept alive: its file must not be reused
            seen |= {p.name for p in _DIR.glob(f"hetero-{os.getpid()}-*")}
            del out
        onward = ctx.run(total, results[0][1])  # lent to another task, then dropped
        assert onward == 0.0
        for k, out in results:
            assert (out == float(k)).all(), k
    assert len(seen) < 40  # files were rewritten, not one pair per call
