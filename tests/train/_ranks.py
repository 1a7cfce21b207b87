"""What the multi-rank tests share: named scenarios run on every rank, what each rank
recorded, and one process training on the same global batches for the exactness checks."""

from __future__ import annotations

import gc
import importlib
import pickle
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetero.errors import HeteroError

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset

    from hetero.train import TrainerOptions

Outcome = tuple[str, Any]  # ("ok", value) or ("error", "ErrorType: message")


def run_scenarios(scenarios: Mapping[str, Callable[[int], Any]], rank: int) -> dict[str, Outcome]:
    """Each scenario's value on this rank, or the HeteroError it raised (as text)."""
    results: dict[str, Outcome] = {}
    for name, scenario in scenarios.items():
        try:
            results[name] = ("ok", scenario(rank))
        except HeteroError as exc:
            results[name] = ("error", f"{type(exc).__name__}: {exc}")
    return results


def run_ranks(module: str, world: int, out: Path) -> list[dict[str, Outcome]]:
    """Run the ``SCENARIOS`` of test module ``module`` on ``world`` gloo ranks, one process
    each, and return what each rank recorded (written to ``out``, read with ``recorded``); a
    module's ``_OUT``, where its scenarios write files, is set to ``out`` in each rank."""
    import torch.multiprocessing as mp

    from hetero.commands.launch import free_port

    mp.spawn(_rank_main, args=(module, world, free_port(), str(out)), nprocs=world, join=True)
    return recorded(out, world)


def _rank_main(rank: int, module: str, world: int, port: int, out: str) -> None:
    import torch

    from hetero import comm

    scenarios = importlib.import_module(module)
    if hasattr(scenarios, "_OUT"):
        scenarios._OUT = out
    torch.set_num_threads(1)  # as torchrun does: the ranks share this machine's cores
    comm.init(rank, world, backend="gloo", master_port=port, timeout=60)
    results = run_scenarios(scenarios.SCENARIOS, rank)
    gc.collect()  # DDP keeps reference cycles; freed after the process group is gone, gloo aborts
    comm.destroy()
    Path(out, f"rank{rank}.pkl").write_bytes(pickle.dumps(results))


def recorded(out: Path, world: int) -> list[dict[str, Outcome]]:
    """What each of the ``world`` ranks recorded (``rank{r}.pkl`` in ``out``), by scenario."""
    return [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(world)]


def each(ranks: list[dict[str, Outcome]], name: str) -> list[Any]:
    """Every rank's value for ``name``, failing the test if a rank raised."""
    outcomes = [r[name] for r in ranks]
    assert all(kind == "ok" for kind, _ in outcomes), outcomes
    return [value for _, value in outcomes]


def matching_one_process(
    ranks: list[dict[str, Outcome]], name: str, tolerance: float
) -> list[dict[str, Any]]:
    """Every rank's result of scenario ``name``, failing the test unless each one's ``diff``
    (its parameters against one process training on the same global batches) is within
    ``tolerance``."""
    results = each(ranks, name)
    diffs = [r["diff"] for r in results]
    print(f"{name}: difference per rank {diffs}")
    assert max(diffs) <= tolerance
    return results


def errors(ranks: list[dict[str, Outcome]], name: str) -> str:
    """The error ``name`` raised, the same on every rank."""
    outcomes = [r[name] for r in ranks]
    assert all(kind == "error" for kind, _ in outcomes), outcomes
    assert len({message for _, message in outcomes}) == 1, outcomes
    return str(outcomes[0][1])


def one_process(
    model: nn.Module,
    dataset: TensorDataset,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[Any, Any], Any],
    options: TrainerOptions,
    steps: int,
) -> nn.Module:
    """One process, no DDP: each step the mean loss of the whole global batch, the batches in
    the sampler's order (global batch k of an epoch is order[k*B:(k+1)*B])."""
    from hetero.train import HeteroSampler

    size, batch = len(dataset), options.global_batch
    done, epoch = 0, 0
    while done < steps:
        order = HeteroSampler.global_order(size, options.seed, epoch, options.shuffle)
        for k in range(0, size, batch):
            if done == steps:
                break
            x, y = dataset[order[k : k + batch]]
            loss = loss_fn(model(x), y) / len(x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
        epoch += 1
    return model
