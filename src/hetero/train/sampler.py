"""A sampler that gives each rank its own share of every global batch.

The epoch's order is one permutation, identical on every rank (``global_order``). Global batch k is
the slice ``order[k*B:(k+1)*B]`` and rank i reads the contiguous piece of it at offset
``sum(shares[:i])`` of length ``shares[i]``. Batch boundaries depend only on the dataset size, the
global batch and the seed, never on the shares, so shares may change between any two global batches
(rebalancing, or a restart with fewer ranks) and every sample of the epoch is still read exactly
once across the ranks.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from hetero._torch import torch_missing

try:
    import torch
except ImportError as exc:  # an optional extra
    raise torch_missing(__name__) from exc
from torch.utils.data import Sampler

from hetero.errors import ConfigError

__all__ = ["HeteroSampler"]


def _int(name: str, value: object, minimum: int) -> int:
    """``value`` as an ``int`` (numpy integers too, bools not) of at least ``minimum``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError([(name, f"must be an integer, got {value!r}")]) from None
    if number < minimum:
        raise ConfigError([(name, f"must be at least {minimum}, got {number}")])
    return number


def _split(total: int, shares: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``shares`` by largest remainder (ties to the lower rank),
    so the pieces sum to ``total`` exactly and a rank with share 0 gets 0."""
    weight = sum(shares)
    pieces = [total * share // weight for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: (-(total * shares[i] % weight), i))
    for i in by_remainder[: total - sum(pieces)]:
        pieces[i] += 1
    return pieces


class HeteroSampler(Sampler[int]):
    """This rank's indices of every global batch, with uneven per-rank shares.

    ``shares[i]`` is how many samples of each global batch rank i reads (they sum to
    ``global_batch``; a rank may get 0). The last partial global batch is split in proportion to
    the shares, or dropped with ``drop_last``. The order is deterministic per (seed, epoch).

    The sampler does not move itself: the trainer calls ``advance`` once per global batch it has
    consumed, and that position (with epoch, shares and seed) is what ``state_dict`` saves, so a
    restored sampler continues with the next unconsumed global batch.
    """

    def __init__(
        self,
        dataset_size: int,
        global_batch: int,
        shares: Sequence[int],
        rank: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        self.dataset_size = _int("dataset_size", dataset_size, 1)
        self.global_batch = _int("global_batch", global_batch, 1)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._seed = _int("seed", seed, 0)
        self._epoch = 0
        self._position = 0
        self._shares = self._check_shares(shares, "shares")
        self.rank = _int("rank", rank, 0)
        if self.rank >= len(self._shares):
            raise ConfigError(
                [("rank", f"must be below {len(self._shares)} (one rank per share), got {rank}")]
            )
        # The permutation of the current (seed, epoch), built once rather than per batches() call.
        self._order: tuple[tuple[int, int], list[int]] | None = None

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        """Global batches of this epoch consumed so far."""
        return self._position

    @property
    def shares(self) -> tuple[int, ...]:
        return self._shares

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def num_batches(self) -> int:
        """Global batches in one epoch (with the partial last one unless ``drop_last``)."""
        full, rest = divmod(self.dataset_size, self.global_batch)
        return full + (1 if rest and not self.drop_last else 0)

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its first global batch; naming the current epoch again keeps the
        position, so a loop resumed from a checkpoint continues mid-epoch."""
        epoch = _int("epoch", epoch, 0)
        if epoch != self._epoch:
            self._epoch, self._position = epoch, 0

    def set_shares(self, shares: Sequence[int]) -> None:
        """Rebalance: the new shares apply from the next global batch ``batches`` yields."""
        values = self._check_shares(shares, "shares")
        if self.rank >= len(values):
            raise ConfigError(
                [("shares", f"has {len(values)} entries, too few for rank {self.rank}")]
            )
        self._shares = values

    def advance(self, batches: int = 1) -> None:
        """Mark ``batches`` more global batches of this epoch as consumed."""
        _int("batches", batches, 0)
        if self._position + batches > self.num_batches:
            raise ConfigError(
                [
                    (
                        "batches",
                        f"advancing by {batches} from position {self._position} passes the end "
                        f"of the epoch ({self.num_batches} global batches); call set_epoch() to "
                        "start the next one",
                    )
                ]
            )
        self._position += batches

    def batches(self) -> Iterator[list[int]]:
        """This rank's indices for each remaining global batch of the epoch, in order; a rank
        whose share is 0 gets an empty list, so every rank steps the same number of times.

        Shares are read as each batch is produced, so ``set_shares`` between two batches takes
        effect at the next one."""
        order = self._epoch_order()
        size = self.global_batch
        for k in range(self._position, self.num_batches):
            batch = order[k * size : (k + 1) * size]
            shares = self._shares if len(batch) == size else _split(len(batch), self._shares)
            start = sum(shares[: self.rank])
            yield batch[start : start + shares[self.rank]]

    def __iter__(self) -> Iterator[int]:
        for batch in self.batches():
            yield from batch

    def __len__(self) -> int:
        """Indices this rank has left in the epoch with the current shares."""
        remaining = self.num_batches - self._position
        rest = self.dataset_size % self.global_batch
        if rest and not self.drop_last and remaining:
            return (remaining - 1) * self._shares[self.rank] + _split(rest, self._shares)[self.rank]
        return remaining * self._shares[self.rank]

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "position": self._position,
            "shares": list(self._shares),
            "seed": self._seed,
            "dataset_size": self.dataset_size,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue where ``state`` stopped. The saved shares are restored when they are for as
        many ranks as this sampler has; otherwise the world changed (an elastic restart) and this
        sampler keeps the shares it was built with: batch boundaries do not depend on the shares,
        so the epoch still reads every sample exactly once."""
        for key in ("dataset_size", "global_batch"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(
                    [
                        (
                            key,
                            f"the state was saved with {key}={state[key]!r} but this sampler has "
                            f"{getattr(self, key)!r}; positions would not line up",
                        )
                    ]
                )
        missing = {"epoch", "position", "seed"} - set(state)
        if missing:
            raise ConfigError([("state", f"lacks {', '.join(sorted(missing))}")])
        epoch = _int("state.epoch", state["epoch"], 0)
        seed = _int("state.seed", state["seed"], 0)
        shares = self._shares
        if "shares" in state and len(state["shares"]) == len(self._shares):
            shares = self._check_shares(state["shares"], "state.shares")
        self._epoch, self._seed, self._shares = epoch, seed, shares
        self._position = 0
        self.advance(_int("state.position", state["position"], 0))

    @staticmethod
    def global_order(dataset_size: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
        """The epoch's order of sample indices, the same on every rank."""
        if not shuffle:
            return list(range(dataset_size))
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        return torch.randperm(dataset_size, generator=generator).tolist()

    def _epoch_order(self) -> list[int]:
        key = (self._seed, self._epoch)
        if self._order is None or self._order[0] != key:
            order = self.global_order(self.dataset_size, self._seed, self._epoch, self.shuffle)
            self._order = (key, order)
        return self._order[1]

    def _check_shares(self, shares: Sequence[int], name: str) -> tuple[int, ...]:
        if isinstance(shares, (str, bytes)) or not isinstance(shares, Iterable):
            raise ConfigError([(name, f"must be a list of integers, got {shares!r}")])
        values = tuple(_int(f"{name}[{i}]", share, 0) for i, share in enumerate(shares))
        if sum(values) != self.global_batch:
            raise ConfigError(
                [
                    (
                        name,
                        f"must sum to global_batch={self.global_batch}, got {list(values)} "
                        f"(sum {sum(values)})",
                    )
                ]
            )
        return values
