"""hetero on a Ray cluster: three nodes with different devices, one that joins, one that leaves.

Starts a three-node Ray cluster on this machine (``ray.cluster_utils.Cluster``); each node
declares its own emulated fleet from ``examples/ray/*.yaml`` (on real machines:
``HETERO_NODE_CONFIG=node.yaml ray start --address …``, or no config for the node's own
devices). A ``hetero.Context(backend="ray")`` maps one function over many items: hetero's
dispatcher, not Ray's scheduler, decides which device's actor runs each batch. While it runs, a node
joins and another leaves; the map still returns every result once, in order. (The tests in
``tests/ray/`` kill nodes outright, ``allow_graceful=False``, with the same outcome.)

    python examples/ray_cluster.py
    python examples/ray_cluster.py --items 1500 --quick
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

import hetero
from hetero.runtime.ray_cluster import local_cluster, node_args

HERE = Path(__file__).resolve().parent / "ray"


@hetero.task(cost=1.0)
def score(x: int) -> tuple[int, str]:
    """One unit of work (an emulated device takes 1 / speed × time_scale seconds): the square
    of ``x``, and the device that computed it, so that each device's results can be counted."""
    return x * x, hetero.get_current_device().id


def main() -> int:
    parser = argparse.ArgumentParser(
        # The docstring's first paragraph, rewrapped to the terminal (argparse's default).
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--items", type=int, default=2000, help="items to map (default 2000)")
    parser.add_argument(
        "--quick", action="store_true", help="a shorter emulated duration per item (a smoke run)"
    )
    args = parser.parse_args()
    if args.items < 10:
        parser.error(f"--items must be >= 10, got {args.items}")
    time_scale = 0.01 if args.quick else 0.02
    nodes = [HERE / "head.yaml", HERE / "node_v100.yaml", HERE / "node_t4.yaml"]
    started = time.perf_counter()
    with local_cluster(nodes) as cluster:
        print(f"cluster of {len(nodes)} nodes up in {time.perf_counter() - started:.1f} s")
        with hetero.Context(backend="ray", address=cluster.address, time_scale=time_scale) as ctx:
            for d in ctx.devices:
                print(f"  {d.id:28} {d.model:15} speed {d.speed:.2f}  on {d.node}")
            t4_node = next(d.id.split("/")[0] for d in ctx.devices if d.model == "T4")
            victim = next(n for n in cluster.worker_nodes if n.node_id.startswith(t4_node))
            results = []
            t0 = time.perf_counter()
            for value in ctx.map(score, range(args.items), progress=False):
                results.append(value)
                if len(results) == args.items // 10:
                    print(f"{len(results)} results: an H100 node joins the cluster")
                    cluster.add_node(num_cpus=1, **node_args(HERE / "node_h100.yaml"))
                if len(results) == args.items // 2:
                    print(f"{len(results)} results: the T4 + V100 node leaves the cluster")
                    cluster.remove_node(victim)
            elapsed = time.perf_counter() - t0
            squares = [value for value, _ in results]
            assert squares == [x * x for x in range(args.items)], "lost or duplicated results"
            print(f"{len(results)} results, every one once and in order, in {elapsed:.1f} s")
            by_device = Counter(device for _, device in results)
            # Ray reports a node come or gone a moment after it happens, and the fleet follows
            # when the backend's watcher next asks: where the map ended first, give it that.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not settled(ctx, t4_node):
                time.sleep(0.1)
            members = set(ctx.dispatcher.members)
            devices = ctx.status()["devices"]
            print(f"{'device':28} {'results':>7}  in the fleet")
            for d in devices:
                print(
                    f"{d['id']:28} {by_device[d['id']]:7}  "
                    f"{'yes' if d['id'] in members else 'left'}"
                )
            # ctx.map sends items in batches, sized by each device's speed: a device's tasks
            # are batches, not results.
            batches = sum(d["done"] for d in devices)
            print(
                f"results: items each device computed ({sum(by_device.values())} in all); "
                f"ctx.map ran them as {batches} batches (tasks)"
            )
    return 0


def settled(ctx: hetero.Context, gone: str) -> bool:
    """Whether the fleet has let the ``gone`` node's devices go and taken the H100 in."""
    members = ctx.dispatcher.members
    left = not any(m.startswith(f"{gone}/") for m in members)
    return left and any("h100" in m for m in members)  # ids name the device's model


if __name__ == "__main__":
    raise SystemExit(main())
