"""hetero.comm on 3 gloo ranks over 127.0.0.1: each collective against its expected value.

The three processes start once per module (starting torch costs most of the time) and run every
scenario in order; the tests then check what each rank recorded. A scenario that must fail fails
the same way on every rank before any communication, so no rank is left waiting.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hetero import comm
from hetero.commands.launch import free_port
from hetero.config import parse_config
from hetero.errors import BackendError, ConfigError, HeteroError
from tests.train._ranks import Outcome, each, recorded, run_scenarios

WORLD = 3


def _values(tensor: torch.Tensor) -> list[Any]:
    return tensor.tolist()  # type: ignore[no-any-return]


def _identity(rank: int) -> Any:
    return comm.rank(), comm.world_size(), comm.is_initialized()


def _init_again(rank: int) -> Any:
    comm.init(rank, WORLD, backend="gloo")  # the same settings: nothing happens
    comm.init(rank, WORLD + 1, backend="gloo")


def _broadcast(rank: int) -> Any:
    tensor = torch.full((3,), float(rank))
    comm.broadcast(tensor, src=1)
    return _values(tensor)


def _reduce(op: str) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        tensor = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
        comm.all_reduce(tensor, op=op)
        return _values(tensor)

    return scenario


def _reduce_int(rank: int) -> Any:
    tensor = torch.tensor([rank, 10 * rank])
    comm.all_reduce(tensor)
    return _values(tensor)


WEIGHTS = [1.0, 2.0, 5.0]


def _weighted(op: str) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        tensor = torch.tensor([rank + 1.0])
        comm.all_reduce(tensor, op=op, weight=WEIGHTS[rank])
        return _values(tensor)

    return scenario


def _uneven_means(rank: int) -> Any:
    """Per-rank means over uneven shares, weighted by share: the mean of the whole batch."""
    shares = [2, 3, 7]
    start = sum(shares[:rank])
    tensor = torch.arange(12.0)[start : start + shares[rank]].mean().reshape(1)
    comm.all_reduce(tensor, op="mean", weight=shares[rank])
    return _values(tensor)


def _all_gather(rank: int) -> Any:
    return [_values(t) for t in comm.all_gather(torch.tensor([rank, 10 * rank]))]


def _all_gather_object(rank: int) -> Any:
    return comm.all_gather_object({"rank": rank, "name": f"r{rank}"})


def _reduce_scatter(op: str) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        inputs = [torch.tensor([10.0 * rank + j, 1.0]) for j in range(WORLD)]
        output = torch.zeros(2)
        comm.reduce_scatter(output, inputs, op=op)
        return _values(output)

    return scenario


def _ring(rank: int) -> Any:
    """Each rank sends its rank to the next; even ranks send first so the ring cannot lock."""
    out, got = torch.tensor([float(rank)]), torch.zeros(1)
    nxt, prev = (rank + 1) % WORLD, (rank - 1) % WORLD
    if rank % 2 == 0:
        comm.send(out, dst=nxt)
        comm.recv(got, src=prev)
    else:
        comm.recv(got, src=prev)
        comm.send(out, dst=nxt)
    return _values(got)


def _barrier(rank: int) -> Any:
    comm.barrier()


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "identity": _identity,
    "init_again": _init_again,
    "broadcast": _broadcast,
    **{f"reduce_{op}": _reduce(op) for op in ("sum", "mean", "max", "min", "product")},
    "reduce_int": _reduce_int,
    "weighted_sum": _weighted("sum"),
    "weighted_mean": _weighted("mean"),
    "uneven_means": _uneven_means,
    "all_gather": _all_gather,
    "all_gather_object": _all_gather_object,
    "reduce_scatter_sum": _reduce_scatter("sum"),
    "reduce_scatter_mean": _reduce_scatter("mean"),
    "ring": _ring,
    "barrier": _barrier,
    "send_to_self": lambda rank: comm.send(torch.zeros(1), dst=rank),
    "broadcast_from_nowhere": lambda rank: comm.broadcast(torch.zeros(1), src=WORLD),
    "unknown_op": lambda rank: comm.all_reduce(torch.zeros(1), op="avg"),
    "mean_of_ints": lambda rank: comm.all_reduce(torch.zeros(1, dtype=torch.int64), op="mean"),
    "weighted_max": lambda rank: comm.all_reduce(torch.zeros(1), op="max", weight=1.0),
    "scatter_too_few": lambda rank: comm.reduce_scatter(torch.zeros(1), [torch.zeros(1)]),
    "scatter_bad_shape": lambda rank: comm.reduce_scatter(torch.zeros(1), [torch.zeros(2)] * 3),
}


def _worker(rank: int, port: int, out: str) -> None:
    # rank and world size come from the environment, as under torchrun; "tcp" means gloo.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD))
    comm.init(backend="tcp", master_port=port, timeout=30)
    results = run_scenarios(SCENARIOS, rank)
    results["backend"] = ("ok", str(dist.get_backend()))
    comm.destroy()
    results["after_destroy"] = ("ok", comm.is_initialized())
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    out = tmp_path_factory.mktemp("comm")
    mp.spawn(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True)
    return recorded(out, WORLD)


def test_init_from_the_environment_joins_three_gloo_ranks(ranks: list[dict[str, Outcome]]) -> None:
    assert each(ranks, "identity") == [(r, WORLD, True) for r in range(WORLD)]
    assert each(ranks, "backend") == ["gloo"] * WORLD
    assert each(ranks, "after_destroy") == [False] * WORLD


def test_init_again_is_a_no_op_with_the_same_settings_and_an_error_with_others(
    ranks: list[dict[str, Outcome]],
) -> None:
    for r, rank in enumerate(ranks):
        kind, message = rank["init_again"]
        assert kind == "error"
        assert f"already initialised as rank {r} of 3 on gloo, not rank {r} of 4" in message
        assert "hetero.comm.destroy() first" in message


def test_broadcast_copies_the_source_rank(ranks: list[dict[str, Outcome]]) -> None:
    assert each(ranks, "broadcast") == [[1.0, 1.0, 1.0]] * WORLD


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("sum", [6.0, 12.0]),
        ("mean", [2.0, 4.0]),
        ("max", [3.0, 6.0]),
        ("min", [1.0, 2.0]),
        ("product", [6.0, 48.0]),
    ],
)
def test_all_reduce_ops(ranks: list[dict[str, Outcome]], op: str, expected: list[float]) -> None:
    assert each(ranks, f"reduce_{op}") == [expected] * WORLD


def test_all_reduce_sums_integer_tensors(ranks: list[dict[str, Outcome]]) -> None:
    assert each(ranks, "reduce_int") == [[3, 30]] * WORLD


def test_weighted_all_reduce(ranks: list[dict[str, Outcome]]) -> None:
    # Σ w·x = 1·1 + 2·2 + 5·3 = 20; the mean divides by Σ w = 8.
    assert each(ranks, "weighted_sum") == [[20.0]] * WORLD
    assert each(ranks, "weighted_mean") == [[2.5]] * WORLD
    # Means over 2, 3 and 7 samples of 0..11, weighted by count: the mean of 0..11.
    assert each(ranks, "uneven_means") == [[pytest.approx(5.5)]] * WORLD


def test_all_gather_returns_every_rank_in_order(ranks: list[dict[str, Outcome]]) -> None:
    assert each(ranks, "all_gather") == [[[0, 0], [1, 10], [2, 20]]] * WORLD
    objects = [{"rank": r, "name": f"r{r}"} for r in range(WORLD)]
    assert each(ranks, "all_gather_object") == [objects] * WORLD


def test_reduce_scatter_on_gloo(ranks: list[dict[str, Outcome]]) -> None:
    # Rank r gets Σ_k inputs_k[r] = Σ_k [10k + r, 1] = [30 + 3r, 3].
    assert each(ranks, "reduce_scatter_sum") == [[30.0 + 3 * r, 3.0] for r in range(WORLD)]
    assert each(ranks, "reduce_scatter_mean") == [[10.0 + r, 1.0] for r in range(WORLD)]


def test_send_and_recv_pass_a_tensor_round_a_ring(ranks: list[dict[str, Outcome]]) -> None:
    assert each(ranks, "ring") == [[2.0], [0.0], [1.0]]
    assert each(ranks, "barrier") == [None] * WORLD


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("send_to_self", "ConfigError: dst: must be another rank than this one ({rank})"),
        ("broadcast_from_nowhere", "ConfigError: src: must be a rank in [0, 3), got 3"),
        ("unknown_op", "ConfigError: op: unknown op 'avg'; expected one of max, mean, min"),
        ("mean_of_ints", "ConfigError: tensor: op='mean' needs a floating-point tensor"),
        ("weighted_max", "ConfigError: weight: applies to op 'sum' or 'mean', not 'max'"),
        ("scatter_too_few", "ConfigError: inputs: needs one tensor per rank (3), got 1"),
        ("scatter_bad_shape", "ConfigError: inputs[0]: must match output ((1,), torch.float32)"),
    ],
)
def test_bad_arguments_fail_on_every_rank_before_any_communication(
    ranks: list[dict[str, Outcome]], scenario: str, expected: str
) -> None:
    for r, rank in enumerate(ranks):
        kind, message = rank[scenario]
        assert kind == "error" and message.startswith(expected.format(rank=r)), message


@pytest.mark.parametrize(
    "call",
    [
        comm.rank,
        comm.world_size,
        comm.barrier,
        lambda: comm.send(torch.zeros(1), 1),
        lambda: comm.recv(torch.zeros(1), 1),
        lambda: comm.broadcast(torch.zeros(1)),
        lambda: comm.all_reduce(torch.zeros(1)),
        lambda: comm.all_gather(torch.zeros(1)),
        lambda: comm.all_gather_object(1),
        lambda: comm.reduce_scatter(torch.zeros(1), [torch.zeros(1)]),
    ],
)
def test_every_call_before_init_says_to_call_init(call: Callable[[], Any]) -> None:
    assert not comm.is_initialized()
    with pytest.raises(HeteroError, match=r"not initialised; call hetero.comm.init\(\) first"):
        call()
    comm.destroy()  # nothing to leave: no error


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"backend": "infiniband"},
            ConfigError,
            r"backend: unknown backend 'infiniband'; expected one of gloo, mpi, nccl, rdma, tcp",
        ),
        ({"rank": 3}, ConfigError, r"rank: must be in \[0, 3\) for world_size=3, got 3"),
        ({"world_size": 0, "rank": 0}, ConfigError, r"world_size: must be at least 1, got 0"),
        ({"timeout": 0}, ConfigError, r"timeout: must be a positive number of seconds, got 0"),
        ({"master_port": 70000}, ConfigError, r"master_port: must be in \[1, 65535\], got 70000"),
    ],
)
def test_init_rejects_bad_settings_before_connecting(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    args: dict[str, Any] = {"rank": 0, "world_size": 3, "backend": "gloo"} | kwargs
    with pytest.raises(error, match=match):
        comm.init(**args)
    assert not comm.is_initialized()


def test_init_without_rank_or_env_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match=r"rank: not given and \$RANK is not set"):
        comm.init(world_size=2, backend="gloo")
    monkeypatch.setenv("RANK", "first")
    with pytest.raises(ConfigError, match=r"rank: \$RANK must be an integer, got 'first'"):
        comm.init(world_size=2, backend="gloo")


@pytest.mark.skipif(dist.is_mpi_available(), reason="this torch build has MPI")
def test_the_backend_comes_from_the_config_and_a_missing_one_is_a_backend_error() -> None:
    config = parse_config({"devices": [{"type": "cpu"}], "communication": {"protocol": "mpi"}})
    with pytest.raises(BackendError, match=r"backend 'mpi' is not available in this torch build"):
        comm.init(0, 1, config=config)
