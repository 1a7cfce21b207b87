"""``hetero serve --autoscale FILE``: start the first replicas through the provider, serve, and
let the autoscaler grow and shrink the fleet until Ctrl-C or SIGTERM (see ``docs/serve.md``)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from hetero.serve.autoscale.config import AutoscaleSetup
from hetero.serve.autoscale.controller import AutoscaleController, ControllerOptions
from hetero.serve.autoscale.policy import ScalePolicy
from hetero.serve.autoscale.providers import (
    LocalProcessProvider,
    RayPlacement,
    RayProvider,
    ReplicaHandle,
    RetryingProvider,
)

if TYPE_CHECKING:
    from hetero.serve.app import Server
    from hetero.serve.replicas import Replica
    from hetero.serve.router import Router

__all__ = ["provider_for", "run_autoscaled"]


def provider_for(setup: AutoscaleSetup) -> RetryingProvider:
    """The provider the file names, with each type's command."""
    config = setup.config
    commands = {name: t.command for name, t in config.types.items()}
    if config.provider == "ray":
        placements = {
            name: RayPlacement(accelerator=t.accelerator, num_gpus=t.num_gpus)
            for name, t in config.types.items()
        }
        return RayProvider(setup.types, commands, placements=placements)
    return LocalProcessProvider(setup.types, commands)


async def run_autoscaled(
    setup: AutoscaleSetup,
    static: list[Replica],
    build: Callable[[list[Replica]], Server],
    dry_run: bool,
) -> None:
    """Start each type's ``initial`` replicas, build the server around them and the
    ``static`` ones (``build``), serve with the autoscaler until a signal, then drain."""
    provider = provider_for(setup)
    started: list[ReplicaHandle] = []
    try:
        for name, t in setup.config.types.items():
            for _ in range(t.initial):
                handle = await provider.start(name)
                started.append(handle)
                print(f"hetero serve: started {handle.name} ({name}) at {handle.url}", flush=True)
        server = build([*static, *(setup.describe(h) for h in started)])
    except BaseException:
        for handle in started:
            await provider.stop(handle)
        await provider.close()
        raise
    router: Router = server.router
    controller = AutoscaleController(
        router,
        ScalePolicy(setup.types, setup.sizer, setup.options),
        provider,
        lambda: router.traffic.traffic(router.clock.now()),
        options=ControllerOptions(interval=setup.config.interval, dry_run=dry_run),
        added=server.replica_added,
        describe=setup.describe,
    )
    for handle in started:
        controller.adopt(handle)
    server.autoscaler = controller
    url = await server.start()
    mode = " (dry run: decisions are logged, nothing is started or stopped)" if dry_run else ""
    print(
        f"hetero serve listening on {url} ({len(router.replicas)} replicas, strategy "
        f"{router.options.strategy}, autoscaling {', '.join(setup.config.types)}{mode})",
        flush=True,
    )
    controller.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        print(f"hetero serve: draining {len(router.tickets)} requests", file=sys.stderr, flush=True)
        await server.drain()
        await controller.close(stop_replicas=True)
        await provider.close()
