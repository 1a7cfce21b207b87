"""The Prometheus text an emulated replica writes (exposition format 0.0.4, as
prometheus_client writes it): vLLM's and SGLang's ``/metrics`` pages from its counters and
histograms, and SGLang's ``/v1/loads?format=prometheus``."""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from hetero.serve.emulator.config import Engine
from hetero.serve.emulator.replica_engine import CacheFigures, Load
from hetero.serve.emulator.request_bodies import Generation

__all__ = ["PROM_TYPE", "EngineMetrics", "huge_padding", "loads_prometheus"]

PROM_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
# Bucket bounds of the engines' default histograms.
_VLLM_TTFT_BOUNDS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_VLLM_E2E_BOUNDS: Final = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_SGLANG_TTFT_BOUNDS: Final = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
_SGLANG_E2E_BOUNDS: Final = (*_SGLANG_TTFT_BOUNDS, 600, 1200, 1800, 2400)
_VLLM_FINISH_REASONS: Final = ("stop", "length", "abort", "error", "repetition")
_HUGE_BYTES = 10 * 1024 * 1024


def _num(value: float) -> str:
    """A sample value as prometheus_client writes it (Go's float format)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _labels(labels: dict[str, str]) -> str:
    """``{a="x",b="y"}``, sorted by name as prometheus_client writes them."""
    escaped = (
        (k, v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"'))
        for k, v in sorted(labels.items())
    )
    return "{" + ",".join(f'{k}="{v}"' for k, v in escaped) + "}"


def _head(name: str, kind: str, doc: str) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n"


class _Histogram:
    """One labelled series of a histogram; its sample names are built once."""

    __slots__ = ("_bounds", "_buckets", "_count", "_counts", "_sum", "_sum_first", "total")

    def __init__(
        self,
        name: str,
        bounds: tuple[float, ...],
        labels: dict[str, str],
        *,
        sum_first: bool,  # prometheus_client's multiprocess collector writes _sum first
    ) -> None:
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        les = [*(_num(b) for b in bounds), "+Inf"]
        self._buckets = [f"{name}_bucket{_labels({**labels, 'le': le})} " for le in les]
        plain = _labels(labels)
        self._count = f"{name}_count{plain} "
        self._sum = f"{name}_sum{plain} "
        self._sum_first = sum_first

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1  # buckets are "<= le"
        self.total += value

    def lines(self, out: list[str]) -> None:
        if self._sum_first:
            out.append(f"{self._sum}{_num(self.total)}\n")
        seen = 0
        for sample, n in zip(self._buckets, self._counts, strict=True):
            seen += n
            out.append(f"{sample}{_num(seen)}\n")
        out.append(f"{self._count}{_num(seen)}\n")
        if not self._sum_first:
            out.append(f"{self._sum}{_num(self.total)}\n")


@dataclass(slots=True)
class _Tally:
    """SGLang's tokenizer counters and histograms of one ``is_streaming`` value."""

    ttft: _Histogram
    e2e: _Histogram
    requests: int = 0
    prompt_tokens: int = 0
    generated: int = 0


@functools.cache
def huge_padding() -> str:
    """About 10 MB of comment and sample lines that parse, ahead of the real page."""
    lines: list[str] = []
    size = 0
    while size < _HUGE_BYTES:
        i = len(lines)
        lines.append(
            f"# hetero mock padding {i}: a comment line, as long as some engines' HELP texts\n"
            f'hetero_mock_padding{{line="{i}"}} 0.0\n'
        )
        size += len(lines[-1])
    return "".join(lines)


def loads_prometheus(loads: list[dict[str, Any]]) -> str:
    """SGLang's /v1/loads?format=prometheus: a gauge per number, sections prefixed."""
    prefixes = {"disaggregation": "disagg"}
    samples: dict[str, list[tuple[int, float]]] = {}
    for load in loads:
        rank = load["dp_rank"]
        for key, value in load.items():
            if key == "dp_rank":
                continue
            if isinstance(value, dict):
                prefix = prefixes.get(key, key)
                for sub, number in value.items():
                    if isinstance(number, int | float):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append((rank, number))
            elif isinstance(value, int | float):
                samples.setdefault(f"sglang_{key}", []).append((rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f'{name}{{dp_rank="{rank}"}} {value}' for rank, value in values]
    return "\n".join(lines) + "\n"


class EngineMetrics:
    """The counters and histograms of the requests a replica completed, and the ``/metrics``
    page its engine would write from them and from its state of the moment: ``load`` is
    ``(running, waiting, KV tokens held, tokens generated per second)``, ``reading`` turns a
    gauge into what it reads under the replica's ``load_fault``, ``cancelled`` counts the
    requests aborted."""

    def __init__(self, model: str, created: float) -> None:
        self._created = created
        self.prompt_total = 0  # prompt and output tokens of the requests completed
        self.generated_total = 0
        self._finished: dict[str, int] = {}  # completed requests by finish reason
        model_label = {"model_name": model}
        vllm = {**model_label, "engine": "0"}
        self._vllm_ttft = _Histogram(
            "vllm:time_to_first_token_seconds", _VLLM_TTFT_BOUNDS, vllm, sum_first=False
        )
        self._vllm_e2e = _Histogram(
            "vllm:e2e_request_latency_seconds", _VLLM_E2E_BOUNDS, vllm, sum_first=False
        )
        self._vllm_labels = _labels(vllm)
        self._sglang_tokenizer = {**model_label, "engine_type": "unified"}
        self._sglang_labels = _labels(
            {**self._sglang_tokenizer, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        )
        self._sglang_tallies: dict[bool, _Tally] = {}  # by is_streaming, once one is seen

    def observe(self, engine: Engine, job: Generation, first_token: float, e2e: float) -> None:
        """Count a completed generation: ``first_token`` and ``e2e`` are seconds from its
        arrival. Only the emulated engine's histograms are kept."""
        self.prompt_total += job.prompt_tokens
        self.generated_total += job.out_tokens
        self._finished[job.finish_reason] = self._finished.get(job.finish_reason, 0) + 1
        if engine == "vllm":
            self._vllm_ttft.observe(first_token)
            self._vllm_e2e.observe(e2e)
        elif engine == "sglang":
            tally = self._sglang_tallies.get(job.stream)
            if tally is None:
                labels = {**self._sglang_tokenizer, "is_streaming": str(job.stream).lower()}
                tally = self._sglang_tallies[job.stream] = _Tally(
                    ttft=_Histogram(
                        "sglang:time_to_first_token_seconds",
                        _SGLANG_TTFT_BOUNDS,
                        labels,
                        sum_first=True,
                    ),
                    e2e=_Histogram(
                        "sglang:e2e_request_latency_seconds",
                        _SGLANG_E2E_BOUNDS,
                        labels,
                        sum_first=True,
                    ),
                )
            tally.requests += 1
            tally.prompt_tokens += job.prompt_tokens
            tally.generated += job.out_tokens
            tally.ttft.observe(first_token)
            tally.e2e.observe(e2e)

    def vllm_page(
        self,
        load: Load,
        kv_capacity: int,
        reading: Callable[[float], float],
        cancelled: int,
        cache: CacheFigures | None = None,
    ) -> str:
        """vLLM's v1 engine page (``vllm/v1/metrics/loggers.py``, PrometheusStatLogger): its
        scheduler gauges, prefix cache, token and request counters (each with the ``_created``
        sample prometheus_client adds) and two of its histograms, labelled engine and
        model_name. With ``cache`` (an engine with a prefix cache), its prefix cache and
        preemptions, and the cache config whose blocks give the KV capacity; without, no prefix
        cached."""
        running, waiting, used, _ = load
        usage = min(1.0, used / kv_capacity)
        labels = self._vllm_labels
        created = _num(self._created)
        out: list[str] = []

        def gauge(name: str, doc: str, value: float, extra: str = "") -> None:
            lab = labels[:-1] + extra + "}" if extra else labels
            out.append(f"{_head(name, 'gauge', doc)}{name}{lab} {_num(reading(value))}\n")

        def counter(name: str, doc: str, values: list[tuple[str, float]]) -> None:
            out.append(_head(f"{name}_total", "counter", doc))
            for extra, value in values:
                lab = labels[:-1] + extra + "}" if extra else labels
                out.append(f"{name}_total{lab} {_num(value)}\n")
            out.append(_head(f"{name}_created", "gauge", doc))
            for extra, _ in values:
                lab = labels[:-1] + extra + "}" if extra else labels
                out.append(f"{name}_created{lab} {created}\n")

        def histogram(name: str, doc: str, histo: _Histogram) -> None:
            out.append(_head(name, "histogram", doc))
            histo.lines(out)
            out.append(
                f"{_head(f'{name}_created', 'gauge', doc)}{name}_created{labels} {created}\n"
            )

        gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", running
        )
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        name = "vllm:num_requests_waiting_by_reason"
        out.append(
            _head(
                name,
                "gauge",
                "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
                "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA "
                "budget, KV transfer, blocked status). Sum of all reasons equals "
                "vllm:num_requests_waiting.",
            )
        )
        for reason, value in (("capacity", waiting), ("deferred", 0)):
            lab = f'{labels[:-1]},reason="{reason}"}}'
            out.append(f"{name}{lab} {_num(reading(value))}\n")
        name = "vllm:engine_sleep_state"
        out.append(
            _head(
                name,
                "gauge",
                "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
                "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means "
                "sleep level 2.",
            )
        )
        for state, value in (("awake", 1), ("weights_offloaded", 0), ("discard_all", 0)):
            out.append(f'{name}{labels[:-1]},sleep_state="{state}"}} {_num(value)}\n')
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage)
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            [("", self.prompt_total if cache is None else cache.queries)],
        )
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            [("", 0 if cache is None else cache.hits)],
        )
        counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            [("", 0 if cache is None else cache.preemptions)],
        )
        counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", [("", self.prompt_total)]
        )
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            [("", self.generated_total)],
        )
        finished = {**self._finished, "abort": cancelled}
        counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [(f',finished_reason="{r}"', finished.get(r, 0)) for r in _VLLM_FINISH_REASONS],
        )
        histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            self._vllm_ttft,
        )
        histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            self._vllm_e2e,
        )
        if cache is not None:
            # An info metric as a gauge of 1 (CacheConfig.metrics_info), a few of its labels.
            info = {
                "block_size": str(cache.block_size),
                "cache_dtype": "auto",
                "enable_prefix_caching": "True",
                "engine": "0",
                "num_cpu_blocks": "None",
                "num_gpu_blocks": str(cache.num_blocks),
            }
            name = "vllm:cache_config_info"
            out.append(_head(name, "gauge", "Information of the LLMEngine CacheConfig"))
            out.append(f"{name}{_labels(info)} 1.0\n")
        return "".join(out)

    def sglang_page(
        self,
        load: Load,
        kv_capacity: int,
        reading: Callable[[float], float],
        cancelled: int,
        cache: CacheFigures | None = None,
    ) -> str:
        """SGLang's page (``sglang/srt/observability/metrics_collector.py``), as its
        multiprocess prometheus registry writes it (labels sorted, no ``_created``): the
        scheduler's gauges, then the tokenizer's counters and histograms by is_streaming once a
        request of that kind has completed."""
        running, waiting, used, rate = load
        labels = self._sglang_labels
        out: list[str] = []
        for name, doc, value in (
            ("sglang:num_running_reqs", "The number of running requests.", running),
            ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", waiting),
            (
                "sglang:num_grammar_queue_reqs",
                "The number of requests in the grammar waiting queue.",
                0,
            ),
            ("sglang:gen_throughput", "The generation throughput (token/s).", rate),
            (
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                0.0 if cache is None else cache.hit_rate,
            ),
            ("sglang:token_usage", "The token usage.", min(1.0, used / kv_capacity)),
            ("sglang:num_used_tokens", "The number of used tokens.", used),
            (
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                kv_capacity,
            ),
            ("sglang:utilization", "The utilization.", 0.0),  # SGLang's stays 0 too
        ):
            out.append(f"{_head(name, 'gauge', doc)}{name}{labels} {_num(reading(value))}\n")
        tallies = sorted(self._sglang_tallies.items())
        if not tallies:
            return "".join(out)
        tokenizer = self._sglang_tokenizer
        for name, doc, field in (
            ("sglang:prompt_tokens_total", "Number of prefill tokens processed.", "prompt_tokens"),
            (
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                "generated",
            ),
            ("sglang:num_requests_total", "Number of requests processed.", "requests"),
        ):
            out.append(_head(name, "counter", doc))
            for stream, tally in tallies:
                lab = _labels({**tokenizer, "is_streaming": str(stream).lower()})
                out.append(f"{name}{lab} {_num(getattr(tally, field))}\n")
        if cancelled:
            name = "sglang:num_aborted_requests_total"
            out.append(_head(name, "counter", "Number of requests aborted."))
            out.append(f"{name}{_labels(tokenizer)} {_num(cancelled)}\n")
        for name, doc, attr in (
            (
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                "ttft",
            ),
            (
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                "e2e",
            ),
        ):
            out.append(_head(name, "histogram", doc))
            for _, tally in tallies:
                histo: _Histogram = getattr(tally, attr)
                histo.lines(out)
        return "".join(out)
