"""``prefix_affinity``: shortest expected delay with each device's prompt cache counted."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import numpy.typing as npt

from hetero.errors import ConfigError
from hetero.sched.cache_check import CacheCheck
from hetero.sched.item import WorkItem
from hetero.sched.policies.load import check_overtake_weight
from hetero.sched.policy import BoolArray, Policy, masked_argmin
from hetero.sched.prefix import DEFAULT_CAPACITY_BLOCKS, Prefix, PrefixIndex
from hetero.sched.registry import register
from hetero.sched.view import FleetView

__all__ = ["PrefixAffinity"]


@register
class PrefixAffinity(Policy):
    """The device that would finish the item soonest, counting the part of its prompt the
    device has cached: its expected delay (as ``shortest_expected_delay`` counts it) less the
    prefill it would not redo there, at its speed.

    So a long shared prefix pulls a request to the device that holds it only while that device
    still finishes it sooner: a hot prefix whose holder queues up spreads to the next device,
    which the index then learns holds it too. Items with no ``prefix`` are placed as
    ``shortest_expected_delay`` places them. A session (a conversation) counts the device that
    ran its last turn as holding that turn's blocks (its history, even where the client renders
    it differently), under the same trade against queueing. The index keeps at most
    ``capacity_blocks`` blocks per device (``hetero.sched.prefix``) and ``sessions`` sessions,
    least recently used first.

    An executor that reads the engines tells it each device's KV cache size and prefix-cache
    counters (``engine_cache``): the index's capacity follows the cache, scaled down where the
    engine finds far fewer cached tokens than the index predicted (``CacheCheck``).
    """

    name = "prefix_affinity"
    places_by_delay = True

    def __init__(
        self,
        *,
        overtake_weight: float = 2.0,
        capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS,
        sessions: int = 65536,
    ) -> None:
        check_overtake_weight(overtake_weight)
        for name, value in (("capacity_blocks", capacity_blocks), ("sessions", sessions)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"option {name}={value!r}; allowed: an integer >= 1")
        self.overtake_weight = overtake_weight
        self.capacity_blocks = capacity_blocks
        self.max_sessions = sessions
        self.index = PrefixIndex([])
        self.check = CacheCheck()
        self._ceiling: list[int] = []  # per device: its cache in blocks, as last known
        # session -> the device of its last turn, and that turn's blocks
        self._sessions: OrderedDict[str, tuple[int, int]] = OrderedDict()

    def bind(self, view: FleetView) -> None:
        while self.index.n < view.n:  # the fleet at start, then each device that joins
            self.index.add_device(self.capacity_blocks)
            self.check.add_device()
            self._ceiling.append(self.capacity_blocks)

    def pick(self, item: WorkItem, view: FleetView, allowed: BoolArray | None) -> int | None:
        inv = view.perf.inv_speed(item.kind)
        score = view.delay_score(item.cost, inv, self.overtake_weight)
        prefix = item.prefix
        if prefix is None:
            return masked_argmin(score, allowed)
        span = prefix.span or len(prefix.blocks)
        if not prefix.blocks:
            i = masked_argmin(score, allowed)
            if i is not None:
                self.check.placed(i, 0.0, span)
            return i
        matched = self._matched(prefix)
        # The prefill a device would skip, never more than the item's whole cost; only on
        # usable devices (inf - inf would be NaN, which argmin picks).
        held = np.flatnonzero(matched)
        held = held[np.isfinite(inv[held])]
        if held.size:
            saved = np.minimum(matched[held] * prefix.block_work, item.cost)
            score[held] -= saved * inv[held]
        i = masked_argmin(score, allowed)
        if i is not None:
            self._placed(i, prefix, matched)
        return i

    def _matched(self, prefix: Prefix) -> npt.NDArray[np.int64]:
        """Per device, the leading blocks of ``prefix`` it holds: from the index, and for a
        session, the device of its last turn holds about as much as that turn had (even where
        the client rendered the conversation differently this time)."""
        matched = self.index.match(prefix.blocks)
        if prefix.session is not None:
            last, before = self._sessions.get(prefix.session, (-1, 0))
            if 0 <= last < matched.size:
                matched[last] = max(int(matched[last]), min(before, len(prefix.blocks)))
        return matched

    def _placed(self, i: int, prefix: Prefix, matched: npt.NDArray[np.int64]) -> None:
        """``prefix`` went to device ``i``: its blocks are held there from now on."""
        self.check.placed(i, float(matched[i]), prefix.span or len(prefix.blocks))
        self.index.insert(i, prefix.blocks)
        if prefix.session is not None:
            self._remember(prefix.session, i, len(prefix.blocks))

    def engine_cache(
        self,
        device: int,
        *,
        blocks: int | None = None,
        queries: int | None = None,
        hits: int | None = None,
    ) -> None:
        """What device ``device``'s engine publishes of its cache: its size in index blocks
        and its prefix-cache counters (prompt tokens looked up and found, cumulative). The
        index keeps the size times the share the counters bear out."""
        if queries is not None and hits is not None:
            self.check.read(device, queries, hits)
        ceiling = self._ceiling[device] if blocks is None else blocks
        capacity = round(ceiling * self.check.factor(device))
        if capacity != self.index.capacity(device):
            self.index.set_capacity(device, capacity)  # refuses a negative size
        self._ceiling[device] = ceiling

    def forget(self, device: int) -> None:
        """Device ``device``'s engine starts again with an empty cache."""
        self.index.forget(device)
        self.check.forget(device)

    def _remember(self, session: str, device: int, blocks: int) -> None:
        sessions = self._sessions
        sessions[session] = (device, blocks)
        sessions.move_to_end(session)
        if len(sessions) > self.max_sessions:
            sessions.popitem(last=False)
