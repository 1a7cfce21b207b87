"""``hetero mock-replica``: an emulated OpenAI-compatible inference replica, until stopped."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import TYPE_CHECKING, Annotated, cast

import typer

from hetero._cli_util import fail, print_problems
from hetero.errors import ConfigError

if TYPE_CHECKING:  # the server (and aiohttp) is imported when the command runs, not for --help
    from hetero.serve.mock_config import Engine, LoadFault, MockConfig, OutputDist

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
        int, typer.Option(help="Requests served at once; more wait first come, first served.")
    ] = 16,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(
            min=0, max=65535, help="Port to listen on; 0 picks a free one (printed on start)."
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
            " 2048.",
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
) -> None:
    """Serve an emulated OpenAI-compatible inference replica until Ctrl-C or SIGTERM.

    Chat and text completions (streamed or not), embeddings and /v1/models, each taking as long
    as on a replica of the given relative speed.

    --engine picks the load endpoints it speaks, with figures true to its state (running,
    waiting, KV tokens held): SGLang's by default (sglang-router accepts it as a worker), vLLM's,
    or none (openai).

    POST /mock/config with speed, slowdown, fail_rate, garbage_rate, load_fault or load_delay
    changes them at run time; GET /mock/stats counts the requests.

    On start it prints one line: hetero mock-replica listening on http://HOST:PORT (...).

    Example: `hetero mock-replica --model llama-8b --speed 2.5 --slots 16 --port 8001`.
    """
    from hetero.serve.mock_config import MockConfig

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
    from hetero.serve.mock import MockReplica

    replica = MockReplica(config, host, port)
    url = await replica.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Scripts read the URL from this line, so it goes to stdout alone and is flushed at once.
    sys.stdout.write(
        f"hetero mock-replica listening on {url} "
        f"(model {','.join(config.models)}, speed {config.speed:g}, slots {config.slots})\n"
    )
    sys.stdout.flush()
    try:
        await stop.wait()
    finally:
        await replica.stop()
