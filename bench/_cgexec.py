"""Run a command in a CPU quota of its own: ``python bench/_cgexec.py SHARE CMD...`` makes a
cgroup (v1 cpu controller) allowed ``SHARE`` of one core, moves itself into it and execs
``CMD``; everything the command starts stays in it. Where the controller is not writable it
execs ``CMD`` unthrottled and says so on stderr. The groups are named ``hetero-bench-cg-<pid>``
(``cleanup`` removes the empty ones)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 20_000
PREFIX = "hetero-bench-cg-"


def enter(share: float) -> bool:
    group = CGROUP_CPU / f"{PREFIX}{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, round(share * PERIOD_US))))
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        print(f"_cgexec: no CPU quota ({exc}); running unthrottled", file=sys.stderr)
        return False
    return True


def cleanup() -> None:
    """Remove the groups this script made that no process is in any more."""
    for group in CGROUP_CPU.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            group.rmdir()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: _cgexec.py SHARE CMD...", file=sys.stderr)
        return 2
    enter(float(argv[0]))
    os.execvp(argv[1], argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
