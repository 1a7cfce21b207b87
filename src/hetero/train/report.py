"""Step reports: ``RankReport`` and ``StepReport``, how a step's per-rank timings become one
(the same on every rank), and rank 0's live view of them. Plain data: no torch needed."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["ProgressView", "RankReport", "StepReport", "rank_timings", "step_report"]


@dataclass(frozen=True, slots=True)
class RankReport:
    """One rank's part of one step (seconds of wall time)."""

    rank: int
    samples: int
    micro_batches: int
    compute_seconds: float  # its micro-batches' forward and backward (and emulated pacing)
    idle_seconds: float  # waiting for the slowest rank's compute to end
    comm_seconds: float  # the all-reduce left after that: what the last backward did not hide
    step_seconds: float  # the whole step, optimizer included
    data_seconds: float = 0.0  # waiting for its micro-batches and moving them to the device

    @property
    def samples_per_second(self) -> float:
        return self.samples / self.compute_seconds if self.compute_seconds > 0 else 0.0


_RANK_FIELDS = frozenset(f.name for f in fields(RankReport))


@dataclass(frozen=True, slots=True)
class StepReport:
    """One synchronised step on every rank, the same on all of them.

    ``throughputs`` are the per-rank samples/s the trainer works from (profiled, then measured
    over each rebalance window); the ideal step time is ``global_batch / Σ throughputs``, what a
    perfect split with no communication would take, and ``efficiency`` is ideal / actual.

    ``loss`` is the mean loss over the step's global batch (every rank's summed loss over the
    number of samples, so uneven shares give one process's figure), taken in the forward passes,
    before the update; ``grad_norm`` the L2 norm of the global batch's gradient before clipping
    (with ``max_grad_norm`` only); ``lr`` the first parameter group's learning rate this step's
    update used. ``None`` where a report was made without them.

    ``comm_bytes`` is what each rank handed to the collectives of the step's gradient
    reduction (with local SGD, of its parameter averaging), and ``dense_bytes`` what an
    uncompressed all-reduce of the gradients would hand them: the same on every rank, payloads
    before the collective's algorithm (a ring all-reduce moves about twice its payload per rank,
    an all-gather world size − 1 times). ``None`` where not measured (FSDP, PowerSGD).
    """

    step: int  # steps done, this one included
    epoch: int
    shares: tuple[int, ...]  # of this step's global batch
    throughputs: tuple[float, ...]
    ranks: tuple[RankReport, ...]
    rebalanced: bool = False  # the shares change from the next step
    next_shares: tuple[int, ...] = field(default=())
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    comm_bytes: int | None = None
    dense_bytes: int | None = None

    @property
    def global_batch(self) -> int:
        return sum(r.samples for r in self.ranks)

    @property
    def step_seconds(self) -> float:
        return max(r.step_seconds for r in self.ranks)

    @property
    def ideal_seconds(self) -> float:
        return self.global_batch / sum(self.throughputs)

    @property
    def efficiency(self) -> float:
        return self.ideal_seconds / self.step_seconds

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["ranks"] = [
            {**asdict(r), "samples_per_second": r.samples_per_second} for r in self.ranks
        ]
        doc.update(
            shares=list(self.shares),
            throughputs=list(self.throughputs),
            next_shares=list(self.next_shares),
            global_batch=self.global_batch,
            step_seconds=self.step_seconds,
            ideal_seconds=self.ideal_seconds,
            efficiency=self.efficiency,
        )
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> StepReport:
        """The report ``to_dict`` wrote (a line of ``report_path``); the derived figures in it
        are left out, as the report derives them again."""
        ranks = tuple(
            RankReport(**{k: v for k, v in r.items() if k in _RANK_FIELDS}) for r in doc["ranks"]
        )
        return cls(
            step=doc["step"],
            epoch=doc["epoch"],
            shares=tuple(doc["shares"]),
            throughputs=tuple(doc["throughputs"]),
            ranks=ranks,
            rebalanced=doc.get("rebalanced", False),
            next_shares=tuple(doc.get("next_shares", ())),
            loss=doc.get("loss"),
            grad_norm=doc.get("grad_norm"),
            lr=doc.get("lr"),
            comm_bytes=doc.get("comm_bytes"),
            dense_bytes=doc.get("dense_bytes"),
        )

    def summary(self) -> str:
        """One line: step time against the ideal, shares, and each rank's time split."""
        ms = 1e3
        ranks = "; ".join(
            f"r{r.rank} {r.compute_seconds * ms:.0f}/{r.data_seconds * ms:.0f}/"
            f"{r.comm_seconds * ms:.0f}/{r.idle_seconds * ms:.0f}"
            for r in self.ranks
        )
        return (
            f"step {self.step}: {self.step_seconds * ms:.1f} ms, ideal "
            f"{self.ideal_seconds * ms:.1f} ms ({self.efficiency:.0%}), shares "
            f"{'/'.join(map(str, self.shares))}, "
            + (f"loss {self.loss:.4g}, " if self.loss is not None else "")
            + f"compute/data/comm/idle ms {ranks}"
            + (f"; rebalanced to {'/'.join(map(str, self.next_shares))}" if self.rebalanced else "")
        )


def rank_timings(
    samples: int,
    micro_batches: int,
    started: float,
    computed: float,
    synced: float,
    ended: float,
    wall: float,
    data: float = 0.0,
    loss_sum: float = 0.0,
) -> list[float]:
    """This rank's row of a step, for every rank to gather and pass to ``step_report``: its
    samples and micro-batches, then its compute, the tail after it (idle and all-reduce), the
    whole step, when its compute ended on the wall clock and its data time. ``started``,
    ``computed`` (its compute's end), ``synced`` (the all-reduce's end) and ``ended`` are
    ``perf_counter`` instants; ``wall`` turns them into wall-clock ones, comparable across
    ranks. ``data`` (seconds waiting for micro-batches, between ``started`` and ``computed``)
    is taken out of the compute. ``loss_sum`` is the sum of its samples' losses."""
    return [
        samples,
        micro_batches,
        computed - started - data,
        synced - computed,
        ended - started,
        computed + wall,
        data,
        loss_sum,
    ]


def step_report(
    step: int,
    epoch: int,
    shares: tuple[int, ...],
    throughputs: Sequence[float],
    rows: list[list[float]],
    *,
    grad_norm: float | None = None,
    lr: float | None = None,
    comm_bytes: int | None = None,
    dense_bytes: int | None = None,
) -> StepReport:
    """The step's report from every rank's ``rank_timings`` row, in rank order. Its loss is
    the global batch's mean: every rank's loss sum over all their samples."""
    slowest = max(row[5] for row in rows)  # when the last rank's compute ended
    samples_in_all = sum(row[0] for row in rows)
    loss = math.fsum(row[7] for row in rows) / samples_in_all if samples_in_all else math.nan
    reports = []
    for i, (samples, micro, compute, tail, whole, end, data, _) in enumerate(rows):
        # What came after its compute: waiting for the slowest rank, then the all-reduce.
        idle = min(max(slowest - end, 0.0), tail)
        reports.append(
            RankReport(i, int(samples), int(micro), compute, idle, tail - idle, whole, data)
        )
    return StepReport(
        step,
        epoch,
        shares,
        tuple(throughputs),
        tuple(reports),
        loss=loss,
        grad_norm=grad_norm,
        lr=lr,
        comm_bytes=comm_bytes,
        dense_bytes=dense_bytes,
    )


class ProgressView:
    """Rank 0's live view: a rich progress bar when stderr is a terminal, else a line every
    ``every`` steps."""

    def __init__(self, total: int, every: int) -> None:
        self._every = every
        self._bar: Any = None
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                console=Console(stderr=True),
            )
            self._bar.start()
            self._task = self._bar.add_task("", total=total)

    def update(self, report: StepReport) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, description=report.summary())
        elif report.step % self._every == 0 or report.rebalanced:
            print(report.summary(), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
