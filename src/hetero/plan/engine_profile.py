"""Engine profiles: the engine model's calibration fitted to short probes of a running engine.

A **probe** is a few streamed ``/v1/completions`` of random prompt token ids (``ignore_eos``, so
each runs to ``max_tokens``): the time to first token of single requests of several prompt
lengths, the time between tokens while 1, 2, 8 requests decode together, and the mean time to
first token and between tokens in closed loops of 16, 32, 64 clients (``ProbePlan``). The loops
are the regime a replica serves near its capacity: many requests decoding while new prompts are
prefilled in the same steps. Without them the fit is free to trade the step's fixed cost
against its bandwidth term, which the small probes cannot tell apart but a full batch can: one
profile of a half-core vLLM put its capacity at 1.8 times another's of the same engine. Both
halves of a loop count: fitted to its latency alone, the fit traded the wait for a first token
against the time between tokens, and two profiles still differed 1.7 times.
The **emulator** (``EngineModel`` of the same model shape, device and limits, on a fake clock)
replays the same probes; :func:`calibrate` fits the four knobs of its ``Calibration`` (compute and
bandwidth efficiency, step and per-request overhead) to the measurements by least squares of the
relative error, with one more constant for the HTTP path of the first-token probes (not part of
the engine). An :class:`EngineProfile` is what is saved: the engine as the emulator was told it,
the fitted calibration and each probe, measured and emulated side by side.

``hetero profile-engine URL`` runs :func:`profile_engine`; ``bench/bench_emulator.py`` uses the
same pieces against a real vLLM.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from hetero._checks import is_integer, is_number
from hetero._errors_render import show
from hetero.devices.spec import DeviceSpec
from hetero.errors import BackendError, ConfigError
from hetero.plan.models import ModelShape
from hetero.sched.engine_fit import BURST_PACE
from hetero.serve.engine_model import (
    BLOCK_SIZE,
    DEFAULT_MAX_BATCHED_TOKENS,
    Calibration,
    EngineModel,
    EngineRequest,
    EngineSpec,
    engine_spec,
    resolve_device,
    resolve_shape,
)

if TYPE_CHECKING:  # aiohttp is imported when an engine is probed
    import aiohttp

__all__ = [
    "DEFAULT_MAX_NUM_SEQS",
    "Emulator",
    "EngineProfile",
    "ProbeClient",
    "ProbePlan",
    "ProbeResult",
    "Probes",
    "Timing",
    "calibrate",
    "engine_facts",
    "probe",
    "profile_engine",
    "served_model",
    "warm_up",
]

#: vLLM's default cap on running requests.
DEFAULT_MAX_NUM_SEQS = 256
#: Seconds apart that requests sent together reach the engine: its HTTP front end parses and
#: hands them on one at a time (vLLM's API server takes a fraction of a millisecond each).
FRONT_END_S = 2.5e-4
ProbeKind = Literal["ttft", "itl", "load_ttft", "load_itl"]
_KINDS: tuple[ProbeKind, ...] = get_args(ProbeKind)
#: Each probe's median in seconds, by (kind, size): prompt tokens for ``ttft``, requests
#: decoding together for ``itl``, clients in the loop for ``load_ttft`` and ``load_itl``.
Probes = dict[tuple[ProbeKind, int], float]
Progress = Callable[[int, int], None]
_FORMAT = 1  # of the saved file
#: Runs of a probe in a row that may stream in bursts before the profile gives up. A server
#: that falls behind sends a whole reply at once: read as a pace, it is a step of nothing (on
#: a busy machine, probes right after a loop of 64 read 7.5 µs a token where steps took 2 ms,
#: and the fit made the engine's lone step that fast).
BURST_TRIES = 3


@dataclass(frozen=True, slots=True)
class ProbePlan:
    """Which probes: first tokens of single requests of ``ttft_prompts`` tokens; the time
    between tokens of ``itl_batches`` requests of ``itl_prompt`` + ``itl_output`` tokens sent
    together; the mean time to first token and between tokens of ``load_clients`` closed-loop
    clients sending ``load_rounds`` requests of ``load_prompt`` + ``load_output`` tokens each
    (none: a profile saved before the loads were probed; ``profile_engine`` clips them to the
    engine's ``max_num_seqs``)."""

    ttft_prompts: tuple[int, ...] = (32, 512, 1024, 1536)
    itl_batches: tuple[int, ...] = (1, 2, 8)
    itl_prompt: int = 128
    itl_output: int = 48
    load_clients: tuple[int, ...] = (16, 32, 64)
    load_prompt: int = 256
    load_output: int = 32
    load_rounds: int = 2

    def schedule(self) -> list[tuple[ProbeKind, int]]:
        ttft: list[tuple[ProbeKind, int]] = [("ttft", p) for p in self.ttft_prompts]
        itl: list[tuple[ProbeKind, int]] = [("itl", b) for b in self.itl_batches]
        loads: list[tuple[ProbeKind, int]] = []
        for n in self.load_clients:
            loads += [("load_ttft", n), ("load_itl", n)]
        return ttft + itl + loads

    def runs(self) -> list[tuple[ProbeKind, int]]:
        """The schedule less the loops' second halves: one loop gives both."""
        return [(kind, size) for kind, size in self.schedule() if kind != "load_itl"]


# ------------------------------------------------------------------------------- the engine


@dataclass(frozen=True, slots=True)
class Timing:
    """One streamed request: seconds from sending to its first and last token, and tokens."""

    first: float
    last: float
    tokens: int

    @property
    def itl(self) -> float:
        """Mean seconds between its tokens."""
        return (self.last - self.first) / (self.tokens - 1) if self.tokens > 1 else 0.0


class ProbeClient:
    """Streamed completions of random token ids (drawn from the middle of a ``vocab`` of
    tokens, clear of the special ones at either end), timed at the first and last token.
    ``seed`` None: drawn afresh, so that a second profile of the same engine does not find
    its prompts in the engine's prefix cache (with one fixed seed it did: prompts of 1,536
    tokens read as a 53 ms TTFT where they took 390)."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        *,
        vocab: int,
        seed: int | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.session, self.url, self.model, self.timeout = session, url.rstrip("/"), model, timeout
        self.ids = range(vocab // 32, vocab - vocab // 32)
        self.rng = random.Random(seed)

    async def complete(self, prompt: int, output: int) -> Timing:
        """``BackendError`` when the engine cannot be reached, refuses, or streams another
        number of tokens."""
        import aiohttp

        body = {
            "model": self.model,
            "prompt": [self.rng.choice(self.ids) for _ in range(prompt)],
            "max_tokens": output,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        times: list[float] = []
        tokens = None
        sent = time.perf_counter()
        try:
            async with self.session.post(
                self.url + "/v1/completions",
                json=body,
                timeout=aiohttp.ClientTimeout(total=self.timeout),
            ) as reply:
                if reply.status != 200:
                    text = (await reply.text())[:300]
                    raise BackendError(
                        f"{self.url}/v1/completions answered HTTP {reply.status}: {text}"
                    )
                async for line in reply.content:
                    if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                        continue
                    chunk = json.loads(line[5:])
                    if not isinstance(chunk, dict):
                        raise ValueError(f"a chunk that is no JSON object: {show(chunk)}")
                    choices = chunk.get("choices")
                    choice = choices[0] if isinstance(choices, list) and choices else None
                    if isinstance(choice, dict) and choice.get("text") is not None:
                        times.append(time.perf_counter() - sent)
                    if isinstance(chunk.get("usage"), dict):
                        tokens = chunk["usage"].get("completion_tokens")
        except asyncio.TimeoutError:
            raise BackendError(
                f"{self.url}/v1/completions: no answer within {self.timeout:g} s (the timeout)"
            ) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise BackendError(f"{self.url}/v1/completions: {type(exc).__name__}: {exc}") from exc
        tokens = len(times) if tokens is None else tokens  # no usage: a chunk a token
        if not times or tokens != output:
            raise BackendError(
                f"{self.url} streamed {tokens} tokens, not {output} (does it honour ignore_eos?)"
            )
        return Timing(times[0], times[-1], tokens)


async def warm_up(client: ProbeClient, plan: ProbePlan) -> None:
    """A few requests first: an engine compiles the first passes of each shape."""
    longest = max(plan.ttft_prompts)
    for prompt in sorted({min(16, longest), min(256, longest), min(1024, longest)}):
        await client.complete(prompt, 4)
    await asyncio.gather(*(client.complete(64, 8) for _ in range(max(plan.itl_batches))))


async def probe(
    client: ProbeClient, plan: ProbePlan, repeats: int, progress: Progress | None = None
) -> Probes:
    """The medians of ``repeats`` of each probe; ``progress(done, total)`` after each run."""
    total, done = len(plan.runs()) * repeats, 0

    async def loop() -> list[Timing]:
        rounds = range(plan.load_rounds)
        return [await client.complete(plan.load_prompt, plan.load_output) for _ in rounds]

    async def run(kind: ProbeKind, size: int) -> tuple[float, ...]:
        if kind == "ttft":
            return ((await client.complete(size, 2)).first,)
        if kind == "itl":
            runs = (client.complete(plan.itl_prompt, plan.itl_output) for _ in range(size))
            return (statistics.mean(t.itl for t in await asyncio.gather(*runs)),)
        loops = await asyncio.gather(*(loop() for _ in range(size)))
        return _loop_means([t for one in loops for t in one])

    out: Probes = {}
    for kind, size in plan.runs():
        values: list[tuple[float, ...]] = []
        for _ in range(repeats):
            for _ in range(BURST_TRIES):
                value = await run(kind, size)
                if kind == "ttft" or value[-1] >= BURST_PACE:
                    break
            else:
                raise BackendError(
                    f"{client.url}: the {kind} probe of {size} streamed its tokens in bursts "
                    f"{BURST_TRIES} times (under {BURST_PACE * 1e3:g} ms a token): the engine's "
                    "server is falling behind, so its pace cannot be read; profile it on an "
                    "idle machine"
                )
            values.append(value)
            done += 1
            if progress is not None:
                progress(done, total)
        out[kind, size] = statistics.median(v[0] for v in values)
        if kind == "load_ttft":
            out["load_itl", size] = statistics.median(v[1] for v in values)
    return out


def _loop_means(done: list[Timing]) -> tuple[float, float]:
    """A loop's mean time to first token and between tokens."""
    return statistics.mean(t.first for t in done), statistics.mean(t.itl for t in done)


async def served_model(session: aiohttp.ClientSession, url: str, timeout: float) -> str:
    """The first model ``GET /v1/models`` lists; ``BackendError`` when the server cannot be
    reached or is not an OpenAI-compatible one."""
    from hetero.serve.engines.base import LoadError, get_body, parse_json

    target = url.rstrip("/") + "/v1/models"
    try:
        body = await get_body(session, target, timeout)
        assert body is not None
        data = parse_json(body, "/v1/models")
    except LoadError as exc:
        detail = str(exc).removeprefix("/v1/models: ")
        raise BackendError(
            f"cannot read {target} ({detail}): is an OpenAI-compatible engine serving there?"
        ) from None
    models = data.get("data") if isinstance(data, dict) else None
    if not isinstance(models, list) or not models or not isinstance(models[0], dict):
        raise BackendError(f"{target} lists no models: not an OpenAI-compatible server?")
    name = models[0].get("id")
    if not isinstance(name, str) or not name:
        raise BackendError(f"{target} gives no model id: {show(models[0])}")
    return name


async def engine_facts(
    session: aiohttp.ClientSession, url: str, timeout: float
) -> tuple[str, int | None]:
    """The engine's name (sglang, vllm, openai) and the tokens its KV cache holds, where its
    load endpoints publish them (vLLM's ``/metrics``, SGLang's server info)."""
    from hetero.serve.engines import LoadError, detect

    url = url.rstrip("/")
    try:
        engine = await detect(session, url, timeout)
        return engine.name, (await engine.read(session, url, timeout)).kv_tokens
    except LoadError:
        return "openai", None


# ----------------------------------------------------------------------------- the emulator


class Emulator:
    """The engine model of ``shape`` on ``device`` (names or specs) with the engine's limits, on
    a fake clock, replaying the probes. ``ConfigError`` naming every bad argument; KV tokens
    default to what the memory fit leaves."""

    def __init__(
        self,
        shape: str | ModelShape,
        device: str | DeviceSpec,
        *,
        tensor_parallel: int = 1,
        kv_tokens: int | None = None,
        max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    ) -> None:
        self.tensor_parallel = tensor_parallel
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        checked = self._spec(shape, device, kv_tokens, Calibration())  # ConfigError now
        self.shape, self.device, self.kv_tokens = checked.shape, checked.device, checked.kv_tokens

    def spec(self, calibration: Calibration) -> EngineSpec:
        return self._spec(self.shape, self.device, self.kv_tokens, calibration)

    def _spec(
        self,
        shape: str | ModelShape,
        device: str | DeviceSpec,
        kv_tokens: int | None,
        calibration: Calibration,
    ) -> EngineSpec:
        return engine_spec(
            shape,
            device,
            calibration=calibration,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            kv_tokens=kv_tokens,
            tensor_parallel=self.tensor_parallel,
        )

    def engine(self, calibration: Calibration) -> tuple[EngineModel, list[float]]:
        """A fresh engine and its clock (``clock[0]``, seconds; move it to each step's end)."""
        clock = [0.0]
        return EngineModel(self.spec(calibration), lambda: clock[0]), clock

    def clients(
        self,
        calibration: Calibration,
        clients: int,
        rounds: int,
        prompt: int,
        output: int,
        http_s: float = 0.0,
    ) -> list[Timing]:
        """``clients`` closed-loop clients sending ``rounds`` requests each (the next as the
        last one's final token arrives), timed as the client sees them: each request reaches
        the engine half ``http_s`` after it is sent, its tokens the client half ``http_s``
        after their step. Requests sent together reach the engine one after another (its front
        end takes them one at a time, ``FRONT_END_S`` apart), so an idle engine starts a step
        with the first alone and the others join the next, as a real one does."""
        model, clock = self.engine(calibration)
        half = http_s / 2
        # A heap (sorted as built) of (reaches the engine, order sent, sent at, requests left).
        arriving = [(half + i * FRONT_END_S, i, 0.0, rounds) for i in range(clients)]
        order = clients
        sent: dict[EngineRequest, tuple[float, int]] = {}
        out: list[Timing] = []
        while arriving or model.busy:
            if not model.busy:
                clock[0] = max(clock[0], arriving[0][0])
            while arriving and arriving[0][0] <= clock[0]:
                _, _, sent_at, left = heapq.heappop(arriving)
                sent[model.submit(EngineRequest(prompt, output))] = (sent_at, left)
            step = model.step()
            assert step is not None  # busy: a request was just submitted or runs
            clock[0] = step.end
            for k, request in enumerate(step.finished):
                sent_at, left = sent.pop(request)
                first = (request.first_token_at or 0.0) + half - sent_at
                last = step.end + half - sent_at
                out.append(Timing(first, last, output))
                if left > 1:
                    again = step.end + 2 * half + k * FRONT_END_S
                    heapq.heappush(arriving, (again, order, step.end + half, left - 1))
                    order += 1
        return out

    def replay(self, calibration: Calibration, plan: ProbePlan, http_s: float = 0.0) -> Probes:
        """Each probe as the emulator runs it, through the HTTP path of ``http_s``."""
        out: Probes = {}
        for kind, size in plan.runs():
            if kind == "ttft":
                (single,) = self.clients(calibration, 1, 1, size, 2, http_s)
                out[kind, size] = single.first
            elif kind == "itl":
                done = self.clients(calibration, size, 1, plan.itl_prompt, plan.itl_output, http_s)
                out[kind, size] = statistics.mean(t.itl for t in done)
            else:
                done = self.clients(
                    calibration, size, plan.load_rounds, plan.load_prompt, plan.load_output, http_s
                )
                out[kind, size], out["load_itl", size] = _loop_means(done)
        return out


def calibrate(emulator: Emulator, real: Probes, plan: ProbePlan) -> tuple[Calibration, float]:
    """The calibration, and the seconds of the HTTP path, whose replay best fits ``real``
    (least squares of the relative errors, in log space)."""
    import numpy as np
    from scipy.optimize import least_squares

    def unpack(x: Any) -> tuple[Calibration, float]:
        o, r, ce, be, h, ae = (float(v) for v in np.exp(x))
        return Calibration(min(ce, 1.0), min(be, 1.0), o, r, min(ae, 1.0)), h

    def residuals(x: Any) -> list[float]:
        calibration, http_s = unpack(x)
        got = emulator.replay(calibration, plan, http_s)
        return [got[key] / real[key] - 1 for key in plan.schedule()]

    start = np.log([0.005, 0.001, 0.1, 0.1, 0.01, 0.1])
    low = np.log([1e-6, 1e-7, 1e-4, 1e-4, 1e-5, 1e-5])
    high = np.log([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    fit = least_squares(residuals, start, bounds=(low, high), diff_step=1e-3)
    return unpack(fit.x)


# ------------------------------------------------------------------------------ the profile


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe: its kind and size, measured on the engine and replayed by the emulator."""

    kind: ProbeKind
    size: int
    real: float
    emulated: float

    @property
    def error(self) -> float:
        """The emulator's relative error."""
        return self.emulated / self.real - 1


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """A running engine profiled: what the emulator was told of it (model shape, catalog device,
    tensor-parallel degree, KV tokens, step limits), the calibration fitted to its probes and
    the HTTP constant, each probe measured and emulated, the model it serves at ``url``, and
    when (ISO 8601, UTC)."""

    model_shape: str
    device: str
    calibration: Calibration
    http_s: float
    probes: tuple[ProbeResult, ...]
    model: str
    url: str
    taken_at: str
    tensor_parallel: int = 1
    kv_tokens: int | None = None
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    engine: str = "openai"
    plan: ProbePlan = field(default_factory=ProbePlan)

    @property
    def worst_error(self) -> float:
        """The largest relative error of the emulator on a probe."""
        return max((abs(p.error) for p in self.probes), default=0.0)

    def emulator(self) -> Emulator:
        """The emulator of the engine profiled (``.spec(profile.calibration)``: its engine)."""
        return Emulator(
            self.model_shape,
            self.device,
            tensor_parallel=self.tensor_parallel,
            kv_tokens=self.kv_tokens,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {"format": _FORMAT, **asdict(self), "worst_error": self.worst_error}
        out["plan"] = {k: list(v) if isinstance(v, tuple) else v for k, v in out["plan"].items()}
        out["probes"] = [asdict(p) for p in self.probes]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> EngineProfile:
        """The profile ``data`` (as ``to_dict`` writes it) holds; ``ConfigError`` naming every
        bad field."""
        return _Reader().profile(data)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EngineProfile:
        """The profile saved at ``path``; ``ConfigError`` naming the file and every bad
        field."""
        from hetero._data_files import read_data_file

        path = Path(path)
        data = read_data_file(path, "engine profile")
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(
                [(f"{path}: {where}" if where else str(path), msg) for where, msg in exc.problems]
            ) from None


def _sizes(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(is_integer(x) and x >= 1 for x in v)


def _iso_time(v: Any) -> bool:
    try:
        datetime.fromisoformat(v)
    except (TypeError, ValueError):
        return False
    return True


def _check(what: str, ok: Callable[[Any], bool]) -> tuple[str, Callable[[Any], bool]]:
    return what, ok


_TEXT = _check("a non-empty string", lambda v: isinstance(v, str) and bool(v.strip()))
_COUNT = _check("an integer >= 1", lambda v: is_integer(v) and v >= 1)
_SECONDS = _check("a number of seconds > 0", lambda v: is_number(v) and v > 0)
_SIZES = _check("a non-empty list of integers >= 1", _sizes)
_PROFILE = {
    "model_shape": _TEXT,
    "device": _TEXT,
    "model": _TEXT,
    "url": _TEXT,
    "engine": _TEXT,
    "taken_at": _check("an ISO 8601 time", _iso_time),
    "http_s": _check("a number of seconds >= 0", lambda v: is_number(v) and v >= 0),
    "tensor_parallel": _COUNT,
    "max_num_batched_tokens": _COUNT,
    "max_num_seqs": _COUNT,
    "kv_tokens": _check(
        f"null or an integer >= {BLOCK_SIZE}",
        lambda v: v is None or (is_integer(v) and v >= BLOCK_SIZE),
    ),
    "calibration": _check("a mapping", lambda v: isinstance(v, dict)),
    "probes": _check("a non-empty list of probes", lambda v: isinstance(v, list) and bool(v)),
}
_CALIBRATION = dict.fromkeys(Calibration.__dataclass_fields__, _check("a number", is_number))
_CALIBRATION["attention_efficiency"] = _check(
    "null or a number", lambda v: v is None or is_number(v)
)
_PROBE = {
    "kind": _check("one of " + ", ".join(map(repr, _KINDS)), lambda v: v in _KINDS),
    "size": _COUNT,
    "real": _SECONDS,
    "emulated": _SECONDS,
}
_OUTPUT = _check("an integer >= 2", lambda v: is_integer(v) and v >= 2)
_PLAN = {
    "ttft_prompts": _SIZES,
    "itl_batches": _SIZES,
    "itl_prompt": _COUNT,
    "itl_output": _OUTPUT,
    "load_clients": _check(
        "a list of integers >= 1", lambda v: isinstance(v, list) and (not v or _sizes(v))
    ),
    "load_prompt": _COUNT,
    "load_output": _OUTPUT,
    "load_rounds": _COUNT,
}
#: A profile saved before the loads were probed: its plan had none.
_NO_LOADS = {
    **{k: getattr(ProbePlan(), k) for k in ("load_prompt", "load_output", "load_rounds")},
    "load_clients": [],
}
_OPTIONAL = ("format", "worst_error", "plan")  # worst_error: derived, not read


class _Reader:
    """A saved profile read back, every bad field a problem."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def fields(
        self, data: Any, where: str, checks: dict[str, tuple[str, Callable[[Any], bool]]]
    ) -> dict[str, Any] | None:
        """``data``'s fields, each checked; None when any is missing or bad."""
        if not isinstance(data, dict):
            self.problems.append((where, f"must be a mapping, got {show(data)}"))
            return None
        before = len(self.problems)
        optional = _OPTIONAL if not where else ()
        for key in data:
            if key not in checks and key not in optional:
                allowed = ", ".join((*checks, *optional))
                self.problems.append((_join(where, key), f"unknown key; allowed: {allowed}"))
        for key, (what, ok) in checks.items():
            if key not in data:
                self.problems.append((_join(where, key), "required field is missing"))
            elif not ok(data[key]):
                self.problems.append((_join(where, key), f"must be {what}, got {show(data[key])}"))
        return {k: data[k] for k in checks} if len(self.problems) == before else None

    def profile(self, data: Any) -> EngineProfile:
        if not isinstance(data, dict):
            raise ConfigError([("", f"expected a mapping (a saved profile), got {show(data)}")])
        if data.get("format", _FORMAT) != _FORMAT:
            self.problems.append(("format", f"must be {_FORMAT}, got {show(data['format'])}"))
        got = self.fields(data, "", _PROFILE) or {}
        for key, resolve in (("model_shape", resolve_shape), ("device", resolve_device)):
            if isinstance(data.get(key), str):
                try:
                    resolve(data[key], key)
                except ConfigError as exc:
                    self.problems += exc.problems
        if isinstance(data.get("calibration"), dict):
            # A profile saved before attention had its own efficiency: as the compute's.
            calibration_data = {"attention_efficiency": None, **data["calibration"]}
            values = self.fields(calibration_data, "calibration", _CALIBRATION)
            if values is not None:
                got["calibration"] = calibration = Calibration(**values)
                self.problems += [(f"calibration.{k}", m) for k, m in calibration.problems()]
        if isinstance(data.get("probes"), list):
            probes = [self.fields(p, f"probes[{i}]", _PROBE) for i, p in enumerate(data["probes"])]
            got["probes"] = tuple(ProbeResult(**p) for p in probes if p is not None)
        plan_data = data.get("plan")
        if isinstance(plan_data, dict) and "load_clients" not in plan_data:
            plan_data = {**_NO_LOADS, **plan_data}
        plan = self.fields(plan_data, "plan", _PLAN) if "plan" in data else None
        if plan is not None:
            got["plan"] = ProbePlan(
                tuple(plan["ttft_prompts"]),
                tuple(plan["itl_batches"]),
                plan["itl_prompt"],
                plan["itl_output"],
                tuple(plan["load_clients"]),
                plan["load_prompt"],
                plan["load_output"],
                plan["load_rounds"],
            )
        elif "plan" not in data:
            got["plan"] = ProbePlan(load_clients=())  # saved before the plan was
        if self.problems:
            raise ConfigError(self.problems)
        return EngineProfile(**got)


def _join(where: str, key: object) -> str:
    return f"{where}.{key}" if where else str(key)


# ---------------------------------------------------------------------------------- profile


async def profile_engine(
    url: str,
    model_shape: str,
    device: str,
    *,
    tensor_parallel: int = 1,
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
    model: str | None = None,
    repeats: int = 3,
    timeout: float = 120.0,
    plan: ProbePlan | None = None,
    seed: int | None = None,
    progress: Progress | None = None,
) -> EngineProfile:
    """Probe the engine at ``url`` (serving ``model``, else the first of its ``/v1/models``),
    fit the emulator of ``model_shape`` on ``device`` to it, and return the profile.
    ``ConfigError`` for a bad shape, device or limit (before any request); ``BackendError``
    when the engine cannot be reached, is no OpenAI server or fails a probe (each request is
    bounded by ``timeout`` seconds)."""
    import aiohttp

    plan = plan or ProbePlan()
    # A loop of more clients than the engine runs at once measures its queue, not its batch.
    plan = replace(
        plan, load_clients=tuple(sorted({min(n, max_num_seqs) for n in plan.load_clients}))
    )
    if not is_integer(repeats) or repeats < 1:
        raise ConfigError([("repeats", f"must be an integer >= 1, got {show(repeats)}")])
    if not is_number(timeout) or timeout <= 0:
        raise ConfigError([("timeout", f"must be a number of seconds > 0, got {show(timeout)}")])

    def emulator(kv_tokens: int | None) -> Emulator:
        return Emulator(
            model_shape,
            device,
            tensor_parallel=tensor_parallel,
            kv_tokens=kv_tokens,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        )

    checked = emulator(BLOCK_SIZE)  # every bad argument named before any request
    shape, spec = checked.shape, checked.device
    url = url.rstrip("/")
    async with aiohttp.ClientSession() as session:
        served = model or await served_model(session, url, timeout)
        engine, kv_tokens = await engine_facts(session, url, min(timeout, 10.0))
        fitter = emulator(kv_tokens)
        longest = max(
            max(plan.ttft_prompts) + 2,
            plan.itl_prompt + plan.itl_output,
            plan.load_prompt + plan.load_output if plan.load_clients else 0,
        )
        context = fitter.spec(Calibration()).max_context
        if context < longest:
            raise BackendError(
                f"{url}: the engine emulated holds {context} tokens a request at most (KV cache"
                f" {fitter.kv_tokens}), fewer than the longest probe's {longest}"
            )
        client = ProbeClient(session, url, served, vocab=shape.vocab, seed=seed, timeout=timeout)
        if progress is not None:
            progress(0, len(plan.schedule()) * repeats)
        await warm_up(client, plan)
        real = await probe(client, plan, repeats, progress)
    calibration, http_s = calibrate(fitter, real, plan)
    emulated = fitter.replay(calibration, plan, http_s)
    if model_shape.endswith(".json") or Path(model_shape).is_dir():
        model_shape = str(Path(model_shape).resolve())  # a config.json: found from anywhere
    return EngineProfile(
        model_shape=model_shape,
        device=spec.model,
        calibration=calibration,
        http_s=http_s,
        probes=tuple(ProbeResult(k, s, real[k, s], emulated[k, s]) for k, s in plan.schedule()),
        model=served,
        url=url,
        taken_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        tensor_parallel=tensor_parallel,
        kv_tokens=kv_tokens,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        engine=engine,
        plan=plan,
    )
