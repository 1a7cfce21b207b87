"""Train a GPT-style transformer on synthetic tokens with hetero's Trainer, on ranks of
different speeds.

    python examples/train_gpt.py --nproc 3 --steps 10 --html gpt.html
    hetero launch --nproc 3 examples/train_gpt.py --sharding fsdp --steps 10

The model is transformers' GPT-2 built from a config with random weights (nothing is fetched):
by default 6 layers of width 512 over a vocabulary of 8,192 tokens, 23 million parameters. The
data are sequences of a random Markov chain in which each token has 4 possible successors, so
the loss can fall from ln(vocabulary) to ln(4). Without torchrun or ``hetero launch`` the script
starts ``--nproc`` gloo ranks itself. Rank i emulates device i of the fleet config ``--fleet``
at its catalog speed relative to the fleet's fastest device (each micro-batch takes samples ×
``--sample-time`` / speed seconds; ``--sample-time 0``: its real compute time over the speed);
``--sharding fsdp`` shards the model with FSDP instead of replicating it with DDP. The learning
rate warms up linearly over ``--warmup-steps`` and then follows a cosine down to a tenth by the
last step (an LR scheduler the trainer steps once per global step); ``--max-grad-norm`` clips the
global gradient. Rank 0 prints how each rank spent its time, how close the step time came to the
ideal and the loss; ``--html`` writes that as a picture.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

import _training  # what the training examples share
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from torch.utils.data import TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel

from hetero.train import Trainer

SUCCESSORS = 4  # possible next tokens of each token in the synthetic data
HELD_OUT = 32  # sequences the loss is reported on


def gpt(
    layers: int, width: int, vocab: int, seq_len: int, seed: int, *, heads: int | None = None
) -> nn.Module:
    """GPT-2 of ``layers`` blocks of ``width`` (``heads`` heads; by default heads of 64, or one
    below that), random weights, no dropout (so the distributed update is exactly one
    process's)."""
    config = GPT2Config(
        n_layer=layers,
        n_embd=width,
        n_head=heads if heads is not None else max(1, width // 64),
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


def warmup_cosine(warmup: int, steps: int) -> Callable[[torch.optim.Optimizer], LRScheduler]:
    """A scheduler over the optimizer: the rate rises linearly to the optimizer's over
    ``warmup`` steps, then falls along a cosine to a tenth of it at step ``steps``."""

    def factor(step: int) -> float:  # steps done before this one
        if step < warmup:
            return (step + 1) / warmup
        done = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    return lambda optimizer: LambdaLR(optimizer, factor)


def train_rank(rank: int, world: int, args: argparse.Namespace) -> None:
    """One rank's run: the held-out loss before and after training; rank 0 reports."""
    devices = args.devices[:world]
    rank_speeds = [d.speed for d in devices]
    model = gpt(args.layers, args.width, args.vocab, args.seq_len, args.seed)
    sequences = tokens(args.samples + HELD_OUT, args.seq_len, args.vocab, args.seed).tensors
    data = TensorDataset(*(t[:-HELD_OUT] for t in sequences))
    held_out = TensorDataset(*(t[-HELD_OUT:] for t in sequences))  # the same chain, unseen
    before = held_out_loss(model, held_out)
    options = _training.trainer_options(
        args, rank_speeds[rank], sharding=args.sharding, mixed_precision=args.mixed_precision
    )
    parameters = sum(p.numel() for p in model.parameters())
    trainer = Trainer(
        model,
        lambda params: torch.optim.AdamW(params, lr=args.lr, fused=True),
        token_loss,
        data,
        options,
        scheduler=warmup_cosine(args.warmup_steps, args.steps),
    )
    if rank == 0:
        print(
            f"{world} ranks (gloo, {args.sharding}), GPT-2 {args.layers} layers × {args.width}, "
            f"vocabulary {args.vocab}, {parameters / 1e6:.1f}M parameters, sequences of "
            f"{args.seq_len}; {_training.shares_line(trainer, rank_speeds)}",
            flush=True,
        )
    reports = trainer.train(max(0, args.steps - trainer.steps), progress=not args.quiet)
    after = held_out_loss(trainer.model, held_out)
    if rank == 0:
        if reports:
            print(_training.summary(rank_speeds, reports))
        print(f"held-out loss: {before:.3f} -> {after:.3f} (the data's floor: ln 4 = 1.386)")
        _training.write_html(args, trainer, devices)
    trainer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _training.add_training_options(
        parser, steps=10, global_batch=14, sample_time=0.3, samples=2048, checkpoint_every=5
    )
    parser.add_argument("--sharding", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--mixed-precision", choices=("no", "bf16"), default="no")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4, help="the peak learning rate")
    parser.add_argument(
        "--warmup-steps", type=int, default=2, help="steps of linear warm-up to --lr"
    )
    args = parser.parse_args(argv)
    _training.start_ranks(parser, args, train_rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
