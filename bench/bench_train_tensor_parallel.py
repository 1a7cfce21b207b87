"""Tensor parallelism: a small Llama (transformers' ``LlamaForCausalLM`` from a config, random
weights) trained whole in one process (TP=1) and with every decoder layer split over 2 gloo
ranks (TP=2, ``hetero.train.tensor_parallel``), each process on one thread.

- ``step_time_ms``: median wall time of a step (forward, backward, SGD step) over ``--steps``
  steps after ``--warmup`` untimed ones, on rank 0.
- ``communicated``: each rank's collectives in one step, counted as they reach the dispatcher
  (DTensor's all-reduces; their count and the bytes each rank puts in), against Megatron's
  four all-reduces of the activations per layer.
- ``parameter_bytes``: the bytes of parameters each rank holds (a split one's own part), of
  the whole model and of its decoder layers; SGD's momentum and the gradients follow them.
- ``exactness``: the largest parameter difference after all the steps, TP=2 against TP=1,
  relative to the parameter's largest value.

This machine has 2 cores, shared with other work (``load_average_before``): the two ranks'
matrix products are smaller than one process's but wait on each other's all-reduces, so TP=2 is
not expected to be faster here. What it buys on this machine is memory: half the layers'
weights per rank.

    nice -n 19 python bench/bench_train_tensor_parallel.py \
        --out bench/results/train_tensor_parallel.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _common
import torch
import torch.multiprocessing as mp
from _common import emit
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

import hetero
from hetero import comm
from hetero.commands.launch import free_port
from hetero.train.tensor_parallel import parameter_bytes, tensor_parallel
from hetero.train.tensor_parallel_groups import tensor_parallel_groups, tensor_parallel_mesh


@dataclass(frozen=True)
class Setup:
    layers: int = 2
    width: int = 256
    heads: int = 8
    kv_heads: int = 4
    hidden: int = 688
    vocab: int = 512
    batch: int = 8
    seq_len: int = 64
    steps: int = 20
    warmup: int = 3


def llama(setup: Setup) -> nn.Module:
    """The same random start in every process; no dropout."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=setup.width,
        intermediate_size=setup.hidden,
        num_hidden_layers=setup.layers,
        num_attention_heads=setup.heads,
        num_key_value_heads=setup.kv_heads,
        vocab_size=setup.vocab,
        max_position_embeddings=setup.seq_len,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def tokens(setup: Setup, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step)
    return torch.randint(0, setup.vocab, (setup.batch, setup.seq_len), generator=generator)


class Collectives(TorchDispatchMode):
    """The collectives that reach the dispatcher while it is on: count and input bytes."""

    COLLECTIVES = (
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "all_to_all",
        "broadcast",
        "scatter",
    )

    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}
        self.bytes = 0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = func._schema.name
        if name.partition("::")[0] in ("_c10d_functional", "c10d") and any(
            op in name for op in self.COLLECTIVES
        ):
            self.ops[name] = self.ops.get(name, 0) + 1
            self.bytes += sum(a.nbytes for a in args if isinstance(a, torch.Tensor))
        return func(*args, **(kwargs or {}))


def train(model: nn.Module, setup: Setup, counted_step: int | None) -> dict[str, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    times, counted = [], Collectives()
    for step in range(setup.warmup + setup.steps):
        ids = tokens(setup, step)
        started = time.perf_counter()
        if step == counted_step:
            with counted:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
        else:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step >= setup.warmup:
            times.append(time.perf_counter() - started)
    return {
        "step_time_ms": round(statistics.median(times) * 1e3, 2),
        "step_time_ms_all": [round(t * 1e3, 2) for t in times],
        "collectives": counted.ops,
        "bytes_communicated": counted.bytes,
        "last_loss": round(loss.item(), 5),
    }


def layer_bytes(model: nn.Module) -> int:
    return sum(parameter_bytes(layer) for layer in model.model.layers)


def whole(rank: int, setup: Setup, folder: str) -> None:
    """TP=1: the model whole, one process."""
    torch.set_num_threads(1)
    model = llama(setup)
    result = train(model, setup, counted_step=None)
    result["parameter_bytes"] = {"model": parameter_bytes(model), "layers": layer_bytes(model)}
    torch.save(model.state_dict(), Path(folder, "whole.pt"))
    Path(folder, "tp1.json").write_text(json.dumps(result))


def split(rank: int, port: int, setup: Setup, folder: str) -> None:
    """TP=2: every decoder layer split over the two ranks."""
    torch.set_num_threads(1)
    comm.init(rank, 2, backend="gloo", master_port=port, timeout=300)
    mesh = tensor_parallel_mesh(tensor_parallel_groups([[0.0, 1.0], [1.0, 0.0]], 2))
    model = llama(setup)
    tensor_parallel(model, mesh, {f"model.layers.{i}": "block" for i in range(setup.layers)})
    result = train(model, setup, counted_step=setup.warmup)
    result["parameter_bytes"] = {"model": parameter_bytes(model), "layers": layer_bytes(model)}
    reference = torch.load(Path(folder, "whole.pt"))
    result["exactness"] = max(
        (
            ((p.full_tensor() if isinstance(p, DTensor) else p) - reference[name]).abs().max()
            / reference[name].abs().max()
        ).item()
        for name, p in model.named_parameters()
    )
    comm.destroy()
    if rank == 0:
        Path(folder, "tp2.json").write_text(json.dumps(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=Setup.steps, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=Setup.warmup, help="untimed steps first")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    setup = Setup(steps=args.steps, warmup=args.warmup)
    record = _common.Run("bench/bench_train_tensor_parallel.py", argv)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(whole, args=(setup, tmp), nprocs=1, join=True)
        mp.spawn(split, args=(free_port(), setup, tmp), nprocs=2, join=True)
        tp1 = json.loads(Path(tmp, "tp1.json").read_text())
        tp2 = json.loads(Path(tmp, "tp2.json").read_text())
    activation = setup.batch * setup.seq_len * setup.width * 4  # fp32
    doc: dict[str, Any] = {
        **record.header(
            "tensor parallelism (DTensor over gloo)",
            hetero=hetero.__version__,
            torch=torch.__version__,
        ),
        "setup": {
            **asdict(setup),
            "model": "LlamaForCausalLM (transformers), random weights",
            "optimizer": "SGD lr 0.05 momentum 0.9",
            "threads_per_process": 1,
        },
        "step_time_ms": {"tp1": tp1["step_time_ms"], "tp2": tp2["step_time_ms"]},
        "step_time_ms_all": {"tp1": tp1["step_time_ms_all"], "tp2": tp2["step_time_ms_all"]},
        "communicated": {
            "tp1_bytes_per_step": tp1["bytes_communicated"],
            "tp2_bytes_per_step_per_rank": tp2["bytes_communicated"],
            "tp2_collectives_per_step": tp2["collectives"],
            "megatron_bytes_per_step_per_rank": 4 * setup.layers * activation,
        },
        "parameter_bytes": {
            "tp1": tp1["parameter_bytes"],
            "tp2_per_rank": tp2["parameter_bytes"],
            "layers_ratio": round(
                tp2["parameter_bytes"]["layers"] / tp1["parameter_bytes"]["layers"], 4
            ),
            "model_ratio": round(
                tp2["parameter_bytes"]["model"] / tp1["parameter_bytes"]["model"], 4
            ),
        },
        "exactness": tp2["exactness"],
        "last_loss": {"tp1": tp1["last_loss"], "tp2": tp2["last_loss"]},
        **record.footer(),
    }
    return emit(doc, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
