"""``hetero launch``: start a script as N ranks on this machine, and start them all again when
one dies (elastic restart), as ``torchrun --nproc-per-node N --max-restarts K`` does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from hetero._cli_util import err_console, fail

__all__ = ["free_port", "register"]

# Seconds the other ranks get to leave after one died, before they are killed.
_GRACE_S = 5.0


def register(app: typer.Typer) -> None:
    """Add ``launch`` to ``app``."""
    app.command(
        "launch",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(launch)


def launch(
    ctx: typer.Context,
    script: Annotated[Path, typer.Argument(help="Python script to run on every rank.")],
    nproc: Annotated[int, typer.Option("--nproc", "-n", help="Ranks to start.")] = 1,
    max_restarts: Annotated[
        int, typer.Option(help="Times all ranks are started again after one fails.")
    ] = 3,
    master_port: Annotated[
        int, typer.Option(help="Port of rank 0's rendezvous; 0 picks a free one per start.")
    ] = 0,
) -> None:
    """Run SCRIPT as --nproc ranks on this machine; restart them all when one fails.

    Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as with torchrun.

    OMP_NUM_THREADS is 1 unless set: the ranks share this machine's cores.

    HETERO_RESTART (and TORCHELASTIC_RESTART_COUNT) counts restarts: resume from a checkpoint.

    Arguments after SCRIPT go to the script. Exit status: 0 when every rank succeeded.

    Example: `hetero launch --nproc 3 examples/train_mlp.py --steps 100`.
    """
    if nproc < 1:
        fail(f"--nproc must be >= 1, got {nproc}", code=2)
    if max_restarts < 0:
        fail(f"--max-restarts must be >= 0, got {max_restarts}", code=2)
    if not 0 <= master_port < 65536:
        fail(f"--master-port must be from 0 to 65535, got {master_port}", code=2)
    if not script.is_file():
        fail(f"script {str(script)!r} does not exist or is not a file", code=2)
    args = [sys.executable, str(script), *ctx.args]
    for attempt in range(max_restarts + 1):
        port = master_port or free_port()
        failed = _run_once(args, nproc, port, attempt)
        if failed is None:
            return
        rank, code = failed
        left = max_restarts - attempt
        err_console.print(
            f"hetero launch: rank {rank} exited with {_describe(code)}"
            + (f"; starting all {nproc} ranks again ({left} restarts left)" if left else ""),
            highlight=False,
        )
    starts = max_restarts + 1
    fail(f"rank {rank} failed {'once' if starts == 1 else f'{starts} times'}; giving up", code=1)


def _run_once(args: list[str], nproc: int, port: int, attempt: int) -> tuple[int, int] | None:
    """Start every rank; wait until all succeed (None) or one fails ((rank, exit code))."""
    base = {
        **os.environ,
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "HETERO_RESTART": str(attempt),
        "TORCHELASTIC_RESTART_COUNT": str(attempt),
    }
    # As torchrun: ranks that share a machine's cores each get one thread unless told otherwise
    # (three ranks of two threads on two cores ran their compute 40 times slower).
    base.setdefault("OMP_NUM_THREADS", "1")
    procs = [
        subprocess.Popen(args, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(nproc)
    ]
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def forward(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for sig in previous:
        signal.signal(sig, forward)
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = next(((r, c) for r, c in enumerate(codes) if c not in (None, 0)), None)
            if bad is not None:
                _stop(procs)
                return bad
            if all(c == 0 for c in codes):
                return None
            time.sleep(0.05)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _describe(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"status {code}"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, for a rendezvous (rank 0's store)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
