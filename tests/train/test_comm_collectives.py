"""hetero.comm's reduce, all_to_all, subgroups, async handles and collective timing, on 3 gloo
ranks over 127.0.0.1.

The ranks start once per module and run every scenario in order (``tests.train._ranks``); the
tests check what each rank recorded. A scenario that must fail fails alike on every rank before
any communication, so no rank is left waiting.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from hetero import comm
from hetero.commands.launch import free_port
from hetero.errors import HeteroError
from hetero.runtime.profiling import Profiler
from hetero.telemetry.collectives import OpStats, RankCollectives
from tests.cli_apps import hetero_cli
from tests.train._ranks import Outcome, each, errors, run_ranks

WORLD = 3
WEIGHTS = [1.0, 2.0, 5.0]


def _values(tensor: torch.Tensor) -> Any:
    return tensor.tolist()


# ---------------------------------------------------------------------------------- reduce


def _reduce(op: str, dst: int, weighted: bool = False) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        tensor = torch.tensor([rank + 1.0, 2.0 * (rank + 1)])
        comm.reduce(tensor, dst, op=op, weight=WEIGHTS[rank] if weighted else None)
        return _values(tensor)

    return scenario


# ------------------------------------------------------------------------------ all_to_all


def _rows(src: int, dst: int) -> int:
    """Rows rank ``src`` sends rank ``dst``: uneven, and none from rank 0 to itself."""
    return src + 2 * dst


def _piece(src: int, dst: int) -> torch.Tensor:
    """What ``src`` sends ``dst``: row k is [100·src + 10·dst + k, -src]."""
    n = _rows(src, dst)
    first = torch.arange(n, dtype=torch.float32) + 100 * src + 10 * dst
    return torch.stack([first, torch.full((n,), -float(src))], dim=1)


def _all_to_all(sizes_known: bool) -> Callable[[int], Any]:
    def scenario(rank: int) -> Any:
        inputs = [_piece(rank, dst) for dst in range(WORLD)]
        sizes = [_rows(src, rank) for src in range(WORLD)] if sizes_known else None
        return [_values(t) for t in comm.all_to_all(inputs, output_sizes=sizes)]

    return scenario


# ------------------------------------------------------------------------------- subgroups


def _subgroup(rank: int) -> Any:
    """Collectives on ranks {0, 2}; rank 1 makes the same calls and takes no part."""
    pair = comm.new_group([2, 0])  # any order; the group orders its ranks
    tail = comm.new_group([1, 2])
    summed = torch.tensor([rank + 1.0])
    comm.all_reduce(summed, group=pair)
    sent = torch.tensor([10.0 * (rank + 1)])
    comm.broadcast(sent, src=2, group=pair)
    gathered = comm.all_gather(torch.tensor([float(rank)]), group=pair)
    reduced = torch.tensor([rank + 1.0])
    comm.reduce(reduced, 0, group=pair)
    scattered = torch.zeros(1)
    comm.reduce_scatter(scattered, [torch.tensor([rank + 1.0 + j]) for j in range(2)], group=pair)
    swapped = comm.all_to_all([torch.tensor([[rank, j]]) for j in range(2)], group=pair)
    comm.barrier(group=pair)
    objects = comm.all_gather_object(f"r{rank}", group=pair)
    other = torch.tensor([rank + 1.0])
    comm.all_reduce(other, group=tail)
    return {
        "ranks": pair.ranks,
        "member": pair.member,
        "index": pair.rank() if pair.member else None,
        "all_reduce": _values(summed),
        "broadcast": _values(sent),
        "all_gather": [_values(t) for t in gathered],
        "reduce": _values(reduced),
        "reduce_scatter": _values(scattered),
        "all_to_all": [_values(t) for t in swapped],
        "all_gather_object": objects,
        "other_group": _values(other),
    }


def _point_to_point_in_a_group(rank: int) -> Any:
    pair = comm.new_group([1, 2])
    got = torch.full((2,), -1.0)
    if rank == 1:
        comm.send(torch.tensor([7.0, 8.0]), dst=2, group=pair)
    elif rank == 2:
        comm.recv(got, src=1, group=pair)
    else:  # outside the group: the same calls do nothing
        comm.send(torch.tensor([7.0, 8.0]), dst=2, group=pair)
    return _values(got)


def _bad_dst_in_group(rank: int) -> Any:
    pair = comm.new_group([0, 2])
    comm.reduce(torch.zeros(1), 1, group=pair)


def _bad_group_ranks(rank: int) -> Any:
    comm.new_group([0, 3])


def _repeated_group_ranks(rank: int) -> Any:
    comm.new_group([1, 0, 1])


def _not_a_group(rank: int) -> Any:
    comm.all_reduce(torch.zeros(1), group=[0, 1])  # type: ignore[call-overload]


def _outside_rank_asks_its_index(rank: int) -> Any:
    pair = comm.new_group([0, 1])
    return pair.rank() if pair.member else f"member={pair.member}"


# ----------------------------------------------------------------------------------- async


def _async_matches_sync(rank: int) -> Any:
    """Each call made both ways on the same inputs: the results, sync then async."""
    pair = comm.new_group([0, 2])

    def both(call: Callable[[bool], Any]) -> tuple[Any, Any]:
        return call(False), call(True)

    def all_reduce(a: bool, op: str = "sum", weight: float | None = None) -> Any:
        t = torch.tensor([rank + 1.0, 3.0])
        handle = comm.all_reduce(t, op, weight, async_op=True) if a else None
        if handle is None:
            comm.all_reduce(t, op, weight)
        else:
            assert handle.wait() is None
        return _values(t)

    def reduce(a: bool) -> Any:
        t = torch.tensor([rank + 1.0])
        if a:
            comm.reduce(t, 2, "mean", WEIGHTS[rank], async_op=True).wait()
        else:
            comm.reduce(t, 2, "mean", WEIGHTS[rank])
        return _values(t)

    def broadcast(a: bool) -> Any:
        t = torch.tensor([float(rank)])
        if a:
            comm.broadcast(t, 1, async_op=True).wait()
        else:
            comm.broadcast(t, 1)
        return _values(t)

    def all_gather(a: bool) -> Any:
        t = torch.tensor([rank, -rank])
        out = comm.all_gather(t, async_op=True).wait() if a else comm.all_gather(t)
        return [_values(x) for x in out]

    def reduce_scatter(a: bool) -> Any:
        out = torch.zeros(2)
        ins = [torch.tensor([10.0 * rank + j, 1.0]) for j in range(WORLD)]
        if a:
            comm.reduce_scatter(out, ins, "mean", async_op=True).wait()
        else:
            comm.reduce_scatter(out, ins, "mean")
        return _values(out)

    def all_to_all(a: bool) -> Any:
        ins = [_piece(rank, dst) for dst in range(WORLD)]
        out = comm.all_to_all(ins, async_op=True).wait() if a else comm.all_to_all(ins)
        return [_values(x) for x in out]

    def in_group(a: bool) -> Any:
        t = torch.tensor([rank + 1.0])
        if a:
            handle = comm.all_reduce(t, group=pair, async_op=True)
            handle.wait()
            return _values(t), handle.is_completed()
        comm.all_reduce(t, group=pair)
        return _values(t), True

    def barrier(a: bool) -> Any:
        if a:
            return comm.barrier(async_op=True).wait()
        return comm.barrier()

    return {
        "all_reduce_sum": both(all_reduce),
        "all_reduce_mean": both(lambda a: all_reduce(a, "mean")),
        "all_reduce_weighted_mean": both(lambda a: all_reduce(a, "mean", WEIGHTS[rank])),
        "reduce_weighted_mean": both(reduce),
        "broadcast": both(broadcast),
        "all_gather": both(all_gather),
        "reduce_scatter_mean": both(reduce_scatter),
        "all_to_all": both(all_to_all),
        "in_group": both(in_group),
        "barrier": both(barrier),
    }


def _async_overlaps(rank: int) -> Any:
    """Two reductions in flight at once, a ring of isend/irecv, and waiting twice."""
    first, second = torch.tensor([rank + 1.0]), torch.tensor([10.0 * (rank + 1)])
    h1 = comm.all_reduce(first, async_op=True)
    h2 = comm.all_reduce(second, "max", async_op=True)
    got = torch.zeros(1)
    receiving = comm.recv(got, (rank - 1) % WORLD, async_op=True)
    sending = comm.send(torch.tensor([float(rank)]), (rank + 1) % WORLD, async_op=True)
    h2.wait()
    h1.wait()
    sending.wait()
    receiving.wait()
    gathered = comm.all_gather(torch.tensor([rank]), async_op=True)
    once, twice = gathered.wait(), gathered.wait()
    return {
        "sum": _values(first),
        "max": _values(second),
        "ring": _values(got),
        "same_result": once is twice,
        "completed": h1.is_completed() and h2.is_completed() and gathered.is_completed(),
    }


# ----------------------------------------------------------------------------------- stats


def _stats(rank: int) -> Any:
    """Known calls after a reset: the counts, bytes and that time was spent."""
    comm.reset_stats()
    for _ in range(3):
        comm.all_reduce(torch.ones(4))  # 16 bytes each
    comm.all_reduce(torch.ones(4), async_op=True).wait()
    comm.broadcast(torch.ones(2, dtype=torch.float64), 0)  # 16 bytes
    comm.broadcast(torch.ones(2, dtype=torch.float64), 1)
    comm.all_to_all([torch.ones(_rows(rank, dst), 3) for dst in range(WORLD)])
    comm.reduce(torch.ones(8), 0)  # 32 bytes
    mine = comm.stats()
    everyone = comm.gather_stats()
    after = comm.stats()  # gather_stats counts in no one's numbers
    return {
        "mine": mine.to_dict(),
        "everyone": [r.to_dict() for r in everyone],
        "unchanged": after.ops == mine.ops,
    }


SCENARIOS: dict[str, Callable[[int], Any]] = {
    "reduce_sum": _reduce("sum", 1),
    "reduce_max": _reduce("max", 2),
    "reduce_mean": _reduce("mean", 0),
    "reduce_weighted_mean": _reduce("mean", 0, weighted=True),
    "reduce_weighted_sum": _reduce("sum", 2, weighted=True),
    "all_to_all": _all_to_all(False),
    "all_to_all_sized": _all_to_all(True),
    "subgroup": _subgroup,
    "group_send": _point_to_point_in_a_group,
    "outside_index": _outside_rank_asks_its_index,
    "async": _async_matches_sync,
    "async_overlaps": _async_overlaps,
    "stats": _stats,
    "bad_dst_in_group": _bad_dst_in_group,
    "bad_group_ranks": _bad_group_ranks,
    "repeated_group_ranks": _repeated_group_ranks,
    "not_a_group": _not_a_group,
    "reduce_to_nowhere": lambda rank: comm.reduce(torch.zeros(1), WORLD),
    "all_to_all_too_few": lambda rank: comm.all_to_all([torch.zeros(1)]),
    "all_to_all_mixed_rows": lambda rank: comm.all_to_all(
        [torch.zeros(1, 2), torch.zeros(1, 3), torch.zeros(1, 2)]
    ),
    "all_to_all_scalar": lambda rank: comm.all_to_all(
        [torch.zeros(1), torch.tensor(1.0), torch.zeros(1)]
    ),
    "all_to_all_bad_sizes": lambda rank: comm.all_to_all(
        [torch.zeros(1)] * WORLD, output_sizes=[1, -1, 1]
    ),
}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Outcome]]:
    """What each of the 3 ranks recorded, by scenario."""
    return run_ranks(__name__, WORLD, tmp_path_factory.mktemp("collectives"))


def test_reduce_leaves_the_result_on_dst_and_the_others_as_they_were(
    ranks: list[dict[str, Outcome]],
) -> None:
    mine = [[r + 1.0, 2.0 * (r + 1)] for r in range(WORLD)]
    assert each(ranks, "reduce_sum") == [mine[0], [6.0, 12.0], mine[2]]
    assert each(ranks, "reduce_max") == [mine[0], mine[1], [3.0, 6.0]]
    assert each(ranks, "reduce_mean") == [[2.0, 4.0], mine[1], mine[2]]
    # Σ w·x / Σ w = (1·1 + 2·2 + 5·3) / 8 = 2.5 and twice that; the sum is not divided.
    assert each(ranks, "reduce_weighted_mean") == [[2.5, 5.0], mine[1], mine[2]]
    assert each(ranks, "reduce_weighted_sum") == [mine[0], mine[1], [20.0, 40.0]]


def test_all_to_all_delivers_uneven_pieces_in_rank_order(ranks: list[dict[str, Outcome]]) -> None:
    expected = [[_piece(src, dst).tolist() for src in range(WORLD)] for dst in range(WORLD)]
    assert expected[0][0] == []  # rank 0 sends itself no rows
    assert each(ranks, "all_to_all") == expected
    assert each(ranks, "all_to_all_sized") == expected


def test_a_subgroup_runs_among_its_members_and_leaves_the_others_untouched(
    ranks: list[dict[str, Outcome]],
) -> None:
    r0, r1, r2 = each(ranks, "subgroup")
    assert r0["ranks"] == r1["ranks"] == r2["ranks"] == (0, 2)
    assert (r0["member"], r1["member"], r2["member"]) == (True, False, True)
    assert (r0["index"], r2["index"]) == (0, 1)
    for member in (r0, r2):
        assert member["all_reduce"] == [4.0]  # 1 + 3: rank 1's 2 is not in it
        assert member["broadcast"] == [30.0]
        assert member["all_gather"] == [[0.0], [2.0]]
        assert member["all_gather_object"] == ["r0", "r2"]
    assert r0["reduce"] == [4.0] and r2["reduce"] == [3.0]  # dst 0; rank 2's as it was
    # Group index i gets Σ over members of inputs[i] = [rank + 1 + i].
    assert r0["reduce_scatter"] == [1.0 + 3.0] and r2["reduce_scatter"] == [2.0 + 4.0]
    assert r0["all_to_all"] == [[[0, 0]], [[2, 0]]]
    assert r2["all_to_all"] == [[[0, 1]], [[2, 1]]]
    untouched = {
        "all_reduce": [2.0],
        "broadcast": [20.0],
        "all_gather": [],
        "reduce": [2.0],
        "reduce_scatter": [0.0],
        "all_to_all": [],
        "all_gather_object": [],
    }
    assert {key: r1[key] for key in untouched} == untouched
    # The second group, made after the first on every rank: 2 + 3.
    assert [r["other_group"] for r in (r0, r1, r2)] == [[1.0], [5.0], [5.0]]
    assert each(ranks, "group_send") == [[-1.0, -1.0], [-1.0, -1.0], [7.0, 8.0]]
    assert each(ranks, "outside_index") == [0, 1, "member=False"]


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("bad_dst_in_group", "ConfigError: dst: must be a rank of the group [0, 2], got 1"),
        ("bad_group_ranks", "ConfigError: ranks: must be ranks in [0, 3), got 3"),
        ("repeated_group_ranks", "ConfigError: ranks: names rank 1 more than once"),
        ("not_a_group", "ConfigError: group: must be a Group from hetero.comm.new_group()"),
        ("reduce_to_nowhere", "ConfigError: dst: must be a rank in [0, 3), got 3"),
        ("all_to_all_too_few", "ConfigError: inputs: needs one tensor per rank (3), got 1"),
        ("all_to_all_mixed_rows", "ConfigError: inputs[1]: must have inputs[0]'s rows"),
        ("all_to_all_scalar", "ConfigError: inputs[1]: needs a first dimension (rows)"),
        ("all_to_all_bad_sizes", "ConfigError: output_sizes: must be 3 row counts"),
    ],
)
def test_bad_arguments_fail_on_every_rank_before_any_communication(
    ranks: list[dict[str, Outcome]], scenario: str, expected: str
) -> None:
    assert errors(ranks, scenario).startswith(expected)


def test_async_handles_give_what_the_sync_calls_give(ranks: list[dict[str, Outcome]]) -> None:
    for r, results in enumerate(each(ranks, "async")):
        for name, (sync, async_) in results.items():
            assert async_ == sync, (r, name)
    r0 = each(ranks, "async")[0]
    assert r0["all_reduce_weighted_mean"][0] == [2.5, 3.0]  # the sync result is the right one
    assert r0["in_group"][0] == ([4.0], True)
    assert each(ranks, "async")[1]["in_group"] == (([2.0], True), ([2.0], True))


def test_async_calls_overlap_and_wait_returns_the_same_result_twice(
    ranks: list[dict[str, Outcome]],
) -> None:
    for r, result in enumerate(each(ranks, "async_overlaps")):
        assert result == {
            "sum": [6.0],
            "max": [30.0],
            "ring": [float((r - 1) % WORLD)],
            "same_result": True,
            "completed": True,
        }


def test_every_call_is_counted_with_its_time_and_bytes(ranks: list[dict[str, Outcome]]) -> None:
    results = each(ranks, "stats")
    for r, result in enumerate(results):
        mine = RankCollectives.from_dict(result["mine"])
        assert (mine.rank, mine.world_size) == (r, WORLD)
        counts = {name: (op.count, op.bytes) for name, op in mine.ops.items()}
        sent = sum(_rows(r, dst) for dst in range(WORLD)) * 3 * 4
        assert counts == {
            "all_reduce": (4, 4 * 16),  # the async one counted once, like the others
            "broadcast": (2, 2 * 16),
            "all_to_all": (1, sent),
            "reduce": (1, 32),
        }
        assert all(op.seconds > 0 for op in mine.ops.values())
        assert mine.seconds <= mine.ended - mine.started
        assert result["unchanged"]
        gathered = [RankCollectives.from_dict(d) for d in result["everyone"]]
        assert [g.rank for g in gathered] == list(range(WORLD))
        assert gathered[r].ops == mine.ops


# ------------------------------------------------------------------ one rank, in this process


def test_a_group_of_an_ended_process_group_is_refused(group: None) -> None:
    solo = comm.new_group([0])
    tensor = torch.ones(1)
    comm.all_reduce(tensor, group=solo)
    comm.destroy()
    comm.init(0, 1, backend="gloo", master_port=free_port(), timeout=30)
    with pytest.raises(HeteroError, match=r"destroy\(\) ended; make it again with new_group"):
        comm.all_reduce(tensor, group=solo)


def test_new_calls_before_init_say_to_call_init() -> None:
    assert not comm.is_initialized()
    for call in (
        lambda: comm.reduce(torch.zeros(1), 0),
        lambda: comm.all_to_all([torch.zeros(1)]),
        lambda: comm.new_group([0]),
        lambda: comm.gather_stats(),
    ):
        with pytest.raises(HeteroError, match=r"not initialised; call hetero.comm.init\(\)"):
            call()
    assert comm.stats().world_size >= 1  # works without a group


def test_a_profile_records_this_ranks_collectives_in_its_window(
    group: None, tmp_path: Path
) -> None:
    comm.all_reduce(torch.ones(2))  # before the window: not in the profile
    profiler = Profiler(threading.RLock(), [])
    session = profiler.start("comm", tmp_path)
    for _ in range(5):
        comm.all_reduce(torch.ones(2))
    comm.barrier(async_op=True).wait()
    done = threading.Thread(target=comm.broadcast, args=(torch.ones(3),))  # any thread counts
    done.start()
    done.join()
    profile, paths = profiler.finish(session, lambda: [])
    (rank,) = profile.collectives
    assert {name: op.count for name, op in rank.ops.items()} == {
        "all_reduce": 5,
        "barrier": 1,
        "broadcast": 1,
    }
    assert rank.ops["all_reduce"].bytes == 5 * 8 and rank.seconds > 0
    assert profile.summary().collectives == (rank,)
    trace = json.loads(paths[0].read_text())
    assert trace["collectives"][0]["ops"]["all_reduce"]["count"] == 5
    page = paths[1].read_text()
    assert "Collective communication" in page and "all_reduce" in page


def test_the_report_shows_each_ranks_time_in_collectives(tmp_path: Path) -> None:
    from hetero.telemetry import Profile

    ranks = [
        RankCollectives(0, 2, {"all_reduce": OpStats(4, 0.5, 64)}, 10.0, 12.0),
        RankCollectives(
            1, 2, {"all_reduce": OpStats(4, 1.5, 64), "send": OpStats(1, 0.25, 8)}, 10.0, 12.0
        ),
    ]
    profile = Profile([], [], 10.0, 12.0, name="<ranks>", collectives=ranks)
    assert [r.share for r in profile.summary().collectives] == [0.25, 0.875]
    _, html_path = profile.save(tmp_path)
    page = html_path.read_text()
    assert "&lt;ranks&gt;" in page  # escaped
    assert "1.75 s (rank 1, 87.5% of its time)" in page  # the rank that spent the most
    assert "<td>1</td><td>all</td><td>5</td><td>1.75 s</td><td>87.5%</td>" in page
    assert "<h2>Timeline</h2>" not in page  # no fleet to chart


# ----------------------------------------------------------------------- hetero profile


_RANKS_SCRIPT = """
import sys
import torch
import torch.multiprocessing as mp
from hetero import comm
from hetero.commands.launch import free_port

def rank_main(rank, port, calls):
    torch.set_num_threads(1)
    comm.init(rank, 2, backend="gloo", master_port=port, timeout=60)
    for _ in range(calls):
        comm.all_reduce(torch.ones(4))
    comm.all_reduce(torch.ones(4), async_op=True).wait()
    comm.broadcast(torch.ones(2), 0)
    pair = comm.new_group([0, 1])
    comm.all_gather(torch.ones(1), group=pair)
    comm.destroy()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(free_port(), int(sys.argv[1])), nprocs=2, join=True)
"""


def test_hetero_profile_merges_every_ranks_collective_time(tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(_RANKS_SCRIPT)
    out = tmp_path / "reports"
    result = hetero_cli("profile", "--out", str(out), str(script), "6")
    assert result.returncode == 0, result.stderr
    assert str(out / "ranks.html") in result.stdout
    assert str(out / "ranks.trace.json") in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["ranks.html", "ranks.trace.json"]
    trace = json.loads((out / "ranks.trace.json").read_text())
    merged = [RankCollectives.from_dict(r) for r in trace["collectives"]]
    assert [r.rank for r in merged] == [0, 1]
    for r in merged:
        assert {name: op.count for name, op in r.ops.items()} == {
            "all_reduce": 7,
            "broadcast": 1,
            "all_gather": 1,
        }
        assert r.ops["all_reduce"].bytes == 7 * 16
        assert r.seconds > 0 and 0 < (r.share or 0) <= 1
    page = (out / "ranks.html").read_text()
    assert "Collective communication" in page and "<td>1</td><td>all</td><td>9</td>" in page
