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
the rest of a longer one is never matched. A block's hash is 64 bits (Python's keyed SipHash of
its text, chained through a tuple's hash): taken as random, any two of the half million blocks
such an index holds collide with a chance of about 1 in 10 million.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat, takewhile
from operator import and_

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
    full = max(0, min(len(text) // block_chars, limit))
    if block_chars == BLOCK_CHARS and full <= MAX_BLOCKS:
        blocks: Iterable[slice] = _BLOCK_SLICES[:full]  # made once: per block, a tenth of the time
    else:
        end = full * block_chars
        blocks = map(slice, range(0, end, block_chars), range(block_chars, end + 1, block_chars))
    h = 0
    return tuple([h := hash((h, text[block])) for block in blocks])


_BLOCK_SLICES = tuple(
    slice(a, a + BLOCK_CHARS) for a in range(0, MAX_BLOCKS * BLOCK_CHARS, BLOCK_CHARS)
)


class PrefixIndex:
    """The prompt blocks each device holds, evicted least recently used first at its capacity.

    Holders are kept per block as a bitmask of devices, so ``match`` walks a prompt's blocks once
    for every device together and stops at the first block nobody holds. A decision records
    every block of its prompt on the device it picks (an 8k-token prompt is 64 blocks), so
    ``insert`` is one pass over them: a block held already moves to the end of the device's LRU,
    a new one joins it and its holders, and an evicted one leaves both.
    """

    def __init__(self, capacity: Sequence[int]) -> None:
        self._lru: list[OrderedDict[int, object]] = [OrderedDict() for _ in capacity]
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
        # The devices holding every block so far, block by block, up to the first nobody holds.
        alive = list(takewhile(bool, accumulate(map(self._holders.get, blocks, repeat(0)), and_)))
        if not alive:
            return matched
        # Equal sets are runs, each set within the one before: the devices that leave at the end
        # of a run hold exactly the blocks up to it.
        start, last = 0, alive[-1]
        while alive[start] != last:
            end = start + alive.count(alive[start])
            _set_bits(matched, alive[start] & ~alive[end], end)
            start = end
        _set_bits(matched, last, len(alive))
        return matched

    def insert(self, device: int, blocks: Sequence[int]) -> None:
        """Device ``device`` prefilled ``blocks`` (a request placed there): they are its most
        recently used, and its least recently used go beyond its capacity."""
        lru, holders, bit = self._lru[device], self._holders, 1 << device
        touch = object()  # the value a block new here gets, to tell it from one held already
        before, new = len(lru), 0
        setdefault, move_to_end, hold = lru.setdefault, lru.move_to_end, holders.setdefault
        for h in blocks:
            if setdefault(h, touch) is not touch:
                move_to_end(h)  # held already
                continue
            new += 1  # new here (or twice in this insert)
            mask = hold(h, bit)
            if mask != bit:
                holders[h] = mask | bit  # held elsewhere too
        if new > len(lru) - before:  # a block twice: it was last used where it last is
            deque(map(move_to_end, blocks), 0)
        if len(lru) > self._capacity[device]:
            self._evict(device, self._capacity[device])

    def _evict(self, device: int, capacity: int) -> None:
        """Drop device ``device``'s least recently used blocks beyond ``capacity``."""
        lru, holders, bit = self._lru[device], self._holders, 1 << device
        popitem = lru.popitem
        for _ in range(len(lru) - capacity):
            h = popitem(False)[0]  # the least recently used
            mask = holders.pop(h)
            if mask != bit:
                holders[h] = mask & ~bit  # still held elsewhere

    def set_capacity(self, device: int, blocks: int) -> None:
        """The device's KV cache holds ``blocks`` blocks (learned, or read from its engine)."""
        self._capacity[device] = self._checked(blocks)
        self._evict(device, blocks)

    def forget(self, device: int) -> None:
        """The device's cache is empty (its engine restarted, or it left the fleet)."""
        self._evict(device, 0)

    def add_device(self, capacity: int = DEFAULT_CAPACITY_BLOCKS) -> int:
        self._lru.append(OrderedDict())
        self._capacity.append(self._checked(capacity))
        return len(self._lru) - 1


def _set_bits(out: npt.NDArray[np.int64], bits: int, value: int) -> None:
    """``out[i] = value`` for every bit ``i`` set in ``bits``: one by one while they are few,
    else all at once (unpacking the bits costs about as much as setting 16 of them)."""
    if bits.bit_count() > 16:
        flags = np.frombuffer(bits.to_bytes((out.size + 7) // 8, "little"), np.uint8)
        out[np.unpackbits(flags, count=out.size, bitorder="little").view(bool)] = value
        return
    while bits:
        bit = bits & -bits
        out[bit.bit_length() - 1] = value
        bits ^= bit
