"""A long task that survives losing its worker: checkpoints, a crash, and a resumed retry.

The task counts through ``--steps`` steps and calls ``hetero.checkpoint(state)`` after each one;
it starts from ``hetero.restore(default)``. To show recovery, its first attempt kills its own
worker process half-way (SIGKILL, as the kernel's out-of-memory killer would). The
engine sees the worker die, starts the task again (``retries=2``), and the retry restores the
last checkpoint: it runs only the second half. It runs on this machine's own devices.

    python examples/checkpoint.py
    python examples/checkpoint.py --steps 40 --quick
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import hetero


@hetero.task(retries=2)
def count(steps: int, seconds_per_step: float) -> dict[str, object]:
    """Run ``steps`` steps, checkpointing after each; return which steps this attempt ran."""
    state = hetero.restore({"step": 0, "total": 0, "pids": []})
    resumed = state["step"] > 0  # a checkpoint from an earlier attempt was found
    state["pids"].append(os.getpid())  # which worker process ran each attempt
    ran = []
    while state["step"] < steps:
        if not resumed and state["step"] == steps // 2:
            os.kill(os.getpid(), signal.SIGKILL)  # the first attempt dies here, mid-way
        time.sleep(seconds_per_step)  # a step of real work would go here
        state["total"] += state["step"]
        ran.append(state["step"])
        state["step"] += 1
        hetero.checkpoint(state)  # atomic: a retry sees this state or the previous one
    return {
        "ran": ran,
        "total": state["total"],
        "device": hetero.get_current_device().id,
        "pids": state["pids"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=20, help="steps in the task (default 20)")
    parser.add_argument(
        "--quick", action="store_true", help="steps of 1 ms instead of 50 ms (a smoke test)"
    )
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2")
    seconds = 0.001 if args.quick else 0.05

    with hetero.Context() as ctx:  # this machine
        future = ctx.submit(count, args.steps, seconds)
        result = future.result()
        stats = dict(ctx.stats)

    ran: list[int] = result["ran"]  # type: ignore[assignment]
    first, *_, last = result["pids"]  # type: ignore[misc]
    half = args.steps // 2
    print(
        f"task of {args.steps} steps: the first attempt (worker pid {first}) killed its worker "
        f"at step {half}"
    )
    print(f"retries after a lost worker: {stats['retried']}")
    print(
        f"the retry ran on {result['device']} (a new worker, pid {last}) and resumed from "
        f"the checkpoint: it ran steps {ran[0]}..{ran[-1]} ({len(ran)} of {args.steps})"
    )
    expected_total = sum(range(args.steps))
    ok = (
        ran == list(range(half, args.steps)) and result["total"] == expected_total and first != last
    )
    print(f"total over all steps: {result['total']} (expected {expected_total}): ", end="")
    print("every step ran exactly once" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
