"""Train a GPT-style transformer on synthetic tokens with hetero's Trainer, on ranks of
different speeds.

    python examples/train_gpt.py --nproc 3 --speeds 1,0.5,0.25 --steps 10
    hetero launch --nproc 3 examples/train_gpt.py --sharding fsdp --steps 10

The model is transformers' GPT-2 built from a config with random weights (nothing is fetched):
by default 6 layers of width 512 over a vocabulary of 8,192 tokens, 23 million parameters. The
data are sequences of a random Markov chain in which each token has 4 possible successors, so
the loss can fall from ln(vocabulary) to ln(4). Without torchrun or ``hetero launch`` the script
starts ``--nproc`` gloo ranks itself. Rank i emulates a device of relative speed ``speeds[i]``
(each micro-batch takes samples × ``--sample-time`` / speed seconds; ``--sample-time 0``: its
real compute time over the speed); ``--sharding fsdp`` shards the model with FSDP instead of
replicating it with DDP. Rank 0 prints how each rank spent its time and how close the step time
came to the ideal.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.utils.data import TensorDataset
from train_mlp import summary  # the same report as the MLP example's
from transformers import GPT2Config, GPT2LMHeadModel

from hetero import comm
from hetero.commands.launch import free_port
from hetero.train import Trainer, TrainerOptions

SUCCESSORS = 4  # possible next tokens of each token in the synthetic data
HELD_OUT = 32  # sequences the loss is reported on


def gpt(layers: int, width: int, vocab: int, seq_len: int, seed: int) -> nn.Module:
    """GPT-2 of ``layers`` blocks of ``width`` (heads of 64, or one below that), random
    weights, no dropout (so the distributed update is exactly one process's)."""
    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=max(1, width // 64),
        vocab_size=vocab,
        n_positions=seq_len,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)  # the same start on every rank
    return GPT2LMHeadModel(config)


def tokens(samples: int, seq_len: int, vocab: int, seed: int) -> TensorDataset:
    """``samples`` sequences of a random Markov chain (each token has ``SUCCESSORS`` possible
    successors, followed with equal odds): inputs and the same sequences shifted by one
    token."""
    generator = torch.Generator().manual_seed(seed)
    # Successors drawn by Zipf's law, as words are: frequent tokens are learnt first.
    zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64)
    successors = torch.multinomial(zipf, vocab * SUCCESSORS, replacement=True, generator=generator)
    successors = successors.view(vocab, SUCCESSORS)
    sequence = torch.empty(samples, seq_len + 1, dtype=torch.long)
    sequence[:, 0] = torch.randint(0, vocab, (samples,), generator=generator)
    for t in range(seq_len):
        pick = torch.randint(0, SUCCESSORS, (samples,), generator=generator)
        sequence[:, t + 1] = successors[sequence[:, t], pick]
    return TensorDataset(sequence[:, :-1], sequence[:, 1:])


def token_loss(output: object, target: torch.Tensor) -> torch.Tensor:
    """The sum over the batch's sequences of each one's mean next-token cross-entropy."""
    logits = output.logits  # type: ignore[attr-defined]
    flat = nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), target.flatten(), reduction="sum"
    )
    return flat / target.shape[1]


def held_out_loss(model: nn.Module, data: TensorDataset) -> float:
    """The mean loss on ``data`` (every rank runs it: under FSDP the forward gathers the
    parameters from all of them)."""
    x, y = data.tensors
    with torch.no_grad():
        return float(token_loss(model(x), y)) / len(x)


def run(rank: int, world: int, args: argparse.Namespace, port: int | None) -> None:
    if "OMP_NUM_THREADS" not in os.environ:  # torchrun sets it to 1 for the same reason:
        torch.set_num_threads(1)  # the ranks share this machine's cores
    comm.init(rank, world, backend="gloo", master_port=port)
    speeds = [float(s) for s in args.speeds.split(",")]
    model = gpt(args.layers, args.width, args.vocab, args.seq_len, args.seed)
    sequences = tokens(args.samples + HELD_OUT, args.seq_len, args.vocab, args.seed).tensors
    data = TensorDataset(*(t[:-HELD_OUT] for t in sequences))
    held_out = TensorDataset(*(t[-HELD_OUT:] for t in sequences))  # the same chain, unseen
    before = held_out_loss(model, held_out)
    options = TrainerOptions(
        global_batch=args.global_batch,
        micro_batch=args.micro_batch,
        rebalance_every=args.rebalance_every,
        seed=args.seed,
        speed=speeds[rank],
        emulate_sample_time=args.sample_time or None,
        sharding=args.sharding,
        mixed_precision=args.mixed_precision,
        report_path=args.report,
        checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every,
    )
    parameters = sum(p.numel() for p in model.parameters())
    trainer = Trainer(
        model,
        lambda params: torch.optim.AdamW(params, lr=args.lr, fused=True),
        token_loss,
        data,
        options,
    )
    if rank == 0:
        resumed = (
            f"; resumed from the checkpoint of step {trainer.resumed_from}"
            if trainer.resumed_from is not None
            else ""
        )
        print(
            f"{world} ranks (gloo, {args.sharding}), GPT-2 {args.layers} layers × {args.width}, "
            f"vocabulary {args.vocab}, {parameters / 1e6:.1f}M parameters, sequences of "
            f"{args.seq_len}; global batch {args.global_batch}, speeds "
            f"{' : '.join(f'{s:g}' for s in speeds)}; shares after profiling: "
            f"{'/'.join(map(str, trainer.shares))}{resumed}",
            flush=True,
        )
    reports = trainer.train(max(0, args.steps - trainer.steps), progress=not args.quiet)
    after = held_out_loss(trainer.model, held_out)
    if rank == 0:
        if reports:
            print(summary(speeds, reports))
        print(f"held-out loss: {before:.3f} -> {after:.3f} (the data's floor: ln 4 = 1.386)")
    trainer.close()
    del trainer
    gc.collect()  # DDP holds reference cycles: free them while the process group is up
    comm.destroy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=3, help="ranks to start (without torchrun)")
    parser.add_argument("--speeds", default="1,0.5,0.25", help="relative speed of each rank")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=14)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument(
        "--sample-time", type=float, default=0.3, help="seconds per sample at speed 1"
    )
    parser.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--rebalance-every", type=int, default=10)
    parser.add_argument("--samples", type=int, default=2048, help="synthetic sequences")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", default=None, help="JSON lines of step reports (rank 0)")
    parser.add_argument("--quiet", action="store_true", help="no live progress")
    parser.add_argument("--checkpoint-dir", default=None, help="save and resume training here")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="steps between saves")
    args = parser.parse_args(argv)
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.nproc
    if len(args.speeds.split(",")) != world:
        parser.error(f"--speeds gives {len(args.speeds.split(','))} speeds for {world} ranks")
    if under_torchrun:
        run(int(os.environ["RANK"]), world, args, None)
    else:
        mp.spawn(run, args=(world, args, free_port()), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
