"""``hetero mock-replica``: an emulated OpenAI-compatible inference replica, until stopped."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING, Annotated, cast

import typer

from hetero._cli_util import fail, print_problems
from hetero.commands.serve import check_port
from hetero.errors import ConfigError

if TYPE_CHECKING:  # the server (and aiohttp) is imported when the command runs, not for --help
    from hetero.serve.emulator.config import (
        Engine,
        EngineModelName,
        LoadFault,
        MockConfig,
        OutputDist,
    )

__all__ = ["register"]

# MockConfig fields whose option is not the field's name with dashes.
_OPTIONS = {"models": "--model", "default_max_tokens": "--max-tokens"}


def register(app: typer.Typer) -> None:
    """Add ``mock-replica`` to ``app``."""
    app.command("mock-replica")(mock_replica)


def mock_replica(
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            metavar="NAME",
            help="Model name to serve; repeat for more. Default: mock-llm.",
            show_default=False,
        ),
    ] = None,
    speed: Annotated[
        float, typer.Option(help="Relative speed: service time is divided by it.")
    ] = 1.0,
    slots: Annotated[
        int,
        typer.Option(
            help="Requests served at once; more wait first come, first served (continuous"
            " model: the most running in its batch)."
        ),
    ] = 16,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            callback=check_port,
            help="Port to listen on; 0 picks a free one (printed on start).",
        ),
    ] = 0,
    seed: Annotated[
        int, typer.Option(help="Seed of the output lengths and of the injected faults.")
    ] = 0,
    decode_time: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds per output token at speed 1.")
    ] = 0.02,
    prefill_time: Annotated[
        float, typer.Option(metavar="SECONDS", help="Seconds per prompt token at speed 1.")
    ] = 0.0005,
    output_mean: Annotated[
        float, typer.Option(metavar="TOKENS", help="Mean output length, before the cap.")
    ] = 128,
    output_dist: Annotated[
        str,
        typer.Option(
            metavar="DIST",
            help="Output length distribution: lognormal, pareto, exponential or fixed.",
        ),
    ] = "lognormal",
    max_tokens: Annotated[
        int,
        typer.Option(metavar="TOKENS", help="Output cap of a request that gives no max_tokens."),
    ] = 256,
    fail_rate: Annotated[
        float, typer.Option(metavar="P", help="Probability of answering 500.")
    ] = 0.0,
    garbage_rate: Annotated[
        float,
        typer.Option(
            metavar="P", help="Probability of answering 200 with a body that is not JSON."
        ),
    ] = 0.0,
    slowdown: Annotated[
        float, typer.Option(help="Service time is multiplied by it: a gray failure.")
    ] = 1.0,
    queue_limit: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Requests that may wait for a slot; more get 429. Default: no limit.",
            show_default=False,
        ),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            metavar="ENGINE",
            help="Whose load endpoints to answer besides the OpenAI API: sglang (/get_server_info,"
            " /v1/loads, /get_load, /metrics), vllm (/metrics, /version, /load) or openai (none).",
        ),
    ] = "sglang",
    kv_tokens: Annotated[
        int | None,
        typer.Option(
            metavar="TOKENS",
            help="KV cache capacity, the denominator of the KV usage reported. Default: slots ×"
            " 2048; continuous model: what the memory fit of --model-shape on --device leaves.",
            show_default=False,
        ),
    ] = None,
    load_fault: Annotated[
        str,
        typer.Option(
            metavar="FAULT",
            help="Fault of the load endpoints (never the API): none, garbage, nan, negative, huge,"
            " slow or error.",
        ),
    ] = "none",
    load_delay: Annotated[
        float,
        typer.Option(
            metavar="SECONDS", help="How long a load endpoint takes under --load-fault slow."
        ),
    ] = 5.0,
    engine_model: Annotated[
        str,
        typer.Option(
            metavar="MODEL",
            help="How requests are paced: simple (each in a slot, --prefill-time per prompt"
            " token and --decode-time per output token) or continuous (an emulated engine of"
            " --model-shape on --device: continuous batching, step times from the batch, KV"
            " cache with preemption and prefix caching).",
        ),
    ] = "simple",
    model_shape: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="Continuous model: the LLM emulated, a name from `hetero fit`'s table"
            " (llama-3-8b, qwen2.5-72b, ...) or a path to a Hugging Face config.json.",
        ),
    ] = "llama-3-8b",
    device: Annotated[
        str,
        typer.Option(
            metavar="DEVICE",
            help="Continuous model: the accelerator emulated, a catalog name (`hetero catalog"
            " list`): its TFLOPS, memory bandwidth and memory.",
        ),
    ] = "H100-SXM-80GB",
    compute_efficiency: Annotated[
        float,
        typer.Option(
            metavar="SHARE",
            help="Continuous model: share of the device's peak TFLOPS a step's tokens run at.",
        ),
    ] = 0.5,
    bandwidth_efficiency: Annotated[
        float,
        typer.Option(
            metavar="SHARE",
            help="Continuous model: share of the device's peak memory bandwidth a step reads"
            " the weights and the KV cache at.",
        ),
    ] = 0.8,
    step_overhead: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="Continuous model: seconds each engine step costs besides compute and memory.",
        ),
    ] = 0.002,
    request_overhead: Annotated[
        float,
        typer.Option(
            metavar="SECONDS",
            help="Continuous model: seconds each engine step costs per request in its batch.",
        ),
    ] = 0.0,
    attention_efficiency: Annotated[
        float | None,
        typer.Option(
            metavar="SHARE",
            help="Continuous model: share of the device's peak TFLOPS attention over the"
            " context runs at (default: the compute efficiency; `hetero profile-engine` fits"
            " it).",
        ),
    ] = None,
    max_num_batched_tokens: Annotated[
        int,
        typer.Option(
            metavar="TOKENS",
            help="Continuous model: tokens one step computes at most (chunked prefill).",
        ),
    ] = 8192,
) -> None:
    """Serve an emulated OpenAI-compatible inference replica until Ctrl-C or SIGTERM.

    Chat and text completions (streamed or not), embeddings and /v1/models, each taking as long
    as on a replica of the given relative speed.

    --engine picks the load endpoints it speaks, with figures true to its state (running,
    waiting, KV tokens held): SGLang's by default (sglang-router accepts it as a worker), vLLM's,
    or none (openai).

    --engine-model continuous emulates an engine instead of slots: vLLM's scheduler (continuous
    batching, chunked prefill within --max-num-batched-tokens, at most --slots running) with each
    step's time from the batch (its tokens at the device's TFLOPS, the weights and the KV cache
    read at its memory bandwidth, times the efficiencies, plus --step-overhead, plus
    --request-overhead per request in it), a KV cache of the size the memory fit leaves (or
    --kv-tokens) that preempts the newest request when full, and a prefix cache of 16-token
    blocks (64 characters of the prompt); /metrics then publishes its prefix-cache counters,
    preemptions and block count. --speed and --slowdown still scale its step times.

    POST /mock/config with speed, slowdown, fail_rate, garbage_rate, load_fault or load_delay
    changes them at run time; GET /mock/stats counts the requests.

    On start it prints one line: hetero mock-replica listening on http://HOST:PORT (...).

    Example: `hetero mock-replica --model llama-8b --speed 2.5 --slots 16 --port 8001`, or
    `hetero mock-replica --engine vllm --engine-model continuous --model-shape llama-3-8b
    --device L4 --slots 64`.
    """
    from hetero.serve.emulator.config import MockConfig

    try:
        config = MockConfig(
            models=tuple(model or ("mock-llm",)),
            speed=speed,
            slots=slots,
            seed=seed,
            decode_time=decode_time,
            prefill_time=prefill_time,
            output_mean=output_mean,
            output_dist=cast("OutputDist", output_dist),  # MockConfig checks it
            default_max_tokens=max_tokens,
            fail_rate=fail_rate,
            garbage_rate=garbage_rate,
            slowdown=slowdown,
            queue_limit=queue_limit,
            engine=cast("Engine", engine),  # MockConfig checks these two
            kv_tokens=kv_tokens,
            load_fault=cast("LoadFault", load_fault),
            load_delay=load_delay,
            engine_model=cast("EngineModelName", engine_model),
            model_shape=model_shape,
            device=device,
            compute_efficiency=compute_efficiency,
            bandwidth_efficiency=bandwidth_efficiency,
            step_overhead=step_overhead,
            request_overhead=request_overhead,
            attention_efficiency=attention_efficiency,
            max_num_batched_tokens=max_num_batched_tokens,
        )
    except ConfigError as exc:
        named = [(_OPTIONS.get(f, "--" + f.replace("_", "-")), m) for f, m in exc.problems]
        print_problems(ConfigError(named), "error: ")
        raise typer.Exit(2) from None
    try:
        asyncio.run(_serve(config, host, port))
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


async def _serve(config: MockConfig, host: str, port: int) -> None:
    from hetero.serve.emulator.server import MockReplica

    replica = MockReplica(config, host, port)
    url = await replica.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Scripts read the URL from this line, so it goes to stdout alone and is flushed at once.
    spec = config.engine_spec
    engine = (
        ""
        if spec is None
        else f", {spec.shape.name} on {spec.device.model}, {spec.kv_tokens} KV tokens"
    )
    sys.stdout.write(
        f"hetero mock-replica listening on {url} "
        f"(model {','.join(config.models)}, speed {config.speed:g}, slots {config.slots}"
        f"{engine})\n"
    )
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await replica.stop()
