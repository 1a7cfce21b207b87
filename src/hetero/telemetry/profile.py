"""The profiler: what a run's task attempts say about how well the fleet was kept busy.

A :class:`Profile` is a window of :class:`TaskTrace` records (one per task attempt) and the
devices that could run them. :meth:`Profile.summary` reduces them to a few numbers (makespan
against the ideal, efficiency, load balance, per-device utilization and time split);
:meth:`Profile.write_chrome_trace` writes a timeline that Perfetto opens and
:meth:`Profile.write_html` one self-contained report. Beside the attempts, a profile may hold
each rank's time in ``hetero.comm`` collectives (:mod:`hetero.telemetry.collectives`), which
the report shows per rank. ``docs/profiling.md`` defines each number.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from hetero.errors import HeteroError
from hetero.telemetry.collectives import RankCollectives
from hetero.telemetry.measures import efficiency, ideal_makespan, imbalance, load_balance
from hetero.telemetry.trace import DeviceInfo, TaskTrace

__all__ = [
    "PROFILE_DIR_ENV",
    "PROFILE_NAME_ENV",
    "DeviceSummary",
    "Profile",
    "ProfileSummary",
]

#: When set, every ``Context`` profiles itself and saves its report into this directory at close.
PROFILE_DIR_ENV = "HETERO_PROFILE_DIR"
#: The stem of those reports' file names (``<name>.trace.json``, ``<name>.html``; a second
#: ``Context`` in the same process writes ``<name>-2.*``, and so on).
PROFILE_NAME_ENV = "HETERO_PROFILE_NAME"

# Chrome's reserved colour names, so retried and failed attempts stand out in chrome://tracing
# (Perfetto ignores ``cname``; the name suffix marks them there).
_CNAMES = {"retried": "bad", "failed": "terrible", "cancelled": "grey"}


@dataclass(slots=True, frozen=True)
class DeviceSummary:
    """One device over the profiled window; times in seconds.

    ``tasks`` counts its attempts that completed (``done``), ``attempts`` all of them. ``busy``
    is the time it ran at least one attempt (the union of their started→ended intervals, so the
    sum of their durations when it runs one at a time) and ``utilization`` is ``busy`` over the
    makespan. ``compute`` sums the attempts' durations, ``transfer`` their ``transfer_in +
    transfer_out``; ``wait`` is the mean queue wait (``started - submitted``) of an attempt.
    """

    id: str
    model: str
    kind: str
    speed: float
    tasks: int
    attempts: int
    busy: float
    utilization: float
    compute: float
    transfer: float
    wait: float
    bytes_in: int
    bytes_out: int


@dataclass(slots=True, frozen=True)
class ProfileSummary:
    """What a profile says about the run as a whole.

    ``ideal_makespan`` is the work done (the cost of every ``done`` attempt) over the fleet's
    total speed, idle devices included: how long a perfect split would have taken; ``None`` when
    no device has a speed. ``efficiency`` is ``ideal_makespan / makespan`` (1.0 is perfect);
    ``None`` when either is undefined or the makespan is 0. ``load_balance`` is the mean
    utilization of every device over the highest one's: 1.0 when all were busy equally long,
    lower for each device left idle; ``None`` when no device was busy. The simulator's
    ``FleetMetrics`` computes both the same way (:mod:`hetero.telemetry.measures`).
    ``done``, ``failed``, ``retried`` and ``cancelled`` count attempts by status.
    ``collectives`` is each rank's time in ``hetero.comm`` calls, in rank order (empty when
    none were made).
    """

    makespan: float
    ideal_makespan: float | None
    efficiency: float | None
    load_balance: float | None
    work: float
    done: int
    failed: int
    retried: int
    cancelled: int
    devices: tuple[DeviceSummary, ...]
    collectives: tuple[RankCollectives, ...] = ()
    # Seed 001's load balance factor: the highest utilization over the lowest (inf: a device
    # idle; None: none busy), as the simulator's FleetMetrics.imbalance.
    imbalance: float | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(slots=True)
class Profile:
    """The task attempts of one profiled window and the devices that could run them.

    ``started`` and ``ended`` bound the window in ``time.monotonic()`` seconds, the clock of
    the traces; ``name`` titles the reports. ``collectives`` holds each rank's time in
    ``hetero.comm`` calls over the window (one entry for a profile of one process; one per rank
    for ``hetero profile`` of a script whose ranks it ran); a profile may hold them alone.
    """

    traces: list[TaskTrace]
    devices: list[DeviceInfo]
    started: float
    ended: float
    name: str = "run"
    collectives: list[RankCollectives] = field(default_factory=list)

    def window(self) -> tuple[float, float]:
        """``(start, end)`` of the run: the profiled window, or, when it is empty, first submit
        to last end of the traces."""
        if self.ended > self.started or not self.traces:
            return self.started, max(self.started, self.ended)
        return min(t.submitted for t in self.traces), max(t.ended for t in self.traces)

    def rows(self) -> list[tuple[DeviceInfo, list[TaskTrace]]]:
        """Every device with its attempts in trace order: the known devices in their order, then
        any device the traces name that ``devices`` lacks (model ``unknown``, speed 0)."""
        by_id: dict[str, list[TaskTrace]] = {d.id: [] for d in self.devices}
        infos = list(self.devices)
        for t in self.traces:
            if t.device not in by_id:
                by_id[t.device] = []
                infos.append(DeviceInfo(t.device, "unknown", "", 0.0, False))
            by_id[t.device].append(t)
        return [(info, by_id[info.id]) for info in infos]

    def summary(self) -> ProfileSummary:
        """The run's numbers, as :class:`ProfileSummary` and :class:`DeviceSummary` define them."""
        start, end = self.window()
        makespan = end - start
        devices = [_device_summary(info, traces, makespan) for info, traces in self.rows()]
        work = math.fsum(t.cost for t in self.traces if t.status == "done")
        ideal = ideal_makespan(work, (d.speed for d in devices))
        counts = Counter(t.status for t in self.traces)
        return ProfileSummary(
            makespan=makespan,
            ideal_makespan=ideal,
            efficiency=efficiency(ideal, makespan),
            load_balance=load_balance(d.utilization for d in devices),
            work=work,
            done=counts["done"],
            failed=counts["failed"],
            retried=counts["retried"],
            cancelled=counts["cancelled"],
            devices=tuple(devices),
            collectives=tuple(sorted(self.collectives, key=lambda r: r.rank)),
            imbalance=imbalance(d.utilization for d in devices),
        )

    def chrome_trace(self) -> dict[str, object]:
        """The profile in Chrome's Trace Event Format (``{"traceEvents": [...]}``): one process
        for the run, one thread per device, a complete (``X``) event per attempt with times in
        µs from the window's start, and a ``running`` counter of attempts in progress. Each
        rank's collective times, which have no timeline, ride along under ``"collectives"``
        (trace viewers ignore keys they do not know)."""
        origin, _ = self.window()

        def us(t: float) -> float:
            return round((t - origin) * 1e6, 3)

        events: list[dict[str, object]] = [
            _meta("process_name", 0, {"name": f"hetero {self.name}"}),
        ]
        for tid, (info, traces) in enumerate(self.rows(), start=1):
            events.append(_meta("thread_name", tid, {"name": f"{info.id} {info.model}"}))
            events.append(_meta("thread_sort_index", tid, {"sort_index": tid}))
            for t in traces:
                event: dict[str, object] = {
                    "ph": "X",
                    "pid": 1,
                    "tid": tid,
                    "name": t.name if t.status == "done" else f"{t.name} [{t.status}]",
                    "cat": t.status,
                    "ts": us(t.started),
                    "dur": round(max(t.ended - t.started, 0.0) * 1e6, 3),
                    "args": {
                        "task_id": t.task_id,
                        "attempt": t.attempt,
                        "cost": t.cost,
                        "status": t.status,
                        "bytes_in": t.bytes_in,
                        "bytes_out": t.bytes_out,
                        "queue_wait_s": t.started - t.submitted,
                        "transfer_in_s": t.transfer_in,
                        "transfer_out_s": t.transfer_out,
                        **({"error": t.error} if t.error else {}),
                    },
                }
                if t.status in _CNAMES:
                    event["cname"] = _CNAMES[t.status]
                events.append(event)
        # One sample per distinct instant, taken after every change at it, so that back-to-back
        # attempts do not show as a spike.
        changes = sorted(
            [(t.ended, -1) for t in self.traces] + [(t.started, 1) for t in self.traces]
        )
        running = 0
        for i, (at, step) in enumerate(changes):
            running += step
            if i + 1 == len(changes) or changes[i + 1][0] != at:
                events.append(
                    {
                        "ph": "C",
                        "pid": 1,
                        "name": "running",
                        "ts": us(at),
                        "args": {"attempts": running},
                    }
                )
        trace: dict[str, object] = {"traceEvents": events, "displayTimeUnit": "ms"}
        if self.collectives:
            trace["collectives"] = [
                r.to_dict() for r in sorted(self.collectives, key=lambda r: r.rank)
            ]
        return trace

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write :meth:`chrome_trace` as JSON to ``path``; open it at ui.perfetto.dev."""
        return _write(Path(path), json.dumps(self.chrome_trace(), separators=(",", ":")))

    def write_html(self, path: str | Path) -> Path:
        """Write the self-contained HTML report (no network needed to view it) to ``path``."""
        from hetero.telemetry.report_html import render_html

        return _write(Path(path), render_html(self, self.summary()))

    def save(self, directory: str | Path, name: str | None = None) -> tuple[Path, Path]:
        """Write ``<name>.trace.json`` and ``<name>.html`` into ``directory``, creating it;
        returns both paths. ``name`` (default: the profile's) also titles the reports. Raises
        :class:`HeteroError` naming the path that could not be written."""
        directory = Path(directory)
        named = self if name is None else replace(self, name=name)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unwritable(directory, exc) from exc
        return (
            named.write_chrome_trace(directory / f"{named.name}.trace.json"),
            named.write_html(directory / f"{named.name}.html"),
        )


def _device_summary(info: DeviceInfo, traces: list[TaskTrace], makespan: float) -> DeviceSummary:
    busy = _union([(t.started, max(t.started, t.ended)) for t in traces])
    return DeviceSummary(
        id=info.id,
        model=info.model,
        kind=info.kind,
        speed=info.speed,
        tasks=sum(t.status == "done" for t in traces),
        attempts=len(traces),
        busy=busy,
        utilization=busy / makespan if makespan > 0 else 0.0,
        compute=math.fsum(max(t.ended - t.started, 0.0) for t in traces),
        transfer=math.fsum(t.transfer_in + t.transfer_out for t in traces),
        wait=math.fsum(t.started - t.submitted for t in traces) / len(traces) if traces else 0.0,
        bytes_in=sum(t.bytes_in for t in traces),
        bytes_out=sum(t.bytes_out for t in traces),
    )


def _union(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals``: overlapping attempts (several slots on one
    device) count once."""
    total, reached = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end > reached:
            total += end - max(start, reached)
            reached = end
    return total


def _meta(name: str, tid: int, args: dict[str, object]) -> dict[str, object]:
    return {"ph": "M", "pid": 1, "tid": tid, "name": name, "args": args}


def _unwritable(path: Path, exc: OSError) -> HeteroError:
    return HeteroError(
        f"cannot write the profile to {path}: {exc.strerror or exc}; "
        "choose a directory you can write to"
    )


def _write(path: Path, text: str) -> Path:
    try:
        path.write_text(text, "utf-8")
    except OSError as exc:
        raise _unwritable(path, exc) from exc
    return path
