"""``hetero launch``: start a script as ranks on this machine, as ``torchrun --nproc-per-node``
does, and keep the run going when a rank fails: all ranks start again (``--max-restarts``), and
with ``--nproc MIN:MAX`` a rank that keeps failing is left out, the others going on from the
last checkpoint, until it may rejoin at a checkpoint (the rules: ``hetero.train.elastic``).
A rank that hangs is found by its heartbeat within ``--heartbeat-timeout`` seconds, killed and
recovered from as a rank that failed (the rule: ``hetero.train.heartbeat``).

A set-up the Trainer refuses is not retried: every start would be refused alike. Each rank leads
a session of its own, as under torchrun, so a terminal's Ctrl-C reaches the launcher alone: it
stops the ranks (SIGTERM to each rank's session) and says in one line which it stopped."""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from hetero.devices.topology import Topology

from hetero._cli_util import err_console, fail
from hetero.train.elastic import (
    LAUNCHED_ENV,
    REGROUP_FILE_ENV,
    SETUP_REFUSED_EXIT,
    Membership,
    Next,
    local_ranks,
    regroup_answer,
)
from hetero.train.heartbeat import Beat, Hung, find_hung
from hetero.train.heartbeat_sender import HEARTBEAT_FILE_ENV, HEARTBEAT_INTERVAL_ENV

__all__ = ["free_port", "parse_nproc", "register"]

# Seconds the other ranks get to leave after one died, before they are killed.
_GRACE_S = 5.0
# How often the launcher looks whether a lost rank may rejoin while the ranks run.
_TICK_S = 0.1
# The most of a rank's error the launcher prints.
_ERROR_CHARS = 4000
# The shortest --heartbeat-timeout: a rank beats every quarter of it, at most every second.
_MIN_HEARTBEAT_S = 1.0
# What starts a rank with its heartbeat thread, then the script.
_RANK_MAIN = "hetero.train.rank_main"


def register(app: typer.Typer) -> None:
    """Add ``launch`` to ``app``."""
    app.command(
        "launch",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(launch)


def launch(
    ctx: typer.Context,
    script: Annotated[Path, typer.Argument(help="Python script to run on every rank.")],
    nproc: Annotated[
        str,
        typer.Option(
            "--nproc",
            "-n",
            metavar="N|MIN:MAX",
            help="Ranks to start: N, or MAX that may shrink to MIN as ranks are lost.",
        ),
    ] = "1",
    max_restarts: Annotated[
        int, typer.Option(help="Times the same ranks are started again after one fails.")
    ] = 3,
    rank_restarts: Annotated[
        int | None,
        typer.Option(
            help="Failures of one rank that are retried; at the next it is lost "
            "(default: 1 with MIN:MAX, else --max-restarts).",
            show_default=False,
        ),
    ] = None,
    rejoin_after: Annotated[
        float,
        typer.Option(
            help="Seconds after its loss before a lost rank rejoins, at the ranks' next "
            "checkpoint; doubled at each further loss.",
        ),
    ] = 60.0,
    master_port: Annotated[
        int, typer.Option(help="Port of rank 0's rendezvous; 0 picks a free one per start.")
    ] = 0,
    heartbeat_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds after which a rank is hung: without a heartbeat, or without "
            "progress outside any collective while a peer waits in one; it is killed and "
            "counted as failed. 0 turns hang detection off.",
        ),
    ] = 30.0,
) -> None:
    """Run SCRIPT as --nproc ranks on this machine; start them again when one fails.

    Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as with torchrun.
    LOCAL_RANK is the rank's slot (its device): it stays with it when the ranks shrink.

    OMP_NUM_THREADS is 1 unless set: the ranks share this machine's cores.

    HETERO_RESTART (and TORCHELASTIC_RESTART_COUNT) counts the starts: resume from a checkpoint.

    With --nproc MIN:MAX, a rank that fails more than --rank-restarts times, or raises the same
    error twice in a row, is lost and the others go on (from the last checkpoint, with new
    shares), down to MIN; after --rejoin-after seconds it rejoins at their next checkpoint
    (hetero.train.Trainer does this). Errors are read from TORCHELASTIC_ERROR_FILE, which
    torch's @record on the script's main writes.

    A rank that hangs is killed and counted as failed, as if it had crashed: one that sends
    no heartbeat for --heartbeat-timeout seconds (stopped, or stuck in C), or that makes no
    progress outside any collective that long while a peer has waited in one that long. Its
    heartbeat thread starts before the script; completed hetero.comm calls (the Trainer makes
    one a step) are progress, and so are hetero.train.heartbeat_sender.mark_progress() calls.

    A configuration error the Trainer raises before the first step is printed once, with the
    rank that raised it, and not retried. Ctrl-C stops the ranks (SIGTERM) and says which.

    Arguments after SCRIPT go to the script. Exit status: 0 when every rank succeeded, 128 + the
    signal when interrupted (130 for Ctrl-C).

    Example: `hetero launch --nproc 2:3 examples/train_mlp.py --checkpoint-dir ckpt`.
    """
    try:
        minimum, maximum = parse_nproc(nproc)
    except ValueError as exc:
        fail(str(exc), code=2)
    if max_restarts < 0:
        fail(f"--max-restarts must be >= 0, got {max_restarts}", code=2)
    if rank_restarts is not None and rank_restarts < 0:
        fail(f"--rank-restarts must be >= 0, got {rank_restarts}", code=2)
    if not (math.isfinite(rejoin_after) and rejoin_after >= 0):
        fail(f"--rejoin-after must be a number of seconds >= 0, got {rejoin_after}", code=2)
    if not 0 <= master_port < 65536:
        fail(f"--master-port must be from 0 to 65535, got {master_port}", code=2)
    if not (
        math.isfinite(heartbeat_timeout)
        and (heartbeat_timeout == 0 or heartbeat_timeout >= _MIN_HEARTBEAT_S)
    ):
        fail(
            f"--heartbeat-timeout must be 0 (off) or a number of seconds >= "
            f"{_MIN_HEARTBEAT_S:g}, got {heartbeat_timeout}",
            code=2,
        )
    if not script.is_file():
        fail(f"script {str(script)!r} does not exist or is not a file", code=2)
    if rank_restarts is None:
        # A fixed size cannot lose a rank: one that fails gets every restart there is.
        rank_restarts = 1 if minimum < maximum else max_restarts
    membership = Membership(
        minimum,
        maximum,
        max_restarts=max_restarts,
        rank_restarts=rank_restarts,
        rejoin_after=rejoin_after,
    )
    topology = _gpu_topology(maximum)
    # A watched rank runs its heartbeat thread, then the script, in one process.
    runner = ("-m", _RANK_MAIN) if heartbeat_timeout else ()
    args = [sys.executable, *runner, str(script), *ctx.args]
    with tempfile.TemporaryDirectory(prefix="hetero-launch-") as folder:
        # Only an elastic launch asks its ranks to regroup; a fixed one leaves them alone.
        request = Path(folder) / "regroup" if minimum < maximum else None
        _supervise(
            args, membership, master_port, Path(folder), request, topology, heartbeat_timeout
        )


def _gpu_topology(ranks: int) -> Topology:
    """This machine's GPU links, which order the ranks (an empty topology on a machine without
    GPUs or with MIG slices, which have no links between them); refuses ranks on two slices of
    one GPU."""
    from hetero.devices.discovery import get_device_list
    from hetero.devices.spec import DeviceKind
    from hetero.devices.topology import Topology
    from hetero.devices.topology_nvml import read_topology
    from hetero.errors import ConfigError
    from hetero.train.gpus import check_slices

    gpus = [d for d in get_device_list() if d.kind is DeviceKind.GPU]
    try:
        check_slices(range(ranks), gpus)
    except ConfigError as exc:
        fail(str(exc), code=2)
    return Topology() if any(g.parent for g in gpus) else read_topology()


def _supervise(
    args: list[str],
    membership: Membership,
    master_port: int,
    folder: Path,
    request: Path | None,
    topology: Topology,
    heartbeat: float,
) -> None:
    """Start the live slots again and again until they all succeed or the membership gives up;
    each start numbers the ranks along the best ring through their GPUs. ``heartbeat``: the
    seconds after which a rank is hung (0: not watched)."""
    from hetero.train.gpus import ring_slots

    start = 0
    with _Interrupts() as interrupts:
        while True:
            if request is not None:
                request.unlink(missing_ok=True)
                regroup_answer(request).unlink(missing_ok=True)
            port = master_port or free_port()
            slots = ring_slots(membership.live, topology)
            group = _Group(args, slots, port, start, folder, request, heartbeat)
            interrupts.watch(group)
            regroup = False
            try:
                ended = group.watch(membership)
                regroup = (
                    ended is not None and request is not None and regroup_answer(request).exists()
                )
            finally:
                group.close(leaving=regroup)
            if interrupts.signum:
                _say(group.interrupted(interrupts.signum))
                raise typer.Exit(128 + interrupts.signum)
            if ended is None:
                return
            _next_start(group, ended, membership, regroup)
            start += 1


def _next_start(
    group: _Group, ended: tuple[int, int], membership: Membership, regroup: bool
) -> None:
    """Say why the ranks start again after ``group`` ``ended`` (its first rank to end otherwise
    than well: slot, status), and with which; or end the launch."""
    refused = [slot for slot, proc in group.procs.items() if proc.returncode == SETUP_REFUSED_EXIT]
    if refused:
        slot, error = group.first_failure(refused[0], among=refused)
        what = error or f"exited with {_describe(SETUP_REFUSED_EXIT)}"
        _say(f"local rank {slot} refused its set-up before the first step: {what}")
        fail("not restarted: a configuration error is raised alike at every start", code=1)
    if regroup:
        joined = membership.rejoin(time.monotonic())
        _say(
            f"the ranks left at their checkpoint; starting {len(membership.live)} ranks "
            f"({local_ranks(membership.live)}), {local_ranks(joined)} rejoining"
        )
        return
    if group.hung is not None:
        # Killed by the launcher: the hang, not what its peers raised after, is the failure.
        slot, error = group.hung.rank, None
        how = f"hung: {group.hung.reason}"
    else:
        slot, error = group.first_failure(ended[0])
        how = f"raised {error.splitlines()[0]}" if error else f"exited with {_describe(ended[1])}"
    decision = membership.failed(slot, time.monotonic(), error)
    failed = f"local rank {slot} {how}"
    if decision.next is Next.STOP:
        _say(failed)
        fail(decision.reason, code=1)
    _say(f"{failed}; {decision.reason}")


class _Group:
    """One start of the ranks: a process per live slot, each watched by a thread that reports
    its exit, and the files (in ``folder``) where they may say how they failed and, when
    ``heartbeat`` (seconds) is not 0, where they write their heartbeats."""

    def __init__(
        self,
        args: list[str],
        slots: tuple[int, ...],
        port: int,
        start: int,
        folder: Path,
        request: Path | None,
        heartbeat: float,
    ) -> None:
        base = {
            **os.environ,
            "WORLD_SIZE": str(len(slots)),
            "LOCAL_WORLD_SIZE": str(len(slots)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "HETERO_RESTART": str(start),
            "TORCHELASTIC_RESTART_COUNT": str(start),
            LAUNCHED_ENV: "1",
        }
        if request is not None:
            base[REGROUP_FILE_ENV] = str(request)
        if heartbeat:
            base[HEARTBEAT_INTERVAL_ENV] = str(min(1.0, heartbeat / 4))
        # As torchrun: ranks that share a machine's cores each get one thread unless told
        # otherwise (three ranks of two threads on two cores ran their compute 40 times slower).
        base.setdefault("OMP_NUM_THREADS", "1")
        self.request = request
        self.heartbeat = heartbeat
        self.hung: Hung | None = None  # the rank the launcher killed as hung
        self.exits: queue.Queue[tuple[int, int]] = queue.Queue()
        self.ended_at: dict[int, int] = {}  # slot -> when its end was seen (ns, wall clock)
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.stopped: set[int] = set()  # slots the launcher signalled while they ran
        self.waiters: list[threading.Thread] = []
        # Where torch's @record writes a rank's uncaught exception, as under torchrun.
        self.errors = {slot: folder / f"error-{start}-{slot}.json" for slot in slots}
        self.beats = (
            {slot: folder / f"heartbeat-{start}-{slot}.json" for slot in slots} if heartbeat else {}
        )
        for rank, slot in enumerate(slots):
            env = {
                **base,
                "RANK": str(rank),
                "LOCAL_RANK": str(slot),
                "TORCHELASTIC_ERROR_FILE": str(self.errors[slot]),
            }
            if heartbeat:
                env[HEARTBEAT_FILE_ENV] = str(self.beats[slot])
            self.procs[slot] = proc = subprocess.Popen(args, env=env, start_new_session=True)
            waiter = threading.Thread(target=self._wait, args=(slot, proc), daemon=True)
            waiter.start()
            self.waiters.append(waiter)

    def watch(self, membership: Membership) -> tuple[int, int] | None:
        """Wait until every rank succeeded (None) or one ended otherwise: (slot, status), the
        first one, or one hung: killed, its slot and SIGKILL (``hung`` says why). Meanwhile,
        when a lost slot may rejoin, ask the ranks to regroup."""
        running = set(self.procs)
        watched_since = looked = time.monotonic()
        while running:
            now = time.monotonic()
            if now - looked > self.heartbeat / 2:
                watched_since = now  # the launcher itself did not run: nobody is blamed for it
            looked = now
            hung = self._find_hung(running, now, watched_since)
            if hung is not None:
                # The others first: the hung rank's end would fail their collectives, each
                # printing its error.
                self.hung = hung
                self.terminate()
                self._kill(hung.rank)
                return hung.rank, -signal.SIGKILL
            if self.request is not None and not self.request.exists():
                back = membership.due(time.monotonic())
                if back:
                    self.request.touch()
                    _say(
                        f"{local_ranks(back)} may rejoin: the ranks regroup at their next "
                        "checkpoint"
                    )
            try:
                slot, code = self.exits.get(timeout=_TICK_S)
            except queue.Empty:
                continue
            running.discard(slot)
            if code != 0:
                return slot, code
        return None

    def first_failure(
        self, ended: int, among: Iterable[int] | None = None
    ) -> tuple[int, str | None]:
        """The rank that failed first (of the slots ``among``, default all) and what it raised
        (None: unknown), given the first to end. That may be one the failure reached: ranks fail
        when a peer closes its connections, which the peer may do before it ends. So:

        1. the rank whose error file (torch's ``@record``) was written first, of those whose
           error is not a lost connection, and written before the first rank's end was seen
           (one written after may be what that end caused);
        2. else a rank that ended by itself and wrote none (``os._exit``, a signal not sent
           here): its peers' collectives fail once it is gone, and how soon the launcher sees
           its end depends on the machine's load;
        3. else the first error file written before that end, else the first rank to end.
        """
        slots = list(self.errors if among is None else among)
        seen_end = self.ended_at.get(ended)
        written: list[tuple[int, int, str | None]] = []
        for s in slots:
            path = self.errors[s]
            if not path.exists():
                continue
            mtime = path.stat().st_mtime_ns
            if s == ended or seen_end is None or mtime < seen_end:
                written.append((mtime, s, _recorded_error(path)))
        causes = [w for w in written if w[2] is not None and not _lost_connection(w[2])]
        if causes:
            _, first, error = min(causes)
            return first, error
        silent = [
            s
            for s in slots
            if s not in self.stopped
            and self.procs[s].returncode not in (0, None)
            and not self.errors[s].exists()
        ]
        if silent:
            return min(silent, key=lambda s: (s != ended, self.ended_at.get(s, 0))), None
        known = [w for w in written if w[2] is not None]
        if known:
            _, first, error = min(known)
            return first, error
        return ended, None

    def close(self, leaving: bool) -> None:
        """Stop the ranks still running, at once or, when they are ``leaving`` on their own (a
        regroup), after the grace."""
        if leaving:
            self._join(_GRACE_S)
        self.terminate()
        if not self._join(_GRACE_S):
            self._signal(signal.SIGKILL)
            self._join(None)

    def terminate(self) -> None:
        """Ask every rank still running to end (SIGTERM), with what it started in its session."""
        self._signal(signal.SIGTERM)

    def interrupted(self, signum: int) -> str:
        """What the launcher says when ``signum`` stopped this start, once its ranks ended."""
        finished = tuple(slot for slot, proc in self.procs.items() if proc.returncode == 0)
        stopped = tuple(slot for slot in self.procs if slot not in finished)
        name = "interrupted" if signum == signal.SIGINT else signal.Signals(signum).name
        done = f"{local_ranks(finished)} had finished" if finished else "none had finished"
        return f"{name}: stopped {local_ranks(stopped)}; {done}" if stopped else f"{name}: {done}"

    def _find_hung(self, running: set[int], now: float, watched_since: float) -> Hung | None:
        """The hung rank among the ``running`` slots at ``now``, by their last heartbeats."""
        if not self.heartbeat:
            return None
        beats = {
            slot: beat for slot in running if (beat := _read_beat(self.beats[slot])) is not None
        }
        return find_hung(beats, now, self.heartbeat, watched_since)

    def _kill(self, slot: int) -> None:
        """Kill ``slot``'s session at once: SIGKILL ends a stopped process too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.procs[slot].pid, signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        for slot, proc in self.procs.items():
            if proc.returncode is None:
                self.stopped.add(slot)  # its end, and a missing error file, are ours
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signum)  # it leads its process group

    def _join(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: as long as it takes) for every rank to end;
        whether all did."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for waiter in self.waiters:
            waiter.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(waiter.is_alive() for waiter in self.waiters)

    def _wait(self, slot: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self.ended_at[slot] = time.time_ns()  # the clock error files' mtimes are on
        self.exits.put((slot, code))


class _Interrupts:
    """SIGINT and SIGTERM while the launch runs: the running start's ranks are asked to end, and
    the launch ends once they have. The ranks lead sessions of their own, so a terminal's Ctrl-C
    reaches the launcher alone and each rank ends once, on SIGTERM, rather than with a
    ``KeyboardInterrupt`` traceback of its own."""

    def __init__(self) -> None:
        self.signum = 0
        self._group: _Group | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._stop)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def watch(self, group: _Group) -> None:
        """``group`` is the running start (stopped at once if a signal came before it ran)."""
        self._group = group
        if self.signum:
            group.terminate()

    def _stop(self, signum: int, _frame: object) -> None:
        self.signum = signum
        if self._group is not None:
            self._group.terminate()


def parse_nproc(text: str) -> tuple[int, int]:
    """``--nproc``'s ``N`` or ``MIN:MAX`` as ``(minimum, maximum)``; ``ValueError`` naming the
    option, the value and what is allowed."""
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts] if len(parts) <= 2 else []
    except ValueError:
        numbers = []
    if not numbers:
        raise ValueError(
            f"--nproc must be a number of ranks N or a range MIN:MAX of whole numbers, got {text!r}"
        )
    if len(numbers) == 1:
        if numbers[0] < 1:
            raise ValueError(f"--nproc must be >= 1, got {numbers[0]}")
        return numbers[0], numbers[0]
    low, high = numbers
    if low < 1:
        raise ValueError(f"--nproc {text!r}: MIN must be >= 1 (a run needs a rank), got {low}")
    if low > high:
        raise ValueError(
            f"--nproc {text!r}: MIN must be <= MAX, got MIN {low} above MAX {high} (start MAX "
            "ranks and go on with no fewer than MIN)"
        )
    return low, high


def _read_beat(path: Path) -> Beat | None:
    """The heartbeat a rank last wrote at ``path``; None before its first."""
    try:
        return Beat.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _recorded_error(path: Path) -> str | None:
    """The exception torch's ``@record`` wrote at ``path`` (``Type: message``, the message cut
    at ``_ERROR_CHARS``); None when the file is still being written or holds something else."""
    try:
        error = str(json.loads(path.read_text())["message"]["message"]).strip()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return error[:_ERROR_CHARS] or None


#: What a collective raises when a peer is gone (gloo's and NCCL's words, lower case): an
#: effect of another rank's end, not a cause.
_LOST_CONNECTION = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "nccl communicator was aborted",
    "socket closed",
)


def _lost_connection(error: str) -> bool:
    text = error.lower()
    return any(words in text for words in _LOST_CONNECTION)


def _say(text: str) -> None:
    err_console.print(f"hetero launch: {text}", markup=False, highlight=False, soft_wrap=True)


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, for a rendezvous (rank 0's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
