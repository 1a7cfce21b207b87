"""``hetero serve``: the heterogeneity-aware router in front of OpenAI-compatible replicas."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hetero._cli_util import fail, print_problems
from hetero.config import load_config
from hetero.errors import ConfigError, HeteroError
from hetero.sched.registry import policy_names, unknown_strategy
from hetero.serve.event_loop import run, uses_uvloop
from hetero.serve.router import DEFAULT_STRATEGY

if TYPE_CHECKING:
    from hetero.sched.capacity import CapacityOptions
    from hetero.serve.app import Server
    from hetero.serve.replicas import Replica

__all__ = ["check_port", "register"]


def register(app: typer.Typer) -> None:
    """Add ``serve`` to ``app``."""
    app.command("serve")(serve)


def check_port(value: int | None) -> int | None:
    """A ``--port`` option's value: a TCP port, or 0 for a free one (else the socket's bind
    would fail with a traceback, not a message)."""
    if value is not None and not 0 <= value <= 65535:
        raise typer.BadParameter(
            f"{value} is not a port; allowed: 1 to 65535, or 0 to pick a free one"
        )
    return value


def serve(
    replica: Annotated[
        list[str] | None,
        typer.Option(
            "--replica",
            "-r",
            metavar="URL[=GPU|speed:N][,slots=N,models=a|b,name=X,fit_model=M,context=N]",
            help="A replica: its base URL, which is enough. Repeat for each. Its speed and "
            "capacity are learned from its replies and its engine's load (vLLM, SGLang); a GPU "
            "(catalog name), a per-request speed (V100 = 1.0) or slots are priors that only "
            "make the start faster. Options follow a comma (URL,slots=8 or URL=T4,slots=8). "
            "Slots, the requests at once to start with, default to `hetero fit`'s for "
            "fit_model on its GPU, else the engine's published cap, else --capacity-initial. "
            "Models: default asked at its /v1/models.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Fleet config with a replicas: section (and scheduler:).",
            show_default=False,
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Address to listen on (0.0.0.0 to accept other machines).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(callback=check_port, help="Port to listen on; 0 picks a free one.")
    ] = 8080,
    strategy: Annotated[
        str | None,
        typer.Option(
            help="Routing policy (see `hetero policies list`). Default: the config's, else "
            f"{DEFAULT_STRATEGY}: each replica predicted as a continuous-batching engine (time "
            "to first token, time per output token) and each request sent where it meets the "
            "SLO (--slo-ttft, --slo-tpot) with the most headroom.",
            show_default=False,
        ),
    ] = None,
    slo_ttft: Annotated[
        float | None,
        typer.Option(
            help="The time to first token (seconds) each request should meet (strategy slo, "
            "the default; refused with another). Default: 1 s, or ten times the fleet's best "
            "lone TTFT of the request if more, as each replica was timed at start (or its "
            "catalog figures), held for the run.",
            show_default=False,
        ),
    ] = None,
    slo_tpot: Annotated[
        float | None,
        typer.Option(
            help="The time per output token (seconds) each request should meet (strategy "
            "slo, the default; refused with another). Default: 20 ms, or if more the least "
            "step time at which the replicas, each batching what it allows, reach 80% of "
            "their top decode throughput (five times a lone replica's fixed step; a fleet's "
            "slow replicas are taken in as far as that share needs them), from each replica "
            "as timed at start (or its catalog figures), held for the run.",
            show_default=False,
        ),
    ] = None,
    queue_size: Annotated[
        int, typer.Option(help="Requests waiting in the router before it answers 429.")
    ] = 1000,
    timeout: Annotated[
        float, typer.Option(help="Seconds a request may take from arrival; then 504.")
    ] = 600.0,
    max_retries: Annotated[
        int, typer.Option(help="Failed attempts retried on another replica before a 502.")
    ] = 2,
    default_max_tokens: Annotated[
        int, typer.Option(help="Output cap assumed for requests that give no max_tokens.")
    ] = 256,
    prefill_weight: Annotated[
        float,
        typer.Option(help="Cost of a prompt token relative to an output token, for routing."),
    ] = 0.02,
    unit_rate: Annotated[
        float,
        typer.Option(
            help="Output tokens per second of one request on a speed-1.0 replica: the scale of "
            "declared speeds, so that learned ones read alike.",
        ),
    ] = 50.0,
    rate_limit: Annotated[
        float | None,
        typer.Option(
            help="Requests per second per client address; an API key (Authorization: Bearer "
            "KEY) counts against the address it was first seen from.",
            show_default=False,
        ),
    ] = None,
    max_body: Annotated[int, typer.Option(help="Largest request body in bytes (then 413).")] = (
        8 * 2**20
    ),
    max_reply: Annotated[
        int,
        typer.Option(
            help="Largest answer in bytes a replica may give a request that is not streamed "
            "(then 502; the router holds it whole before passing it on)."
        ),
    ] = 64 * 2**20,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar="HETERO_ADMIN_KEY",
            help="Key of the admin API (add, drain, remove replicas); without it there is none.",
            show_default=False,
        ),
    ] = None,
    admin_host: Annotated[str, typer.Option(help="Address of the admin API.")] = "127.0.0.1",
    admin_port: Annotated[
        int | None,
        typer.Option(
            callback=check_port,
            help="Port of the admin API; 0 picks a free one (default: --port + 1, or a free "
            "one with --port 0).",
            show_default=False,
        ),
    ] = None,
    health_interval: Annotated[
        float, typer.Option(help="Seconds between health checks of each replica.")
    ] = 2.0,
    header_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds a connection has to send a request's headers (from its opening or "
            "its previous answer); then it is closed. Also how long an idle keep-alive "
            "connection stays open."
        ),
    ] = 15.0,
    max_connections: Annotated[
        int | None,
        typer.Option(
            help="Client connections open at once; one more is refused (503). Default: from "
            "the descriptor limit (ulimit -n), so that the router never runs out.",
            show_default=False,
        ),
    ] = None,
    load_interval: Annotated[
        float | None,
        typer.Option(
            help="Seconds between reads of each replica's published load (vLLM /metrics, "
            "SGLang /v1/loads), in the background. Default: 1 under strategy slo (the "
            "default: its own books track each replica; a read costs the engine's server "
            "CPU), 0.1 under the others.",
            show_default=False,
        ),
    ] = None,
    load_reads: Annotated[
        float,
        typer.Option(
            help="The load reads' budget: reads per second over the whole fleet at most (a "
            "large fleet is read less often than --load-interval; each read costs the router "
            "about 0.3 ms of CPU)."
        ),
    ] = 50.0,
    loop: Annotated[
        str,
        typer.Option(
            help="The event loop: auto (uvloop where installed, else asyncio), asyncio or "
            "uvloop (which costs the router less CPU per request)."
        ),
    ] = "auto",
    capacity_initial: Annotated[
        int,
        typer.Option(
            help="Requests at once, to start with, on a replica that declares no slots (nor "
            "fit_model with a GPU) and whose engine publishes no cap; it doubles each round "
            "trip while the replica keeps up. Strategy slo keeps no such count: a replica "
            "takes up to its engine's published cap, else its slots (declared or from "
            "fit_model), else 4096."
        ),
    ] = 1,
    capacity_tolerance: Annotated[
        float,
        typer.Option(
            help="A replica whose replies are this many times slower than unloaded (per token "
            "or unit of work) is full: it gets no more until it drains. One more request "
            "at r times slower adds about 1/r² of a lone request's throughput."
        ),
    ] = 8.0,
    access_log: Annotated[
        str | None,
        typer.Option(
            help="Write one JSON line per request to this file ('-': stderr).", show_default=False
        ),
    ] = None,
    autoscale: Annotated[
        Path | None,
        typer.Option(
            help="Start and stop replicas as the traffic asks, by the autoscale file (replica "
            "types, their commands, the serving plan that sizes them; examples/autoscale.yaml). "
            "--replica ones stay whatever the traffic.",
            show_default=False,
        ),
    ] = None,
    autoscale_dry_run: Annotated[
        bool,
        typer.Option(
            "--autoscale-dry-run",
            help="With --autoscale: decide and show the decisions in /status, start or stop "
            "nothing after the first replicas.",
        ),
    ] = False,
) -> None:
    """Route OpenAI-compatible requests to replicas by what each engine can do.

    Each replica is predicted as the continuous-batching engine it is (vLLM, SGLang, TGI): a
    request's time to first token from the prompt tokens queued there, its time per output
    token from the batch and KV tokens it would join, both fitted from every reply. A request
    goes where both meet the SLO (--slo-ttft, --slo-tpot; derived from the fleet if not given)
    with the most headroom. When none would, it waits here instead of overloading a small GPU.

    --strategy shortest_expected_delay (or another policy) routes by speed and slots instead:
    speeds learned from every reply, capacity from the engine's load and each reply's pace.

    Examples:

      hetero serve --port 8080 -r http://10.0.0.5:8000 -r http://10.0.0.6:8000

      hetero serve --port 8080 -r http://10.0.0.5:8000=A100-80GB -r http://10.0.0.6:8000=T4

      hetero serve -c fleet.yaml --admin-key secret

      hetero serve --port 0 -r http://127.0.0.1:9001=speed:6,slots=20

      hetero serve --autoscale examples/autoscale.yaml
    """
    from hetero.serve.app import ServeOptions, Server
    from hetero.serve.autoscale.config import load_autoscale
    from hetero.serve.replicas import parse_replica_flag, replica_from_config
    from hetero.serve.router import Router, RouterOptions

    try:
        file = load_config(config) if config is not None else None
        entries = list(file.replicas) if file is not None else []
        entries += [parse_replica_flag(text) for text in replica or []]
        setup = load_autoscale(autoscale) if autoscale is not None else None
        if autoscale_dry_run and setup is None:
            raise ConfigError([("--autoscale-dry-run", "applies with --autoscale FILE")])
        if not entries and setup is None:
            raise ConfigError(
                [
                    (
                        "--replica",
                        "no replicas: give --replica URL, a config with replicas:, or "
                        "--autoscale FILE",
                    )
                ]
            )
        if strategy is not None and strategy not in policy_names() and ":" not in strategy:
            raise ConfigError([("--strategy", unknown_strategy(strategy))])
        scheduler = file.scheduler if file is not None else None
        # The config's strategy only when it names one: the engine's default is not the router's.
        chosen = scheduler if scheduler and "strategy" in scheduler.model_fields_set else None
        options = RouterOptions(
            strategy=strategy or (chosen.strategy if chosen else DEFAULT_STRATEGY),
            strategy_options=dict(chosen.options) if chosen and not strategy else {},
            queue_size=queue_size,
            timeout=timeout,
            max_retries=max_retries,
            default_max_tokens=default_max_tokens,
            prefill_weight=prefill_weight,
            unit_rate=unit_rate,
            capacity=_capacity(capacity_initial, capacity_tolerance),
            slo_ttft=slo_ttft or (setup.spec.slo.ttft if setup else None),
            slo_tpot=slo_tpot or (setup.spec.slo.tpot if setup else None),
        )
        serve_options = ServeOptions(
            host=host,
            port=port,
            admin_host=admin_host,
            admin_port=admin_port,
            admin_key=admin_key,
            max_body=max_body,
            max_reply=max_reply,
            rate_limit=rate_limit,
            health_interval=health_interval,
            header_timeout=header_timeout,
            max_connections=max_connections,
            load_interval=load_interval,
            load_reads=load_reads,
        )
        if admin_key and admin_port is None and port == 65535:
            raise ConfigError(
                [("--admin-port", "the default, --port + 1, is 65536: give --admin-port")]
            )
        uvloop = uses_uvloop(loop)
        static = [replica_from_config(e) for e in entries]
        _one_replica_per_engine(static)

        def build(replicas: list[Replica]) -> Server:
            return Server(Router(replicas, options), serve_options)

        server = build(static) if setup is None else None
    except ConfigError as exc:
        print_problems(exc, "error: ")
        raise typer.Exit(1) from None
    except (HeteroError, ValueError) as exc:
        fail(str(exc))
    if access_log is not None:
        _open_access_log(access_log)
    try:
        if setup is not None:
            from hetero.commands.serve_autoscale import run_autoscaled

            run(run_autoscaled(setup, static, build, autoscale_dry_run), uvloop)
        else:
            assert server is not None
            run(_run(server), uvloop)
    except OSError as exc:  # the port is taken, the address is not ours
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    except HeteroError as exc:  # a first replica the provider could not start
        fail(str(exc))


def _one_replica_per_engine(replicas: list[Replica]) -> None:
    """Refuse a URL given twice (in the config, the flags or both): one engine counted as two
    replicas gets twice its share of requests."""
    from hetero.serve.replicas import same_engine

    for i, replica in enumerate(replicas):
        first = same_engine(replica.url, replicas[:i])
        if first is not None:
            raise ConfigError(
                [
                    (
                        "--replica",
                        f"{replica.url} is given twice (replicas {first.name!r} and "
                        f"{replica.name!r}); one engine is one replica",
                    )
                ]
            )


def _capacity(initial: int, tolerance: float) -> CapacityOptions:
    """The capacity options of the flags, a bad one named as its flag."""
    from hetero.sched.capacity import CapacityOptions

    try:
        return CapacityOptions(initial=initial, tolerance=tolerance)
    except ConfigError as exc:
        raise ConfigError([(f"capacity_{field}", why) for field, why in exc.problems]) from None


def _open_access_log(target: str) -> None:
    handler: logging.Handler = (
        logging.StreamHandler(sys.stderr) if target == "-" else logging.FileHandler(target)
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger = logging.getLogger("hetero.serve.access")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


async def _run(server: Server) -> None:
    url = await server.start()
    router = server.router
    admin = f", admin API on {server.admin_url}" if server.admin_url else ""
    print(
        f"hetero serve listening on {url} ({_count(len(router.replicas), 'replica')}, "
        f"strategy {router.options.strategy}{admin})",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print(f"hetero serve: draining {len(router.tickets)} requests", file=sys.stderr, flush=True)
    await server.drain()


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
