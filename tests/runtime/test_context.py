"""The engine end to end on real worker processes: run, submit, graphs, map, errors."""

from __future__ import annotations

import concurrent.futures as cf
import os

import numpy as np
import pytest

import hetero
from hetero.errors import ConfigError, HeteroError, NoCapableDevice, TaskFailed
from hetero.testing import emulated_fleet


def add(a: int, b: int) -> int:
    return a + b


def where() -> tuple[str, bool, bool, int]:
    dev = hetero.get_current_device()
    return dev.id, dev.type == "GPU", dev.emulated, os.getpid()


def boom(x: int) -> int:
    raise ValueError(f"bad value {x}")


def test_run_submit_and_a_graph_on_this_machine() -> None:
    with hetero.Context() as ctx:
        assert ctx.run(add, 1, 2) == 3
        f = ctx.submit(add, 3, 4)
        g = ctx.submit(add, f, b=f)  # a future as a positional and a keyword argument
        assert isinstance(f, cf.Future)
        assert g.result(timeout=30) == 14
        assert g.device == ctx.devices[0].id
        done, _ = cf.wait([ctx.submit(add, i, i) for i in range(20)], timeout=30)
        assert sorted(f.result() for f in done) == [2 * i for i in range(20)]


def test_each_device_has_its_own_worker_process_reused_across_tasks() -> None:
    paced = hetero.task(cost=0.02)(where)  # 20 ms each: both devices are needed
    with hetero.Context(devices=emulated_fleet([1.0, 1.0])) as ctx:
        seen = {ctx.run(paced) for _ in range(3)}
        seen |= {f.result() for f in [ctx.submit(paced) for _ in range(20)]}
    ids = {s[0] for s in seen}
    assert ids == {"d0", "d1"}
    assert all(s[1] and s[2] for s in seen)  # "GPU" compares equal to "gpu"
    pids = {s[0]: s[3] for s in seen}
    assert len({(s[0], s[3]) for s in seen}) == 2  # one process per device, reused
    assert pids["d0"] != pids["d1"] and os.getpid() not in pids.values()


def test_numpy_arrays_travel_both_ways_without_corruption() -> None:
    big = np.arange(2_000_000, dtype=np.float64)  # 16 MB: through shared memory
    with hetero.Context() as ctx:
        out = ctx.run(np.multiply, big, 2.0)
        assert out.dtype == np.float64 and out.shape == big.shape
        assert np.array_equal(out, big * 2)
        out[0] = -1.0  # results are writable and the caller's own


def test_a_task_that_raises_fails_with_the_remote_traceback() -> None:
    with hetero.Context() as ctx:
        f = ctx.submit(boom, 7)
        with pytest.raises(TaskFailed) as info:
            f.result(timeout=30)
    err = info.value
    assert "ValueError: bad value 7" in str(err)
    assert err.remote_traceback is not None and "in boom" in err.remote_traceback
    assert isinstance(err.__cause__, ValueError)


def test_a_failed_parent_fails_its_children_with_the_cause() -> None:
    with hetero.Context() as ctx:
        parent = ctx.submit(boom, 1)
        child = ctx.submit(add, parent, 1)
        grandchild = ctx.submit(add, child, 1)
        with pytest.raises(TaskFailed, match=r"parent task \d+ failed"):
            child.result(timeout=30)
        with pytest.raises(TaskFailed, match="not run"):
            grandchild.result(timeout=30)
        assert isinstance(child.exception().__cause__, TaskFailed)


def test_map_returns_results_in_order_for_lists_and_iterators() -> None:
    with hetero.Context(devices=emulated_fleet([2.0, 1.0, 0.5])) as ctx:
        assert list(ctx.map(lambda x: x * x, range(200), progress=False)) == [
            x * x for x in range(200)
        ]
        stream = (i for i in range(57))
        out = ctx.map(lambda x: x + 1, stream, batch_size=5)
        assert list(out) == list(range(1, 58))
        unordered = ctx.map(lambda x: -x, range(50), ordered=False, progress=False)
        assert sorted(unordered) == sorted(-x for x in range(50))


def test_variants_run_the_code_for_the_device_kind() -> None:
    @hetero.task(variants={"gpu": lambda: "gpu code", "cpu": lambda: "cpu code"})
    def kind() -> str:
        return "default"

    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        assert ctx.run(kind) == "gpu code"

    @hetero.task(variants={"tpu": lambda: "tpu code"})
    def tpu_only() -> str:
        return "x"

    with (
        hetero.Context(devices=emulated_fleet([1.0])) as ctx,
        pytest.raises(NoCapableDevice, match="variants for tpu but the fleet has only gpu devices"),
    ):
        ctx.submit(tpu_only)


def test_bad_input_is_refused_at_submit_with_a_clear_error() -> None:
    import threading

    lock = threading.Lock()
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        with pytest.raises(HeteroError, match=r"arguments of task .* cannot be sent"):
            ctx.submit(add, lock, 1)
        with pytest.raises(HeteroError, match="its function does not pickle"):
            ctx.submit(lambda: lock)
        big = hetero.task(memory="1TB")(add)
        with pytest.raises(
            NoCapableDevice,
            match=r"task 'add': work item .* needs 931.32 GiB of memory; the largest device, d0",
        ):
            ctx.submit(big, 1, 2)
    with pytest.raises(HeteroError, match="Context is closed"):
        ctx.submit(add, 1, 2)
    with pytest.raises(ConfigError, match="memory"):
        hetero.task(memory="lots")(add)
    with pytest.raises(ConfigError, match="retries"):
        hetero.task(retries=-1)(add)
    with pytest.raises(ConfigError, match="time_scale"):
        hetero.Context(time_scale=0)
    with pytest.raises(HeteroError, match="cannot be written"):
        hetero.Context(checkpoint_dir="/proc/hetero-cannot-write")


def test_get_current_device_outside_a_task_is_an_error() -> None:
    with pytest.raises(HeteroError, match="only available inside a task"):
        hetero.get_current_device()
    with pytest.raises(HeteroError, match="inside a running task"):
        hetero.checkpoint({"x": 1})


def visible() -> tuple[str | None, str | None, int, str | None]:
    env = os.environ
    return (
        env.get("CUDA_VISIBLE_DEVICES"),
        env.get("HIP_VISIBLE_DEVICES"),
        len(os.sched_getaffinity(0)),
        env.get("OMP_NUM_THREADS"),
    )


def test_a_gpu_worker_sees_only_its_gpu_and_the_cpu_worker_gets_its_cores() -> None:
    from hetero.devices.catalog import get_catalog
    from hetero.devices.discovery import discover_cpu
    from hetero.devices.spec import Device

    gpu = Device(id="gpu:1", spec=get_catalog().get("A100-80GB"), local_index=1)
    cpu = discover_cpu()
    cpu.cores = 1
    with hetero.Context(devices=[gpu, cpu]) as ctx:
        on_gpu = ctx.run(hetero.task(devices=["gpu:1"])(visible))
        on_cpu = ctx.run(hetero.task(devices=["cpu"])(visible))
    assert on_gpu[:2] == ("1", "1")
    assert on_cpu[2:] == (1, "1")


def test_start_brings_every_worker_up_before_the_first_task() -> None:
    with hetero.Context(devices=emulated_fleet([1.0, 1.0, 1.0])).start() as ctx:
        pids = ctx.backend.pids()
        assert all(p is not None for p in pids)
        assert len({ctx.run(where)[3] for _ in range(3)} - set(pids)) == 0


def test_a_worker_from_another_protocol_version_exits_with_a_clear_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import hetero.runtime.local as local

    monkeypatch.setattr(local, "PROTOCOL", -1)  # the driver speaks another version
    with (
        hetero.Context(devices=emulated_fleet([1.0]), max_retries=0) as ctx,
        pytest.raises(TaskFailed, match="runs another version of hetero than the driver"),
    ):
        ctx.run(add, 1, 2)


def test_bad_map_arguments_are_refused_cleanly(recwarn: pytest.WarningsRecorder) -> None:
    import gc

    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        with pytest.raises(ConfigError, match="iterable: must be iterable, got int"):
            ctx.map(add, 5)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="batch_size: must be 'auto' or an integer >= 1"):
            ctx.map(add, [1], batch_size=0)
        gc.collect()
    assert not [w for w in recwarn if "MapRun" in str(w.message)]


def lock_maker() -> object:
    import threading

    return threading.Lock()


def test_a_result_that_cannot_be_sent_back_fails_the_task_with_the_reason() -> None:
    with hetero.Context(devices=emulated_fleet([1.0])) as ctx:
        with pytest.raises(TaskFailed, match="the result of lock_maker cannot be pickled"):
            ctx.run(lock_maker)
        assert ctx.run(add, 3, 4) == 7  # the worker carries on
