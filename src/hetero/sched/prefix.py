"""Prefix-cache affinity: which prompt prefixes each device (a replica) holds in its KV cache.

Engines cache the KV of a prompt in blocks (vLLM: 16 tokens), each named by a hash chained from
the block before it, so one block's hash stands for the whole prefix up to it. The router sees
text, not tokens: here a block is ``BLOCK_CHARS`` characters (about 128 tokens at 4 characters
a token), hashed the same chained way (``prefix_blocks``). ``PrefixIndex`` keeps, per device, the
blocks placed there, least recently used first, up to the device's capacity in blocks (its KV
cache), and evicts as the engine would; ``match`` tells, for every device at once, how many
leading blocks of a prompt it holds.

Memory is bounded: at most ``capacity`` blocks per device (by default ``DEFAULT_CAPACITY_BLOCKS``,
about 1M tokens), each an entry of about 200 bytes in two dicts (so 64 replicas at the default
hold at most about 100 MB); a prompt is hashed up to ``MAX_BLOCKS`` blocks (256k characters),
the rest of a longer one is never matched.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = [
    "BLOCK_CHARS",
    "DEFAULT_CAPACITY_BLOCKS",
    "MAX_BLOCKS",
    "Prefix",
    "PrefixIndex",
    "prefix_blocks",
]

#: Characters per block (about 128 tokens): coarser than an engine's 16-token blocks, so that an
#: 8k-token prompt is 64 blocks to hash, match and record, well within a decision's budget.
BLOCK_CHARS = 512
#: Blocks hashed per prompt at most (256k characters).
MAX_BLOCKS = 512
#: A device's capacity in blocks until its KV cache is known: about 1M tokens.
DEFAULT_CAPACITY_BLOCKS = 8192


@dataclass(frozen=True, slots=True)
class Prefix:
    """What a work item's prompt shares with others: its chained block hashes, the work units
    one cached block saves (its tokens times the cost of a prompt token), the session it
    belongs to (a conversation, kept together while that costs nothing), and the prompt's
    length in blocks, its partial last block included (0: as many as ``blocks``)."""

    blocks: tuple[int, ...]
    block_work: float
    session: str | None = None
    span: float = 0.0


def prefix_blocks(
    text: str, block_chars: int = BLOCK_CHARS, limit: int = MAX_BLOCKS
) -> tuple[int, ...]:
    """The chained hashes of the full blocks of ``text``, at most ``limit`` of them (a partial
    last block is not matched: engines cache full blocks only). Hashes are Python's, so they
    are comparable within one process."""
    full = min(len(text) // block_chars, limit)
    hashes: list[int] = []
    h = 0
    for start in range(0, full * block_chars, block_chars):
        h = hash((h, text[start : start + block_chars]))
        hashes.append(h)
    return tuple(hashes)


class PrefixIndex:
    """The prompt blocks each device holds, evicted least recently used first at its capacity.

    Holders are kept per block as a bitmask of devices, so ``match`` walks a prompt's blocks once
    for every device together and stops at the first block nobody holds.
    """

    def __init__(self, capacity: Sequence[int]) -> None:
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in capacity]
        self._capacity = [self._checked(c) for c in capacity]
        self._holders: dict[int, int] = {}  # block hash -> bitmask of the devices holding it

    @staticmethod
    def _checked(capacity: int) -> int:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"a device's prefix capacity must be blocks >= 0, got {capacity!r}")
        return capacity

    @property
    def n(self) -> int:
        return len(self._lru)

    def capacity(self, device: int) -> int:
        """The most blocks device ``device`` keeps."""
        return self._capacity[device]

    def held(self, device: int) -> int:
        """Blocks device ``device`` holds now."""
        return len(self._lru[device])

    def match(self, blocks: Sequence[int]) -> npt.NDArray[np.int64]:
        """Per device, how many leading blocks of ``blocks`` it holds."""
        matched = np.zeros(self.n, dtype=np.int64)
        holders = self._holders
        alive = -1  # the devices that hold every block so far (-1: all, before the first)
        for depth, h in enumerate(blocks):
            mask = holders.get(h, 0) & alive
            if alive != -1:
                _set_bits(matched, alive & ~mask, depth)  # they hold the blocks before this one
            if not mask:
                return matched
            alive = mask
        _set_bits(matched, max(alive, 0), len(blocks))
        return matched

    def insert(self, device: int, blocks: Sequence[int]) -> None:
        """Device ``device`` prefilled ``blocks`` (a request placed there): they are its most
        recently used, and its least recently used go beyond its capacity."""
        lru = self._lru[device]
        bit = 1 << device
        holders = self._holders
        for h in blocks:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                holders[h] = holders.get(h, 0) | bit
        capacity = self._capacity[device]
        while len(lru) > capacity:
            self._drop(lru.popitem(last=False)[0], bit)

    def _drop(self, h: int, bit: int) -> None:
        rest = self._holders[h] & ~bit
        if rest:
            self._holders[h] = rest
        else:
            del self._holders[h]

    def set_capacity(self, device: int, blocks: int) -> None:
        """The device's KV cache holds ``blocks`` blocks (learned, or read from its engine)."""
        self._capacity[device] = self._checked(blocks)
        lru, bit = self._lru[device], 1 << device
        while len(lru) > blocks:
            self._drop(lru.popitem(last=False)[0], bit)

    def forget(self, device: int) -> None:
        """The device's cache is empty (its engine restarted, or it left the fleet)."""
        lru, bit = self._lru[device], 1 << device
        for h in lru:
            self._drop(h, bit)
        lru.clear()

    def add_device(self, capacity: int = DEFAULT_CAPACITY_BLOCKS) -> int:
        self._lru.append(OrderedDict())
        self._capacity.append(self._checked(capacity))
        return len(self._lru) - 1


def _set_bits(out: npt.NDArray[np.int64], bits: int, value: int) -> None:
    """``out[i] = value`` for every bit ``i`` set in ``bits``."""
    while bits:
        bit = bits & -bits
        out[bit.bit_length() - 1] = value
        bits ^= bit
