"""Matrix multiplies on a mixed fleet: ``run``, ``submit``, a two-task graph and ``map``.

Every result is checked against numpy here. On a real (not emulated) GPU the task multiplies
with CuPy when it is installed; everywhere else, including emulated GPUs, with numpy.

    python examples/matmul.py                        # examples/emulated_fleet.yaml
    python examples/matmul.py --this-machine         # this machine's own devices
    python examples/matmul.py --config my_fleet.yaml --size 2048
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

import hetero

FLEET = Path(__file__).resolve().parent / "emulated_fleet.yaml"


def flops(a: np.ndarray, b: np.ndarray) -> float:
    """Work units of ``a @ b``: its GFLOPs. An emulated device of speed 1 (a V100) does one unit
    per second at time_scale 1: far slower than a real V100, so that this host keeps pace."""
    return 2 * a.shape[0] * a.shape[1] * b.shape[1] / 1e9


@hetero.task(cost=flops)
def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    dev = hetero.get_current_device()
    if dev.type == "gpu" and not dev.emulated:
        try:
            import cupy as cp  # type: ignore[import-not-found]
        except ImportError:
            pass
        else:
            return cp.asnumpy(cp.asarray(a) @ cp.asarray(b))  # type: ignore[no-any-return]
    return a @ b


@hetero.task(cost=lambda c: c.size / 1e7)
def post(c: np.ndarray) -> float:
    """A follow-up step on a product: its Frobenius norm."""
    return float(np.linalg.norm(c))


@hetero.task(cost=lambda batch: batch.size / 1e5)
def score(batch: np.ndarray) -> float:
    """One score per batch of rows: the mean of tanh over the batch."""
    return float(np.tanh(batch).mean())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--config", type=Path, default=FLEET, help=f"fleet config (default {FLEET.name})"
    )
    where.add_argument(
        "--this-machine", action="store_true", help="use this machine's devices, not a config"
    )
    parser.add_argument("--size", type=int, default=1024, help="matrix side (default 1024)")
    parser.add_argument("--batches", type=int, default=64, help="batches to score (default 64)")
    parser.add_argument(
        "--time-scale", type=float, default=1.0, help="emulated durations × this (default 1)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="small sizes, for a smoke test (--size 128)"
    )
    args = parser.parse_args()
    n = 128 if args.quick else args.size
    if n < 1 or args.batches < 1 or not args.time_scale > 0:
        parser.error("--size and --batches must be >= 1 and --time-scale > 0")

    rng = np.random.default_rng(0)
    a = rng.random((n, n), dtype=np.float32)
    b = rng.random((n, n), dtype=np.float32)
    batches = [rng.standard_normal((32, n), dtype=np.float32) for _ in range(args.batches)]
    expected = a @ b

    config = None if args.this_machine else args.config
    t0 = time.monotonic()
    with hetero.Context(config, time_scale=args.time_scale) as ctx:
        print(f"fleet: {', '.join(d.id for d in ctx.devices)} (time_scale {args.time_scale:g})")

        c = ctx.run(matmul, a, b)  # one task, its result
        ok = np.allclose(c, expected, rtol=1e-4)
        print(f"run:    {n}x{n} @ {n}x{n} -> {c.shape}, matches numpy: {ok}")

        f = ctx.submit(matmul, a, b)  # a future...
        g = ctx.submit(post, f)  # ...passed to another task: it runs once f is done
        norm = g.result()
        ok_graph = np.isclose(norm, np.linalg.norm(expected), rtol=1e-4)
        print(
            f"graph:  matmul on {f.device}, then post on {g.device}: "
            f"norm {norm:.6g}, matches numpy: {ok_graph}"
        )

        outs = list(ctx.map(score, batches))  # in input order
        ok_map = np.allclose(outs, [np.tanh(x).mean() for x in batches], rtol=1e-5)
        print(f"map:    {len(outs)} batches scored, match numpy: {ok_map}")
        done = {d["id"]: d["done"] for d in ctx.status()["devices"]}
        print(
            "tasks done per device (a map batch is one task):",
            ", ".join(f"{k} {v}" for k, v in done.items()),
        )
    print(f"done in {time.monotonic() - t0:.1f} s")
    return 0 if ok and ok_graph and ok_map else 1


if __name__ == "__main__":
    raise SystemExit(main())
