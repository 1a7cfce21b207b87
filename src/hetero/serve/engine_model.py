"""An engine-faithful model of one LLM inference replica, after vLLM v1's scheduler.

**Continuous batching**: the engine runs steps back to back; requests join the running batch at
a step boundary, leave it when they finish. Each step schedules the running requests first,
oldest first (a decoding request takes one token, a prefilling one a chunk), then admits waiting
requests first come, first served, all within a token budget (``max_num_batched_tokens``,
chunked prefill) and a cap on running requests (``max_num_seqs``). The step that computes a
request's last prompt token also samples its first output token; each later step samples one.

**Step time** from the batch, by the roofline of the model's shape on the device: the tokens
scheduled (prefill chunks and one per decoding request) cost ``2 × parameters`` FLOPs each, plus
their attention over the tokens before them, at the catalog's TFLOPS for the weights' format
(attention at an efficiency of its own: its kernels are not the weights' matrix products);
the step reads the weights once plus the KV cache of every scheduled request at the catalog's
memory bandwidth; it takes the longer of the two (each over an efficiency factor), plus an
overhead per step and one per request in the batch. Decoding alone is bound by memory, so adding
requests to the batch is nearly free until the compute side overtakes it. Sliding windows are
not modelled (a windowed model's KV reads as if it attended to everything).

**KV cache**: ``block_size``-token blocks, as many as the device's memory holds once the
weights, one step's activations and the runtime overhead are taken (``hetero.plan.memory``),
at vLLM's default ``gpu_memory_utilization`` of 0.9. When a running request needs a block and
none is free, the newest running request is **preempted**: its blocks are freed and it waits
again at the head of the line, to recompute its prompt and the output generated so far (vLLM
v1 preempts by recomputation); it still finishes once, with its whole output.

**Prefix cache**: the full blocks of a prompt are named by chained hashes (given with each
request), cached as they are computed and shared by the running requests that hit them; a
request admitted skips the prefill of its longest cached prefix (always recomputing the last
prompt token, as vLLM does). Freed blocks stay cached until their memory is needed, evicted
least recently freed first, a prompt's tail before its head (``PrefixIndex``'s LRU).

Pure: no I/O and no sleeping; time comes from an injected clock. :meth:`EngineModel.step`
schedules the next step and returns when it ends; a driver sleeps until then
(``emulator.continuous``) or, in tests and benchmarks, moves a fake clock.
"""

from __future__ import annotations

import math
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hetero._checks import is_positive
from hetero.devices.catalog import get_catalog
from hetero.devices.spec import DeviceSpec
from hetero.errors import ConfigError, DeviceError
from hetero.plan.memory import (
    DTYPE_BYTES,
    MAX_TENSOR_PARALLEL,
    FitRequest,
    kv_bytes_per_token,
    kv_share,
    memory_breakdown,
)
from hetero.plan.models import ModelShape, get_model, load_hf_config, model_names
from hetero.sched.engine_fit import EnginePrior
from hetero.sched.prefix import PrefixIndex

__all__ = [
    "BLOCK_SIZE",
    "DEFAULT_MAX_BATCHED_TOKENS",
    "MEMORY_UTILIZATION",
    "Calibration",
    "EngineModel",
    "EngineRequest",
    "EngineSpec",
    "Step",
    "StepCost",
    "engine_spec",
    "resolve_device",
    "resolve_shape",
]

#: Tokens per KV block (vLLM's default on GPUs).
BLOCK_SIZE = 16
#: vLLM's default token budget per step on H100-class GPUs behind its OpenAI server.
DEFAULT_MAX_BATCHED_TOKENS = 8192
#: vLLM's default ``gpu_memory_utilization``: the share of device memory it takes.
MEMORY_UTILIZATION = 0.9
# Formats whose TFLOPS a step runs at; weights stored in int8/int4 are computed in bf16.
_COMPUTE_DTYPES = ("fp32", "fp16", "bf16", "fp8")
#: Seconds of one small all-reduce over an NVLink-class link, and through PCIe.
ALLREDUCE_LATENCY_FAST = 10e-6
ALLREDUCE_LATENCY_PCIE = 30e-6
_FAST_LINKS = ("nvlink", "infinityfabric", "ici", "neuronlink", "roce", "xgmi")
# The prefix index is never full by itself: _fit_cache evicts from it as memory runs short.
_UNBOUNDED = sys.maxsize


@dataclass(frozen=True, slots=True)
class Calibration:
    """How close to the catalog's peaks the engine runs: the share of the peak TFLOPS its
    forward passes reach, the share of the peak memory bandwidth its steps read at, and the
    seconds each step costs besides (scheduling, kernel launches), and each request in it
    (preparing its inputs, sampling, its output); the share of the peak its attention over
    the context reaches (None: as the rest of the pass; vLLM on this project's CPU ran it at
    about half the matrix products' share, so a long prompt's prefill grew faster than its
    length).
    Fit them to a real engine's measured step times (``hetero profile-engine`` does;
    ``bench/bench_emulator.py`` for vLLM on a CPU)."""

    compute_efficiency: float = 0.5
    bandwidth_efficiency: float = 0.8
    step_overhead: float = 0.002
    request_overhead: float = 0.0
    attention_efficiency: float | None = None

    @property
    def attention(self) -> float:
        """The share of the peak attention runs at."""
        eff = self.attention_efficiency
        return self.compute_efficiency if eff is None else eff

    def problems(self) -> list[tuple[str, str]]:
        out = []
        for name in ("compute_efficiency", "bandwidth_efficiency", "attention_efficiency"):
            value = getattr(self, name)
            if name == "attention_efficiency" and value is None:
                continue
            if not (is_positive(value) and value <= 1):
                out.append((name, f"must be a fraction of the peak in (0, 1], got {value!r}"))
        for name in ("step_overhead", "request_overhead"):
            value = getattr(self, name)
            if not (is_positive(value) or (value == 0 and not isinstance(value, bool))):
                out.append((name, f"must be a finite number of seconds >= 0, got {value!r}"))
        return out


@dataclass(frozen=True, slots=True)
class StepCost:
    """The time of one step from what it computes: ``tokens`` scheduled (prefill and decode)
    for ``requests``; ``context``, the tokens of KV cache those requests hold once it is done;
    ``attended``, the pairs of a token scheduled and a position it attends to (a chunk of ``n``
    tokens after ``p`` cached attends to ``n·p + n(n+1)/2``)."""

    flops_per_token: float
    attention_flops: float  # per pair of a token and a position it attends to
    flops_per_s: float  # effective: peak × compute efficiency
    weight_bytes: float
    active_share: float  # the share of the weights one token reads (MoE: its experts)
    kv_bytes_per_token: float
    bytes_per_s: float  # effective: peak × bandwidth efficiency
    overhead: float
    request_overhead: float
    # Tensor parallelism: the all-reduces of each step (two per layer), a latency each plus
    # every scheduled token's activations over the link. Both 0 on one device.
    allreduce_s: float = 0.0
    allreduce_s_per_token: float = 0.0
    # The compute efficiency over attention's: an attended pair costs this many times its
    # FLOPs at the compute side's rate (1: the same efficiency, and the same arithmetic).
    attention_slowdown: float = 1.0

    def comm_s(self, tokens: int) -> float:
        return self.allreduce_s + self.allreduce_s_per_token * tokens

    def compute_s(self, tokens: int, attended: int = 0) -> float:
        attention = attended * self.attention_flops * self.attention_slowdown
        return (tokens * self.flops_per_token + attention) / self.flops_per_s

    def memory_s(self, tokens: int, context: int) -> float:
        # Every weight is read once per step, but a few tokens of an MoE touch few experts.
        weights = self.weight_bytes * min(1.0, self.active_share * tokens)
        return (weights + context * self.kv_bytes_per_token) / self.bytes_per_s

    def time(self, tokens: int, context: int, attended: int = 0, requests: int = 1) -> float:
        if tokens <= 0:
            return 0.0
        roofline = max(self.compute_s(tokens, attended), self.memory_s(tokens, context))
        return self.overhead + self.request_overhead * requests + roofline + self.comm_s(tokens)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """A checked engine: the model and device it emulates, its limits and its calibration.
    Build it with :func:`engine_spec`."""

    shape: ModelShape
    device: DeviceSpec
    dtype: str  # the weights' storage format
    kv_dtype: str
    kv_tokens: int  # KV cache capacity, a whole number of blocks
    max_num_seqs: int
    max_num_batched_tokens: int
    calibration: Calibration
    cost: StepCost
    tensor_parallel: int = 1

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // BLOCK_SIZE

    def prior(self) -> EnginePrior:
        """The router's starting point for a replica running this engine: ``StepCost``
        linearised (``hetero.sched.engine_fit``). A step reads the weights once (the base),
        each request in it adds its overhead and its token's compute (an upper bound while the
        step is bound by memory), each thousand KV tokens their read; a prompt token costs its
        compute. Each coefficient starts as unsure as it is large: the calibration is a guess
        until replies correct it."""
        cost = self.cost
        weights = cost.weight_bytes / cost.bytes_per_s
        per_token = cost.flops_per_token / cost.flops_per_s + cost.allreduce_s_per_token
        per_request = cost.request_overhead + per_token
        base = (cost.overhead + weights + cost.allreduce_s, per_token, per_request)
        step = (
            cost.overhead + weights + cost.allreduce_s,
            per_request,
            1000 * cost.kv_bytes_per_token / cost.bytes_per_s,
        )
        return EnginePrior(*base, *step, ttft_sd=base, tpot_sd=step, kv_tokens=self.kv_tokens)

    @property
    def max_context(self) -> int:
        """The longest request (prompt and output) it serves: the model's positions, and what
        its KV cache holds."""
        positions = self.shape.max_positions or self.kv_tokens
        return min(positions, self.kv_tokens)


def resolve_shape(name: str | ModelShape, field_name: str = "model_shape") -> ModelShape:
    """A built-in model shape by name, or read from a Hugging Face ``config.json`` (a path to
    it, or to its folder); ``ConfigError`` on ``field_name`` naming the built-in ones."""
    if isinstance(name, ModelShape):
        return name
    if not isinstance(name, str) or not name.strip():
        raise ConfigError([(field_name, f"must be a model name or a config.json, got {name!r}")])
    if name.endswith(".json") or Path(name).is_dir():
        try:
            return load_hf_config(name)
        except ConfigError as exc:
            raise ConfigError([(field_name, str(exc))]) from None
    try:
        return get_model(name)
    except ConfigError:
        raise ConfigError(
            [
                (
                    field_name,
                    f"unknown model shape {name!r}; built-in: {', '.join(model_names())}; or a "
                    "path to a Hugging Face config.json",
                )
            ]
        ) from None


def resolve_device(name: str | DeviceSpec, field_name: str = "device") -> DeviceSpec:
    """A catalog device by name; ``ConfigError`` on ``field_name`` naming the closest ones."""
    if isinstance(name, DeviceSpec):
        return name
    catalog = get_catalog()
    try:
        return catalog.get(name) if isinstance(name, str) else catalog.get(repr(name))
    except DeviceError:
        close = catalog.closest(str(name))
        hint = f"closest: {', '.join(close)}; " if close else ""
        raise ConfigError(
            [(field_name, f"unknown device {name!r}; {hint}see `hetero catalog list`")]
        ) from None


def engine_spec(
    model_shape: str | ModelShape,
    device: str | DeviceSpec,
    *,
    calibration: Calibration | None = None,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    kv_tokens: int | None = None,
    tensor_parallel: int = 1,
) -> EngineSpec:
    """The engine of ``model_shape`` (a built-in name, a config.json, or a shape) on ``device``
    (a catalog name or spec). ``kv_tokens`` overrides the KV capacity the memory fit gives (a
    real engine's, read from its ``/metrics``). Raises ``ConfigError`` naming every bad field,
    its value and what is allowed, or the model that does not fit.

    ``tensor_parallel`` devices of the type serve one replica, as vLLM's
    ``--tensor-parallel-size`` does: each holds a share of the weights and of the KV heads (a
    KV head is copied when there are more devices than KV heads; MLA's latent is copied on
    every one), computes its share of each token and reads its share at its own bandwidth, and
    each layer ends in two all-reduces of the tokens' activations over the device's link (ring:
    ``2(k-1)/k`` of them cross each link, at half the bidirectional figure the catalog quotes)."""
    calibration = calibration or Calibration()
    problems = calibration.problems()
    shape: ModelShape | None = None
    spec: DeviceSpec | None = None
    try:
        shape = resolve_shape(model_shape)
    except ConfigError as exc:
        problems += exc.problems
    try:
        spec = resolve_device(device)
    except ConfigError as exc:
        problems += exc.problems
    for name, value in (
        ("max_num_seqs", max_num_seqs),
        ("max_num_batched_tokens", max_num_batched_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            problems.append((name, f"must be an integer >= 1, got {value!r}"))
    if kv_tokens is not None and (
        isinstance(kv_tokens, bool) or not isinstance(kv_tokens, int) or kv_tokens < BLOCK_SIZE
    ):
        allowed = f"None (from the memory fit) or an integer >= {BLOCK_SIZE}"
        problems.append(("kv_tokens", f"must be {allowed}, got {kv_tokens!r}"))
    tp = tensor_parallel
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= MAX_TENSOR_PARALLEL:
        allowed = f"an integer from 1 to {MAX_TENSOR_PARALLEL}"
        problems.append(("tensor_parallel", f"must be {allowed}, got {tp!r}"))
    elif tp > 1 and spec is not None and spec.interconnect_gbs <= 0:
        problems.append(
            ("tensor_parallel", f"{spec.model} publishes no device-to-device link to split over")
        )
    if problems or shape is None or spec is None:
        raise ConfigError(problems)
    request = FitRequest(
        seq=max_num_batched_tokens, prefill_chunk=max_num_batched_tokens, devices=tp
    )
    try:
        request = request.resolved(shape)
    except ConfigError as exc:
        raise ConfigError([("tensor_parallel", message) for _, message in exc.problems]) from None
    assert request.dtype is not None and request.kv_dtype is not None
    compute = request.dtype if request.dtype in _COMPUTE_DTYPES else "bf16"
    tflops = spec.peak_tflops(compute)
    if tflops <= 0 or spec.memory_bandwidth_gbs <= 0:
        raise ConfigError(
            [("device", f"{spec.model} publishes no {compute} TFLOPS or memory bandwidth")]
        )
    # Per device (the memory fit splits the weights, the KV heads and the logits).
    kv_per_token = kv_bytes_per_token(shape, request.kv_dtype) * kv_share(shape, tp)
    parts = memory_breakdown(shape, request)
    if kv_tokens is None:
        # What vLLM's profiling run finds: its share of memory, less all but the KV cache.
        others = sum(parts.values()) - parts["kv_cache"]
        kv_tokens = int((spec.memory_bytes * MEMORY_UTILIZATION - others) // kv_per_token)
        if kv_tokens < BLOCK_SIZE:
            gib = 1024**3
            usable = spec.memory_bytes * MEMORY_UTILIZATION / gib
            where = f"{tp} × {spec.model}" if tp > 1 else spec.model
            each = " each" if tp > 1 else ""
            message = (
                f"{shape.name} does not fit on {where}: its weights, activations and runtime"
                f" take {others / gib:.1f} GiB{each} of the {usable:.1f} GiB vLLM would use,"
                " leaving no KV cache"
            )
            raise ConfigError([("device", message)])
    kv_tokens -= kv_tokens % BLOCK_SIZE
    # Scores (q·k) and the weighted sum of values: 2 FLOPs a multiply-add, per head and layer.
    v_dim = shape.v_head_dim if shape.is_mla else shape.head_dim
    allreduce_s = allreduce_per_token = 0.0
    if tp > 1:
        # Two all-reduces a layer, of each token's hidden state in the compute format.
        link = spec.interconnect_gbs / 2 * 1e9 * calibration.bandwidth_efficiency
        ring = 2 * (tp - 1) / tp
        allreduce_s = 2 * shape.layers * _allreduce_latency(spec)
        allreduce_per_token = 2 * shape.layers * ring * shape.hidden * DTYPE_BYTES[compute] / link
    cost = StepCost(
        flops_per_token=2.0 * shape.active_params / tp,
        attention_flops=2.0 * shape.layers * shape.heads * (shape.head_dim + v_dim) / tp,
        flops_per_s=tflops * 1e12 * calibration.compute_efficiency,
        attention_slowdown=calibration.compute_efficiency / calibration.attention,
        weight_bytes=float(parts["weights"]),
        active_share=shape.active_params / shape.params,
        kv_bytes_per_token=float(kv_per_token),
        bytes_per_s=spec.memory_bandwidth_gbs * 1e9 * calibration.bandwidth_efficiency,
        overhead=calibration.step_overhead,
        request_overhead=calibration.request_overhead,
        allreduce_s=allreduce_s,
        allreduce_s_per_token=allreduce_per_token,
    )
    return EngineSpec(
        shape=shape,
        device=spec,
        dtype=request.dtype,
        kv_dtype=request.kv_dtype,
        kv_tokens=kv_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        calibration=calibration,
        cost=cost,
        tensor_parallel=tp,
    )


def _allreduce_latency(spec: DeviceSpec) -> float:
    """Seconds one small all-reduce takes over the device's link: a few µs over NVLink-class
    fabrics, more through PCIe and the host."""
    fast = spec.interconnect.lower().startswith(_FAST_LINKS)
    return ALLREDUCE_LATENCY_FAST if fast else ALLREDUCE_LATENCY_PCIE


@dataclass(eq=False, slots=True)
class EngineRequest:
    """A request and its progress. ``blocks`` are the chained hashes of its prompt's full
    blocks (``prefix_blocks`` of the prompt's text, one block per ``BLOCK_SIZE`` tokens)."""

    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] = ()
    arrival: float = 0.0
    computed: int = 0  # tokens whose KV is in the cache
    generated: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache spared it, at its first admission
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    _shared: list[int] = field(default_factory=list)  # cached blocks it holds (hashes)
    _private: int = 0  # blocks it holds that no other request may share
    _next_block: int = 0  # prompt blocks before it are cached or shared
    _admitted: bool = False

    @property
    def num_tokens(self) -> int:
        """Tokens it has: its prompt and the output generated so far."""
        return self.prompt_tokens + self.generated

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


@dataclass(frozen=True, slots=True)
class Step:
    """One engine step: when it ran, what it computed, and what it changed (as of ``end``)."""

    start: float
    end: float
    prefill_tokens: int
    decode_tokens: int
    batch: int  # requests scheduled in it
    progressed: tuple[EngineRequest, ...]  # a token sampled for each
    finished: tuple[EngineRequest, ...]
    preempted: tuple[EngineRequest, ...]

    @property
    def duration(self) -> float:
        return self.end - self.start


class EngineModel:
    """The scheduler and KV cache of one engine over time read from ``clock``.

    Usage: :meth:`submit` requests (stamped at ``clock()``); :meth:`step` runs the next step
    (None when there is nothing to do) and says when it ends and what came of it; a request
    leaving early is :meth:`abort`-ed. ``scale`` stretches step times (slowdown / speed).
    """

    def __init__(self, spec: EngineSpec, clock: Callable[[], float]) -> None:
        self.spec = spec
        self._clock = clock
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self._cache = PrefixIndex([_UNBOUNDED])  # every cached block, in use or free
        self._refs: dict[int, int] = {}  # cached blocks in use -> requests holding them
        self._private = 0  # blocks held outside the cache
        self._evictable = 0  # cached blocks surely behind every block in use in LRU order
        self._free_at = -math.inf  # when the last step ended
        self._backlog = False  # the last step left work: the next one starts as it ends
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # ... and found there
        self.preemptions = 0
        self.steps = 0

    # --- state ------------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def used_blocks(self) -> int:
        return len(self._refs) + self._private

    @property
    def kv_usage(self) -> float:
        """The share of KV blocks held by requests (cached free blocks count as free)."""
        return self.used_blocks / self.spec.num_blocks

    def cached_prefix(self, blocks: Sequence[int]) -> int:
        """Leading blocks of ``blocks`` the prefix cache holds now."""
        self._fit_cache()
        return int(self._cache.match(blocks)[0])

    # --- requests ---------------------------------------------------------------------------

    def submit(self, request: EngineRequest) -> EngineRequest:
        """Queue ``request``, arrived now. ``ValueError`` when it could never run: longer than
        ``spec.max_context``, or no output."""
        total = request.prompt_tokens + request.output_tokens
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError("a request needs a prompt token and an output token at least")
        if total > self.spec.max_context:
            raise ValueError(
                f"{total} tokens (prompt and output) exceed the engine's {self.spec.max_context}"
            )
        request.arrival = self._clock()
        self.waiting.append(request)
        return request

    def abort(self, request: EngineRequest) -> None:
        """``request`` leaves (its client went away): its blocks are freed. No-op once done."""
        if request in self.running:
            self.running.remove(request)
            self._release(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if not self.busy:
            self._backlog = False

    # --- steps ------------------------------------------------------------------------------

    def step(self, scale: float = 1.0) -> Step | None:
        """Schedule and run the next step; its results are applied at once and hold from its
        ``end``. It starts as the last one ended while there was a backlog, else now."""
        if not self.busy:
            self._backlog = False
            return None
        start = self._free_at if self._backlog else max(self._clock(), self._free_at)
        budget = self.spec.max_num_batched_tokens
        scheduled: list[tuple[EngineRequest, int]] = []
        preempted: list[EngineRequest] = []
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            n = min(request.num_tokens - request.computed, budget)
            while not self._allocate(request, n):
                victim = self.running.pop()  # the newest goes first, maybe this one
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    break
            else:
                scheduled.append((request, n))
                budget -= n
                i += 1
        if not preempted:  # as vLLM: no admission in a step short of memory
            budget = self._admit(budget, scheduled)
        if not scheduled:
            raise RuntimeError("engine model: work waiting, yet nothing could be scheduled")
        tokens = sum(n for _, n in scheduled)
        context = sum(r.computed + n for r, n in scheduled)
        attended = sum(n * r.computed + n * (n + 1) // 2 for r, n in scheduled)
        cost = self.spec.cost.time(tokens, context, attended, len(scheduled))
        end = start + cost * scale
        decode = sum(1 for r, n in scheduled if n == 1 and r.generated)
        progressed: list[EngineRequest] = []
        finished: list[EngineRequest] = []
        for request, n in scheduled:
            request.computed += n
            self._cache_blocks(request)
            if request.computed < request.num_tokens:
                continue  # a chunk of a longer prefill
            request.generated += 1
            progressed.append(request)
            if request.first_token_at is None:
                request.first_token_at = end
            if request.generated == request.output_tokens:
                request.finished_at = end
                self.running.remove(request)
                self._release(request)
                finished.append(request)
        self._fit_cache()
        self.steps += 1
        self._free_at = end
        self._backlog = self.busy
        return Step(
            start=start,
            end=end,
            prefill_tokens=tokens - decode,
            decode_tokens=decode,
            batch=len(scheduled),
            progressed=tuple(progressed),
            finished=tuple(finished),
            preempted=tuple(preempted),
        )

    def _admit(self, budget: int, scheduled: list[tuple[EngineRequest, int]]) -> int:
        """Move waiting requests into the batch, first come first served, while the budget, the
        cap on running requests and the free blocks allow; returns the budget left."""
        bs = BLOCK_SIZE
        while self.waiting and budget > 0 and len(self.running) < self.spec.max_num_seqs:
            request = self.waiting[0]
            self._fit_cache()
            # The last token is always computed again: its logits give the next token.
            limit = min(len(request.blocks), (request.num_tokens - 1) // bs)
            hit = min(int(self._cache.match(request.blocks[:limit])[0]), limit)
            shared = request.blocks[:hit]
            n = min(request.num_tokens - hit * bs, budget)
            reclaimed = sum(1 for h in shared if h not in self._refs)  # free cached blocks
            private = -(-(hit * bs + n) // bs) - hit
            if reclaimed + private > self.spec.num_blocks - self.used_blocks:
                break
            self.waiting.popleft()
            for h in shared:
                self._refs[h] = self._refs.get(h, 0) + 1
            self._cache.insert(0, shared)
            self._evictable = max(0, self._evictable - reclaimed)
            request._shared = list(shared)
            request._private = private
            request._next_block = hit
            request.computed = hit * bs
            self._private += private
            if not request._admitted:  # vLLM counts a preempted request's lookups apart
                request._admitted = True
                request.cached_tokens = hit * bs
                self.prefix_queries += request.num_tokens
                self.prefix_hits += hit * bs
            self.running.append(request)
            scheduled.append((request, n))
            budget -= n
        return budget

    def _allocate(self, request: EngineRequest, n: int) -> bool:
        """Blocks for ``n`` more tokens of ``request``; False when too few are free."""
        held = len(request._shared) + request._private
        need = -(-(request.computed + n) // BLOCK_SIZE) - held
        if need > self.spec.num_blocks - self.used_blocks:
            return False
        if need > 0:
            request._private += need
            self._private += need
        return True

    def _preempt(self, request: EngineRequest) -> None:
        self._release(request)
        request.computed = 0
        request.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(request)

    def _cache_blocks(self, request: EngineRequest) -> None:
        """Name the prompt blocks ``request`` has filled, so that others may share them."""
        full = min(request.computed // BLOCK_SIZE, len(request.blocks))
        if full <= request._next_block:
            return
        fresh = []
        for h in request.blocks[request._next_block : full]:
            if h in self._refs:
                continue  # computed twice at once: this copy stays private, as in vLLM
            self._refs[h] = 1
            request._shared.append(h)
            request._private -= 1
            self._private -= 1
            fresh.append(h)
            # It may have been cached already (a prefix that diverged earlier in the chain).
            self._evictable = max(0, self._evictable - 1)
        request._next_block = full
        self._cache.insert(0, fresh)

    def _release(self, request: EngineRequest) -> None:
        for h in request._shared:
            left = self._refs[h] - 1
            if left:
                self._refs[h] = left
            else:
                del self._refs[h]
        # Freed blocks are the most recently used, a prompt's tail evicted before its head (a
        # chained prefix is useless past its first missing block).
        self._cache.insert(0, request._shared[::-1])
        self._private -= request._private
        request._shared = []
        request._private = 0
        request._next_block = 0
        self._fit_cache()

    def _fit_cache(self) -> None:
        """Evict cached free blocks, least recently used first, until the cache fits in the
        blocks that private ones leave. Blocks in use must never go: when the eviction could
        reach them, they are moved behind every free block first (an O(in use) pass, done
        once per as many evictions as there were free blocks then)."""
        room = self.spec.num_blocks - self._private
        excess = self._cache.held(0) - room
        if excess <= 0:
            return
        if excess > self._evictable:
            self._cache.insert(0, list(self._refs))
            self._evictable = self._cache.held(0) - len(self._refs)
        self._cache.set_capacity(0, room)
        self._cache.set_capacity(0, _UNBOUNDED)
        self._evictable -= excess
